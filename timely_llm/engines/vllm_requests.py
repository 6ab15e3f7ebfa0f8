"""The vLLM requests behind the embedded engine's generations (vllm_engine.py), steered in process.

Each running generation is one vLLM request. A suspended one is paused in place: it stays in vLLM's running list
with its KV blocks, but vLLM's scheduler skips it. Where a newcomer needs the memory or the request slot a paused
request holds, the oldest paused request is aborted, its full KV blocks left to vLLM's prefix cache. What this needs
of vLLM beyond its public API goes through vllm_internals.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vllm import LLMEngine, SamplingParams, TokensPrompt
from vllm.config import SchedulerConfig
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from timely_llm.engines import vllm_internals as internals
from timely_llm.engines.base import GenerationSpec, ResumeInfo, most_cached
from timely_llm.engines.forcing import FORCED_KEY
from timely_llm.engines.vllm_internals import VllmCore


@dataclass
class Generation:
    spec: GenerationSpec
    output_ids: list[int] = field(default_factory=list)
    request_id: str | None = None
    """The live vLLM request, None while suspended."""
    starts: int = 0
    context_tokens: int = 0
    awaiting_first_output: bool = False
    preemptions: int = 0
    """vLLM's preemptions of the live request seen so far."""
    paused: Any = None
    """The live vLLM request while suspended in place (its KV kept), else None."""
    kept_tokens: int | None = None
    """Context tokens whose KV a resume in place kept, until its first output reports them."""

    def resume_info(self, cached: int, block_size: int) -> ResumeInfo:
        """How this start found its context, vLLM having served ``cached`` tokens from its prefix cache."""
        if self.kept_tokens is not None:
            kept, self.kept_tokens = self.kept_tokens, None
            return ResumeInfo(self.context_tokens, kept, False)
        expected = most_cached(self.context_tokens, block_size)
        evicted = bool(self.spec.output_ids) and cached < expected
        return ResumeInfo(self.context_tokens, cached, evicted)


