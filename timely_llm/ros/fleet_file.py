"""The fleet file (node parameter ``fleet_file``): who may ask the node for plans, for which robot types, how
urgent a goal may claim to be and how much each robot may hold. No ROS import: ``timely-llm security-policy
--fleet`` reads it too.

```yaml
classes:                 # optional: priority classes, each the most urgent TUF a goal of it may claim
  urgent: {max_beta: 2.0, max_slope: 6.67, min_ert: 0.2}    # (the defaults: DEFAULT_CLASSES)
defaults: {in_flight: 4, rate: 5.0, burst: 10, max_new_tokens: 0}   # optional: quotas of robots that give none
robots:
  - id: drone_01         # an agent id, or an fnmatch pattern of ids (drone_*)
    types: [tello]       # robot types it may ask for ("*": any served)
    class: urgent        # its priority class (default normal)
    in_flight: 2         # requests in flight at once
    rate: 1.0            # requests per second, sustained (token bucket) ...
    burst: 3             # ... and at once
    max_new_tokens: 256  # token budget per plan (0: the node's max_new_tokens)
```

An agent's entry is the one naming its id exactly, else the first pattern that matches it. Every field is
checked with a one-line error naming the file and the field (``ConfigError``). Without a fleet file the node
serves every agent as one entry ``*`` of class ``urgent`` with the default quotas (``open_fleet``).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace
from typing import Any

from timely_llm_interfaces.names import TASK_REQUESTS, agent_id_error

from timely_llm.core.tuf import DEFAULT_TUFS, TUF
from timely_llm.errors import ConfigError, read_mapping

FILE_KEYS = ("classes", "defaults", "robots")
CLASS_KEYS = ("max_beta", "max_slope", "min_ert")
QUOTA_KEYS = ("in_flight", "rate", "burst", "max_new_tokens")
ROBOT_KEYS = ("id", "types", "class", *QUOTA_KEYS)
DEFAULT_CLASS = "normal"
"""The class of a fleet-file robot that names none."""
OPEN_CLASS = "urgent"
"""Without a fleet file every agent is of this class: the most urgent of the defaults."""
_PATTERN_CHARS = re.compile(r"[*?\[\]]")


def own_request_topic(agent: str) -> str:
    """A robot's own request topic, ``<agent>/task_requests``, relative to the node's namespace (its client
    writes the same name: ``timely_llm_robot.topic_client``)."""
    return f"{agent}/{TASK_REQUESTS}"


@dataclass(frozen=True)
class PriorityClass:
    """The most urgent TUF a goal of this class may claim: highest beta, steepest alpha, shortest ERT."""

    name: str
    max_beta: float
    max_slope: float
    min_ert: float

    def clamp(self, tuf: TUF) -> tuple[TUF, str]:
        """``tuf`` within these bounds, and what was changed ("" if nothing)."""
        bounded = TUF(max(tuf.ert, self.min_ert), max(tuf.alpha, -self.max_slope), min(tuf.beta, self.max_beta))
        if bounded == tuf:
            return tuf, ""
        changed = [f"{name} {getattr(tuf, name):g} -> {getattr(bounded, name):g}" for name in ("ert", "alpha", "beta")
                   if getattr(tuf, name) != getattr(bounded, name)]
        return bounded, f"TUF clamped to class {self.name!r}: {', '.join(changed)}"


def _bounds(name: str, tuf: TUF) -> PriorityClass:
    return PriorityClass(name, tuf.beta, -tuf.alpha, tuf.ert)


DEFAULT_CLASSES: dict[str, PriorityClass] = {
    "urgent": _bounds("urgent", DEFAULT_TUFS["urgent"]),
    "normal": _bounds("normal", DEFAULT_TUFS["normal"]),
    "background": PriorityClass("background", 0.5, 0.5, 5.0),
}
"""The default classes: urgent and normal bound a goal to its category's default TUF (core/tuf.py)."""


@dataclass(frozen=True)
class Quotas:
    in_flight: int = 4
    rate: float = 5.0
    burst: int = 10
    max_new_tokens: int = 0
    """0: the node's ``max_new_tokens`` alone."""


DEFAULT_QUOTAS = Quotas()


@dataclass(frozen=True)
class FleetEntry:
    """Robots by id or id pattern: the robot types they may ask for (None: any), their class and quotas."""

    pattern: str
    types: frozenset[str] | None
    priority: PriorityClass
    quotas: Quotas

    @property
    def exact(self) -> bool:
        """It names one agent id (not a pattern)."""
        return not _PATTERN_CHARS.search(self.pattern)

    def type_error(self, agent: str, robot_type: str) -> str | None:
        if self.types is None or robot_type in self.types:
            return None
        return f"agent {agent!r} may not ask for robot type {robot_type!r} (its fleet entry allows " \
               f"{', '.join(sorted(self.types))})"


