"""ALA's throughput model for batch control: decode throughput as a saturating function of the batch size.

The ALA paper (Ray et al., "Statistical Modeling and Uncertainty Estimation of LLM Inference
Systems", Algorithm 1) models throughput at batch size bb as

    thpt(bb) = c - a * exp(-b * bb)        tokens/s; c the saturation throughput

and fits a, b, c by least squares to the batch sizes benchmarked (Algorithm 2). The batch
controller reads a decode step's time off the curve, step(bb) = bb / thpt(bb), for batch
sizes it has not run, and the curve's knee tells it where adding generations stops paying.

Two sources feed the curve: a prior derived from the hardware profile's step model at a
typical context, and the decode steps the server measures (simulator or real vLLM), fitted
online. Each carries the paper's confidence for an unseen configuration (Algorithm 8):
``1 / (1 + d_min)``, d_min the distance from the batch size asked about to the nearest one the
source has seen, here in doublings (|log2(bb / m)|). Where neither source is confident the
controller falls back to its conservative rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

CONFIDENT = 0.5
"""Confidence at or above which a curve's prediction is used: within one doubling of a batch size seen."""
KNEE_SPEED = 0.5
"""The knee: the largest batch whose generations each still decode at half their speed alone or more
(step(bb) <= 2 step(1)). See ``ThroughputCurve.knee``."""
MIN_SAMPLES = 3
"""Decode steps a batch size needs before the online fit counts it as seen."""
REFIT_EVERY = 16
"""Decode steps between online refits (a fit costs well under a millisecond)."""
CAP_BOUND_SPEED = 0.125
"""A batch cap bounds the batch where each generation at the cap still decodes at 1/8 of its speed alone or
more (a knee at this speed reaches the cap); see ``BatchController``."""
PRIOR_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Batch sizes the profile prior is derived on (and so, for the confidence, has seen)."""
TYPICAL_CONTEXT = 1024
"""Context tokens per generation at which the profile prior is derived (robot prompts are ~900)."""
B_RANGE = (1e-3, 10.0)
"""Rate parameters b searched (per generation): saturation after ~1,000 generations to after one."""
GRID_POINTS = 33
ZOOMS = 4


@dataclass(frozen=True)
class ThroughputCurve:
    """thpt(bb) = c - a * exp(-b * bb) tokens/s (a >= 0, b > 0)."""

    a: float
    b: float
    c: float

    def thpt(self, batch: float) -> float:
        return self.c - self.a * math.exp(-self.b * batch)

    def step_time(self, batch: int) -> float:
        """Seconds per decode step with ``batch`` generations (each gets one token a step)."""
        rate = self.thpt(batch)
        return batch / rate if rate > 0 else math.inf

    def knee(self, limit: int, speed: float = KNEE_SPEED, servers: int = 1) -> int:
        """Largest batch size in [1, ``limit``] whose per-generation speed thpt(bb)/bb is at least ``speed``
        times the speed alone: thpt(1), or over ``servers`` servers sharing the batch, thpt(servers)/servers
        (one generation on each).

        Throughput keeps rising past it, but every generation already running, the protected
        urgent ones included, decodes more than 1/``speed`` times slower than alone: the
        newcomer's gain is paid by their slower steps.
        """
        alone = self.thpt(servers) / servers
        if alone <= 0:
            return 1
        for batch in range(servers + 1, limit + 1):
            if self.thpt(batch) / batch < speed * alone:
                return batch - 1
        return limit


def fit_curve(batch_sizes: Iterable[float], throughputs: Iterable[float],
              weights: Iterable[float] | None = None) -> ThroughputCurve | None:
    """Least-squares fit of thpt = c - a * exp(-b * bb) in relative error; None with fewer than three sizes.

    Each point's squared error is divided by its throughput squared (times its weight, e.g. the
    steps measured there), so small batches, whose steps the urgent generations live by, count
    as much as large ones. For a fixed b the model is linear in (c, a): the fit solves that 2x2
    problem in closed form over a log-spaced grid of b at once, then zooms in around the best
    grid point (ZOOMS rounds: b to ~1e-4 relative). a is kept >= 0 (throughput does not fall as the
    batch grows).
    """
    x = np.asarray(list(batch_sizes), dtype=float)
    y = np.asarray(list(throughputs), dtype=float)
    w = np.ones_like(x) if weights is None else np.asarray(list(weights), dtype=float)
    if len(np.unique(x)) < 3 or (y <= 0).any():
        return None
    w = w / (y * y)
    lo, hi = math.log(B_RANGE[0]), math.log(B_RANGE[1])
    for _ in range(ZOOMS):  # each round: the best of a log-spaced grid, then the grid between its neighbours
        grid = np.exp(np.linspace(lo, hi, GRID_POINTS))
        sse, a, c = _solve(grid, x, y, w)
        best = int(np.argmin(sse))
        lo, hi = math.log(grid[max(best - 1, 0)]), math.log(grid[min(best + 1, GRID_POINTS - 1)])
    return ThroughputCurve(float(a[best]), float(grid[best]), float(c[best]))


def _solve(bs: np.ndarray, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ...]:
    """For each b in ``bs``: (weighted SSE, a, c) of the best fit with that b, a >= 0."""
    e = np.exp(-np.outer(bs, x))  # len(bs) x len(x)
    sw, sy, syy = w.sum(), (w * y).sum(), (w * y * y).sum()
    se, see, sey = e @ w, (e * e) @ w, e @ (w * y)
    det = sw * see - se * se
    safe = np.where(np.abs(det) > 1e-12, det, 1.0)
    c = (see * sy - se * sey) / safe
    slope = (sw * sey - se * sy) / safe  # y = c + slope * e, so a = -slope
    flat = (slope > 0) | (np.abs(det) <= 1e-12)  # throughput would fall with the batch: fit a constant
    c = np.where(flat, sy / sw, c)
    slope = np.where(flat, 0.0, slope)
    sse = syy - 2 * c * sy - 2 * slope * sey + c * c * sw + 2 * c * slope * se + slope * slope * see
    return sse, -slope, c


def confidence(batch: int, seen: Iterable[int]) -> float:
    """ALA's confidence for an unseen configuration, 1 / (1 + d_min), d_min in doublings to the nearest size seen."""
    distances = [abs(math.log2(batch / m)) for m in seen if m > 0]
    return 1.0 / (1.0 + min(distances)) if distances and batch > 0 else 0.0


