"""How each ``timely_llm_server`` parameter may change: its descriptor (range, read-only) and when a new value applies.

Three kinds, by name:

- read-only (descriptor ``read_only``): fixed once the node exists (``autostart``, ``result_timeout``); rclpy
  itself refuses a change, with the reason "Trying to set a read-only parameter".
- configure-time: read when the node is configured (the engine and everything built with it: ``engine``,
  ``model``, every ``vllm.*`` and ``remote.*`` parameter, the scheduler's policy parts...). They can be set while
  the node is unconfigured and apply at the next configure; set while it is configured they are refused, with the
  reason.
- live: applied at once by the running node (``live`` below), e.g. the default TUFs and the watchdog's timeouts.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, SetParametersResult
from rclpy.parameter import Parameter

from timely_llm.engines.registry import ENGINE_PREFIXES, ENGINES

READ_ONLY = frozenset({"autostart", "result_timeout"})
LIVE = frozenset({"policy", "max_task_chars", "max_prompt_tokens", "max_new_tokens", "segment_timeout_factor",
                  "segment_timeout_margin", "status_period"})
LIVE_PREFIXES = ("tuf.",)
CONFIGURE_TIME_PREFIXES = tuple(ENGINE_PREFIXES.values())
"""Each engine's own parameters (``engines/registry.py``), by name prefix: configure-time (the engine is built at
configure), and refused at configure on a node whose engine is another (``foreign_engine_parameters``)."""

ROS_OWN = frozenset({"use_sim_time", "start_type_description_service"})
"""Parameters rclpy declares on every node (Jazzy; Humble has only ``use_sim_time``) ..."""
ROS_OWN_PREFIXES = ("qos_overrides.",)
"""... and the families it reads by prefix (QoS overrides of publishers and subscriptions)."""
OPEN_PREFIXES = tuple(kind.prefix for kind in ENGINES.values() if kind.open_parameters)
"""Families whose fields are a library's (``vllm.<EngineArgs field>``): that engine checks them when it loads."""

_FLOAT_RANGES = {
    "kv_cache_gib": (0.01, 4096.0),
    "network_latency": (0.0, 10.0),
    "segment_timeout_factor": (0.0, 1000.0),
    "segment_timeout_margin": (0.0, 3600.0),
    "status_period": (0.05, 60.0),
    "result_timeout": (0.0, 86400.0),
    "remote.timeout": (0.1, 3600.0),
}
_INT_RANGES = {
    "max_batch": (0, 4096),
    "max_task_chars": (1, 1_000_000),
    "max_prompt_tokens": (1, 1 << 20),
    "max_new_tokens": (1, 1 << 16),
    "remote.max_num_seqs": (1, 1 << 16),
}
_TUF_RANGES = {"ert": (0.0, 3600.0), "alpha": (-1e6, 0.0), "beta": (1e-9, 1e6)}
"""As a goal's TUF is checked (goals.py); beta must be > 0, which a closed range says as its smallest step."""


def when_applied(name: str) -> str:
    """``read-only``, ``live`` or ``configure-time``."""
    if name in READ_ONLY:
        return "read-only"
    if name in LIVE or name.startswith(LIVE_PREFIXES):
        return "live"
    return "configure-time"


def descriptor(name: str, description: str, dynamic: bool = False) -> ParameterDescriptor:
    """The parameter's descriptor: its description, when a change applies, its range where it has one; ``dynamic``:
    its type may change (an engine argument, whose type is its engine's to check)."""
    kind = when_applied(name)
    note = {"read-only": "read-only: fixed when the node starts",
            "live": "live: a change applies at once",
            "configure-time": "configure-time: set it while the node is unconfigured; applies at configure"}[kind]
    d = ParameterDescriptor(description=description, additional_constraints=note, read_only=kind == "read-only",
                            dynamic_typing=dynamic)
    low_high = _FLOAT_RANGES.get(name) or (_TUF_RANGES.get(name.rsplit(".", 1)[-1]) if name.startswith("tuf.")
                                           else None)
    if low_high:
        d.floating_point_range = [FloatingPointRange(from_value=low_high[0], to_value=low_high[1])]
    elif name in _INT_RANGES:
        d.integer_range = [IntegerRange(from_value=_INT_RANGES[name][0], to_value=_INT_RANGES[name][1], step=1)]
    return d


def refuse_while_configured(params: Iterable[Parameter], state: str) -> SetParametersResult:
    """Refuse configure-time parameters unless the node is unconfigured (``state``: its lifecycle state label)."""
    if state == "unconfigured":
        return SetParametersResult(successful=True)
    fixed = [p.name for p in params if when_applied(p.name) == "configure-time"]
    if not fixed:
        return SetParametersResult(successful=True)
    return SetParametersResult(successful=False, reason=(
        f"{', '.join(fixed)}: configure-time, read when the node is configured (now {state}); deactivate and "
        f"clean up the node, set it, then configure again"))


def foreign_engine_parameters(engine: str, values: Mapping[str, object], defaults: Mapping[str, object]) -> list[str]:
    """The parameters in ``values`` that belong to an engine other than ``engine`` and are set to other than their
    default (one without a default: set at all)."""
    return sorted(name for name, value in values.items()
                  for owner, prefix in ENGINE_PREFIXES.items()
                  if owner != engine and name.startswith(prefix) and (name not in defaults or value != defaults[name]))


def foreign_engine_refusal(engine: str, names: list[str]) -> str:
    """One line: why a configure on ``engine`` refuses the parameters ``names`` of other engines."""
    owners = {name: owner for name in names for owner, prefix in ENGINE_PREFIXES.items() if name.startswith(prefix)}
    if len(names) == 1:
        return (f"parameter {names[0]} is for engine {owners[names[0]]}, and this node's engine is {engine}: remove it "
                f"or set engine to {owners[names[0]]}")
    listed = ", ".join(f"{name} (engine {owners[name]})" for name in names)
    return f"parameters {listed} are for other engines than this node's, {engine}: remove them or set the engine"


def unknown_parameters(given: Iterable[str], known: Iterable[str]) -> list[str]:
    """The names in ``given`` that the node does not take: not one of its own (``known``: the defaults' names),
    not rclpy's, and not under an open engine family's prefix. ``remote.urll`` and ``tuf.urgent.ert2`` are
    unknown fields of known families."""
    names = set(known)
    return sorted(name for name in given if name not in names and name not in ROS_OWN
                  and not name.startswith(ROS_OWN_PREFIXES + OPEN_PREFIXES))


def unknown_refusal(names: list[str], known: Iterable[str]) -> str:
    """One line: configure refuses the unknown parameters ``names``, the nearest known name suggested for each."""
    candidates = sorted(set(known) | ROS_OWN)
    described = []
    for name in names:
        near = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
        described.append(f"{name} (did you mean {near[0]}?)" if near else name)
    what = "parameter" if len(names) == 1 else "parameters"
    return (f"unknown {what} {', '.join(described)}: not a parameter of this node (ros2 param list; "
            "docs/node.md, Parameters); remove it or fix its name")
