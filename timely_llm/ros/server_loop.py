"""The server loop: the thread that alone calls the Server, applying the inbox's commands between engine steps."""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable

from timely_llm.clock import WallClock
from timely_llm.core.policies import ServingPolicy
from timely_llm.server import Server

IDLE_WAIT_S = 0.05

Command = Callable[[Server], None]
"""Something the server loop applies to the Server between engine steps."""


class ServerLoop:
    """The inbox (any thread appends, the loop pops) and the loop's thread, one per configured server."""

    def __init__(self, clock: WallClock, log: object) -> None:
        self.clock = clock
        self._log = log  # the node's logger
        self._inbox: collections.deque[Command] = collections.deque()
        self._thread: threading.Thread | None = None
        self._running = threading.Event()
        self.last_step_s = float("nan")

    def send(self, command: Command) -> None:
        """Queue ``command`` for the loop (any thread) and wake it."""
        self._inbox.append(command)
        self.clock.wake()

    def start(self, server: Server) -> None:
        server.step = self._timed(server.step)
        self._running = running = threading.Event()
        running.set()
        self._thread = threading.Thread(target=self._serve, args=(server, running), name="timely_llm_server_loop",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> threading.Thread | None:
        """Ask the loop to end (it applies what is left in its inbox first); its thread, to join."""
        self._running.clear()
        self.clock.wake()
        return self._thread

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _serve(self, server: Server, running: threading.Event) -> None:
        while running.is_set():
            try:
                self._apply_inbox(server)
                if not server.step():
                    self.clock.idle_until(self.clock.now() + IDLE_WAIT_S)
            except Exception as exc:  # noqa: BLE001 - a bug in one step must not stop serving everyone
                self._log.error(f"server step failed: {exc!r}")
                self.clock.idle_until(self.clock.now() + IDLE_WAIT_S)
        self._apply_inbox(server)  # no longer serving: goals still waiting to be submitted end aborted

    def _apply_inbox(self, server: Server) -> None:
        while self._inbox:
            command = self._inbox.popleft()
            try:
                command(server)
            except Exception as exc:  # noqa: BLE001 - one command's failure must not hold up the rest
                self._log.error(f"server command failed: {exc!r}")

    def _timed(self, step: Callable[[], bool]) -> Callable[[], bool]:
        """``server.step`` timing each engine step it runs, for the diagnostics."""
        @functools.wraps(step)
        def timed() -> bool:
            began = time.monotonic()
            stepped = step()
            if stepped:
                self.last_step_s = time.monotonic() - began
            return stepped
        return timed


def use_policy(policy: ServingPolicy, server: Server) -> None:
    """Another policy of the same serving mode and engine scheduling: only the queue's order differs, so switching
    between engine steps is safe for the requests in flight (LiveParameters refuses the others)."""
    server.policy = policy
    server.queue.policy = policy.queue_order(server.network_latency)


def set_max_new_tokens(value: int, server: Server) -> None:
    server.default_max_new_tokens = value


def executed(request_id: str, index: int, exec_start: float, exec_end: float, server: Server) -> None:
    server.segment_done(request_id, index, exec_start, exec_end)


def abort(request_id: str, reason: str, server: Server) -> None:
    server.abort(request_id, reason)


def cancel(request_id: str, server: Server) -> None:
    server.cancel(request_id)
