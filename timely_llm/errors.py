"""Errors shared by every layer."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A configuration, workload, trace or skill-model file is malformed, or a command-line option is bad."""

    def __init__(self, source: str, field: str | None, message: str) -> None:
        """``source: field: message``; ``source: message`` without a field (a whole file, a command-line option)."""
        super().__init__(f"{source}: {message}" if field is None else f"{source}: {field}: {message}")
        self.source = source
        self.field = field


class RunIncomplete(RuntimeError):
    """A real-time run gave up on requests that had not ended in the time it allows after the last arrival."""


class RequestRejected(ValueError):
    """A plan request is malformed; nothing was queued."""


def read_mapping(path: str | Path) -> dict:
    """Parse a YAML or JSON file (by suffix) that must hold a mapping; ConfigError otherwise."""
    source = str(path)
    try:
        text = Path(path).read_text()
        data = json.loads(text) if Path(path).suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(source, None, f"cannot read: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(source, None, "expected a mapping")
    return data