def derive_curve(step_time: Callable[[int], float], sizes: Iterable[int] = PRIOR_SIZES) -> ThroughputCurve | None:
    """The curve through a step-time model's throughput at ``sizes`` (e.g. a hardware profile's)."""
    sizes = list(sizes)
    return fit_curve(sizes, [b / step_time(b) for b in sizes])


class ThroughputModel:
    """The fitted curve the batch controller asks: a prior, refined online from measured decode steps."""

    def __init__(self, prior: ThroughputCurve | None = None, prior_sizes: Iterable[int] = PRIOR_SIZES,
                 servers: int = 1) -> None:
        self.prior = prior
        self.servers = servers
        """Servers the batch is spread over (``ThroughputCurve.knee``)."""
        self._prior_sizes = tuple(prior_sizes) if prior is not None else ()
        self._steps: dict[int, list[float]] = {}  # batch size -> [count, mean step seconds]
        self._since_fit = 0
        self._online: ThroughputCurve | None = None
        self._seen: tuple[int, ...] = ()
        self._knee: dict[tuple[int, float], int | None] = {}
        self._step: dict[int, float | None] = {}  # predictions since the last refit

    def record(self, batch: int, duration: float) -> None:
        """One decode step of ``batch`` generations that took ``duration`` seconds."""
        if batch <= 0 or duration <= 0:
            return
        cell = self._steps.setdefault(batch, [0.0, 0.0])
        cell[0] += 1
        cell[1] += (duration - cell[1]) / min(cell[0], 32.0)  # mean of the recent ~32 steps at this size
        self._since_fit += 1

    @property
    def online(self) -> ThroughputCurve | None:
        """The curve fitted to the measured steps (refitted every REFIT_EVERY steps)."""
        self._refresh()
        return self._online

    def _refresh(self) -> None:
        if self._since_fit >= REFIT_EVERY:
            self._refit()

    def _refit(self) -> None:
        self._since_fit = 0
        seen = sorted(b for b, (n, _) in self._steps.items() if n >= MIN_SAMPLES)
        fitted = fit_curve(seen, [b / self._steps[b][1] for b in seen], [min(self._steps[b][0], 32.0) for b in seen])
        if fitted is not None:
            self._online, self._seen = fitted, tuple(seen)
            self._knee.clear()
            self._step.clear()

    def source(self, batch: int) -> tuple[ThroughputCurve, float] | None:
        """The curve to read at ``batch`` and its confidence there: online first, then the prior; None if
        neither is confident."""
        online = self.online
        if online is not None:
            trust = confidence(batch, self._seen)
            if trust >= CONFIDENT:
                return online, trust
        if self.prior is not None:
            trust = confidence(batch, self._prior_sizes)
            if trust >= CONFIDENT:
                return self.prior, trust
        return None

    def step_time(self, batch: int) -> float | None:
        """Predicted seconds per decode step at ``batch``; None where no curve is confident."""
        self._refresh()  # before reading the cache, which a refit clears
        if batch not in self._step:
            found = self.source(batch)
            self._step[batch] = None if found is None else found[0].step_time(batch)
        return self._step[batch]

    def knee(self, limit: int, speed: float = KNEE_SPEED) -> int | None:
        """The batch size past which growth stops paying (``ThroughputCurve.knee``), from a curve confident
        there; None when none is."""
        self._refresh()
        key = (limit, speed)
        if key not in self._knee:
            self._knee[key] = None
            for curve in (self._online, self.prior):
                if curve is None:
                    continue
                knee = curve.knee(limit, speed, self.servers)
                found = self.source(knee)
                if found is not None and found[0] is curve:
                    self._knee[key] = knee
                    break
        return self._knee[key]
