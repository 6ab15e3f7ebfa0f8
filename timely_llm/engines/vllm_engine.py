"""An embedded vLLM engine: one ``LLMEngine.step()`` per ``Engine.step()``.

Suspending pauses the vLLM request where it is: it stays in vLLM's running list with
its KV blocks, grammar state and token ids, but vLLM's scheduler skips it (its
``next_decode_eligible_step`` is set past any step), so a resume decodes on at once
with nothing prefilled again. A resume that appends an observation to a paused request (a blocking
skill's value) continues vLLM's request as a streaming-input session: its KV stays, and vLLM prefills
the observation and the call's last token, whose KV the pause never wrote. Where a newcomer needs the
memory or the batch slot a paused request holds, or vLLM preempts it, the oldest paused request is aborted
instead: its full KV blocks stay in vLLM's prefix cache (until evicted), and
resuming it with prompt + generated ids prefills only the tail. vLLM gets
``PAUSED_SLOTS`` request slots (``max_num_seqs``) beyond the batch cap (``max_batch``) for paused
requests, so that a newcomer at a full batch does not cost one of them its KV.
Scheduling is synchronous and there is no speculative decoding, so each step
yields at most one token per running generation: when the server suspends right
after a step that completed a segment, nothing past the boundary was generated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm import EngineArgs, LLMEngine, SamplingParams, TokensPrompt
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.request import RequestStatus, StreamingUpdate

from timely_llm.engines.base import (
    Engine,
    EngineRejected,
    GenerationSpec,
    KvView,
    ResumeInfo,
    StepOutput,
    appends_observation,
)
from timely_llm.engines.forcing import FORCED_KEY, ForcedTokensProcessor
from timely_llm.engines.hf_tokenizer import HfTokenizer
from timely_llm.engines.vllm_args import check_fields, create_config
from timely_llm.models import resolve_model

GIB = 1 << 30
PAUSED = sys.maxsize
"""A paused request's ``next_decode_eligible_step``: vLLM's scheduler skips it until then."""
PAUSED_SLOTS = 64
"""vLLM request slots beyond a given ``max_batch``, held by requests paused in place (they compute nothing).
With none to spare, every newcomer at a full capped batch aborted a paused request and its resume prefilled again:
229 of 233 resumes at cap 8 in a quiet bursty run, the response time normal robots paid (docs/simulator.md)."""


@dataclass
class _Generation:
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


class VllmEngine(Engine):
    suspends_in_place = True

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        kv_cache_gib: float | None = None,
        kv_offloading_gib: float | None = None,
        max_batch: int | None = None,
        paused_slots: int = PAUSED_SLOTS,
        **engine_args: Any,
    ) -> None:
        """Create the engine in this process.

        ``model`` is a name (``smollm2``, ``tiny``), a Hugging Face model directory or a Hub model id;
        None uses the tiny random model.
        ``kv_cache_gib`` sizes the KV cache on CPU and GPU alike (vLLM's ``kv_cache_memory_bytes``); None or 0
        lets vLLM size it from ``gpu_memory_utilization``. A ``VLLM_CPU_KVCACHE_SPACE`` set in the environment
        still overrides it on CPU. ``kv_offloading_gib`` adds a host memory tier for evicted KV blocks (GPU only).
        ``max_batch`` is the batch cap, the most generations running at once: vLLM's ``max_num_seqs`` is it plus
        ``paused_slots`` for the generations suspended in place; None or 0 leaves ``max_num_seqs`` at vLLM's
        default, which is then the cap.
        ``engine_args`` are any other fields of vLLM's ``EngineArgs`` (e.g. ``max_model_len``, ``dtype``,
        ``tensor_parallel_size``, ``scheduling_policy``: with ``"priority"`` each generation's
        ``priority`` orders vLLM's waiting queue and picks its preemption victim), passed as they are; vLLM's
        refusal, or ``max_num_seqs`` given here, raises EngineArgsError (vllm_args).
        """
        slots = _request_slots(max_batch, paused_slots)
        self._engine, config = _create_engine(model, kv_cache_gib, kv_offloading_gib, slots, engine_args)
        self._priority_scheduling = config.scheduler_config.policy == "priority"
        self._max_model_len: int = config.model_config.max_model_len
        self._vocab_size = self._engine.model_config.get_vocab_size()
        self.block_size: int = self._engine.vllm_config.cache_config.block_size
        self.tokenizer = HfTokenizer(self._engine.get_tokenizer())
        self._slots: int = config.scheduler_config.max_num_seqs
        """vLLM's request slots: running and paused requests together."""
        self.max_batch: int = max_batch or self._slots
        """The given cap, else vLLM's own max_num_seqs: the server's batch cap is at most this."""
        self.device: str = _device_name(config.parallel_config.tensor_parallel_size)
        self._gens: dict[str, _Generation] = {}
        self._by_request: dict[str, str] = {}
        self._paused: dict[str, _Generation] = {}
        """Generations suspended in place, oldest first: the first to give their KV back."""
        self._paused_blocks: int | None = None
        """Blocks only paused requests hold; None once a start, suspend, release or step may have changed it."""

    def start(self, spec: GenerationSpec) -> None:
        self._paused_blocks = None
        gen = self._gens.get(spec.gen_id)
        if gen is not None and gen.paused is not None:
            if gen.output_ids == spec.output_ids and gen.spec.forced_ids == spec.forced_ids:
                self._unpause(gen)
                return
            if appends_observation(spec, gen.output_ids, gen.spec.forced_ids):
                self._append_in_place(gen, spec)
                return
            self._stop_request(gen)
        if gen is not None and gen.request_id is not None:
            raise EngineRejected(f"{spec.gen_id} is already running")
        context = spec.prompt_ids + spec.output_ids
        max_tokens = self._check_startable(spec, context)
        self._make_room(self.blocks_for(len(context) + 1), slot=True)
        gen = _Generation(spec, list(spec.output_ids), starts=gen.starts if gen else 0)
        gen.request_id = f"{spec.gen_id}#{gen.starts}"
        try:
            self._submit(gen.request_id, context, max_tokens, _forced_tail(spec, self.tokenizer.eos_token_id),
                         spec.priority, self._grammar_for(spec))
        except ValueError as exc:  # vLLM's own validation of the request
            raise EngineRejected(f"{spec.gen_id}: {exc}") from exc
        gen.starts += 1
        gen.context_tokens = len(context)
        gen.awaiting_first_output = True
        self._gens[spec.gen_id] = gen
        self._by_request[gen.request_id] = spec.gen_id

    def suspend(self, gen_id: str) -> None:
        self._paused_blocks = None
        gen = self._gens[gen_id]
        if gen.request_id is None or gen.paused is not None:
            raise KeyError(f"{gen_id} is not running")
        request = self._live_request(gen)
        if request is None or request.num_computed_tokens < request.num_tokens - 1:
            self._stop_request(gen)  # still waiting or prefilling: nothing worth keeping in place
            return
        request.next_decode_eligible_step = PAUSED
        gen.paused = request
        self._paused[gen_id] = gen

    def release(self, gen_id: str) -> None:
        self._paused_blocks = None
        self._stop_request(self._gens.pop(gen_id))

    def step(self) -> StepOutput:
        self._paused_blocks = None
        self._free_room_for_waiting()
        began = time.perf_counter()
        try:
            outputs = self._engine.step()
        except Exception as exc:  # any engine fault fails the batch
            return self._fail_running(began, f"vLLM step failed: {exc!r}")
        result = StepOutput(duration=time.perf_counter() - began)
        for out in outputs:
            gen_id = self._by_request.get(out.request_id)
            if gen_id is not None:
                self._record(self._gens[gen_id], out, result)
        self._record_preemptions(result)
        self._make_room(len(self._by_request) - len(self._paused))  # each may need a block next step
        return result

    def free_kv_blocks(self) -> int:
        """Free blocks, counting those only paused requests hold: a newcomer gets them back."""
        if self._paused_blocks is None:  # the scheduler asks once per candidate: count once per change
            self._paused_blocks = sum(self._reclaimable(g) for g in self._paused.values())
        return self._block_pool().get_num_free_blocks() + self._paused_blocks

    def kv_after(self, suspended: Collection[str], resumed: Collection[str]) -> KvView:
        """Counts what each generation alone holds; blocks two of ``suspended`` share stay uncounted."""
        free = self.free_kv_blocks()
        for gen_id in set(suspended) - set(resumed):
            request = self._live_request(self._gens[gen_id])
            free += self._only_held(request.request_id) if request is not None else 0
        free -= sum(self._reclaimable(self._paused[g]) for g in resumed if g in self._paused)
        return KvView(free, self.blocks_to_start)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def output_ids(self, gen_id: str) -> list[int]:
        """Token ids ``gen_id`` has generated so far (all starts together)."""
        return list(self._gens[gen_id].output_ids)

    def close(self) -> None:
        for gen_id in list(self._gens):
            self.release(gen_id)
        self._engine.engine_core.shutdown()

    def _check_startable(self, spec: GenerationSpec, context: list[int]) -> int:
        """Validate a (re)start; return the token budget left for it."""
        if not spec.prompt_ids:
            raise EngineRejected(f"{spec.gen_id}: empty prompt")
        bad = [t for t in context + (spec.forced_ids or []) if not 0 <= t < self._vocab_size]
        if bad:
            raise EngineRejected(f"{spec.gen_id}: token ids {bad[:5]} outside the vocabulary (size {self._vocab_size})")
        room = self._max_model_len - len(context)
        if room <= 0:
            raise EngineRejected(
                f"{spec.gen_id}: context of {len(context)} tokens does not fit max_model_len={self._max_model_len}"
            )
        budget = spec.max_new_tokens - len(spec.sampled_ids)
        if budget <= 0:
            raise EngineRejected(f"{spec.gen_id}: token budget {spec.max_new_tokens} spent")
        return min(budget, room)

    def _grammar_for(self, spec: GenerationSpec) -> str | None:
        """EBNF for the rest of the plan, continued from what ``spec`` generated so far."""
        if spec.grammar is None or spec.forced_ids is not None:
            return None
        grammar = spec.grammar.continuation(self.tokenizer.decode(spec.sampled_ids))
        if grammar is None:
            raise EngineRejected(f"{spec.gen_id}: generated text left the {spec.grammar.model.robot} plan grammar")
        return grammar

    def _submit(
        self,
        request_id: str,
        context: list[int],
        max_tokens: int,
        forced: list[int] | None,
        priority: int = 0,
        grammar: str | None = None,
    ) -> None:
        params = SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            extra_args={FORCED_KEY: forced} if forced is not None else None,
            structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar is not None else None,
        )
        # vLLM refuses a priority under FCFS scheduling; FCFS orders by arrival alone.
        self._engine.add_request(request_id, TokensPrompt(prompt_token_ids=context), params,
                                 priority=priority if self._priority_scheduling else 0)

    def _unpause(self, gen: _Generation) -> Any:
        """Let vLLM schedule ``gen``'s paused request again; return it."""
        request, gen.paused = gen.paused, None
        request.next_decode_eligible_step = 0
        del self._paused[gen.spec.gen_id]
        gen.context_tokens = len(gen.spec.prompt_ids) + len(gen.output_ids)
        gen.awaiting_first_output = True
        gen.kept_tokens = gen.context_tokens
        return request

    def _append_in_place(self, gen: _Generation, spec: GenerationSpec) -> None:
        """Resume ``gen``'s paused request with ``spec``'s observation after its output, its KV kept. vLLM's
        streaming-input update drops the last sampled token (its KV unwritten) and appends the given ids as
        prompt, so they are the call's last token and the observation; the grammar matcher, which never saw
        the observation, goes on from the plan text."""
        context = spec.prompt_ids + spec.output_ids
        max_tokens = self._check_startable(spec, context)
        request = self._unpause(gen)
        scheduler = self._scheduler()
        scheduler.running.remove(request)
        self._make_room(self.blocks_for(len(context) + 1) - self.blocks_for(request.num_tokens))
        last_sampled = request.all_token_ids[request.num_computed_tokens:]
        params = request.sampling_params.clone()
        params.max_tokens = max_tokens
        forced = _forced_tail(spec, self.tokenizer.eos_token_id)
        if forced is not None:
            params.extra_args = {**(params.extra_args or {}), FORCED_KEY: forced}
        appended = last_sampled + spec.output_ids[len(gen.output_ids):]
        update = StreamingUpdate(mm_features=None, prompt_token_ids=appended, max_tokens=max_tokens,
                                 arrival_time=time.time(), sampling_params=params)
        scheduler._update_request_as_session(request, update)
        scheduler._enqueue_waiting_request(request)
        gen.kept_tokens = request.num_computed_tokens
        gen.spec, gen.output_ids, gen.context_tokens = spec, list(spec.output_ids), len(context)

    def _make_room(self, blocks: int, slot: bool = False) -> None:
        """Abort paused requests, oldest first, until ``blocks`` are free (and with ``slot``, vLLM's
        batch has room for one more request), so vLLM never preempts or queues on their account."""
        scheduler = self._scheduler()
        while self._paused and (self._block_pool().get_num_free_blocks() < blocks or slot and
                                len(scheduler.running) + len(scheduler.waiting) >= self._slots):
            self._stop_request(next(iter(self._paused.values())))

    def _free_room_for_waiting(self) -> None:
        """Abort paused requests, oldest first, while a request waits in vLLM's queue for a slot or for the KV
        blocks paused ones hold: a request resumed or started after the batch or the memory filled (two starts
        at one scheduling point may count the same free blocks) is running to our scheduler and must not wait
        behind requests that compute nothing."""
        scheduler = self._scheduler()
        while self._paused and self._waiting_needs_room(scheduler):
            self._stop_request(next(iter(self._paused.values())))

    def _waiting_needs_room(self, scheduler: Any) -> bool:
        if not (scheduler.waiting or scheduler.kv_holding_waiting):
            return False
        if len(scheduler.running) >= self._slots:
            return True
        queue = scheduler.waiting or scheduler.kv_holding_waiting
        return self._block_pool().get_num_free_blocks() < self.blocks_for(queue.peek_request().num_tokens + 1)

    def _reclaimable(self, gen: _Generation) -> int:
        return self._only_held(gen.paused.request_id)

    def _only_held(self, vllm_request_id: str) -> int:
        """KV blocks only this vLLM request holds: what stopping it would free."""
        blocks = self._scheduler().kv_cache_manager.coordinator.get_blocks(vllm_request_id)
        return sum(1 for group in blocks for block in group if block.ref_cnt == 1)

    def _live_request(self, gen: _Generation) -> Any:
        """vLLM's request object for ``gen``'s live request (keyed by our id plus a suffix), if running."""
        for key, request in self._scheduler().requests.items():
            if self._gen_id_of(key) == gen.spec.gen_id:
                return request if request.status == RequestStatus.RUNNING else None
        return None

    def _gen_id_of(self, vllm_request_id: str) -> str | None:
        """The generation behind a vLLM request id: vLLM keys its requests by ours plus "-" and a suffix."""
        return self._by_request.get(vllm_request_id) or self._by_request.get(vllm_request_id.rpartition("-")[0])

    def _stop_request(self, gen: _Generation) -> None:
        if gen.paused is not None:
            gen.paused = None
            del self._paused[gen.spec.gen_id]
        request_id, gen.request_id = gen.request_id, None
        if request_id is not None:
            del self._by_request[request_id]
            self._engine.abort_request([request_id])

    def _record(self, gen: _Generation, out: Any, result: StepOutput) -> None:
        gen_id = gen.spec.gen_id
        completion = out.outputs[0]
        if gen.awaiting_first_output:
            gen.awaiting_first_output = False
            result.started[gen_id] = gen.resume_info(out.num_cached_tokens or 0, self.block_size)
        if completion.token_ids:
            gen.output_ids.extend(completion.token_ids)
            result.new_tokens[gen_id] = list(completion.token_ids)
        if out.finished:
            if gen.request_id is not None:
                self._by_request.pop(gen.request_id, None)
            gen.request_id = None
            reason = completion.finish_reason
            if reason in ("stop", "length"):
                result.finished[gen_id] = "eos" if reason == "stop" else "length"
            else:
                result.failed[gen_id] = f"vLLM ended the request: {reason}"

    def _record_preemptions(self, result: StepOutput) -> None:
        """vLLM's own recompute preemptions this step. vLLM does not say how much of a preempted
        request's context its prefix cache serves back, so the recomputed tokens counted are all
        the tokens it held (an upper bound). A paused request vLLM preempted is aborted: resumed by
        vLLM, it would decode unasked."""
        preempted_paused = []
        for request in self._scheduler().requests.values():
            gen_id = self._gen_id_of(request.request_id)
            gen = self._gens.get(gen_id) if gen_id is not None else None
            if gen_id is not None and gen is not None and request.num_preemptions > gen.preemptions:
                gen.preemptions = request.num_preemptions
                result.preempted.append(gen_id)
                result.recomputed_tokens += request.num_tokens
                if gen.paused is not None:
                    preempted_paused.append(gen)
        for gen in preempted_paused:
            self._stop_request(gen)

    def _fail_running(self, began: float, cause: str) -> StepOutput:
        result = StepOutput(duration=time.perf_counter() - began)
        for gen in list(self._gens.values()):
            if gen.request_id is None:
                continue
            result.failed[gen.spec.gen_id] = cause
            with contextlib.suppress(Exception):  # vLLM may have lost the request already
                self._stop_request(gen)
        return result

    def _block_pool(self) -> Any:
        return self._scheduler().kv_cache_manager.block_pool

    def _scheduler(self) -> Any:
        return self._engine.engine_core.engine_core.scheduler


