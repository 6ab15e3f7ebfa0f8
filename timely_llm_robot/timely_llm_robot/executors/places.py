"""A robot's named places: the poses its plans' ``go_to(place)`` calls drive to.

A places file is YAML, one entry per place: the frame the pose is in, its position (metres) and its heading
(``yaw``, radians, counter-clockwise from the frame's x axis)::

    kitchen: {frame: map, x: 3.2, y: -1.5, yaw: 1.57}
    dock:    {frame: map, x: 0.0, y: 0.0, yaw: 0.0}

Place names are what the plans say (lowercase words joined by ``_``); a malformed file is refused with a
:class:`PlacesError` of one line naming the file, the place and the field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

FIELDS = ("frame", "x", "y", "yaw")
PLACE_NAME = re.compile(r"[A-Za-z0-9_]+\Z")


class PlacesError(ValueError):
    """A places file that cannot be used, said in one line."""


@dataclass(frozen=True)
class Place:
    frame: str
    x: float
    y: float
    yaw: float
    """Radians."""

    def quaternion(self) -> tuple[float, float, float, float]:
        """The heading as a unit quaternion (x, y, z, w): a rotation by ``yaw`` about the z axis."""
        return 0.0, 0.0, math.sin(self.yaw / 2.0), math.cos(self.yaw / 2.0)


def load_places(path: str | Path) -> dict[str, Place]:
    """The places in ``path``; PlacesError (one line) if it cannot be read or an entry is malformed."""
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise PlacesError(f"places file {source}: cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise PlacesError(f"places file {source}: not YAML{where}: {problem}") from None
    return parse_places(data, source)


def parse_places(data: object, source: str = "places") -> dict[str, Place]:
    """Places from a YAML document already read (``source`` names it in errors)."""
    if not isinstance(data, dict) or not data:
        raise PlacesError(f"places file {source}: expected a mapping of place names to "
                          f"{{frame, x, y, yaw}}, got {type(data).__name__}")
    return {_place_name(name, source): _place(entry, f"places file {source}: {name}") for name, entry in data.items()}


def _place_name(name: object, source: str) -> str:
    if not isinstance(name, str) or not PLACE_NAME.match(name):
        raise PlacesError(f"places file {source}: place name {name!r} is not a word of letters, digits and '_'")
    return name


def _place(entry: object, where: str) -> Place:
    if not isinstance(entry, dict):
        raise PlacesError(f"{where}: expected a mapping {{frame, x, y, yaw}}, got {entry!r}")
    unknown = sorted(str(key) for key in entry if key not in FIELDS)
    if unknown:
        raise PlacesError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    missing = [key for key in FIELDS if key not in entry]
    if missing:
        raise PlacesError(f"{where}: missing {missing[0]!r} (fields: {', '.join(FIELDS)})")
    frame = entry["frame"]
    if not isinstance(frame, str) or not frame.strip():
        raise PlacesError(f"{where}.frame: expected a frame name (e.g. map), got {frame!r}")
    return Place(frame, *(_number(entry[key], f"{where}.{key}") for key in ("x", "y", "yaw")))


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PlacesError(f"{where}: expected a finite number, got {value!r}")
    return float(value)
