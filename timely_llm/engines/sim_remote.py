"""The simulator of the remote path: the node driving ``vllm serve`` over HTTP (``engines/remote.py``).

A server (a ``SimEngine`` that drops a suspended generation's KV to its prefix cache) steps on its own; the node
sees it through HTTP. A (re)start is a new request carrying the whole context: it joins the server's running set
``request_overhead`` seconds after the node sent it (the API server's parsing, tokenizing, grammar set-up and the
network) and prefills what the prefix cache misses (full blocks of the context before the last sampled token hit).
A step's tokens reach the node ``token_delay`` after the server's step ends. Suspend = the stream closed: the server
drops the request at its next step (the abort's own travel is not modelled).

Time: the engine keeps its own model clock, the sum of the durations its steps returned, so the node's idle time
between steps (a virtual clock jumping to the next arrival) does not count; a server's step begins where its last
one ended (``clock - token_delay``), or, with nothing running but requests in flight, when the first one lands.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from timely_llm.engines.base import Engine, EngineRejected, GenerationSpec, KvView, StepOutput, Tokenizer
from timely_llm.engines.hardware import HardwareProfile
from timely_llm.engines.sim import SimEngine
from timely_llm.errors import ConfigError


@dataclass(frozen=True)
class _InFlight:
    spec: GenerationSpec
    lands_at: float
    """Model time at which the request joins the server's running set."""


class RemoteSimEngine(Engine):
    suspends_in_place = False

    def __init__(self, profile: HardwareProfile, tokenizer: Tokenizer | None = None) -> None:
        if profile.http is None:
            raise ValueError(f"profile {profile.name} has no http section")
        self.profile = profile
        self.server = SimEngine(profile, tokenizer)
        self.tokenizer = self.server.tokenizer
        self.block_size = self.server.block_size
        self.request_overhead = profile.http["request_overhead"]
        self.token_delay = profile.http["token_delay"]
        self.clock = 0.0
        """Model time at the node: the sum of the durations the steps returned."""
        self._in_flight: dict[str, _InFlight] = {}
        self._never_landed: set[str] = set()
        """Suspended before their request reached the server: the server knows nothing of them."""

    def start(self, spec: GenerationSpec) -> None:
        if spec.gen_id in self._in_flight or spec.gen_id in self.server.running_ids():
            raise EngineRejected(f"{spec.gen_id} is already running")
        if spec.forced_ids is None:
            raise EngineRejected("the simulator replays recorded plans only: give the request a trace")
        self._never_landed.discard(spec.gen_id)
        self._in_flight[spec.gen_id] = _InFlight(spec, self.clock + self.request_overhead)

    def suspend(self, gen_id: str) -> None:
        if self._in_flight.pop(gen_id, None) is not None:
            self._never_landed.add(gen_id)
        else:
            self.server.suspend(gen_id)

    def release(self, gen_id: str) -> None:
        if self._in_flight.pop(gen_id, None) is None and gen_id not in self._never_landed:
            self.server.release(gen_id)
        self._never_landed.discard(gen_id)

    def step(self) -> StepOutput:
        begins = self.clock - self.token_delay  # where the server's last step ended
        if not self.server.running_ids():
            if not self._in_flight:
                return StepOutput(duration=0.0)
            begins = max(begins, min(f.lands_at for f in self._in_flight.values()))
        self._land(begins)
        out = self.server.step()
        delivered = begins + out.duration + self.token_delay
        out.duration = delivered - self.clock
        self.clock = delivered
        return out

    def _land(self, now: float) -> None:
        """The requests that reached the server by ``now`` join its running set, in the order they were sent."""
        for gen_id, flight in list(self._in_flight.items()):
            if flight.lands_at <= now:
                del self._in_flight[gen_id]
                self.server.start(flight.spec)

    def running_ids(self) -> list[str]:
        return self.server.running_ids() + list(self._in_flight)

    def free_kv_blocks(self) -> int:
        """The server's free blocks less what the requests in flight will take when they land."""
        return self.server.free_kv_blocks() - self._in_flight_blocks()

    def kv_after(self, suspended: Collection[str], resumed: Collection[str]) -> KvView:
        on_server = [g for g in suspended if g not in self._in_flight]
        view = self.server.kv_after(on_server, resumed)
        landing = {g: f for g, f in self._in_flight.items() if g not in suspended}
        return KvView(view.free_blocks - self._in_flight_blocks(landing), view.blocks_to_start)

    def _in_flight_blocks(self, flights: dict[str, _InFlight] | None = None) -> int:
        found = self._in_flight if flights is None else flights
        return sum(self.server.blocks_to_start(f.spec.prompt_ids + f.spec.output_ids) for f in found.values())

    def blocks_for(self, num_tokens: int) -> int:
        return self.server.blocks_for(num_tokens)

    def blocks_to_start(self, token_ids: list[int]) -> int:
        return self.server.blocks_to_start(token_ids)

    def reset_cache(self) -> None:
        if self._in_flight:
            raise RuntimeError("reset_cache with requests in flight")
        self.server.reset_cache()


def simulator(profile: HardwareProfile, tokenizer: Tokenizer | None = None, suspends_in_place: bool = False) -> Engine:
    """The simulator a profile describes: of a server behind HTTP where it has an http section (whose resumes
    re-submit the context: ``suspends_in_place`` cannot hold), else of an engine embedded in the node."""
    if profile.http is None:
        return SimEngine(profile, tokenizer, suspends_in_place)
    if suspends_in_place:
        raise ConfigError(profile.name, "http", "a remote server cannot suspend in place (--suspend-in-place)")
    return RemoteSimEngine(profile, tokenizer)