def _create_engine(model: str | Path | None, kv_cache_gib: float | None, kv_offloading_gib: float | None,
                   slots: dict[str, int], engine_args: dict[str, Any]) -> tuple[LLMEngine, Any]:
    """vLLM's engine in this process, with the settings our loop relies on, and its config."""
    check_fields(engine_args)
    # In process (our scheduler reads vLLM's); tensor parallel workers are still processes of their own.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # Model Runner V2 (the CUDA default since vLLM 0.25) takes logits processors
    # of another interface and rejects ForcedTokensProcessor; CPU runs V1 anyway.
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    args = EngineArgs(
        **(_model_args(model) | engine_args | slots),
        kv_cache_memory_bytes=int(kv_cache_gib * GIB) if kv_cache_gib else None,
        enable_prefix_caching=True,
        async_scheduling=False,
        logits_processors=[ForcedTokensProcessor],
        **_offloading_args(kv_offloading_gib),
    )
    config = create_config(args, engine_args)
    return LLMEngine.from_vllm_config(config, disable_log_stats=args.disable_log_stats), config


def _request_slots(max_batch: int | None, paused_slots: int) -> dict[str, int]:
    """vLLM's ``max_num_seqs`` for batch cap ``max_batch`` (none given: vLLM's default, no room kept for paused
    requests)."""
    if (max_batch or 0) < 0 or paused_slots < 0:
        raise ValueError(f"max_batch and paused_slots must be >= 0, got {max_batch} and {paused_slots}")
    return {"max_num_seqs": max_batch + paused_slots} if max_batch else {}


