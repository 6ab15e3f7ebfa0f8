"""An engine over OpenAI-compatible servers (``vllm serve``): each running generation is one streaming completion.

start = a streaming ``/v1/completions`` of the prompt ids plus the ids generated so far, greedy, with the plan
grammar continued from them and the token budget left (and the request's priority where it is not 0: the server
must schedule by priority then); suspend = the stream is closed (the server aborts the request; its prefix cache
keeps the KV until evicted) and a resume re-submits the ids, so ``suspends_in_place`` is False; step = the tokens
that arrived since the last step, waiting up to ``STEP_WAIT_S`` for one, its duration measured. The streams run
on an asyncio loop in a thread of the engine's own (remote_streams.py); the caller's thread never waits on the
network longer than that (the tokenizer aside, when it is the server's: docs/remote-engine.md).

Several servers: a new generation goes where its prompt's leading KV blocks are cached (the engine's record of the
contexts it had each server compute), among the answering servers with room and near the least busy; then to the
fewest open streams, then the most free KV (remote_prefixes.py). Its resumes go back to the same server, which
holds its KV. A server whose open streams have gone ``SILENT_SHARE`` of the read timeout without a token is stalled
until it sends one: the generations there still waiting for their first token start again elsewhere, and new ones
go to it only when no server that answers has room. A server that fails
(connection refused or lost, HTTP 5xx) fails its open streams (``StepOutput.failed``, with the cause), refuses the
resumes of its suspended generations, and is probed (``/health``, with backoff) until it answers again.

KV memory: a server's capacity is what its ``vllm:cache_config_info`` metric says (else its batch cap of full
contexts); a running generation holds its context there, a suspended one nothing (its KV is the server's prefix
cache, which a newcomer may evict, as vLLM's own cached-but-idle blocks count as free).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Collection
from dataclasses import dataclass, field

import httpx

from timely_llm.engines.base import (
    Engine,
    EngineRejected,
    GenerationSpec,
    KvView,
    ResumeInfo,
    ServerHealth,
    StepOutput,
    Tokenizer,
    most_cached,
    trailing_observation,
)
from timely_llm.engines.remote_prefixes import (
    Candidate,
    PrefixCacheCounts,
    PrefixIndex,
    choose_server,
    prefix_cache_metrics,
)
from timely_llm.engines.remote_servers import (
    Chunk,
    RemoteServer,
    ServedModel,
    ServerGarbage,
    bearer_headers,
    failure_cause,
    request_body,
    stalled_beside_one_answering,
)
from timely_llm.engines.remote_settings import RemoteSettings
from timely_llm.engines.remote_streams import CONNECT_TIMEOUT_S, RemoteStreams
from timely_llm.engines.remote_tokenizer import LocalTokenizer, ServerTokenizer

DEFAULT_BLOCK_SIZE = 16
"""KV block size where a server does not say its own (vLLM's GPU default)."""
SILENT_SHARE = 0.25
"""A server whose open streams have gone this share of ``remote.timeout`` without a token (15 s of 60) is stalled:
its streams will likely fail at the timeout (seen on two CPU servers sharing 2 cores, one starved)."""


@dataclass
class _Generation:
    spec: GenerationSpec
    server: RemoteServer
    output_ids: list[int] = field(default_factory=list)
    stream: int = 0
    """Which stream of this generation is current: events of an older one are dropped."""
    live: concurrent.futures.Future | None = None
    """The open stream's task, None while suspended or ended."""
    context_tokens: int = 0
    awaiting_first: bool = False
    warm_only: bool = False
    """A prefill-only start (forced_ids == []): its one token is no output."""
    max_tokens: int = 0
    """What its stream may generate."""


class RemoteEngine(Engine):
    suspends_in_place = False
    resumes_resubmit = True
    steps_are_iterations = False

    def __init__(self, settings: RemoteSettings) -> None:
        try:
            headers = bearer_headers(settings.api_key_env)
        except ValueError as exc:
            raise ValueError(f"remote.api_key_env: {exc}") from None
        timeout = httpx.Timeout(settings.timeout, connect=CONNECT_TIMEOUT_S)
        self._settings = settings
        self._client = httpx.Client(headers=headers, timeout=timeout)
        self._servers = [RemoteServer(u) for u in dict.fromkeys(settings.url)]
        served = self._describe()
        self.model = served.model
        self._max_model_len = served.max_model_len
        self.block_size: int = served.block_size or DEFAULT_BLOCK_SIZE
        self.max_batch: int = settings.max_num_seqs * len(self._servers)
        self.server_count = len(self._servers)
        self.device = f"remote: {', '.join(s.url for s in self._servers)}"
        first = next(s for s in self._servers if s.served is not None)
        self.tokenizer = (LocalTokenizer(settings.tokenizer) if settings.tokenizer
                          else ServerTokenizer(self._client, first.url, self.model))
        self._gens: dict[str, _Generation] = {}
        self._prefixes = {s.url: PrefixIndex(self.block_size, self._capacity(s)) for s in self._servers}
        self._asked = {s.url: PrefixCacheCounts() for s in self._servers}
        self._streams = RemoteStreams(headers, timeout, self._servers, self._describe_again)
        self._silence = settings.timeout * SILENT_SHARE

    # ----- the Engine contract -----

    def start(self, spec: GenerationSpec) -> None:
        gen = self._gens.get(spec.gen_id)
        if gen is not None and gen.live is not None:
            raise EngineRejected(f"{spec.gen_id} is already running")
        context = spec.prompt_ids + spec.output_ids
        max_tokens = self._check_startable(spec, context)
        server = gen.server if gen is not None else self._place(spec.gen_id, spec.prompt_ids)
        if server.down is not None:
            raise EngineRejected(f"{spec.gen_id}: its server {server.url} (which holds its KV) is down: {server.down}")
        self._open(spec, server, gen.stream + 1 if gen else 1, max_tokens)

    def _open(self, spec: GenerationSpec, server: RemoteServer, stream: int, max_tokens: int) -> None:
        """Stream number ``stream`` of ``spec`` from ``server``."""
        context = spec.prompt_ids + spec.output_ids
        grammar = None if spec.forced_ids is not None else _grammar(spec, self.tokenizer)
        body = request_body(self.model, server.api, context, max_tokens, grammar, spec.priority)
        gen = _Generation(spec, server, list(spec.output_ids), stream=stream, context_tokens=len(context),
                          awaiting_first=True, warm_only=spec.forced_ids == [], max_tokens=max_tokens)
        self._gens[spec.gen_id] = gen
        gen.live = self._streams.open(spec.gen_id, gen.stream, server, body)
        server.opened(time.monotonic())
        self._count_start(server, spec, context)

    def suspend(self, gen_id: str) -> None:
        gen = self._gens[gen_id]
        if gen.live is None:
            raise KeyError(f"{gen_id} is not running")
        self._close(gen)

    def release(self, gen_id: str) -> None:
        gen = self._gens.pop(gen_id)
        if gen.live is not None:
            self._close(gen)

    def step(self) -> StepOutput:
        began = time.perf_counter()
        self._leave_stalled_servers()
        events = self._streams.events(wait=any(g.live is not None for g in self._gens.values()))
        result = StepOutput(duration=0.0)
        for event in events:
            self._apply(*event, result)
        result.duration = time.perf_counter() - began
        return result

    def free_kv_blocks(self) -> int:
        return sum(self._free_on(s) for s in self._servers if s.down is None)

    def kv_after(self, suspended: Collection[str], resumed: Collection[str]) -> KvView:
        free = self.free_kv_blocks()
        for gen_id in set(suspended) - set(resumed):
            gen = self._gens[gen_id]
            free += self.blocks_for(gen.context_tokens) if gen.server.down is None else 0
        for gen_id in set(resumed) - set(suspended):
            gen = self._gens[gen_id]
            free -= self.blocks_for(len(gen.spec.prompt_ids) + len(gen.output_ids))
        return KvView(free, self.blocks_to_start)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def servers(self) -> list[ServerHealth]:
        now = time.monotonic()
        return [ServerHealth(s.url, s.down, s.down_since, s.open, s.served.model if s.served else "",
                             None if s.stalled_since is None else now - s.stalled_since)
                for s in self._servers]

    def server_of(self, gen_id: str) -> str:
        """The URL of the server ``gen_id`` runs on (and its KV is on)."""
        return self._gens[gen_id].server.url

    def close(self) -> None:
        for gen_id in list(self._gens):
            self.release(gen_id)
        self._streams.close()
        self._client.close()

    # ----- internals -----

    def _describe(self) -> ServedModel:
        """Ask every server what it serves; the engine takes the first answer, the others must serve the same
        model. A server that does not answer starts taken out; none answering raises RuntimeError."""
        first: ServedModel | None = None
        causes = []
        for server in self._servers:
            try:
                served = server.describe(self._client, first.model if first else self._settings.model,
                                         self._settings.api)
            except (httpx.HTTPError, ServerGarbage) as exc:
                causes.append(f"{server.url}: {failure_cause(exc)}")
                server.failed(failure_cause(exc), time.monotonic())
                continue
            first = first or served
        if first is None:
            raise RuntimeError(f"no remote server answers ({'; '.join(causes)})")
        return first

    def _check_startable(self, spec: GenerationSpec, context: list[int]) -> int:
        """Validate a (re)start; return the token budget left for it."""
        if not spec.prompt_ids:
            raise EngineRejected(f"{spec.gen_id}: empty prompt")
        if spec.forced_ids:
            raise EngineRejected(f"{spec.gen_id}: the remote engine cannot force-decode a recorded plan "
                                 "(trace replay needs engine sim or vllm)")
        if spec.forced_ids == []:
            return 1  # a prefill of the prompt alone (warm_prefix)
        room = None if self._max_model_len is None else self._max_model_len - len(context)
        if room is not None and room <= 0:
            raise EngineRejected(f"{spec.gen_id}: context of {len(context)} tokens does not fit the server's "
                                 f"max_model_len={self._max_model_len}")
        budget = spec.max_new_tokens - len(spec.sampled_ids)
        if budget <= 0:
            raise EngineRejected(f"{spec.gen_id}: token budget {spec.max_new_tokens} spent")
        return budget if room is None else min(budget, room)

    def _leave_stalled_servers(self) -> None:
        """Generations still waiting for their first token on a server whose streams went silent start again on one
        that answers (none of their KV is on the stalled one: it computed nothing they got)."""
        if not stalled_beside_one_answering(self._servers, time.monotonic(), self._silence):
            return
        for gen in list(self._gens.values()):
            if gen.live is not None and gen.awaiting_first and gen.server.stalled_since is not None:
                self._close(gen)
                self._open(gen.spec, self._place(gen.spec.gen_id, gen.spec.prompt_ids), gen.stream, gen.max_tokens)

    def _place(self, gen_id: str, prompt_ids: list[int]) -> RemoteServer:
        """Among the answering servers, where the prompt's leading blocks are cached (``choose_server``)."""
        answering = [s for s in self._servers if s.down is None and s.served is not None]
        for server in self._servers:
            if server.down is not None:
                self._prefixes[server.url].clear()
        if not answering:
            causes = "; ".join(f"{s.url}: {s.down}" for s in self._servers)
            raise EngineRejected(f"{gen_id}: no remote server answers ({causes})")
        candidates = [Candidate(self._prefixes[s.url].cached_blocks(prompt_ids), s.open, self._free_on(s),
                                silent=s.stalled_since is not None) for s in answering]
        return answering[choose_server(candidates, self._settings.max_num_seqs)]

    def _count_start(self, server: RemoteServer, spec: GenerationSpec, context: list[int]) -> None:
        """What this start asks of the server's prefix cache; the context it will have computed."""
        if spec.output_ids:
            reusable = len(context) - 1 - trailing_observation(spec.observed, len(spec.output_ids))
            self._asked[server.url] += PrefixCacheCounts(resumed_tokens=max(reusable, 0), resumes=1)
        else:
            self._asked[server.url] += PrefixCacheCounts(first_start_tokens=most_cached(len(context), self.block_size))
        self._prefixes[server.url].add(context)

    def prefix_cache_counts(self) -> dict[str, PrefixCacheCounts]:
        """Per answering server: its prefix-cache metrics now, with what this engine asked of it so far; servers
        whose metrics do not count the prefix cache are left out."""
        counts = {}
        for server in self._servers:
            try:
                answer = self._client.get(f"{server.url}/metrics") if server.down is None else None
            except httpx.HTTPError:
                continue
            found = prefix_cache_metrics(answer.text) if answer is not None and answer.status_code == 200 else None
            if found is not None:
                counts[server.url] = self._asked[server.url] + PrefixCacheCounts(*found)
        return counts

    def _free_on(self, server: RemoteServer) -> int:
        if server.served is None:
            return 0
        held = sum(self.blocks_for(g.context_tokens) for g in self._gens.values()
                   if g.server is server and g.live is not None)
        return self._capacity(server) - held

    def _capacity(self, server: RemoteServer) -> int:
        """The server's KV cache in this engine's blocks: what its metrics say, else its batch cap of full
        contexts (a server that has not answered yet: the same)."""
        served = server.served
        if served is not None and served.kv_blocks and served.block_size:
            return served.kv_blocks * served.block_size // self.block_size
        return self._settings.max_num_seqs * self.blocks_for(self._max_model_len or 4096)

    def _close(self, gen: _Generation) -> None:
        """The stream ends (cancelled if still open); its late events are dropped."""
        assert gen.live is not None  # only an open stream is closed
        gen.live.cancel()
        gen.live = None
        gen.stream += 1
        gen.server.closed()
        self._prefixes[gen.server.url].add((gen.spec.prompt_ids + gen.output_ids)[:-1])

    def _apply(self, gen_id: str, stream: int, chunk: Chunk | None, cause: str | None, result: StepOutput) -> None:
        gen = self._gens.get(gen_id)
        if gen is None or gen.live is None or gen.stream != stream:
            return  # suspended or released meanwhile: what arrived after is not the generation's
        if cause is not None:
            self._close(gen)
            result.failed[gen_id] = cause
            return
        assert chunk is not None  # an event holds a chunk or a cause
        gen.server.heard(time.monotonic())
        if gen.awaiting_first:
            gen.awaiting_first = False
            result.started[gen_id] = ResumeInfo(gen.context_tokens, 0, reported=False)
        if chunk.finish_reason == "stop" and chunk.token_ids and isinstance(self.tokenizer, ServerTokenizer) and \
                chunk.stop_reason in (None, chunk.token_ids[-1]):
            self.tokenizer.saw_end(chunk.token_ids[-1])  # vLLM's last token at EOS (reason None) or a stop token
        if chunk.token_ids and not gen.warm_only:
            gen.output_ids += chunk.token_ids
            gen.context_tokens += len(chunk.token_ids)
            result.new_tokens.setdefault(gen_id, []).extend(chunk.token_ids)
        if chunk.finish_reason is None:
            return
        self._close(gen)
        if chunk.finish_reason in ("stop", "length"):
            result.finished[gen_id] = "eos" if chunk.finish_reason == "stop" or gen.warm_only else "length"
        else:
            result.failed[gen_id] = f"{gen.server.url} ended the completion: {chunk.finish_reason}"

    def _describe_again(self, server: RemoteServer) -> None:
        """A server that did not answer at start does now: learn what it serves (the engine's model)."""
        try:
            server.describe(self._client, self.model, self._settings.api)
        except (httpx.HTTPError, ServerGarbage) as exc:
            server.failed(failure_cause(exc), time.monotonic())


def _grammar(spec: GenerationSpec, tokenizer: Tokenizer) -> str | None:
    """EBNF for the rest of the plan, continued from what ``spec`` generated so far."""
    if spec.grammar is None:
        return None
    grammar = spec.grammar.continuation(tokenizer.decode(spec.sampled_ids))
    if grammar is None:
        raise EngineRejected(f"{spec.gen_id}: generated text left the {spec.grammar.model.robot} plan grammar")
    return grammar
