"""Mixed-robot workloads for the real-engine peer benchmark (``timely-llm peer-bench``).

Plans are generated from the LRTrace task texts (not replayed), so every request costs what the
model writes. ``light`` keeps the engine mostly idle between arrivals; ``contended`` sends bursts
of tasks, more than the engine serves at once, so requests queue and the policies differ; ``bursty``
sends bigger bursts, meant for a capped batch (``timely-llm demo --point bursty``); ``capped`` sends bursts of
10-14 tasks, more than a server capped at 8 sequences (``--max-num-seqs 8``) admits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from timely_llm.traces import TraceCatalog
from timely_llm_bench.workloads.generator import Workload, WorkloadRequest, default_tuf

URGENT_TRACES = (6, 7, 8)
NORMAL_TRACES = (1, 2, 3, 4, 5)
ARM_TRACES = (9, 10, 11)


@dataclass(frozen=True)
class PeerSpec:
    name: str
    requests: int
    events_per_second: float
    max_tasks_per_event: int
    urgent_share: float
    arm_share: float
    min_tasks_per_event: int = 1


PEER_WORKLOADS = {
    "light": PeerSpec("light", 15, 15 / 54, 1, 1 / 3, 0.2),
    "contended": PeerSpec("contended", 34, 0.5, 6, 0.4, 0.2),
    "bursty": PeerSpec("bursty", 106, 0.22, 16, 0.4, 0.0),
    "capped": PeerSpec("capped", 36, 0.2, 14, 0.4, 0.2, min_tasks_per_event=10),
}
"""``bursty``: drones only, 106 tasks in 60 s in bursts of up to 16, above a batch cap of 8: where batch slots
are scarce and a scheduler has something to decide."""


def generate_peer(spec: PeerSpec, catalog: TraceCatalog, seed: int = 0, network_latency: float = 0.008) -> Workload:
    """``spec.requests`` tasks in Poisson events of ``min_tasks_per_event``..``max_tasks_per_event`` tasks (1 ms
    apart), each task
    urgent, arm or normal drone by the spec's shares; every agent runs one task."""
    rng = random.Random(seed)
    requests: list[WorkloadRequest] = []
    t = rng.expovariate(spec.events_per_second)
    while len(requests) < spec.requests:
        tasks = rng.randint(spec.min_tasks_per_event, spec.max_tasks_per_event)
        for i in range(min(tasks, spec.requests - len(requests))):
            draw = rng.random()
            pool = (URGENT_TRACES if draw < spec.urgent_share
                    else ARM_TRACES if draw < spec.urgent_share + spec.arm_share else NORMAL_TRACES)
            trace = catalog[rng.choice(pool)]
            prefix = "arm" if trace.robot == "arm" else "drone"
            requests.append(WorkloadRequest(f"r{len(requests):05d}", round(t + i * 0.001, 6),
                                            f"{prefix}-{len(requests):02d}", trace.id, default_tuf(trace.category)))
        t += rng.expovariate(spec.events_per_second)
    return Workload(f"peer-{spec.name}", network_latency, tuple(requests))
