"""The calibrated serving simulator: iteration-level continuous batching on a model clock.

It replays recorded plans (``forced_ids``) token by token. Each ``step()`` prefills
the generations started since the last step (only what the prefix cache misses)
and decodes one token for every other running generation; its duration comes from
the hardware profile. When a running generation needs a block and none is free,
the lowest-priority one (the most recently started among equals) is preempted and
recomputed later, as vLLM does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, replace

from timely_llm.engines.base import (
    Engine,
    EngineRejected,
    GenerationSpec,
    KvView,
    ResumeInfo,
    StepOutput,
    Tokenizer,
    appends_observation,
    trailing_observation,
)
from timely_llm.engines.block_manager import BlockManager, OutOfBlocks
from timely_llm.engines.hardware import HardwareProfile
from timely_llm.engines.hf_tokenizer import model_tokenizer
from timely_llm.engines.sim_tokenizer import SimTokenizer


@dataclass
class _Generation:
    spec: GenerationSpec
    output: list[int]
    prefilled: bool = False
    preempted: bool = False
    """Its KV was dropped by a preemption: the next prefill recomputes it."""
    unwritten: int = 1
    """Tokens at the end of ``output`` whose KV the next step writes: the last sampled one, and after an
    observation appended in place the observation too."""

    @property
    def context(self) -> list[int]:
        return self.spec.prompt_ids + self.output


def zero_time(profile: HardwareProfile) -> HardwareProfile:
    """``profile`` with steps that take no time (same KV memory): what a run then costs is the serving
    loop's own work, with the engine's bookkeeping."""
    return replace(profile, name=f"{profile.name}-zero-time", step=dict.fromkeys(profile.step, 0.0))


class SimEngine(Engine):
    def __init__(self, profile: HardwareProfile, tokenizer: Tokenizer | None = None,
                 suspends_in_place: bool = False) -> None:
        """``suspends_in_place``: model the embedded vLLM engine's suspension, which keeps a generation's
        KV blocks until a newcomer needs them (a resume then prefills nothing); by default a suspension
        drops them to the prefix cache, as the profiles were measured."""
        self.profile = profile
        self.tokenizer = tokenizer or (model_tokenizer(profile.tokenizer) if profile.tokenizer else SimTokenizer())
        self.block_size = profile.block_tokens
        self.blocks = BlockManager(profile.num_kv_blocks, self.block_size)
        self.suspends_in_place = suspends_in_place
        self._running: dict[str, _Generation] = {}
        self._suspended: set[str] = set()
        self._paused: dict[str, _Generation] = {}
        """Suspended in place, oldest first: the first to drop their blocks when memory runs short."""
        self._resumed: list[str] = []

    def start(self, spec: GenerationSpec) -> None:
        if spec.gen_id in self._running:
            raise EngineRejected(f"{spec.gen_id} is already running")
        paused = self._paused.pop(spec.gen_id, None)
        if paused is not None and paused.output == spec.output_ids:
            self._running[spec.gen_id] = paused
            self._resumed.append(spec.gen_id)
            return
        if paused is not None and appends_observation(spec, paused.output, paused.spec.forced_ids):
            paused.unwritten += len(spec.output_ids) - len(paused.output)
            paused.spec, paused.output = spec, list(spec.output_ids)
            self._running[spec.gen_id] = paused
            return
        if paused is not None:
            self._drop(paused)
        if spec.forced_ids is None:
            raise EngineRejected("the simulator replays recorded plans only: give the request a trace")
        if not spec.prompt_ids:
            raise EngineRejected("empty prompt")
        total = len(spec.prompt_ids) + len(spec.output_ids)
        if total + 1 > self.profile.max_model_len:
            raise EngineRejected(f"context of {total} tokens exceeds max_model_len {self.profile.max_model_len}")
        if self.blocks_for(total + 1) > self.blocks.num_blocks:
            raise EngineRejected(f"context of {total} tokens cannot fit in KV memory")
        self._suspended.discard(spec.gen_id)
        self._running[spec.gen_id] = _Generation(spec, list(spec.output_ids))

    def suspend(self, gen_id: str) -> None:
        gen = self._running.pop(gen_id)  # KeyError when not running, as the Engine contract says
        if self.suspends_in_place and gen.prefilled:
            self._paused[gen_id] = gen
        else:
            self._drop(gen)

    def release(self, gen_id: str) -> None:
        if gen_id in self._paused:
            self._drop(self._paused.pop(gen_id))
        if gen_id in self._suspended:
            self._suspended.remove(gen_id)
            return
        del self._running[gen_id]
        self.blocks.release(gen_id)

    def reset_cache(self) -> None:
        if self._running or self._suspended or self._paused:
            raise RuntimeError("reset_cache with generations still in the engine")
        self.blocks = BlockManager(self.profile.num_kv_blocks, self.block_size)

    def free_kv_blocks(self) -> int:
        """Free blocks, counting those paused generations hold: a newcomer gets them back."""
        return self.blocks.free_blocks + sum(self.blocks.held(gen_id) for gen_id in self._paused)

    def kv_after(self, suspended: Collection[str], resumed: Collection[str]) -> KvView:
        if not suspended and not resumed:
            return KvView(self.free_kv_blocks(), self.blocks_to_start)
        pausing = {g for g in suspended if self.suspends_in_place and self._running[g].prefilled}
        paused = (self._paused.keys() | pausing) - set(resumed)
        free, freed = self.blocks.free_after([g for g in suspended if g not in pausing], paused)
        return KvView(free, lambda token_ids: self.blocks.blocks_to_allocate(token_ids, freed))

    def _drop(self, gen: _Generation) -> None:
        """Suspend by dropping the KV: its blocks stay in the prefix cache until reused."""
        self.blocks.release(gen.spec.gen_id)
        gen.prefilled, gen.unwritten = False, 1
        self._suspended.add(gen.spec.gen_id)

    def _reclaim(self) -> bool:
        """Drop the oldest paused generation's KV; False when none is paused."""
        if not self._paused:
            return False
        gen_id = next(iter(self._paused))
        self._drop(self._paused.pop(gen_id))
        return True

    def blocks_for(self, num_tokens: int) -> int:
        return self.blocks.blocks_for(num_tokens)

    def blocks_to_start(self, token_ids: list[int]) -> int:
        return self.blocks.blocks_to_allocate(token_ids)

    def running_ids(self) -> list[str]:
        return list(self._running)

    def step(self) -> StepOutput:
        out = StepOutput(duration=0.0)
        prefills: list[tuple[int, int]] = []
        decode_contexts: list[int] = []
        decoding: list[str] = []
        scheduled: list[_Generation] = []
        preempted: dict[str, None] = {}  # in preemption order
        self._note_resumed(out)
        for gen in list(self._running.values()):
            if gen.spec.gen_id in preempted:
                continue
            if not gen.prefilled:
                info = self._prefill(gen)
                if info is None:
                    continue
                out.started[gen.spec.gen_id] = info
                if gen.preempted:
                    gen.preempted = False
                    out.recomputed_tokens += info.context_tokens - info.cached_tokens
                prefills.append((max(info.context_tokens - info.cached_tokens, 1), info.context_tokens))
            elif gen.unwritten > 1:  # an observation appended in place: prefill it with the call's last token
                appended = gen.unwritten
                if not self._grow(gen, preempted):
                    continue
                out.started[gen.spec.gen_id] = ResumeInfo(len(gen.context), len(gen.context) - appended)
                prefills.append((appended, len(gen.context)))
            elif not self._grow(gen, preempted):
                continue
            else:
                decode_contexts.append(len(gen.context))
                decoding.append(gen.spec.gen_id)
            scheduled.append(gen)
        out.preempted = list(preempted)
        if scheduled:
            out.duration = self.profile.step_time(prefills, decode_contexts, self._reread(decoding))
        for gen in scheduled:
            self._emit_token(gen, out)
        return out

    def _note_resumed(self, out: StepOutput) -> None:
        """The generations resumed since the last step go on where they were: their whole context is cached."""
        for gen_id in self._resumed:
            if gen_id in self._running:
                context = len(self._running[gen_id].context)
                out.started[gen_id] = ResumeInfo(context, context, evicted=False)
        self._resumed.clear()

    def _reread(self, decoding: list[str]) -> int:
        """Context tokens of ``decoding`` in blocks another of them holds too (only where the profile prices them
        apart: counting costs a pass over every block table)."""
        if not self.profile.reads_shared_kv_once or len(decoding) < 2:
            return 0
        holders = Counter(block for gen_id in decoding for block in self.blocks.tables[gen_id])
        return sum(n - 1 for n in holders.values()) * self.block_size

    def _prefill(self, gen: _Generation) -> ResumeInfo | None:
        context = gen.context
        while True:
            try:
                cached = self.blocks.allocate(gen.spec.gen_id, context)
                break
            except OutOfBlocks:
                if not self._reclaim():
                    return None  # waits for memory; the batch controller normally prevents this
        gen.prefilled = True
        # Like vLLM, the last token is always computed to produce logits, and the last sampled
        # token of a suspended generation never had its KV written, nor an observation appended after it:
        # only full blocks of the context before them can hit.
        appended = trailing_observation(gen.spec.observed, len(gen.output))
        cacheable = ((len(context) - 1 - appended) // self.block_size) * self.block_size
        cached = min(cached, len(context) - 1)
        return ResumeInfo(len(context), cached, evicted=bool(gen.output) and cached < cacheable)

    def _grow(self, gen: _Generation, preempted: dict[str, None]) -> bool:
        """Write the unwritten tokens' KV; preempt the newest generation when no block is free."""
        while True:
            try:
                self.blocks.append(gen.spec.gen_id, gen.output[-gen.unwritten:])
                gen.unwritten = 1
                return True
            except OutOfBlocks:
                if self._reclaim():
                    continue
                victim = self._victim(preempted)
                self.blocks.release(victim.spec.gen_id)
                victim.prefilled, victim.unwritten = False, 1
                victim.preempted = True
                preempted[victim.spec.gen_id] = None
                if victim is gen:
                    return False

    def _victim(self, preempted: dict[str, None]) -> _Generation:
        """vLLM's choice: the lowest-priority running generation, the latest started among equals
        (so under FCFS, where every priority is 0, simply the latest started)."""
        candidates = [g for g in reversed(self._running.values()) if g.prefilled and g.spec.gen_id not in preempted]
        return max(candidates, key=lambda g: g.spec.priority)

    def _emit_token(self, gen: _Generation, out: StepOutput) -> None:
        spec = gen.spec
        position = len(gen.output) - sum(end - begin for begin, end in spec.observed)  # tokens sampled so far
        forced = spec.forced_ids or []
        if position >= len(forced):
            out.finished[spec.gen_id] = "eos"
            out.new_tokens.setdefault(spec.gen_id, [])
            return
        token = forced[position]
        gen.output.append(token)
        out.new_tokens[spec.gen_id] = [token]
        if position + 1 >= spec.max_new_tokens:
            out.finished[spec.gen_id] = "length"
