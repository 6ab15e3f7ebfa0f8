"""Scheduling overhead vs queue length (Table 5 analog).

One scheduling decision is what the server does before every fetch: re-evaluate the
PUD priority (Eq. 4) of every queued generation at the current time and take the best,
i.e. ``GenerationQueue.best(now)``. The queue holds a realistic mix of initial and
suspended generations of urgent and normal drone and arm requests. With TimeBill
(``timebill``) each decision also recomputes every row's G(s) from its terms.

    python -m timely_llm.cli sched-overhead [--sizes 1 8 10000] [--repeat 200] [--features timebill]
"""

from __future__ import annotations

import random
import statistics
import time

from timely_llm.core.estimator import ExecutionTimeEstimator, SegmentTimes
from timely_llm.core.priority import PUD
from timely_llm.core.queue import GenerationQueue
from timely_llm.core.request import Request, Segment
from timely_llm.core.tuf import NORMAL_TUF, URGENT_TUF
from timely_llm.engines.hardware import load_profile
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.plan.skills import SkillModel

NETWORK_LATENCY = 0.008
NOW = 100.0
URGENT_SHARE = 0.3
LATER_SEGMENT_SHARE = 0.5
TIMEBILL_PROFILE = "rtx4090-llama3-8b"


def measure(sizes: list[int], repeat: int, seed: int = 0, timebill: bool = False) -> list[tuple[int, float]]:
    """Median seconds per decision for each queue length in ``sizes``."""
    if repeat < 1 or any(n < 1 for n in sizes):
        raise ValueError("sizes and repeat must be >= 1")
    skills = load_skill_models()
    return [(n, _time_decisions(build_queue(n, skills, seed, timebill), repeat)) for n in sizes]


def build_queue(size: int, skills: dict[str, SkillModel], seed: int = 0, timebill: bool = False) -> GenerationQueue:
    """A PUD-ordered queue of ``size`` generations, all waiting around time ``NOW`` (with ``timebill``,
    their G(s) from TimeBill's estimator at a batch of 8)."""
    rng = random.Random(seed)
    robots = [skills[name] for name in ("tello", "arm") if name in skills] or list(skills.values())
    queue = GenerationQueue(PUD(NETWORK_LATENCY))
    if timebill:
        times = SegmentTimes(ExecutionTimeEstimator.from_profile(load_profile(TIMEBILL_PROFILE)), skills, 16)
        times.join([800] * 7, max_batch=None)
        queue.gen_terms, queue.token_time = times.queue_terms, times.token_time()
    for i in range(size):
        queue.push(_request(f"q{i:05d}", rng.choice(robots), rng))
    return queue


def _request(rid: str, robot: SkillModel, rng: random.Random) -> Request:
    tuf = URGENT_TUF if rng.random() < URGENT_SHARE else NORMAL_TUF
    arrival = NOW - rng.uniform(0.0, 2.0)
    request = Request(rid, rid, robot, tuf, arrival, [1] * 800, robot.segment_max_tokens * 8,
                      category="urgent" if tuf is URGENT_TUF else "normal")
    if rng.random() < LATER_SEGMENT_SHARE:
        gen_end = arrival + robot.segment_generation_time
        for k in range(rng.randint(1, 3)):
            request.segments.append(Segment(k, "", [], gen_end, gen_end, est_exec_time=1.0))
        request.prev_end_est = NOW + rng.uniform(-0.5, 3.0)
    return request


def _time_decisions(queue: GenerationQueue, repeat: int) -> float:
    queue.best(NOW)  # warm-up
    times = []
    for i in range(repeat):
        now = NOW + i * 1e-3
        start = time.perf_counter()
        queue.best(now)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
