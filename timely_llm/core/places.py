"""Where each live request is, and the transitions between those places.

A live request is in the queue (WAITING, SUSPENDED, and PARKED, which is queued yet still in the engine), in
the running batch, parked at a segment boundary, or blocked on the value of a blocking call (the paper's waiting
queue, §8). Each transition changes a request's status and its place together: one method per transition of the
state machine drawn in ``timely_llm.core.request``, and ``remove`` the one way out. A transition that needs the
engine to act records the engine call; the scheduler hands the calls to the server, in order.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass

from timely_llm.core.priority import PriorityPolicy
from timely_llm.core.queue import GenerationQueue
from timely_llm.core.request import Request, Status


class Call(enum.Enum):
    """An engine call the server makes for a scheduling decision."""

    START = "start"  # a generation the engine does not hold yet
    RESUME = "resume"  # a suspended generation the engine holds
    SUSPEND = "suspend"


@dataclass(frozen=True)
class PlaceCounts:
    """How many live requests are where: what the status topic, ``/diagnostics`` and benchmarks read."""

    queued: int
    """In the queue: WAITING, SUSPENDED and PARKED."""
    running: int
    suspended: int
    """PARKED or SUSPENDED: between two segments, in the engine or its cache."""
    blocked: int
    """Waiting for the value of a blocking call."""


class RequestPlaces:
    """The one owner of where each live request is. Outside ``core/`` and the scheduler, read it through
    ``counts`` (and ``queued``, for a per-step reading), never through its dicts."""

    def __init__(self, queue: GenerationQueue, counters: Counter[str]) -> None:
        self.queue = queue
        self.counters = counters
        self.running: dict[str, Request] = {}
        self.parked: dict[str, Request] = {}
        """Generations at a segment boundary: queued, yet still in the engine until the next scheduling point."""
        self.blocked: dict[str, Request] = {}
        """Generations waiting for the value of the blocking call their last segment ended with."""
        self.evicted: set[str] = set()
        """Generations suspended mid-segment whose resume prefill is still to count as recomputed."""
        self.calls: list[tuple[Call, Request]] = []
        """The engine calls the transitions made since the server last took them (``take_calls``), in order."""
        self._blocking: dict[str, Request] = {}
        """Blocked since the last scheduling point: still to suspend in the engine."""

    def queued(self) -> int:
        """How many requests are queued (cheap: for readings every step)."""
        return len(self.queue)

    def counts(self) -> PlaceCounts:
        suspended = len(self.parked) + sum(r.status is Status.SUSPENDED for r in self.queue)
        return PlaceCounts(len(self.queue), len(self.running), suspended, len(self.blocked))

    def reorder(self, order: PriorityPolicy) -> None:
        """Order the queue by ``order`` from the next fetch on (a live policy switch within a serving mode)."""
        self.queue.policy = order

    def take_calls(self) -> list[tuple[Call, Request]]:
        calls, self.calls = self.calls, []
        return calls

    def add(self, request: Request) -> None:
        """Submitted: WAITING in the queue."""
        self.queue.push(request)

    def start(self, request: Request, now: float) -> None:
        """WAITING or SUSPENDED -> RUNNING: out of the queue, (re)started in the engine."""
        came_from = request.advance(Status.RUNNING)
        self.queue.remove(request.id)
        self.running[request.id] = request
        if request.seg_gen_start is None:
            request.seg_gen_start = now
        self.calls.append((Call.RESUME if came_from is Status.SUSPENDED else Call.START, request))

    def park(self, request: Request) -> None:
        """RUNNING -> PARKED: a segment was dispatched; queued again, still in the engine."""
        request.advance(Status.PARKED)
        del self.running[request.id]
        self.parked[request.id] = request
        self.queue.push(request)

    def keep_running(self, request: Request) -> None:
        """PARKED -> RUNNING: picked at the next scheduling point, it goes on where it is."""
        request.advance(Status.RUNNING)
        self.queue.remove(request.id)
        del self.parked[request.id]
        self.running[request.id] = request

    def suspend(self, request: Request) -> None:
        """PARKED -> SUSPENDED: passed over; the engine drops it from the batch, keeping its context cached."""
        request.advance(Status.SUSPENDED)
        del self.parked[request.id]
        self.calls.append((Call.SUSPEND, request))
        request.seg_gen_start = None
        self.queue.update(request)  # with TimeBill its G(s) now includes the resume prefill

    def evict(self, request: Request, counter: str) -> None:
        """RUNNING -> SUSPENDED mid-segment: Amin frees KV memory, or the generation yields its batch slot to a
        more urgent one; queued again, its token ids kept (the segment goes on from there when it is resumed).
        ``counter``: the event counted."""
        request.advance(Status.SUSPENDED)
        del self.running[request.id]
        self.calls.append((Call.SUSPEND, request))
        self.queue.push(request)
        self.counters[counter] += 1
        self.evicted.add(request.id)

    def block(self, request: Request) -> None:
        """RUNNING -> BLOCKED: a segment ending in a blocking call was dispatched; out of the queue, suspended
        at the next scheduling point (before any engine step: nothing past the call is generated)."""
        request.advance(Status.BLOCKED)
        del self.running[request.id]
        self.blocked[request.id] = request
        self._blocking[request.id] = request

    def suspend_blocked(self) -> None:
        """The engine suspends the generations blocked since the last scheduling point."""
        self.calls.extend((Call.SUSPEND, request) for request in self._blocking.values())
        self._blocking.clear()

    def observed(self, request: Request) -> None:
        """BLOCKED -> SUSPENDED: its observation was appended; queued again for its next segment."""
        request.advance(Status.SUSPENDED)
        del self.blocked[request.id]
        request.seg_gen_start = None
        self.queue.push(request)

    def generated(self, request: Request) -> None:
        """RUNNING -> GENERATED: the plan is complete; out of the running set (the server releases it from the
        engine)."""
        request.advance(Status.GENERATED)
        del self.running[request.id]

    def remove(self, request: Request, status: Status) -> Status:
        """Any live status -> SUCCEEDED, ABORTED or CANCELED: out of every place; returns the status left."""
        came_from = request.advance(status)
        self.evicted.discard(request.id)
        if came_from.queued:
            self.queue.remove(request.id)
        if came_from is Status.RUNNING:
            del self.running[request.id]
        elif came_from is Status.PARKED:
            del self.parked[request.id]
        elif came_from is Status.BLOCKED:
            del self.blocked[request.id]
            self._blocking.pop(request.id, None)  # not suspended yet: the engine releases it running
        return came_from