@dataclass(frozen=True)
class Fleet:
    """The robots a node serves: those of a fleet file (``source``), or every agent (``open_fleet``, no source)."""

    entries: tuple[FleetEntry, ...]
    classes: dict[str, PriorityClass]
    source: str = ""
    _exact: dict[str, FleetEntry] = field(init=False, repr=False, compare=False)
    _patterns: tuple[FleetEntry, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_exact", {e.pattern: e for e in self.entries if e.exact})
        object.__setattr__(self, "_patterns", tuple(e for e in self.entries if not e.exact))

    def entry(self, agent: str) -> FleetEntry | None:
        """The agent's entry: the one naming it, else the first pattern matching it; None if none."""
        found = self._exact.get(agent)
        if found is not None:
            return found
        return next((e for e in self._patterns if fnmatch.fnmatchcase(agent, e.pattern)), None)

    def screen(self, agent: str, robot_type: str) -> str | None:
        """Why the agent may not ask for ``robot_type`` (not in the fleet file, or another type), or None."""
        entry = self.entry(agent)
        if entry is None:
            return f"agent {agent!r} is not in the fleet file"
        return entry.type_error(agent, robot_type)

    @property
    def named(self) -> list[str]:
        return sorted(self._exact)

    def check_types(self, served: set[str]) -> None:
        """ConfigError naming an entry whose robot type the node does not serve."""
        for i, entry in enumerate(self.entries):
            unknown = sorted((entry.types or set()) - served)
            if unknown:
                raise ConfigError(self.source, f"robots[{i}].types", f"unknown robot type {unknown[0]!r} (served: "
                                  f"{', '.join(sorted(served))})")


def open_fleet(quotas: Quotas = DEFAULT_QUOTAS) -> Fleet:
    """No fleet file: every agent, any robot type, class ``urgent``, ``quotas``."""
    return Fleet((FleetEntry("*", None, DEFAULT_CLASSES[OPEN_CLASS], quotas),), dict(DEFAULT_CLASSES))


def load_fleet(path: str) -> Fleet:
    """Load and check a fleet file; ConfigError names the file and the field."""
    data = read_mapping(path)
    _no_unknown(data, FILE_KEYS, path, "")
    classes = dict(DEFAULT_CLASSES) | _classes(data.get("classes") or {}, path)
    defaults = _quotas(_mapping(data.get("defaults") or {}, path, "defaults"), DEFAULT_QUOTAS, path, "defaults.")
    robots = data.get("robots")
    if not isinstance(robots, list) or not robots:
        raise ConfigError(path, "robots", "expected a non-empty list of robots ({id, types, class, quotas...})")
    entries = tuple(_robot(raw, i, classes, defaults, path) for i, raw in enumerate(robots))
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if entry.pattern in seen:
            raise ConfigError(path, f"robots[{i}].id", f"{entry.pattern!r} is listed twice")
        seen.add(entry.pattern)
    return Fleet(entries, classes, path)


def _classes(raw: object, source: str) -> dict[str, PriorityClass]:
    found = {}
    for name, bounds in _mapping(raw, source, "classes").items():
        where = f"classes.{name}"
        if agent_id_error(str(name)):
            raise ConfigError(source, where, "a class name is a letter, then letters, digits and underscores")
        _no_unknown(_mapping(bounds, source, where), CLASS_KEYS, source, where + ".")
        values = [_number(bounds, key, source, where + ".") for key in CLASS_KEYS]
        if values[0] <= 0 or values[1] < 0 or values[2] < 0:
            raise ConfigError(source, where, "max_beta must be > 0, max_slope and min_ert >= 0")
        found[str(name)] = PriorityClass(str(name), *values)
    return found


def _robot(raw: object, index: int, classes: dict[str, PriorityClass], defaults: Quotas,
           source: str) -> FleetEntry:
    where = f"robots[{index}]"
    robot = _mapping(raw, source, where)
    _no_unknown(robot, ROBOT_KEYS, source, where + ".")
    pattern = robot.get("id")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(source, f"{where}.id", "expected an agent id or an id pattern (drone_*)")
    unnamed = None if _PATTERN_CHARS.search(pattern) else agent_id_error(pattern)
    if unnamed:
        raise ConfigError(source, f"{where}.id", unnamed)
    name = robot.get("class", DEFAULT_CLASS)
    if name not in classes:
        raise ConfigError(source, f"{where}.class", f"unknown class {name!r} (known: {', '.join(sorted(classes))})")
    return FleetEntry(pattern, _types(robot.get("types"), source, f"{where}.types"), classes[name],
                      _quotas(robot, defaults, source, where + "."))


def _types(raw: object, source: str, where: str) -> frozenset[str] | None:
    types = [raw] if isinstance(raw, str) else raw
    if not isinstance(types, list) or not types or not all(isinstance(t, str) and t for t in types):
        raise ConfigError(source, where, "expected a robot type or a list of them (\"*\": any)")
    return None if "*" in types else frozenset(types)


def _quotas(raw: dict, base: Quotas, source: str, prefix: str) -> Quotas:
    given: dict[str, Any] = {}
    for key, low, kind in (("in_flight", 1, int), ("burst", 1, int), ("max_new_tokens", 0, int)):
        if key in raw:
            value = raw[key]
            if not isinstance(value, kind) or isinstance(value, bool) or value < low:
                raise ConfigError(source, prefix + key, f"expected an integer >= {low}, got {value!r}")
            given[key] = value
    if "rate" in raw:
        given["rate"] = _number(raw, "rate", source, prefix)
        if given["rate"] <= 0:
            raise ConfigError(source, prefix + "rate", "requests per second must be > 0")
    if prefix == "defaults.":
        _no_unknown(raw, QUOTA_KEYS, source, prefix)
    return replace(base, **given)


def _number(raw: dict, key: str, source: str, prefix: str) -> float:
    value = raw.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or abs(value) == float("inf"):
        raise ConfigError(source, prefix + key, f"expected a finite number, got {value!r}")
    return float(value)


def _mapping(raw: object, source: str, where: str) -> dict:
    if not isinstance(raw, dict):
        raise ConfigError(source, where, "expected a mapping")
    return raw


def _no_unknown(data: dict, known: tuple[str, ...], source: str, prefix: str) -> None:
    for key in data:
        if key not in known:
            raise ConfigError(source, prefix + str(key), f"unknown field (known: {', '.join(known)})")
