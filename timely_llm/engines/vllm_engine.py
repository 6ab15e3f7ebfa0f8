"""An embedded vLLM engine: one ``LLMEngine.step()`` per ``Engine.step()``.

Suspending pauses the vLLM request where it is: it stays in vLLM's running list with
its KV blocks, grammar state and token ids, but vLLM's scheduler skips it (vllm_internals.pause), so a resume
decodes on at once
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

Everything this needs of vLLM beyond its public API is in vllm_internals.py, written for one vLLM version: the
engine refuses to start on another (vllm_version.VllmVersionError, one line).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from vllm import EngineArgs, LLMEngine
from vllm.platforms import current_platform

from timely_llm.engines.base import (
    Engine,
    EngineRejected,
    GenerationSpec,
    KvView,
    StepOutput,
    appends_observation,
)
from timely_llm.engines.forcing import ForcedTokensProcessor
from timely_llm.engines.hf_tokenizer import HfTokenizer
from timely_llm.engines.vllm_args import check_fields, create_config
from timely_llm.engines.vllm_internals import VllmCore, num_preemptions, num_tokens
from timely_llm.engines.vllm_requests import Generation, VllmRequests
from timely_llm.engines.vllm_version import check_version
from timely_llm.models import resolve_model

GIB = 1 << 30
CPU_BLOCK_SIZE = 32
"""KV block size on vLLM's CPU build unless a ``block_size`` engine argument says otherwise (vLLM's own default
there is 128, and 32 is the smallest it runs at full speed). The prefix cache hits whole blocks only: with 128 a
robot's task text after its cached robot prompt (20-70 tokens on SmolLM2) was prefilled at every start, even of a
task seen before, and each start cost a step 50 ms (docs/simulator.md, Fidelity)."""
PAUSED_SLOTS = 64
"""vLLM request slots beyond a given ``max_batch``, held by requests paused in place (they compute nothing).
With none to spare, every newcomer at a full capped batch aborted a paused request and its resume prefilled again:
229 of 233 resumes at cap 8 in a quiet bursty run, the response time normal robots paid (docs/simulator.md)."""


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
        refusal, or ``max_num_seqs`` given here, raises EngineArgsError (vllm_args); a vLLM of another version than
        the one vllm_internals was written for, VllmVersionError, before anything loads.
        """
        check_version()
        slots = _request_slots(max_batch, paused_slots)
        self._engine, config = _create_engine(model, kv_cache_gib, kv_offloading_gib, slots, engine_args)
        self._max_model_len: int = config.model_config.max_model_len
        self._vocab_size = self._engine.model_config.get_vocab_size()
        self.block_size: int = self._engine.vllm_config.cache_config.block_size
        self.tokenizer = HfTokenizer(self._engine.get_tokenizer())
        self.max_batch: int = max_batch or config.scheduler_config.max_num_seqs
        """The given cap, else vLLM's own max_num_seqs: the server's batch cap is at most this."""
        self.device: str = _device_name(config.parallel_config.tensor_parallel_size)
        self._gens: dict[str, Generation] = {}
        self._core = VllmCore(self._engine)
        self._requests = VllmRequests(self._engine, self._core, config.scheduler_config, self.block_size)

    def start(self, spec: GenerationSpec) -> None:
        gen = self._gens.get(spec.gen_id)
        if gen is not None and gen.paused is not None:
            if gen.output_ids == spec.output_ids and gen.spec.forced_ids == spec.forced_ids:
                self._unpause(gen)
                return
            if appends_observation(spec, gen.output_ids, gen.spec.forced_ids):
                self._append_in_place(gen, spec)
                return
            self._requests.stop(gen)
        if gen is not None and gen.request_id is not None:
            raise EngineRejected(f"{spec.gen_id} is already running")
        context = spec.prompt_ids + spec.output_ids
        max_tokens = self._check_startable(spec, context)
        self._requests.make_room(self.blocks_for(len(context) + 1), slot=True)
        gen = Generation(spec, list(spec.output_ids), starts=gen.starts if gen else 0)
        try:
            self._requests.submit(gen, context, max_tokens, _forced_tail(spec, self.tokenizer.eos_token_id),
                                  self._grammar_for(spec))
        except ValueError as exc:  # vLLM's own validation of the request
            raise EngineRejected(f"{spec.gen_id}: {exc}") from exc
        gen.starts += 1
        gen.context_tokens = len(context)
        gen.awaiting_first_output = True
        self._gens[spec.gen_id] = gen

    def suspend(self, gen_id: str) -> None:
        gen = self._gens[gen_id]
        if gen.request_id is None or gen.paused is not None:
            raise KeyError(f"{gen_id} is not running")
        if not self._requests.pause(gen):
            self._requests.stop(gen)  # still waiting or prefilling: nothing worth keeping in place

    def release(self, gen_id: str) -> None:
        self._requests.stop(self._gens.pop(gen_id))

    def step(self) -> StepOutput:
        self._requests.free_room_for_waiting()
        began = time.perf_counter()
        try:
            outputs = self._requests.step()
        except Exception as exc:  # any engine fault fails the batch
            return self._fail_running(began, f"vLLM step failed: {exc!r}")
        result = StepOutput(duration=time.perf_counter() - began)
        for out in outputs:
            gen_id = self._requests.generation_of(out.request_id)
            if gen_id is not None:
                self._record(self._gens[gen_id], out, result)
        self._record_preemptions(result)
        self._requests.make_room(self._requests.unpaused_count())  # each may need a block next step
        return result

    def free_kv_blocks(self) -> int:
        """Free blocks, counting those only paused requests hold: a newcomer gets them back."""
        return self._requests.free_blocks()

    def kv_after(self, suspended: Collection[str], resumed: Collection[str]) -> KvView:
        """Counts what each generation alone holds; blocks two of ``suspended`` share stay uncounted."""
        free = self.free_kv_blocks()
        for gen_id in set(suspended) - set(resumed):
            free += self._requests.held_alone(self._gens[gen_id])
        free -= sum(self._requests.reclaimable(g) for g in resumed)
        return KvView(free, self.blocks_to_start)

    def blocks_for(self, num_tokens: int) -> int:
        return self._requests.blocks_for(num_tokens)

    def output_ids(self, gen_id: str) -> list[int]:
        """Token ids ``gen_id`` has generated so far (all starts together)."""
        return list(self._gens[gen_id].output_ids)

    def reset_cache(self) -> None:
        """vLLM's prefix cache emptied (its public ``reset_prefix_cache``); refused while a generation is left."""
        if self._gens:
            raise RuntimeError(f"reset_cache with {len(self._gens)} generations still in the engine")
        if not self._engine.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache")

    def close(self) -> None:
        for gen_id in list(self._gens):
            self.release(gen_id)
        self._core.shutdown()

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

    def _unpause(self, gen: Generation) -> Any:
        """Let vLLM schedule ``gen``'s paused request again, its whole context kept; return the request."""
        request = self._requests.unpause(gen)
        gen.context_tokens = len(gen.spec.prompt_ids) + len(gen.output_ids)
        gen.awaiting_first_output = True
        gen.kept_tokens = gen.context_tokens
        return request

    def _append_in_place(self, gen: Generation, spec: GenerationSpec) -> None:
        """Resume ``gen``'s paused request with ``spec``'s observation after its output, its KV kept: vLLM prefills
        the observation and the call's last token (whose KV the pause never wrote)."""
        context = spec.prompt_ids + spec.output_ids
        max_tokens = self._check_startable(spec, context)
        request = self._unpause(gen)
        gen.kept_tokens = self._requests.append(request, spec.output_ids[len(gen.output_ids):], len(context),
                                                max_tokens, _forced_tail(spec, self.tokenizer.eos_token_id))
        gen.spec, gen.output_ids, gen.context_tokens = spec, list(spec.output_ids), len(context)

    def _record(self, gen: Generation, out: Any, result: StepOutput) -> None:
        gen_id = gen.spec.gen_id
        completion = out.outputs[0]
        if gen.awaiting_first_output:
            gen.awaiting_first_output = False
            result.started[gen_id] = gen.resume_info(out.num_cached_tokens or 0, self.block_size)
        if completion.token_ids:
            gen.output_ids.extend(completion.token_ids)
            result.new_tokens[gen_id] = list(completion.token_ids)
        if out.finished:
            self._requests.ended(gen)
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
        for gen_id, request in self._requests.by_generation():
            gen = self._gens.get(gen_id)
            if gen is not None and num_preemptions(request) > gen.preemptions:
                gen.preemptions = num_preemptions(request)
                result.preempted.append(gen_id)
                result.recomputed_tokens += num_tokens(request)
                if gen.paused is not None:
                    preempted_paused.append(gen)
        for gen in preempted_paused:
            self._requests.stop(gen)

    def _fail_running(self, began: float, cause: str) -> StepOutput:
        result = StepOutput(duration=time.perf_counter() - began)
        for gen in list(self._gens.values()):
            if gen.request_id is None:
                continue
            result.failed[gen.spec.gen_id] = cause
            with contextlib.suppress(Exception):  # vLLM may have lost the request already
                self._requests.stop(gen)
        return result


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
        **(_model_args(model) | _cpu_block_args() | engine_args | slots),
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


def default_block_size() -> int | None:
    """The KV block size where no ``block_size`` engine argument is given: ``CPU_BLOCK_SIZE`` on vLLM's CPU build,
    else None (vLLM's own)."""
    return CPU_BLOCK_SIZE if current_platform.is_cpu() else None


def _cpu_block_args() -> dict[str, Any]:
    size = default_block_size()
    return {"block_size": size} if size else {}


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
