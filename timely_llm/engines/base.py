"""The small interface every engine implements: the simulator and embedded vLLM.

The server loop owns scheduling. An engine only runs the generations it is told
to run, one iteration per ``step()``, and reports the token ids each produced.
Suspending a generation keeps its context (KV cache where the engine can);
starting it again with the tokens generated so far resumes it.

The contract every engine keeps (test/test_engine_contract.py checks both):

* ``start`` raises ``EngineRejected`` for a generation it cannot run, including
  one that is already running; nothing else about the engine changes then.
* ``suspend`` applies to a running generation, ``release`` to any generation the
  engine knows (running, suspended, or ended by the engine itself). Either one
  on an id the engine does not know raises ``KeyError``: the server's request
  state machine knows exactly which generations the engine holds, so such a
  call is a bug to surface, not to ignore.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from timely_llm.plan.grammar import PlanGrammar


class Tokenizer(Protocol):
    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def encode_continuation(self, text: str) -> list[int]:
        """Ids of ``text`` written after other tokens (no special tokens such as BOS)."""
        ...

    def decode(self, ids: list[int]) -> str: ...


DEFAULT_MAX_NEW_TOKENS = 256
"""A plan's token budget when its request sets none (server, node parameter ``max_new_tokens``)."""


class EngineRejected(Exception):
    """The engine refuses a generation (too long for the context, invalid ids...)."""


@dataclass
class GenerationSpec:
    """What the server asks an engine to run (first start or resume)."""

    gen_id: str
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    """Tokens generated so far; non-empty on resume."""
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    """Budget for the whole generation, counting the sampled ids of ``output_ids``."""
    forced_ids: list[int] | None = None
    """A recorded plan to force-decode (trace replay): the ids to sample, observations not among them;
    None lets the model decide."""
    priority: int = 0
    """vLLM-style priority, lower first: the engine preempts the highest value (latest started among
    equals) when KV memory runs out."""
    grammar: PlanGrammar | None = None
    """Constrain decoding to this plan grammar, continued from the sampled ids of ``output_ids`` (engines
    that can)."""
    observed: tuple[tuple[int, int], ...] = ()
    """Spans ``[start, end)`` of ``output_ids`` that were never sampled: the observations the server wrote
    after blocking calls. They are context like any other token; the plan grammar, a forced plan and the
    token budget skip them."""

    @property
    def sampled_ids(self) -> list[int]:
        """``output_ids`` without the observations."""
        return sampled_ids(self.output_ids, self.observed)


def sampled_ids(output_ids: list[int], observed: tuple[tuple[int, int], ...]) -> list[int]:
    """``output_ids`` without the ``observed`` spans."""
    if not observed:
        return output_ids
    kept, start = [], 0
    for begin, end in observed:
        kept.extend(output_ids[start:begin])
        start = end
    return kept + output_ids[start:]


def most_cached(tokens: int, block_size: int) -> int:
    """The most of a context of ``tokens`` vLLM serves from its prefix cache: whole blocks short of the last
    token, which it computes for the next token's logits (``KVCacheManager.get_computed_blocks``)."""
    return max(tokens - 1, 0) // block_size * block_size


def trailing_observation(observed: tuple[tuple[int, int], ...] | list[tuple[int, int]], output_tokens: int) -> int:
    """Tokens of the observation that ends an output of ``output_tokens`` with ``observed`` spans: written after
    the last sampled token, new to the engine; 0 where the output ends with a sampled token."""
    if not observed or observed[-1][1] != output_tokens:
        return 0
    begin, end = observed[-1]
    return end - begin


def appends_observation(spec: GenerationSpec, output_ids: list[int], forced_ids: list[int] | None) -> bool:
    """``spec`` resumes a generation that had written ``output_ids`` (forcing ``forced_ids``) with an observation
    written after them, and nothing else changed: an engine that kept its KV need prefill only the observation."""
    done = len(output_ids)
    return (bool(spec.observed) and spec.observed[-1] == (done, len(spec.output_ids))
            and spec.output_ids[:done] == output_ids and spec.forced_ids == forced_ids)


@dataclass
class ResumeInfo:
    """How a (re)started generation's context was restored."""

    context_tokens: int
    """prompt + output tokens the engine had to hold for this start."""
    cached_tokens: int
    """Of those, how many were served from cache instead of prefilled."""
    evicted: bool = False
    """True when the generation's cached blocks had been evicted (or offloaded then lost)."""
    reported: bool = True
    """``cached_tokens`` is what the engine did; False where it cannot tell (the remote engine: its servers say
    only in their metrics) and gives 0."""


