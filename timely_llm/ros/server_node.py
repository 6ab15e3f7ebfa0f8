"""What the node's parts (goal desk, robots' reports, status, live parameters, engine loader) use of the node:
rclpy's LifecycleNode and the node's own state. ``TimelyLlmNode`` (``timely_llm.ros.node``) is the one such node;
the parts are typed against this base so that they need not import the node that builds them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rclpy.callback_groups import CallbackGroup
from rclpy.lifecycle import LifecycleNode
from rclpy.parameter import Parameter

from timely_llm.server import Server


class ServerNode(LifecycleNode):
    """The node's state its parts read; ``TimelyLlmNode`` sets it."""

    server: Server | None
    """The configured server (None while unconfigured)."""
    phase: str
    """What the node is doing or last failed at, for the diagnostics."""
    configure_error: str
    """Why the last configure failed ("" if it did not)."""
    goals_group: CallbackGroup
    """Goal, cancel, result requests, outbox: one at a time."""
    defaults: dict[str, object]
    """Each parameter's default (``parameter_defaults``)."""
    _state: str
    """The lifecycle state, kept by the node's transition callbacks."""

    def param(self, name: str) -> Any:
        """The parameter's value."""
        return self.get_parameter(name).value

    def parameters_by_prefix(self, prefix: str) -> dict[str, Parameter]:
        """rclpy's ``get_parameters_by_prefix``, whose annotation says parameter values where it returns Parameters."""
        return self.get_parameters_by_prefix(prefix)  # type: ignore[return-value]

    @property
    def lifecycle_state(self) -> str:
        """The lifecycle state's label: unconfigured, configuring, inactive, active, ..."""
        return self._state


class Guard(Protocol):
    """The node's ``_guarded``, which its parts wrap their callbacks in: ``callback`` that logs an exception instead
    of raising it into the executor, and returns ``on_error`` then."""

    def __call__(self, callback: Callable, on_error: object = None) -> Callable: ...
