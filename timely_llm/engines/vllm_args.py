"""vLLM engine arguments as users give them: node parameters ``vllm.<field>``, ``--vllm-arg KEY=VALUE`` options.

Every field of vLLM's ``EngineArgs`` may be given and reaches vLLM as it is; vLLM itself checks the values when
the engine's configuration is created (:func:`create_config`), and any refusal becomes one line naming what was
given. The shipped defaults are the ``vllm:`` section of ``config/timely_llm.yaml`` (:func:`shipped_vllm_args`),
read by the node and the command line alike. A few fields are not the user's to set: the embedded engine needs
them as they are (:data:`FORCED`), or they have a name of their own here (:data:`RENAMED`).

No vLLM import at module level: the launch file and the node's parameter handling use this without vLLM.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from timely_llm.share import share_dir

PREFIX = "vllm."
"""Node parameters named ``vllm.<EngineArgs field>`` go to vLLM (``vllm: {field: value}`` in a params file)."""

FORCED: dict[str, str] = {
    "enable_prefix_caching": "a resumed generation re-reads its context from vLLM's prefix cache",
    "async_scheduling": "each engine step must return its tokens before the scheduler decides the next",
    "logits_processors": "plans are force-decoded through timely_llm's own logits processor",
}
"""EngineArgs fields the embedded engine sets itself, and why a user may not."""

RENAMED: dict[str, str] = {
    "model": "parameter model (CLI: --model)",
    "kv_cache_memory_bytes": "parameter kv_cache_gib",
    "max_num_seqs": "parameter max_batch (CLI: --max-batch), the batch cap; vLLM gets it plus slots for paused "
                    "generations",
}
"""EngineArgs fields set through a name of their own here."""


class EngineArgsError(ValueError):
    """An engine argument vLLM does not know or refuses: ``str()`` is one line naming it."""


def parse_assignment(text: str, sep: str = "=") -> tuple[str, Any]:
    """``KEY<sep>VALUE`` -> (KEY, VALUE read as a YAML scalar: ``8`` int, ``0.5`` float, ``true`` bool, ``{...}``
    a mapping, else the text), as ROS reads ``-p name:=value``."""
    key, found, value = text.partition(sep)
    key = key.strip()
    if not found or not key:
        raise EngineArgsError(f"{text!r}: expected KEY{sep}VALUE")
    try:
        return key, yaml.safe_load(value) if value.strip() else value
    except yaml.YAMLError:
        return key, value


def parse_assignments(items: Iterable[str], sep: str = "=") -> dict[str, Any]:
    """Several ``KEY<sep>VALUE`` items as a dict; a key given twice is an error."""
    args: dict[str, Any] = {}
    for item in items:
        key, value = parse_assignment(item, sep)
        if key in args:
            raise EngineArgsError(f"{key} given twice")
        args[key] = value
    return args


def shipped_parameters(path: Path | None = None) -> dict[str, Any]:
    """The node's parameters in the shipped params file (its single node section's ``ros__parameters``)."""
    path = path or share_dir() / "config" / "timely_llm.yaml"
    data = yaml.safe_load(path.read_text())
    (section,) = data.values()
    return dict(section["ros__parameters"])


def shipped_vllm_args() -> dict[str, Any]:
    """The shipped defaults of the vLLM engine arguments: the ``vllm:`` section of config/timely_llm.yaml."""
    return dict(shipped_parameters().get(PREFIX.rstrip(".")) or {})


def engine_args(given: Mapping[str, Any], set_here: Mapping[str, tuple[str, Any]],
                source: str = PREFIX) -> dict[str, Any]:
    """The arguments vLLM starts with: the shipped defaults, then the fields timely_llm sets (``set_here``: field ->
    (the option or parameter that sets it, value)), then the user's ``given`` fields. A given field that is set
    here is an EngineArgsError naming what sets it (``source`` prefixes the field's name)."""
    for name, (setter, _) in set_here.items():
        if name in given:
            raise EngineArgsError(f"{source}{name} is set by {setter}")
    return shipped_vllm_args() | {name: value for name, (_, value) in set_here.items()} | dict(given)


def from_parameters(values: Mapping[str, Any]) -> dict[str, Any]:
    """Engine arguments from the values of the node's ``vllm.<field>`` parameters, keyed by field.

    A ROS parameter holds no mapping, so a string that reads as a JSON object is given to vLLM as one
    (e.g. ``-p 'vllm.compilation_config:={"mode": 0}'``)."""
    return {name: _structured(value) for name, value in values.items()}


def check_fields(args: Mapping[str, Any], source: str = PREFIX) -> None:
    """EngineArgsError for a field EngineArgs lacks or one the user may not set; ``source`` prefixes names."""
    from vllm import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    for name in args:
        if name in FORCED:
            raise EngineArgsError(f"{source}{name}: set by timely_llm's engine, not configurable ({FORCED[name]})")
        if name in RENAMED:
            raise EngineArgsError(f"{source}{name}: set it through {RENAMED[name]}")
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {source}{close[0]}?)" if close else ""
            raise EngineArgsError(f"{source}{name}: vLLM has no engine argument {name!r}{hint}")


def create_config(engine_args: Any, given: Mapping[str, Any]) -> Any:
    """vLLM's ``VllmConfig`` for ``engine_args``; vLLM's refusal as an EngineArgsError naming the ``given``
    arguments (vLLM's own message, on one line)."""
    try:
        return engine_args.create_engine_config()
    except Exception as exc:  # noqa: BLE001 - vLLM raises ValueError, TypeError, pydantic's ValidationError ...
        settings = ", ".join(f"{PREFIX}{k}={v!r}" for k, v in given.items()) or "vLLM's defaults"
        raise EngineArgsError(f"vLLM refused the engine arguments ({settings}): {one_line(exc)}") from None


def one_line(exc: BaseException) -> str:
    """An exception's message on one line, without pydantic's documentation links."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(line for line in lines if not line.startswith("For further information")) or repr(exc)


def _structured(value: Any) -> Any:
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value