@dataclass
class StepOutput:
    """The outcome of one engine iteration."""

    duration: float
    """Seconds the iteration took: modelled by the simulator, measured for vLLM."""
    new_tokens: dict[str, list[int]] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)
    """gen_id -> reason ('eos' or 'length') for generations the engine ended itself."""
    failed: dict[str, str] = field(default_factory=dict)
    """gen_id -> cause, for generations the engine could not run."""
    started: dict[str, ResumeInfo] = field(default_factory=dict)
    """gen_id -> cache report, for generations whose context was (re)built this step."""
    preempted: list[str] = field(default_factory=list)
    """Generations the engine preempted this step to free KV memory (their KV dropped, recomputed later)."""
    recomputed_tokens: int = 0
    """Tokens prefilled again this step because a preemption had dropped their KV."""


@dataclass(frozen=True)
class KvView:
    """KV memory as the scheduler counts it while it decides (``Engine.kv_after``)."""

    free_blocks: int
    """What ``Engine.free_kv_blocks`` will say."""
    blocks_to_start: Callable[[list[int]], int]
    """What ``Engine.blocks_to_start`` will say."""


@dataclass(frozen=True)
class ServerHealth:
    """One server an engine serves through (``Engine.servers``), as the node's diagnostics show it."""

    url: str
    down: str | None
    """Why it is taken out; None while it answers."""
    down_since: float | None
    """Since when (wall clock, ``time.time()``) it has been down; None while it answers."""
    open_streams: int
    """Generations streaming from it now."""
    model: str = ""
    silent_s: float | None = None
    """How long its streams have sent no token, once so long that it is stalled (new generations go elsewhere);
    None while it is not."""


class Engine(ABC):
    tokenizer: Tokenizer
    block_size: int
    """KV block size in tokens."""
    max_batch: int | None = None
    """Most generations the engine runs at once (its batch cap); None for no limit."""
    suspends_in_place: bool = False
    """A suspension keeps the generation's KV where it is (until a newcomer needs the memory), so a
    resume prefills nothing; otherwise the KV goes to the prefix cache and a resume recomputes its tail."""
    resumes_resubmit: bool = False
    """A resume is a new request to a server: it pays the request's path and the server's queue, and the server
    prefills again the context's tail past its last full KV block (the remote engines)."""
    server_count: int = 1
    """Servers the engine spreads its batch over, each stepping its share at the same time."""
    steps_are_iterations: bool = True
    """A step's duration is one model iteration over the generations that got tokens in it, so the step-time
    models learn from it; False where a step only collects what servers streamed while the node waited (the
    remote engines): there the models keep the hardware profile's step times."""

    @abstractmethod
    def start(self, spec: GenerationSpec) -> None:
        """Add a generation to the running set (first start or resume).

        Raises EngineRejected when the engine cannot run it at all.
        """

    @abstractmethod
    def suspend(self, gen_id: str) -> None:
        """Stop decoding running ``gen_id``; keep its context cached for a later resume.

        Raises KeyError when ``gen_id`` is not running.
        """

    @abstractmethod
    def release(self, gen_id: str) -> None:
        """Forget ``gen_id`` (finished or canceled); its KV may be reused at once.

        Raises KeyError when the engine does not know ``gen_id``.
        """

    @abstractmethod
    def step(self) -> StepOutput:
        """Run one iteration over the running generations."""

    @abstractmethod
    def free_kv_blocks(self) -> int:
        """KV blocks available for new work now (cached-but-idle blocks count as free)."""

    @abstractmethod
    def kv_after(self, suspended: Collection[str], resumed: Collection[str]) -> KvView:
        """KV memory as it will be once the running generations ``suspended`` are suspended and the
        suspended ones ``resumed`` started again (with the tokens they hold); changes nothing."""

    @abstractmethod
    def blocks_for(self, num_tokens: int) -> int:
        """KV blocks a context of ``num_tokens`` occupies."""

    def blocks_to_start(self, token_ids: list[int]) -> int:
        """Free KV blocks (re)starting a generation on this context would take now.

        Prefix-cache hits on blocks other generations hold take none; engines that cannot
        tell count the whole context.
        """
        return self.blocks_for(len(token_ids))

    def servers(self) -> list[ServerHealth]:
        """The servers it serves through, each up or down (none for an engine in this process)."""
        return []

    def reset_cache(self) -> None:  # noqa: B027 - optional hook
        """Forget what finished requests left cached (prefix cache), so the next requests find the engine as a
        fresh one (with no generation of its own) would be: an engine kept across nodes (``EngineKeeper``)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release engine resources."""
