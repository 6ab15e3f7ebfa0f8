"""The node's ``/diagnostics`` statuses (diagnostic_msgs, as diagnostic_updater publishes them), in one
DiagnosticArray, each named after the node:

- ``<node>: server``, first, the one whose hardware_id is the node's name: what it serves with, how loaded it
  is, and a level with the reason. ERROR: the last configure failed (its reason), or the server loop is gone.
  WARN: the engine is loading, urgent goals missed their deadline in the last minute, the queue holds more
  generations than QUEUE_WARN_FACTOR batches, or the last engine step took longer than SLOW_STEP_S.
  Its values include the share of resumed context served from kept or cached KV, where the engine reports it.
- ``<node>: robot type <type>``, one per robot type: goals served, deadline misses in the last minute (urgent
  ones apart: ``served``), mean response. WARN while urgent goals of the type missed their deadline. No
  hardware_id (a robot type is no hardware).
- ``<node>: remote server <url>``, one per server of the remote engine: up, or down since when and why; the
  streams open on it. ERROR while it is down. Its hardware_id is the server's URL.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from timely_llm.core.kv_reuse import KvReuse
from timely_llm.engines.base import ServerHealth
from timely_llm.ros.served import WINDOW_S, RobotTypeLine

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
    kv_reuse: KvReuse | None = None
    robot_types: list[RobotTypeLine] = field(default_factory=list)
    servers: list[ServerHealth] = field(default_factory=list)

    @property
    def urgent_misses(self) -> str:
        """The robot types whose urgent goals missed their deadline in the last minute, with how many ("": none)."""
        return ", ".join(f"{t.robot} {t.urgent_misses}" for t in self.robot_types if t.urgent_misses)


def level_of(s: Snapshot) -> tuple[bytes, str]:
    """The status level and its message."""
    if s.failed:
        return ERROR, s.phase
    if s.lifecycle in ("inactive", "active") and not s.loop_alive:
        return ERROR, "server loop stopped"
    if s.lifecycle == "configuring":
        return WARN, s.phase
    if s.urgent_misses:
        return WARN, urgent_warning(s)
    if s.batch_cap and s.queue > QUEUE_WARN_FACTOR * s.batch_cap:
        return WARN, f"queue of {s.queue} generations exceeds {QUEUE_WARN_FACTOR} batches of {s.batch_cap}"
    if s.last_step_s > SLOW_STEP_S:
        return WARN, f"slow engine step: {s.last_step_s:.2f} s"
    return OK, s.phase


def urgent_warning(s: Snapshot) -> str:
    return f"urgent goals missed their deadline in the last {WINDOW_S:.0f} s: {s.urgent_misses}"


def diagnostic_array(s: Snapshot, stamp: object) -> DiagnosticArray:
    """The DiagnosticArray of one snapshot; ``stamp``: a builtin_interfaces/Time."""
    array = DiagnosticArray(status=[_server_status(s), *(_robot_type_status(s.node, t) for t in s.robot_types),
                                    *(_remote_server_status(s.node, h) for h in s.servers)])
    array.header.stamp = stamp
    return array


def _status(level: bytes, name: str, message: str, hardware: str, values: dict[str, object]) -> DiagnosticStatus:
    return DiagnosticStatus(level=level, name=name, message=message[:400], hardware_id=hardware,
                            values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])


def _robot_type_status(node: str, t: RobotTypeLine) -> DiagnosticStatus:
    mean = "" if math.isnan(t.mean_response_s) else f"{t.mean_response_s:.3f}"
    message = (f"{t.served} goals served, {t.misses} deadline misses in the last {WINDOW_S:.0f} s"
               f"{f' ({t.urgent_misses} urgent)' if t.urgent_misses else ''}, mean response "
               f"{f'{mean} s' if mean else 'none yet'}")
    values = {"goals served": t.served, f"deadline misses (last {WINDOW_S:.0f} s)": t.misses,
              f"urgent deadline misses (last {WINDOW_S:.0f} s)": t.urgent_misses, "mean response (s)": mean,
              "responses": t.responses}
    return _status(WARN if t.urgent_misses else OK, f"{node}: robot type {t.robot}", message, "", values)


def _remote_server_status(node: str, h: ServerHealth) -> DiagnosticStatus:
    since = "" if h.down_since is None else time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(h.down_since))
    silent = "" if h.silent_s is None else f"{h.silent_s:.0f}"
    message = f"down since {since}: {h.down}" if h.down is not None else \
        f"up, stalled: its streams silent for {silent} s (new goals go elsewhere)" if silent else "up"
    values = {"up": h.down is None, "down since": since,
              "down for (s)": "" if h.down_since is None else f"{time.time() - h.down_since:.0f}",
              "cause": h.down or "", "open streams": h.open_streams, "stalled, silent for (s)": silent,
              "model": h.model}
    level = ERROR if h.down is not None else WARN if silent else OK
    return _status(level, f"{node}: remote server {h.url}", message, h.url, values)


def _server_status(s: Snapshot) -> DiagnosticStatus:
    level, message = level_of(s)
    values = {"lifecycle state": s.lifecycle, "engine": s.engine, "model": s.model, "device": s.device,
              "policy": s.policy, "queue": s.queue, "running": s.running, "executing": s.executing,
              "batch cap": s.batch_cap,
              "last step time (s)": "" if math.isnan(s.last_step_s) else f"{s.last_step_s:.4f}",
              "KV free blocks": "" if s.kv_free_blocks < 0 else f"{s.kv_free_blocks} of {s.kv_blocks}"}
    if s.kv_reuse is not None and s.kv_reuse.share is not None:
        values |= {"resumed context from kept or cached KV (%)": f"{100 * s.kv_reuse.share:.1f}",
                   "resumed context tokens recomputed": s.kv_reuse.recomputed}
    return _status(level, f"{s.node}: server", message, s.node, values)
