"""Warnings about clients' bad messages, at most one line per client per period: a client sending nothing but bad
goals, reports or requests must not flood ``/rosout``."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

PERIOD_S = 10.0
MAX_CLIENTS = 1024
"""Clients whose period is tracked; past that the least recently heard is forgotten (its next line goes out)."""


class ThrottledLog:
    """``warn(client, line)``: the line goes out if ``client`` had none in the last ``period_s``, with the count of
    those suppressed since its last; the others are counted. ``client`` is whatever names the sender: an agent
    id as the message claims it (nothing better is known), or the topic it came on."""

    def __init__(self, sink: Callable[[str], None], period_s: float | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        """``period_s`` None: PERIOD_S as it is now."""
        self._sink, self._now = sink, now
        self._period_s = PERIOD_S if period_s is None else period_s
        self._clients: OrderedDict[str, tuple[float, int]] = OrderedDict()  # client -> (last line at, suppressed)
        self._lock = threading.Lock()  # the executor's callbacks and the topic pump's

    def warn(self, client: str, line: str) -> None:
        now = self._now()
        with self._lock:
            last, suppressed = self._clients.pop(client, (None, 0))
            if last is not None and now - last < self._period_s:
                self._clients[client] = (last, suppressed + 1)
                return
            self._clients[client] = (now, 0)
            if len(self._clients) > MAX_CLIENTS:
                self._clients.popitem(last=False)
        self._sink(f"{line} ({suppressed} more from {client!r} suppressed since its last line)" if suppressed else line)
