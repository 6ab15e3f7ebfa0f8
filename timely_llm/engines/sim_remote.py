"""The simulator of the remote path: the node driving ``vllm serve`` over HTTP (``engines/remote.py``).

Each server (a ``SimEngine`` that drops a suspended generation's KV to its prefix cache) steps on its own; the node
sees them through HTTP. A (re)start is a new request carrying the whole context: it joins its server's running set
``request_overhead`` seconds after the node sent it (the API server's parsing, grammar set-up and the network) and
prefills what the prefix cache misses (full blocks of the context before the last sampled token hit). A step's
tokens reach the node ``token_delay`` after the server's step ends. Suspend = the stream closed: the server drops
the request at its next step (the abort's own travel is not modelled). With several servers (the http section's
``servers``, identical) a new generation goes where its prompt's blocks are cached, near the least busy
(``remote_prefixes.choose_server``), and its resumes go back there, as the remote engine places them.

Time: the engine keeps its own model clock, the sum of the durations its steps returned, so the node's idle time
between steps (a virtual clock jumping to the next arrival) does not count. A server's step begins where its last
one ended, or, with nothing running there but requests in flight, when the first one lands; each ``step()`` runs
the server whose step begins first and returns when its tokens reach the node (never before the node's clock: with
several servers a step that ended while another's tokens travelled is delivered with them).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Collection
from dataclasses import dataclass, field

from timely_llm.engines.base import Engine, EngineRejected, GenerationSpec, KvView, StepOutput, Tokenizer
from timely_llm.engines.hardware import HardwareProfile
from timely_llm.engines.remote_prefixes import Candidate, choose_server
from timely_llm.engines.sim import SimEngine
from timely_llm.errors import ConfigError


@dataclass(frozen=True)
class _InFlight:
    spec: GenerationSpec
    lands_at: float
    """Model time at which the request joins the server's running set."""


@dataclass
class _Server:
    engine: SimEngine
    free_at: float = float("-inf")
    """Model time its last step ended."""
    in_flight: dict[str, _InFlight] = field(default_factory=dict)

    @property
    def load(self) -> int:
        return len(self.engine.running_ids()) + len(self.in_flight)

    def next_begin(self) -> float | None:
        """When its next step begins; None with nothing to do."""
        if self.engine.running_ids():
            return self.free_at
        if self.in_flight:
            return max(self.free_at, min(f.lands_at for f in self.in_flight.values()))
        return None

    def in_flight_blocks(self, leaving: Collection[str] = ()) -> int:
        """Blocks the requests in flight (but ``leaving``) take when they land."""
        return sum(self.engine.blocks_to_start(f.spec.prompt_ids + f.spec.output_ids)
                   for gen_id, f in self.in_flight.items() if gen_id not in leaving)


