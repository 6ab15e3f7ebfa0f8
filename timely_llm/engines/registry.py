"""The engines the node can serve with: the one registry (``ENGINES``). Each entry holds everything an engine is to
the rest of the node: its name (the ``engine`` parameter's value), what builds it (``factory``), the prefix of its
own parameters, what it needs, and its description. The node's parameters and their descriptors, the loader,
status and ``/diagnostics``, the CLI's ``--engine`` choices and docs/node.md's engine table read it: adding an
engine is one entry here (and its own module)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from timely_llm.engines.base import Engine
from timely_llm.engines.remote_settings import PREFIX as REMOTE_PREFIX
from timely_llm.engines.vllm_args import PREFIX as VLLM_PREFIX


@dataclass(frozen=True)
class EngineSettings:
    """What a factory builds its engine from: the node's parameters (``param``), the engine's own ones (its
    prefix's, without the prefix), the batch cap and the engine arguments the policy sets (name: (who, value))."""

    param: Callable[[str], Any]
    own: Mapping[str, Any] = field(default_factory=dict)
    max_batch: int | None = None
    set_by_policy: Mapping[str, tuple[str, object]] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineKind:
    name: str
    description: str
    """What it is, for the ``engine`` parameter's description, ``--engine``'s help and the docs' table."""
    needs: str
    """What it needs to run (installed packages, a server, goals of a kind)."""
    factory: Callable[[EngineSettings], Engine]
    prefix: str = ""
    """Its own parameters' name prefix (``vllm.``), configure-time; empty where it has none."""
    model_parameter: str = "model"
    """The parameter naming the model it serves."""
    loads: tuple[str, str] = ("", "")
    """How configure names what it loads: a word and the parameter after it (``at``, ``remote.url``)."""
    open_parameters: bool = False
    """Its own parameters are any field of its library's (vLLM's EngineArgs), checked when it loads; else only
    those the node declares (``remote.url`` ...) exist, and another name under its prefix fails configure."""
    simulated: bool = False
    """Replays recorded plans on a simulated clock: goals need a ``trace_id``; its device is its hardware profile."""

    def loading(self, param: Callable[[str], Any]) -> str:
        """What configure says it loads: the engine and its model or servers (``loads``)."""
        word, name = self.loads
        return f"engine {self.name}" + (f" {word} {param(name)}" if name else "")

    @property
    def section(self) -> str:
        """Its section in a params file (``vllm:``), empty where it has no parameters of its own."""
        return self.prefix.rstrip(".")


def _vllm(settings: EngineSettings) -> Engine:
    from timely_llm.engines.vllm_args import engine_args, from_parameters
    from timely_llm.engines.vllm_version import check_version
    from timely_llm.models.hub import check_if_hub_id

    param = settings.param
    check_if_hub_id(param("model"))  # before vLLM's import: an unreachable Hub fails in seconds
    check_version()  # so does another vLLM than the one the engine's adapter was written for
    from timely_llm.engines.vllm_engine import VllmEngine

    given = from_parameters(dict(settings.own))
    return VllmEngine(param("model") or None, kv_cache_gib=param("kv_cache_gib"), max_batch=settings.max_batch,
                      **engine_args(given, dict(settings.set_by_policy)))


def _remote(settings: EngineSettings) -> Engine:
    from timely_llm.engines.remote import RemoteEngine
    from timely_llm.engines.remote_settings import RemoteSettings

    return RemoteEngine(RemoteSettings.parse(dict(settings.own)))


def _sim(settings: EngineSettings) -> Engine:
    from timely_llm.engines.hardware import load_profile
    from timely_llm.engines.sim_remote import simulator

    return simulator(load_profile(settings.param("hw_profile")))


VLLM_ENGINE = EngineKind("vllm", "embedded vLLM on the installed build's device (GPU or CPU)",
                  "vllm installed (pinned in requirements); a model: model", _vllm, prefix=VLLM_PREFIX,
                  loads=("model", "model"), open_parameters=True)
REMOTE_ENGINE = EngineKind("remote", "OpenAI-compatible vLLM servers at remote.url",
                    "one or more reachable vllm serve servers: remote.url", _remote, prefix=REMOTE_PREFIX,
                    model_parameter=REMOTE_PREFIX + "model", loads=("at", REMOTE_PREFIX + "url"))
SIM_ENGINE = EngineKind("sim", "calibrated simulator, replays LRTrace plans (of a remote server where its "
                        "hw_profile has an http section)",
                 "nothing installed; goals with a trace_id; a hardware profile: hw_profile", _sim, simulated=True)

ENGINES = {kind.name: kind for kind in (VLLM_ENGINE, REMOTE_ENGINE, SIM_ENGINE)}
ENGINE_PREFIXES = {kind.name: kind.prefix for kind in ENGINES.values() if kind.prefix}
"""Each engine's own parameters, by name prefix."""


def engine_kind(name: str) -> EngineKind:
    """The engine named ``name``; ValueError naming the known ones."""
    if name not in ENGINES:
        raise ValueError(f"parameter engine must be one of {', '.join(ENGINES)}, got {name!r}")
    return ENGINES[name]


def engines_help() -> str:
    """One line naming each engine and what it is."""
    return "; ".join(f"{kind.name}: {kind.description}" for kind in ENGINES.values())
