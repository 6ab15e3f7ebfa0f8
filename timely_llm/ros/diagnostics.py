"""The node's ``/diagnostics`` status (diagnostic_msgs, as diagnostic_updater publishes it): what it serves with,
how loaded it is, and a level with the reason.

ERROR: the last configure failed (its reason), or the server loop is gone. WARN: the engine is loading, the queue
holds more generations than QUEUE_WARN_FACTOR batches, or the last engine step took longer than SLOW_STEP_S.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

QUEUE_WARN_FACTOR = 4
"""WARN when more generations wait than this many full batches."""
SLOW_STEP_S = 2.0
"""WARN when one engine step took longer than this (a CPU vLLM step of a 135M model takes ~0.05-0.3 s)."""

OK, WARN, ERROR = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR


@dataclass
class Snapshot:
    """What the node knows about itself at one moment."""

    node: str
    """Fully qualified node name: the status's name and hardware_id."""
    lifecycle: str
    phase: str
    """What the node is doing or last failed at, in words (e.g. "loading the engine (40 s)")."""
    failed: bool = False
    engine: str = ""
    model: str = ""
    device: str = ""
    policy: str = ""
    queue: int = 0
    running: int = 0
    executing: int = 0
    batch_cap: int = 0
    last_step_s: float = math.nan
    kv_free_blocks: int = -1
    kv_blocks: int = -1
    loop_alive: bool = True


def level_of(s: Snapshot) -> tuple[bytes, str]:
    """The status level and its message."""
    if s.failed:
        return ERROR, s.phase
    if s.lifecycle in ("inactive", "active") and not s.loop_alive:
        return ERROR, "server loop stopped"
    if s.lifecycle == "configuring":
        return WARN, s.phase
    if s.batch_cap and s.queue > QUEUE_WARN_FACTOR * s.batch_cap:
        return WARN, f"queue of {s.queue} generations exceeds {QUEUE_WARN_FACTOR} batches of {s.batch_cap}"
    if s.last_step_s > SLOW_STEP_S:
        return WARN, f"slow engine step: {s.last_step_s:.2f} s"
    return OK, s.phase


def diagnostic_array(s: Snapshot, stamp: object) -> DiagnosticArray:
    """The DiagnosticArray of one snapshot; ``stamp``: a builtin_interfaces/Time."""
    level, message = level_of(s)
    values = {"lifecycle state": s.lifecycle, "engine": s.engine, "model": s.model, "device": s.device,
              "policy": s.policy, "queue": s.queue, "running": s.running, "executing": s.executing,
              "batch cap": s.batch_cap,
              "last step time (s)": "" if math.isnan(s.last_step_s) else f"{s.last_step_s:.4f}",
              "KV free blocks": "" if s.kv_free_blocks < 0 else f"{s.kv_free_blocks} of {s.kv_blocks}"}
    status = DiagnosticStatus(level=level, name=f"{s.node}: server", message=message[:400], hardware_id=s.node,
                              values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
    array = DiagnosticArray(status=[status])
    array.header.stamp = stamp
    return array
