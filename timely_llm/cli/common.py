"""What the ``timely-llm`` commands share: argument types, the inputs they load, progress lines, the embedded engine
they build."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from timely_llm.errors import ConfigError
from timely_llm.models import MODEL_NAMES

DEFAULT_HW = "rtx4090-llama3-8b"


def _quiet_vllm_logging() -> None:
    """vLLM logs to stdout at INFO; send only its errors, to stderr, so results stay readable.

    Must run before vLLM is imported; variables already set in the environment win.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


# ----- argument types: a bad value is a one-line error before any work -----


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def _nonneg_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 0")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _in_file(text: str) -> str:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: no such file")
    return text


def _model_dir(text: str) -> str:
    from timely_llm.models.hub import is_hub_id

    if text in MODEL_NAMES or is_hub_id(text) and not Path(text).exists():
        return text
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no such model directory (nor a Hugging Face id org/name)")
    return text


def _add_vllm_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vllm-arg", action="append", default=[], type=_vllm_arg, metavar="KEY=VALUE",
                   help="a vLLM engine argument (any EngineArgs field but max_num_seqs, which follows the batch "
                        "cap, e.g. dtype=float16, tensor_parallel_size=2), repeatable; VALUE read as YAML; the "
                        "others as in the vllm section of config/timely_llm.yaml")


def _vllm_arg(text: str) -> tuple[str, object]:
    from timely_llm.engines.vllm_args import EngineArgsError, parse_assignment

    try:
        return parse_assignment(text)
    except EngineArgsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _checked_vllm_args(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """The --vllm-arg options as a dict, each a field the user may set (vLLM checks the values)."""
    from timely_llm.engines.vllm_args import EngineArgsError, check_fields

    given: dict[str, object] = {}
    for key, value in pairs:
        if key in given:
            raise ConfigError("--vllm-arg", None, f"{key} given twice")
        given[key] = value
    try:
        check_fields(given, "")
    except EngineArgsError as exc:
        raise ConfigError("--vllm-arg", None, str(exc)) from None
    return given


def _vllm_engine(model: str | None, pairs: list[tuple[str, object]], kv_cache_gib: float | None = None,
                 announce: str = "", max_batch: int | None = None,
                 options: Mapping[str, tuple[str, object]] | None = None):  # noqa: ANN202
    """The embedded vLLM engine with the shipped engine arguments (config/timely_llm.yaml), the command's own
    ``options`` (field: (its option, value)) and the --vllm-arg ones; vLLM's refusal is a ConfigError.
    ``kv_cache_gib`` and the batch cap ``max_batch`` (--max-batch): the shipped ones unless given. ``announce`` goes
    to stderr once the model and the arguments passed the checks made before vLLM loads (so a refusal there stays
    one line)."""
    from timely_llm.engines.vllm_args import EngineArgsError, engine_args, shipped_parameters
    from timely_llm.engines.vllm_version import check_version
    from timely_llm.models.hub import ModelNotReachable, check_if_hub_id

    try:
        check_if_hub_id(model or "")  # before vLLM's import: an unreachable Hub fails in seconds
    except ModelNotReachable as exc:
        raise ConfigError("--model", None, str(exc)) from None
    check_version()  # VllmVersionError, a ConfigError: before vLLM's import (checking the arguments imports it)
    try:
        arguments = engine_args(_checked_vllm_args(pairs), options or {}, source="")
    except EngineArgsError as exc:
        raise ConfigError("--vllm-arg", None, str(exc)) from None
    if announce:
        print(announce, file=sys.stderr, flush=True)
    try:
        from timely_llm.engines.vllm_engine import VllmEngine

        shipped = shipped_parameters()
        return VllmEngine(model, kv_cache_gib=kv_cache_gib or shipped["kv_cache_gib"],
                          max_batch=max_batch or shipped["max_batch"], **arguments)
    except (EngineArgsError, ModelNotReachable) as exc:
        raise ConfigError("--vllm-arg" if isinstance(exc, EngineArgsError) else "--model", None, str(exc)) from None


def _out_file(text: str) -> str:
    """A file we can write: checked before the run, so a long run is not lost at the end."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r}: not writable")
    return text


def _out_dir(text: str) -> str:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: {str(existing)!r} is not writable")
    return text


