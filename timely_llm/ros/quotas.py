"""Per-agent quotas (the fleet file's, or the defaults): requests in flight, and a token bucket of requests per
second; checked when a goal or task request has passed its checks, just before it is accepted."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from timely_llm.ros.fleet_file import Quotas

MAX_BUCKETS = 4096
"""Agents whose bucket is kept; past that the least recently asking one's is forgotten (it starts full again)."""


class AgentQuotas:
    """``refusal(agent, quotas)``: why the agent's next request is over its quota (and nothing taken), or None
    (and one token of its rate taken). ``in_flight(agent)``: its requests in flight now."""

    def __init__(self, in_flight: Callable[[str], int], now: Callable[[], float] = time.monotonic) -> None:
        self._in_flight, self._now = in_flight, now
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # agent -> (tokens, at)
        self._lock = threading.Lock()

    def refusal(self, agent: str, quotas: Quotas) -> str | None:
        held = self._in_flight(agent)
        if held >= quotas.in_flight:
            return f"over quota: {held} requests of {agent!r} in flight (its in_flight quota is {quotas.in_flight})"
        now = self._now()
        with self._lock:
            tokens, at = self._buckets.pop(agent, (float(quotas.burst), now))
            tokens = min(float(quotas.burst), tokens + (now - at) * quotas.rate)
            refused = tokens < 1.0
            self._buckets[agent] = (tokens if refused else tokens - 1.0, now)
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        if refused:
            return (f"over quota: {agent!r} asks faster than its rate of {quotas.rate:g} requests/s "
                    f"(burst {quotas.burst})")
        return None
