"""The server loop: the thread that alone calls the Server, applying the inbox's commands between engine steps."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from timely_llm.clock import WallClock
from timely_llm.core.policies import ServingPolicy
from timely_llm.server import Server
from timely_llm.serving import Driver

Command = Callable[[Server], object]
"""Something the server loop applies to the Server between engine steps."""


class Log(Protocol):
    """Where the loop's failures go: the node's logger."""

    def error(self, message: str) -> object: ...


class ServerLoop:
    """The node's thread running the one server loop (``serving.Driver``) over a configured server: ROS callbacks
    send it commands (its thread-safe inbox), applied between engine steps, until the node stops it."""

    def __init__(self, clock: WallClock, log: Log) -> None:
        self.clock = clock
        self._log = log  # the node's logger
        self._driver = Driver(clock, on_error=self._failed)
        self._thread: threading.Thread | None = None
        self._running = threading.Event()
        self._server: Server | None = None

    @property
    def last_step_s(self) -> float:
        """How long the last engine step took (NaN before the first)."""
        return self._server.last_step_s if self._server is not None else float("nan")

    def send(self, command: Command) -> None:
        """Queue ``command`` for the loop (any thread) and wake it."""
        self._driver.send(command)

    def start(self, server: Server) -> None:
        self._server = server
        self._running = running = threading.Event()
        running.set()
        self._thread = threading.Thread(target=self._driver.run, args=(server, running),
                                        name="timely_llm_server_loop", daemon=True)
        self._thread.start()

    def stop(self) -> threading.Thread | None:
        """Ask the loop to end (it applies what is left in its inbox first); its thread, to join."""
        self._running.clear()
        self.clock.wake()
        return self._thread

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _failed(self, what: str, exc: Exception) -> None:
        self._log.error(f"server {'step' if what == 'step' else 'command'} failed: {exc!r}")


def use_policy(policy: ServingPolicy, server: Server) -> None:
    """Another policy of the same serving mode and engine scheduling: only the queue's order differs, so switching
    between engine steps is safe for the requests in flight (LiveParameters refuses the others)."""
    server.use_policy(policy)


def set_max_new_tokens(value: int, server: Server) -> None:
    server.default_max_new_tokens = value


def executed(request_id: str, index: int, exec_start: float, exec_end: float, server: Server) -> None:
    server.segment_done(request_id, index, exec_start, exec_end)


def abort(request_id: str, reason: str, server: Server) -> None:
    server.abort(request_id, reason)


def cancel(request_id: str, server: Server) -> None:
    server.cancel(request_id)