class RemoteSimEngine(Engine):
    suspends_in_place = False
    resumes_resubmit = True
    steps_are_iterations = False

    def __init__(self, profile: HardwareProfile, tokenizer: Tokenizer | None = None) -> None:
        if profile.http is None:
            raise ValueError(f"profile {profile.name} has no http section")
        self.profile = profile
        self._servers = [_Server(SimEngine(profile, tokenizer)) for _ in range(int(profile.http["servers"]))]
        self.server_count = len(self._servers)
        self.tokenizer = self._servers[0].engine.tokenizer
        self.block_size = self._servers[0].engine.block_size
        self.request_overhead = profile.http["request_overhead"]
        self.token_delay = profile.http["token_delay"]
        self.clock = 0.0
        """Model time at the node: the sum of the durations the steps returned."""
        self._placed: dict[str, _Server] = {}
        """Each generation's server, from its first start to its release (its resumes go back there)."""

    def start(self, spec: GenerationSpec) -> None:
        server = self._placed.get(spec.gen_id) or self._place(spec.prompt_ids)
        if spec.gen_id in server.in_flight or spec.gen_id in server.engine.running_ids():
            raise EngineRejected(f"{spec.gen_id} is already running")
        if spec.forced_ids is None:
            raise EngineRejected("the simulator replays recorded plans only: give the request a trace")
        self._placed[spec.gen_id] = server
        server.in_flight[spec.gen_id] = _InFlight(spec, self.clock + self.request_overhead)

    def suspend(self, gen_id: str) -> None:
        server = self._placed[gen_id]
        if server.in_flight.pop(gen_id, None) is None:  # else it never reached the server, which knows nothing of it
            server.engine.suspend(gen_id)

    def release(self, gen_id: str) -> None:
        server = self._placed.pop(gen_id)
        server.in_flight.pop(gen_id, None)
        with contextlib.suppress(KeyError):  # a generation whose first request never landed: the server never knew it
            server.engine.release(gen_id)

    def step(self) -> StepOutput:
        begins = {id(s): b for s in self._servers if (b := s.next_begin()) is not None}
        if not begins:
            return StepOutput(duration=0.0)
        server = min((s for s in self._servers if id(s) in begins), key=lambda s: begins[id(s)])
        begin = begins[id(server)]
        for gen_id, flight in list(server.in_flight.items()):  # landed by now, in the order they were sent
            if flight.lands_at <= begin:
                del server.in_flight[gen_id]
                server.engine.start(flight.spec)
        out = server.engine.step()
        server.free_at = begin + out.duration
        delivered = max(server.free_at + self.token_delay, self.clock)
        out.duration, self.clock = delivered - self.clock, delivered
        return out

    def running_ids(self) -> list[str]:
        return [g for s in self._servers for g in (*s.engine.running_ids(), *s.in_flight)]

    def free_kv_blocks(self) -> int:
        """The servers' free blocks less what the requests in flight will take when they land."""
        return sum(s.engine.free_kv_blocks() - s.in_flight_blocks() for s in self._servers)

    def kv_after(self, suspended: Collection[str], resumed: Collection[str]) -> KvView:
        free = 0
        for server in self._servers:
            view = server.engine.kv_after([g for g in suspended if g in server.engine.running_ids()],
                                          [g for g in resumed if self._placed.get(g) is server])
            free += view.free_blocks - server.in_flight_blocks(leaving=suspended)
        return KvView(free, self.blocks_to_start)

    def blocks_for(self, num_tokens: int) -> int:
        return self._servers[0].engine.blocks_for(num_tokens)

    def blocks_to_start(self, token_ids: list[int]) -> int:
        """On the server a new generation would go to."""
        return self._place(token_ids).engine.blocks_to_start(token_ids)

    def _place(self, prompt_ids: list[int]) -> _Server:
        """As the remote engine places (``choose_server``), knowing exactly what each server caches; servers without
        a stream cap of their own (the node's batch cap splits over them)."""
        candidates = [Candidate(s.engine.blocks_for(len(prompt_ids)) - s.engine.blocks_to_start(prompt_ids), s.load,
                                s.engine.free_kv_blocks()) for s in self._servers]
        return self._servers[choose_server(candidates, max_open=sys.maxsize)]

    def reset_cache(self) -> None:
        if any(s.in_flight for s in self._servers):
            raise RuntimeError("reset_cache with requests in flight")
        for server in self._servers:
            server.engine.reset_cache()


def simulator(profile: HardwareProfile, tokenizer: Tokenizer | None = None, suspends_in_place: bool = False) -> Engine:
    """The simulator a profile describes: of servers behind HTTP where it has an http section (whose resumes
    re-submit the context: ``suspends_in_place`` cannot hold), else of an engine embedded in the node."""
    if profile.http is None:
        return SimEngine(profile, tokenizer, suspends_in_place)
    if suspends_in_place:
        raise ConfigError(profile.name, "http", "a remote server cannot suspend in place (--suspend-in-place)")
    return RemoteSimEngine(profile, tokenizer)
