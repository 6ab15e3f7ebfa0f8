"""Errors shared by every layer."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration, workload, trace or skill-model file is malformed."""

    def __init__(self, source: str, field: str, message: str) -> None:
        super().__init__(f"{source}: {field}: {message}")
        self.source = source
        self.field = field


class RequestRejected(ValueError):
    """A plan request is malformed; nothing was queued."""
