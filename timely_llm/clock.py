"""Clocks for the server loop: a virtual one for simulation, the wall clock for serving."""

from __future__ import annotations

import threading
import time


class VirtualClock:
    """Simulation time: jumps instead of waiting."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def sleep_until(self, t: float) -> None:
        self._now = max(self._now, t)

    idle_until = sleep_until

    def wake(self) -> None:
        """Nothing waits on a virtual clock."""


class WallClock:
    """Seconds since construction. ``sleep_until`` waits out a modelled step;
    ``idle_until`` waits for the next event but returns early on ``wake``."""

    def __init__(self) -> None:
        self._origin = time.monotonic()
        self._wake = threading.Event()

    def now(self) -> float:
        return time.monotonic() - self._origin

    def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    def idle_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            self._wake.wait(delay)
        self._wake.clear()

    def wake(self) -> None:
        self._wake.set()
