"""Trace forcing: a vLLM (V1) logits processor that replays recorded token ids.

A request opts in by carrying ``SamplingParams.extra_args[FORCED_KEY]``: the token
ids it must emit from its first sampled token on, ending with EOS. The k-th
sampled token of the vLLM request is forced to ``forced[k]``; on a resume the
engine passes only the not-yet-generated tail of the plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

if TYPE_CHECKING:
    from vllm.config import VllmConfig

FORCED_KEY = "timely_forced_ids"


def forced_ids_of(params: SamplingParams) -> list[int] | None:
    """The forced tail a request carries, or None when it decodes freely."""
    return (params.extra_args or {}).get(FORCED_KEY)


class ForcedTokensProcessor(LogitsProcessor):
    """Masks every logit but the forced one for requests that carry a plan."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        # batch index -> (forced ids, live reference to the request's output ids)
        self._reqs: dict[int, tuple[list[int], list[int]]] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        forced = forced_ids_of(sampling_params)
        if forced is None:
            return
        if not forced or not all(isinstance(t, int) for t in forced):
            raise ValueError(f"{FORCED_KEY} must be a non-empty list of token ids")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._reqs, batch_update, _forcing_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._reqs:
            return logits
        rows = list(self._reqs)
        tokens = [_next_forced(*self._reqs[row]) for row in rows]
        row_idx = torch.tensor(rows, device=logits.device)
        tok_idx = torch.tensor(tokens, device=logits.device)
        logits[row_idx] = float("-inf")
        logits[row_idx, tok_idx] = 0.0
        return logits


def _forcing_state(
    params: SamplingParams, _prompt_ids: list[int] | None, output_ids: list[int]
) -> tuple[list[int], list[int]] | None:
    forced = forced_ids_of(params)
    return None if forced is None else (forced, output_ids)


def _next_forced(forced: list[int], output_ids: list[int]) -> int:
    return forced[min(len(output_ids), len(forced) - 1)]