class VllmRequests:
    """Our generations' requests in one in-process vLLM engine (submitted, paused in place, aborted) and the KV
    blocks vLLM's block pool has free or they alone hold."""

    def __init__(self, engine: LLMEngine, core: VllmCore, scheduler_config: SchedulerConfig, block_size: int) -> None:
        self._engine = engine
        self._core = core
        self._slots: int = scheduler_config.max_num_seqs
        """vLLM's request slots: running and paused requests together."""
        self._priority_scheduling = scheduler_config.policy == "priority"
        self.block_size = block_size
        self._by_request: dict[str, str] = {}
        self._paused: dict[str, Generation] = {}
        """Generations suspended in place, oldest first: the first to give their KV back."""
        self._paused_blocks: int | None = None
        """Blocks only paused requests hold; None once a change to the requests or a step may have changed it."""

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def free_blocks(self) -> int:
        """Free blocks, counting those only paused requests hold: a newcomer gets them back."""
        if self._paused_blocks is None:  # the scheduler asks once per candidate: count once per change
            self._paused_blocks = sum(self.reclaimable(g) for g in self._paused)
        return self._pool_free() + self._paused_blocks

    def reclaimable(self, gen_id: str) -> int:
        """Blocks aborting ``gen_id``'s paused request would free; 0 when it is not paused."""
        gen = self._paused.get(gen_id)
        return self._core.blocks_held_alone(gen.paused) if gen is not None else 0

    def held_alone(self, gen: Generation) -> int:
        """Blocks only ``gen``'s live request holds (0 when it is not running): what stopping it would free."""
        request = self.live_request(gen.spec.gen_id)
        return self._core.blocks_held_alone(request) if request is not None else 0

    def generation_of(self, request_id: str) -> str | None:
        """The generation behind one of our request ids, while that request is live."""
        return self._by_request.get(request_id)

    def unpaused_count(self) -> int:
        """Requests not paused: each may need a block next step."""
        return len(self._by_request) - len(self._paused)

    def by_generation(self) -> Iterator[tuple[str, Any]]:
        """(generation id, vLLM's request object) for each request vLLM holds for one of our generations."""
        for key, request in self._core.requests():
            gen_id = self._gen_id_of(key)
            if gen_id is not None:
                yield gen_id, request

    def submit(self, gen: Generation, context: list[int], max_tokens: int, forced: list[int] | None,
               grammar: str | None) -> None:
        """Add a request for ``gen``'s start number ``gen.starts`` to vLLM; raises ValueError where vLLM refuses it."""
        params = SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            extra_args={FORCED_KEY: forced} if forced is not None else None,
            structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar is not None else None,
        )
        request_id = f"{gen.spec.gen_id}#{gen.starts}"
        # vLLM refuses a priority under FCFS scheduling; FCFS orders by arrival alone.
        self._engine.add_request(request_id, TokensPrompt(prompt_token_ids=context), params,
                                 priority=gen.spec.priority if self._priority_scheduling else 0)
        self._paused_blocks = None
        gen.request_id = request_id
        self._by_request[request_id] = gen.spec.gen_id

    def step(self) -> list[Any]:
        """One vLLM iteration: its request outputs (raises what vLLM raises)."""
        self._paused_blocks = None  # the step changes which blocks requests share
        return self._engine.step()

    def pause(self, gen: Generation) -> bool:
        """Pause ``gen``'s running request in place, its KV kept; False (nothing done) while it is still waiting or
        prefilling: nothing worth keeping in place."""
        request = self.live_request(gen.spec.gen_id)
        if request is None or not internals.is_decoding(request):
            return False
        self._paused_blocks = None
        internals.pause(request)
        gen.paused = request
        self._paused[gen.spec.gen_id] = gen
        return True

    def unpause(self, gen: Generation) -> Any:
        """Let vLLM schedule ``gen``'s paused request again; return it."""
        self._paused_blocks = None
        request, gen.paused = gen.paused, None
        internals.unpause(request)
        del self._paused[gen.spec.gen_id]
        return request

    def append(self, request: Any, appended: list[int], context_tokens: int, max_tokens: int,
               forced: list[int] | None) -> int:
        """Continue the unpaused ``request`` with ``appended`` ids, its KV kept, to ``context_tokens`` in all, first
        aborting paused requests until the blocks that takes are free; return the context tokens whose KV was kept.
        vLLM's streaming-input update drops the last sampled token (its KV unwritten) and appends the given ids as
        prompt: that token again, then ``appended``; the grammar matcher, which never saw ``appended``, goes on from
        the plan text."""
        self.make_room(self.blocks_for(context_tokens + 1) - self.blocks_for(internals.num_tokens(request)))
        return self._core.append(request, appended, max_tokens, {FORCED_KEY: forced} if forced is not None else None)

    def stop(self, gen: Generation) -> None:
        """Abort ``gen``'s request, paused or not (nothing when it has none)."""
        self._paused_blocks = None
        if gen.paused is not None:
            gen.paused = None
            del self._paused[gen.spec.gen_id]
        request_id, gen.request_id = gen.request_id, None
        if request_id is not None:
            del self._by_request[request_id]
            self._engine.abort_request([request_id])

    def ended(self, gen: Generation) -> None:
        """vLLM ended ``gen``'s request itself."""
        if gen.request_id is not None:
            self._by_request.pop(gen.request_id, None)
        gen.request_id = None

    def make_room(self, blocks: int, slot: bool = False) -> None:
        """Abort paused requests, oldest first, until ``blocks`` are free (and with ``slot``, vLLM's
        batch has room for one more request), so vLLM never preempts or queues on their account."""
        while self._paused and (self._pool_free() < blocks or slot and self._core.batch_size() >= self._slots):
            self.stop(next(iter(self._paused.values())))

    def free_room_for_waiting(self) -> None:
        """Abort paused requests, oldest first, while a request waits in vLLM's queue for a slot or for the KV
        blocks paused ones hold: a request resumed or started after the batch or the memory filled (two starts
        at one scheduling point may count the same free blocks) is running to our scheduler and must not wait
        behind requests that compute nothing."""
        while self._paused and self._waiting_needs_room():
            self.stop(next(iter(self._paused.values())))

    def _waiting_needs_room(self) -> bool:
        head = self._core.waiting_head_tokens()
        if head is None:
            return False
        if self._core.running_count() >= self._slots:
            return True
        return self._pool_free() < self.blocks_for(head + 1)

    def live_request(self, gen_id: str) -> Any:
        """vLLM's request object for ``gen_id``'s live request (keyed by our id plus a suffix), if running (paused
        in place too); an opaque handle for vllm_internals' functions."""
        for key, request in self._core.requests():
            if self._gen_id_of(key) == gen_id:
                return request if internals.is_running(request) else None
        return None

    def _gen_id_of(self, vllm_request_id: str) -> str | None:
        """The generation behind a vLLM request id: vLLM keys its requests by ours plus "-" and a suffix."""
        return self._by_request.get(vllm_request_id) or self._by_request.get(vllm_request_id.rpartition("-")[0])

    def _pool_free(self) -> int:
        return self._core.free_blocks()