def _model_args(model: str | Path | None) -> dict[str, Any]:
    """What vLLM loads and, for the shipped models, their dtype (a ``dtype`` engine argument wins)."""
    path, dtype = resolve_model("tiny" if model is None else model)
    return {"model": path} | ({"dtype": dtype} if dtype else {})


def _offloading_args(gib: float | None) -> dict[str, Any]:
    if gib is None:
        return {}
    if current_platform.is_cpu():
        raise ValueError(
            "KV offloading needs a GPU: vLLM's CPU build already keeps its KV cache "
            "in host memory and refuses an offloading buffer"
        )
    if "kv_offloading_size" not in {f.name for f in dataclasses.fields(EngineArgs)}:
        raise ValueError("this vLLM version has no KV offloading (kv_offloading_size)")
    return {"kv_offloading_size": gib}


def _forced_tail(spec: GenerationSpec, eos: int) -> list[int] | None:
    """The plan's ids not generated yet, then EOS; None when not forcing."""
    if spec.forced_ids is None:
        return None
    return [*spec.forced_ids[len(spec.sampled_ids) :], eos]


def _device_name(tensor_parallel_size: int) -> str:
    """What the engine runs on, for the node's diagnostics: ``cpu``, or e.g. ``cuda: NVIDIA H100 x2``."""
    if current_platform.is_cpu():
        return "cpu"
    name = f"{current_platform.device_type}: {current_platform.get_device_name()}"
    return name + (f" x{tensor_parallel_size}" if tensor_parallel_size > 1 else "")
