"""A Hugging Face model id as ``model``: vLLM downloads it, but only a machine that can reach the Hub finds out fast.

Left to itself, vLLM retries an unreachable Hub five times with back-off (measured here: 23 s before its
multi-line error). :func:`check_hub_model` answers first, within seconds: a model already in the local
Hugging Face cache is fine (vLLM then loads it from there); otherwise the Hub must serve the model's config.json
metadata within :data:`PROBE_TIMEOUT_S`, and with ``HF_HUB_OFFLINE`` set nothing is downloaded at all.
"""

from __future__ import annotations

import re
from pathlib import Path

PROBE_TIMEOUT_S = 5.0
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]$")
"""``org/name``: what the Hub accepts as a model repository id."""


class ModelNotReachable(RuntimeError):
    """A Hub model that is neither cached nor downloadable now: ``str()`` is one line."""


def is_hub_id(model: str) -> bool:
    return bool(HUB_ID.match(model)) and ".." not in model


def check_if_hub_id(model: str) -> None:
    """:func:`check_hub_model` for a ``model`` that names a Hub id (not a shipped name nor an existing path):
    callers run it before importing vLLM, which alone takes several seconds."""
    if is_hub_id(model) and not Path(model).exists():
        check_hub_model(model)


def check_hub_model(repo_id: str) -> None:
    """Return if vLLM can load ``repo_id`` (cached, or the Hub answers); else raise ModelNotReachable."""
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    local = (f"download it where the Hub is reachable (hf download {repo_id}) into the Hugging Face cache, "
             f"or set model to a local directory holding config.json")
    if constants.HF_HUB_OFFLINE:
        raise ModelNotReachable(f"model {repo_id!r} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
                                f"and HF_HUB_OFFLINE is set: {local}")
    reason = _probe(repo_id)
    if reason is not None:
        raise ModelNotReachable(f"model {repo_id!r}: cannot get its config.json from {constants.ENDPOINT} ({reason}) "
                                f"and it is not in the Hugging Face cache ({constants.HF_HUB_CACHE}): {local}")


def _probe(repo_id: str) -> str | None:
    """None if the Hub serves ``repo_id``'s config.json (its metadata: nothing is downloaded) within
    PROBE_TIMEOUT_S, else why not: unreachable, no answer, not found, gated ..."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=PROBE_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - connection, HTTP and Hub errors alike: vLLM could not load it
        return " ".join(str(exc).split()) or type(exc).__name__
    return None
