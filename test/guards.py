"""Loop guards for tests: a loop that waits for something fails after a bound instead of hanging."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator


def bounded(limit: int = 10_000) -> Iterator[int]:
    """Call ``next()`` on it once per iteration; the call after ``limit`` fails the test."""
    yield from range(limit)
    raise AssertionError(f"still waiting after {limit} iterations")


def wait_until(condition: Callable[[], object], timeout_s: float,
               what: str | Callable[[], object] = "condition") -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout_s`` seconds, saying ``what`` (called then,
    if callable: a node's log as it is at the failure)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what() if callable(what) else what}")
        time.sleep(0.01)
