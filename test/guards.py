"""Loop guards for tests: a loop that waits for something fails after a bound instead of hanging."""

from __future__ import annotations

from collections.abc import Iterator


def bounded(limit: int = 10_000) -> Iterator[int]:
    """Call ``next()`` on it once per iteration; the call after ``limit`` fails the test."""
    yield from range(limit)
    raise AssertionError(f"still waiting after {limit} iterations")
