"""Warnings about clients' bad messages, at most one line per client per period and at most BUDGET_LINES lines per
period in all: a client sending nothing but bad goals, reports or requests must not flood ``/rosout``, and neither
may one that names a new client (agent id) in every message: the claimed id keys the per-client throttle, the
budget bounds the sum whatever ids it rotates."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

PERIOD_S = 10.0
MAX_CLIENTS = 1024
"""Clients whose period is tracked; past that the least recently heard is forgotten (its next line goes out)."""
BUDGET_LINES = 20
"""Lines one log writes per period, whichever clients they are about; past that they are counted, and the count
goes out (one line) with the first line of the next period."""


class ThrottledLog:
    """``warn(client, line)``: the line goes out if ``client`` had none in the last ``period_s``, with the count of
    those suppressed since its last; the others are counted. ``client`` is whatever names the sender: an agent
    id as the message claims it (nothing better is known), or the topic it came on."""

    def __init__(self, sink: Callable[[str], None], period_s: float | None = None,
                 now: Callable[[], float] = time.monotonic, budget: int | None = None) -> None:
        """``period_s`` None: PERIOD_S as it is now; ``budget`` None: BUDGET_LINES as it is now."""
        self._sink, self._now = sink, now
        self._period_s = PERIOD_S if period_s is None else period_s
        self._budget = BUDGET_LINES if budget is None else budget
        self._clients: OrderedDict[str, tuple[float, int]] = OrderedDict()  # client -> (last line at, suppressed)
        self._window: tuple[float, int, int] = (-float("inf"), 0, 0)  # (period began, lines out, lines over budget)
        self._lock = threading.Lock()  # the executor's callbacks and the topic pump's

    def warn(self, client: str, line: str) -> None:
        now = self._now()
        with self._lock:
            last, suppressed = self._clients.pop(client, (None, 0))
            if last is not None and now - last < self._period_s:
                self._clients[client] = (last, suppressed + 1)
                return
            over = self._over_budget(now)
            if over is None:
                if last is not None:
                    self._clients[client] = (last, suppressed + 1)
                return
            self._clients[client] = (now, 0)
            if len(self._clients) > MAX_CLIENTS:
                self._clients.popitem(last=False)
        if over:
            self._sink(f"{over} more lines about clients' messages suppressed in the last {self._period_s:g} s "
                       f"(at most {self._budget} per {self._period_s:g} s)")
        self._sink(f"{line} ({suppressed} more from {client!r} suppressed since its last line)" if suppressed else line)

    def _over_budget(self, now: float) -> int | None:
        """None if the budget of this period is spent (the line counted); else the lines suppressed in the last
        period, to say before this line."""
        began, lines, over = self._window
        if now - began >= self._period_s:
            self._window = (now, 1, 0)
            return over
        if lines >= self._budget:
            self._window = (began, lines, over + 1)
            return None
        self._window = (began, lines + 1, over)
        return 0
