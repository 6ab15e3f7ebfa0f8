"""The serving policies, and what each means: the one table (``POLICIES``) and the one place where a policy's
fields are read into the queue's order, the scheduler parts it runs with, the engine's own scheduling and a
generation's engine priority.

The unsegmented policies are the vLLM baselines: ``vllm`` dispatches a plan when it is complete, ``vllm-stream``
each statement as it is generated, ``vllm-priority`` too with vLLM's own priority scheduling; they run without
scheduler parts, as vLLM does. The segmented ones suspend a generation after each segment and queue it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from timely_llm.core.features import Features
from timely_llm.core.priority import PriorityPolicy, make_policy, request_priority


@dataclass(frozen=True)
class ServingPolicy:
    name: str
    priority: str
    """The queue's order: pud, edf, fcfs, or priority (vLLM's priority scheduling, the ERT as priority)."""
    segmented: bool
    """Suspend the generation after each segment and queue it again."""
    streaming: bool
    """Dispatch each segment as soon as it exists (otherwise the whole plan at the end)."""
    adaptive_batch: bool
    """The batch controller admits by each running generation's deadline, not by the cap alone."""

    def parts(self, features: Features) -> Features:
        """The scheduler parts this policy runs with: none under the vLLM baselines."""
        return features if self.segmented else Features()

    def queue_order(self, network_latency: float) -> PriorityPolicy:
        return make_policy(self.priority, network_latency)

    @property
    def engine_scheduling(self) -> str:
        """vLLM's ``scheduling_policy``: its own priority scheduling (each generation's priority orders vLLM's
        waiting queue and picks its preemption victim) under ``vllm-priority``, FCFS under the others."""
        return "priority" if self.priority == "priority" else "fcfs"

    def engine_priority(self, ert: float) -> int:
        """The priority a generation of ERT ``ert`` starts with in the engine (0 where the engine is FCFS)."""
        return request_priority(ert) if self.engine_scheduling == "priority" else 0

    @property
    def mode(self) -> tuple[bool, bool, bool]:
        """How it serves (segmented, streaming, adaptive batch): a live switch keeps it."""
        return self.segmented, self.streaming, self.adaptive_batch


POLICIES = {
    p.name: p
    for p in (
        ServingPolicy("vllm", "fcfs", segmented=False, streaming=False, adaptive_batch=False),
        ServingPolicy("vllm-stream", "fcfs", segmented=False, streaming=True, adaptive_batch=False),
        ServingPolicy("vllm-priority", "priority", segmented=False, streaming=True, adaptive_batch=False),
        ServingPolicy("fcfs", "fcfs", segmented=True, streaming=True, adaptive_batch=True),
        ServingPolicy("edf", "edf", segmented=True, streaming=True, adaptive_batch=True),
        ServingPolicy("timelyllm", "pud", segmented=True, streaming=True, adaptive_batch=True),
    )
}


def serving_policy(name: str) -> ServingPolicy:
    """The policy named ``name``; ValueError naming the known ones."""
    if name not in POLICIES:
        raise ValueError(f"must be one of {', '.join(POLICIES)}, got {name!r}")
    return POLICIES[name]
