"""The vLLM requests behind the embedded engine's generations (vllm_engine.py), steered in process.

Each running generation is one vLLM request. A suspended one is paused in place: it stays in vLLM's running list
with its KV blocks, but vLLM's scheduler skips it. Where a newcomer needs the memory or the request slot a paused
request holds, the oldest paused request is aborted, its full KV blocks left to vLLM's prefix cache.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vllm import LLMEngine, SamplingParams, TokensPrompt
from vllm.config import SchedulerConfig
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.request import RequestStatus, StreamingUpdate

from timely_llm.engines.base import GenerationSpec, ResumeInfo
from timely_llm.engines.forcing import FORCED_KEY

PAUSED = sys.maxsize
"""A paused request's ``next_decode_eligible_step``: vLLM's scheduler skips it until then."""


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
        # vLLM always recomputes the last context token, so a full hit covers the
        # full blocks of context_tokens - 1.
        expected = (self.context_tokens - 1) // block_size * block_size
        evicted = bool(self.spec.output_ids) and cached < expected
        return ResumeInfo(self.context_tokens, cached, evicted)


class VllmRequests:
    """Our generations' requests in one in-process vLLM engine (submitted, paused in place, aborted) and the KV
    blocks vLLM's block pool has free or they alone hold."""

    def __init__(self, engine: LLMEngine, scheduler_config: SchedulerConfig, block_size: int) -> None:
        self._engine = engine
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
        return self._only_held(gen.paused.request_id) if gen is not None else 0

    def held_alone(self, gen: Generation) -> int:
        """Blocks only ``gen``'s live request holds (0 when it is not running): what stopping it would free."""
        request = self._live_request(gen.spec.gen_id)
        return self._only_held(request.request_id) if request is not None else 0

    def generation_of(self, request_id: str) -> str | None:
        """The generation behind one of our request ids, while that request is live."""
        return self._by_request.get(request_id)

    def unpaused_count(self) -> int:
        """Requests not paused: each may need a block next step."""
        return len(self._by_request) - len(self._paused)

    def by_generation(self) -> Iterator[tuple[str, Any]]:
        """(generation id, vLLM's request object) for each request vLLM holds for one of our generations."""
        for key, request in self._scheduler().requests.items():
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
        request = self._live_request(gen.spec.gen_id)
        if request is None or request.num_computed_tokens < request.num_tokens - 1:
            return False
        self._paused_blocks = None
        request.next_decode_eligible_step = PAUSED
        gen.paused = request
        self._paused[gen.spec.gen_id] = gen
        return True

    def unpause(self, gen: Generation) -> Any:
        """Let vLLM schedule ``gen``'s paused request again; return it."""
        self._paused_blocks = None
        request, gen.paused = gen.paused, None
        request.next_decode_eligible_step = 0
        del self._paused[gen.spec.gen_id]
        return request

    def append(self, request: Any, appended: list[int], context_tokens: int, max_tokens: int,
               forced: list[int] | None) -> None:
        """Continue the unpaused ``request`` with ``appended`` ids, its KV kept, to ``context_tokens`` in all.
        vLLM's streaming-input update drops the last sampled token (its KV unwritten) and appends the given ids as
        prompt: that token again, then ``appended``; the grammar matcher, which never saw ``appended``, goes on from
        the plan text."""
        scheduler = self._scheduler()
        scheduler.running.remove(request)
        self.make_room(self.blocks_for(context_tokens + 1) - self.blocks_for(request.num_tokens))
        last_sampled = request.all_token_ids[request.num_computed_tokens:]
        params = request.sampling_params.clone()
        params.max_tokens = max_tokens
        if forced is not None:
            params.extra_args = {**(params.extra_args or {}), FORCED_KEY: forced}
        update = StreamingUpdate(mm_features=None, prompt_token_ids=last_sampled + appended, max_tokens=max_tokens,
                                 arrival_time=time.time(), sampling_params=params)
        scheduler._update_request_as_session(request, update)
        scheduler._enqueue_waiting_request(request)

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
        scheduler = self._scheduler()
        while self._paused and (self._pool_free() < blocks or slot and
                                len(scheduler.running) + len(scheduler.waiting) >= self._slots):
            self.stop(next(iter(self._paused.values())))

    def free_room_for_waiting(self) -> None:
        """Abort paused requests, oldest first, while a request waits in vLLM's queue for a slot or for the KV
        blocks paused ones hold: a request resumed or started after the batch or the memory filled (two starts
        at one scheduling point may count the same free blocks) is running to our scheduler and must not wait
        behind requests that compute nothing."""
        scheduler = self._scheduler()
        while self._paused and self._waiting_needs_room(scheduler):
            self.stop(next(iter(self._paused.values())))

    def _waiting_needs_room(self, scheduler: Any) -> bool:
        if not (scheduler.waiting or scheduler.kv_holding_waiting):
            return False
        if len(scheduler.running) >= self._slots:
            return True
        queue = scheduler.waiting or scheduler.kv_holding_waiting
        return self._pool_free() < self.blocks_for(queue.peek_request().num_tokens + 1)

    def _live_request(self, gen_id: str) -> Any:
        """vLLM's request object for ``gen_id``'s live request (keyed by our id plus a suffix), if running."""
        for key, request in self._scheduler().requests.items():
            if self._gen_id_of(key) == gen_id:
                return request if request.status == RequestStatus.RUNNING else None
        return None

    def _gen_id_of(self, vllm_request_id: str) -> str | None:
        """The generation behind a vLLM request id: vLLM keys its requests by ours plus "-" and a suffix."""
        return self._by_request.get(vllm_request_id) or self._by_request.get(vllm_request_id.rpartition("-")[0])

    def _only_held(self, vllm_request_id: str) -> int:
        """KV blocks only this vLLM request holds: what stopping it would free."""
        blocks = self._scheduler().kv_cache_manager.coordinator.get_blocks(vllm_request_id)
        return sum(1 for group in blocks for block in group if block.ref_cnt == 1)

    def _pool_free(self) -> int:
        return self._scheduler().kv_cache_manager.block_pool.get_num_free_blocks()

    def _scheduler(self) -> Any:
        return self._engine.engine_core.engine_core.scheduler
