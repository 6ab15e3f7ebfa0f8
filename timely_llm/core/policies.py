"""The serving policies: the one registry (``POLICIES``). Each entry holds everything a policy is: its name, the
queue's order (a priority function), how it serves (segmented, streamed or the whole plan, adaptive batch), the
engine's own scheduling, and its help text. The node's parameters and their descriptors, the CLI's choices and
help, ``/diagnostics`` and docs/node.md's policy table all read it: adding a policy is one entry here.

The unsegmented policies are the vLLM baselines: ``vllm`` dispatches a plan when it is complete, ``vllm-stream``
each statement as it is generated, ``vllm-priority`` too with vLLM's own priority scheduling; they run without
scheduler parts, as vLLM does. The segmented ones suspend a generation after each segment and queue it again.
Benchmarks may add policies of their own (``timely_llm_bench``'s ``isolated``), defined there, never one of these
names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from timely_llm.core.features import Features
from timely_llm.core.priority import EDF, FCFS, PUD, PriorityPolicy, VllmPriority, request_priority

ENGINE_FCFS = "fcfs"
ENGINE_PRIORITY = "priority"
"""vLLM's ``scheduling_policy`` values: its FCFS, and its own priority scheduling."""


@dataclass(frozen=True)
class ServingPolicy:
    name: str
    order: Callable[[float], PriorityPolicy]
    """The queue's order, made for a network latency: PUD, EDF, FCFS or vLLM's priority order."""
    segmented: bool
    """Suspend the generation after each segment and queue it again."""
    streaming: bool
    """Dispatch each segment as soon as it exists (otherwise the whole plan at the end)."""
    adaptive_batch: bool
    """The batch controller admits by each running generation's deadline, not by the cap alone."""
    help: str
    """One line for ``timely-llm --help``, the ``policy`` parameter's description and the docs' table."""

    def parts(self, features: Features) -> Features:
        """The scheduler parts this policy runs with: none under the vLLM baselines."""
        return features if self.segmented else Features()

    def queue_order(self, network_latency: float) -> PriorityPolicy:
        return self.order(network_latency)

    @property
    def engine_scheduling(self) -> str:
        """vLLM's ``scheduling_policy``: its own priority scheduling (each generation's priority orders vLLM's
        waiting queue and picks its preemption victim) under ``vllm-priority``, FCFS under the others."""
        return ENGINE_PRIORITY if self.order is _vllm_priority else ENGINE_FCFS

    def engine_priority(self, ert: float) -> int:
        """The priority a generation of ERT ``ert`` starts with in the engine (0 where the engine is FCFS)."""
        return request_priority(ert) if self.engine_scheduling == ENGINE_PRIORITY else 0

    @property
    def mode(self) -> tuple[bool, bool, bool]:
        """How it serves (segmented, streaming, adaptive batch): a live switch keeps it."""
        return self.segmented, self.streaming, self.adaptive_batch

    @property
    def mode_name(self) -> str:
        """How it serves, in words."""
        if not self.segmented:
            return "streamed" if self.streaming else "whole plan"
        return "segmented" + (", adaptive batch" if self.adaptive_batch else "")


def _fcfs(network_latency: float) -> PriorityPolicy:
    return FCFS()


def _edf(network_latency: float) -> PriorityPolicy:
    return EDF()


def _vllm_priority(network_latency: float) -> PriorityPolicy:
    return VllmPriority()


_VLLM, _VLLM_STREAM, _VLLM_PRIORITY = "vllm", "vllm-stream", "vllm-priority"
_FCFS, _EDF, _TIMELYLLM = "fcfs", "edf", "timelyllm"

POLICIES = {
    p.name: p
    for p in (
        ServingPolicy(_VLLM, _fcfs, segmented=False, streaming=False, adaptive_batch=False,
                      help="FCFS continuous batching; the whole plan is dispatched when it is complete"),
        ServingPolicy(_VLLM_STREAM, _fcfs, segmented=False, streaming=True, adaptive_batch=False,
                      help="FCFS; each statement is dispatched as soon as it is generated, never paused"),
        ServingPolicy(_VLLM_PRIORITY, _vllm_priority, segmented=False, streaming=True, adaptive_batch=False,
                      help="vLLM's priority scheduling (lower ERT first) with preemption; statements streamed"),
        ServingPolicy(_FCFS, _fcfs, segmented=True, streaming=True, adaptive_batch=True,
                      help="segmented: suspended after each segment, queued by arrival"),
        ServingPolicy(_EDF, _edf, segmented=True, streaming=True, adaptive_batch=True,
                      help="segmented, queued by the first segment's deadline (arrival + ERT)"),
        ServingPolicy(_TIMELYLLM, PUD, segmented=True, streaming=True, adaptive_batch=True,
                      help="segmented + PUD priority (Eq. 4) + latency-guided adaptive batch: the paper's system"),
    )
}

VLLM, VLLM_STREAM, VLLM_PRIORITY = POLICIES[_VLLM], POLICIES[_VLLM_STREAM], POLICIES[_VLLM_PRIORITY]
FCFS_POLICY, EDF_POLICY, TIMELYLLM = POLICIES[_FCFS], POLICIES[_EDF], POLICIES[_TIMELYLLM]
"""Each policy by name, for code that names one (a default, a baseline): ``TIMELYLLM.name``, never the string."""
BASELINES = tuple(name for name, p in POLICIES.items() if not p.segmented)
"""The vLLM baselines (unsegmented)."""


def serving_policy(name: str) -> ServingPolicy:
    """The policy named ``name``; ValueError naming the known ones."""
    if name not in POLICIES:
        raise ValueError(f"must be one of {', '.join(POLICIES)}, got {name!r}")
    return POLICIES[name]


def policy_help() -> dict[str, str]:
    """Each policy's help line, by name."""
    return {name: p.help for name, p in POLICIES.items()}
