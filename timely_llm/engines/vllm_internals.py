"""The embedded engine's one door into vLLM's internals.

Suspend-in-place (vllm_engine.py) steers requests inside vLLM's engine core: a paused request stays in vLLM's
running list with its KV blocks, and a resume may continue it as a streaming-input session. vLLM has no public API
for that, so this module reaches into its in-process scheduler, its requests and its KV cache manager, and nothing
else in timely_llm does (``test/test_vllm_adapter.py`` holds it). It was written for one vLLM release,
``vllm_version.WRITTEN_FOR``, the one ``scripts/install_vllm.sh`` installs; ``vllm_version.check_version`` refuses
any other at engine start, in one line, rather than misbehaving where one of these internals changed.

What the engine may do here, and what each rests on in vLLM 0.32.0:

- **the requests**: :meth:`VllmCore.requests` (the scheduler's ``requests`` dict), :func:`is_running`,
  :func:`is_decoding`, :func:`num_tokens`, :func:`num_preemptions`, :func:`num_computed_tokens` (fields of
  ``vllm.v1.request.Request``);
- **pause and unpause** in place: :func:`pause`, :func:`unpause`, through the request's
  ``next_decode_eligible_step`` (vLLM's pipeline-parallel decode cadence: the scheduler skips a request until
  that step, so one set past any step is never scheduled);
- **append tokens** to a paused request, its KV kept: :meth:`VllmCore.append` (off the running list, the
  scheduler's ``_update_request_as_session`` with a ``StreamingUpdate``, then ``_enqueue_waiting_request``);
- **free and held blocks**: :meth:`VllmCore.free_blocks` (the block pool's free count),
  :meth:`VllmCore.blocks_held_alone` (the KV cache coordinator's blocks of one request with no other holder);
- **the batch**: :meth:`VllmCore.batch_size`, :meth:`VllmCore.running_count`,
  :meth:`VllmCore.waiting_head_tokens` (the scheduler's running and waiting queues);
- **the engine core** itself: :meth:`VllmCore.executor_name`, :meth:`VllmCore.shutdown`.

vLLM's request objects pass through the engine as opaque handles: only the functions here read or change them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

from vllm import LLMEngine

from timely_llm.engines.vllm_version import check_version

INTERNALS = ("engine_core", "_update_request_as_session", "_enqueue_waiting_request", "kv_cache_manager",
             "next_decode_eligible_step")
"""The names of vLLM's internals that no other Python file of the repository may name (test/test_vllm_adapter.py
reads them from here, so that it names none itself)."""

PAUSED = sys.maxsize
"""A paused request's ``next_decode_eligible_step``: vLLM's scheduler skips it until then."""

try:  # another vLLM that lacks these names is named as such
    from vllm.v1.request import RequestStatus, StreamingUpdate
except ImportError:
    check_version()
    raise


class VllmCore:
    """vLLM's engine core behind one in-process ``LLMEngine`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""

    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine

    def requests(self) -> Iterator[tuple[str, Any]]:
        """(vLLM's request id, its request) for each request vLLM's scheduler holds; vLLM keys a request by the id
        it was added with plus ``-`` and a suffix."""
        yield from self._scheduler().requests.items()

    def batch_size(self) -> int:
        """Requests running (paused ones too) or waiting: each takes one of vLLM's ``max_num_seqs`` slots."""
        scheduler = self._scheduler()
        return len(scheduler.running) + len(scheduler.waiting)

    def running_count(self) -> int:
        return len(self._scheduler().running)

    def waiting_head_tokens(self) -> int | None:
        """Tokens of the request next in vLLM's waiting queue (those holding KV after it), None when none waits."""
        scheduler = self._scheduler()
        queue = scheduler.waiting or scheduler.kv_holding_waiting
        return queue.peek_request().num_tokens if queue else None

    def free_blocks(self) -> int:
        """KV blocks vLLM's block pool has free (cached blocks nobody holds included)."""
        return self._scheduler().kv_cache_manager.block_pool.get_num_free_blocks()

    def blocks_held_alone(self, request: Any) -> int:
        """KV blocks only ``request`` holds: what aborting it would free."""
        blocks = self._scheduler().kv_cache_manager.coordinator.get_blocks(request.request_id)
        return sum(1 for group in blocks for block in group if block.ref_cnt == 1)

    def append(self, request: Any, appended: list[int], max_tokens: int, extra_args: dict | None) -> int:
        """Continue the running (unpaused) ``request`` with ``appended`` ids, its KV kept, as a streaming-input
        session with ``max_tokens`` more to sample; ``extra_args`` join its sampling parameters' own. vLLM's
        update drops the last sampled token (its KV unwritten) and appends the given ids as prompt: that token
        again, then ``appended``. Returns the context tokens whose KV was kept."""
        scheduler = self._scheduler()
        scheduler.running.remove(request)
        last_sampled = request.all_token_ids[request.num_computed_tokens:]
        params = request.sampling_params.clone()
        params.max_tokens = max_tokens
        if extra_args is not None:
            params.extra_args = {**(params.extra_args or {}), **extra_args}
        update = StreamingUpdate(mm_features=None, prompt_token_ids=last_sampled + appended, max_tokens=max_tokens,
                                 arrival_time=time.time(), sampling_params=params)
        scheduler._update_request_as_session(request, update)
        scheduler._enqueue_waiting_request(request)
        return num_computed_tokens(request)

    def executor_name(self) -> str:
        """The class name of vLLM's model executor (``UniProcExecutor``, ``MultiprocExecutor``)."""
        return type(self._engine.engine_core.engine_core.model_executor).__name__

    def shutdown(self) -> None:
        self._engine.engine_core.shutdown()

    def _scheduler(self) -> Any:
        return self._engine.engine_core.engine_core.scheduler


def pause(request: Any) -> None:
    """vLLM's scheduler skips ``request`` from now on; it keeps its place in the running list and its KV."""
    request.next_decode_eligible_step = PAUSED


def unpause(request: Any) -> None:
    """vLLM's scheduler schedules ``request`` again from its next step."""
    request.next_decode_eligible_step = 0


def is_running(request: Any) -> bool:
    """In vLLM's running list (a paused request too), not waiting, preempted or finished."""
    return request.status == RequestStatus.RUNNING


def is_decoding(request: Any) -> bool:
    """Its prompt prefilled: every token but the last sampled one has its KV."""
    return request.num_computed_tokens >= request.num_tokens - 1


def num_tokens(request: Any) -> int:
    """Prompt and output tokens together."""
    return request.num_tokens


def num_computed_tokens(request: Any) -> int:
    """Tokens whose KV vLLM has computed."""
    return request.num_computed_tokens


def num_preemptions(request: Any) -> int:
    """How often vLLM's scheduler has preempted ``request`` (its KV freed, to be recomputed)."""
    return request.num_preemptions
