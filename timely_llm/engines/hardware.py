"""Hardware profiles: the simulator's per-iteration latency model and KV memory.

One iteration (a continuous-batching step) takes

    base + [prefill_stall if the step prefills] + per_prefill_token * P
         + per_prefill_attention * sum_i(N_i * C_i) + per_decode_seq * B
         + per_kv_token * (K - R) + per_kv_reread * R

where prefill_stall is a fixed cost of any step that prefills (paper 004's c_p: switching from
decode to prefill; 0, the default, where prefills run inside the decode step as in vLLM V1's
chunked prefill and every shipped GPU profile), P is the number of tokens prefilled this step,
N_i / C_i the new tokens and resulting context length of each prefilling generation (TimeBill's quadratic
prefill term a*N^2 when nothing is cached), B the number of decoding generations
and K the total context they attend over (TimeBill's p*N_kv), R the part of it in KV blocks another
decoding generation of the step also attends over (the prefix cache's shared blocks, such as a fleet's robot
prompt). On a CPU such a block is read from memory once and then from the processor's caches:
``per_kv_reread`` is well below ``per_kv_token`` (vLLM CPU, SmolLM2, batch 8 over 960-token contexts sharing
896: 42 ms a step against 56 ms with nothing shared). A profile that leaves it out pays ``per_kv_token`` for
every token. KV memory is ``(total - weights - reserved)`` GiB split into blocks of ``block_tokens``.

An optional ``http:`` section makes it a profile of a server behind HTTP (``vllm serve``, the remote engine): its
``HTTP_TERMS`` are the seconds from a (re)start's POST to the request in the server's running set, and from the
end of the server's step to its tokens at the node, and how many such servers the node drives (default 1; the
steps and memory are each one's). ``sim_remote.py`` models the path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from timely_llm.errors import ConfigError, read_mapping
from timely_llm.models import MODEL_NAMES

PROFILE_DIR = Path(__file__).resolve().parent.parent / "hw"
STEP_TERMS = ("base", "per_prefill_token", "per_prefill_attention", "per_decode_seq", "per_kv_token", "prefill_stall",
              "per_kv_reread")
OPTIONAL_STEP_TERMS = {"prefill_stall": 0.0}
"""Step terms a profile may leave out, with their defaults (and ``per_kv_reread``: its ``per_kv_token``)."""
MEMORY_TERMS = ("total_gib", "weights_gib", "reserved_gib", "kv_bytes_per_token", "block_tokens")
HTTP_TERMS = ("request_overhead", "token_delay", "servers")
FITTED_PROFILES = {"smollm2": "cpu-2core-smollm2-135m"}
"""Shipped profiles ``timely-llm profile`` fitted to a model on vLLM CPU: by default, the step-time model of
TimeBill's estimator (feature timebill) when that model serves."""


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    step: dict[str, float]
    memory: dict[str, float]
    max_model_len: int
    tokenizer: str | None = None
    """A shipped model (``MODEL_NAMES``) whose tokenizer the simulator uses, so that prompts and plans have
    that model's token counts; None: the stand-in ``SimTokenizer`` (Llama-3-like counts)."""
    http: dict[str, float] | None = None
    """``HTTP_TERMS`` of a server behind HTTP; None: the engine is embedded in the node."""

    @property
    def block_tokens(self) -> int:
        return int(self.memory["block_tokens"])

    @property
    def num_kv_blocks(self) -> int:
        m = self.memory
        kv_bytes = (m["total_gib"] - m["weights_gib"] - m["reserved_gib"]) * 2**30
        return int(kv_bytes // (m["kv_bytes_per_token"] * m["block_tokens"]))

    @property
    def reads_shared_kv_once(self) -> bool:
        """A step's shared KV blocks cost less than its others (``step_time``'s ``reread`` matters)."""
        return self.step["per_kv_reread"] != self.step["per_kv_token"]

    def step_time(self, prefills: list[tuple[int, int]], decode_contexts: list[int], reread: int = 0) -> float:
        """Seconds for one iteration; ``prefills`` holds (new tokens, context length) pairs, ``reread`` the context
        tokens of the decoding generations in blocks another of them attends over too (R)."""
        s = self.step
        return (
            s["base"]
            + (s["prefill_stall"] if prefills else 0.0)
            + s["per_prefill_token"] * sum(n for n, _ in prefills)
            + s["per_prefill_attention"] * sum(n * c for n, c in prefills)
            + s["per_decode_seq"] * len(decode_contexts)
            + s["per_kv_token"] * (sum(decode_contexts) - reread)
            + s["per_kv_reread"] * reread
        )

    def to_dict(self) -> dict:
        return {"name": self.name, **({"tokenizer": self.tokenizer} if self.tokenizer else {}), "step": self.step,
                "memory": self.memory, "max_model_len": self.max_model_len,
                **({"http": self.http} if self.http is not None else {})}


def estimator_profile(given: str | None, simulated: bool, model: str | None, hw: str) -> HardwareProfile | None:
    """The step-time profile TimeBill's estimator uses: ``given``, else the simulator's own (``hw``, where the
    engine is ``simulated``) or the shipped fit of a real engine's model; None when there is none."""
    if given:
        return load_profile(given)
    if simulated:
        return load_profile(hw)
    fitted = FITTED_PROFILES.get(str(model))
    return load_profile(fitted) if fitted else None


def load_profile(name_or_path: str) -> HardwareProfile:
    """Load a profile by shipped name (``rtx4090-llama3-8b``) or by file path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    source = str(path)
    if not path.is_file():
        shipped = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
        raise ConfigError(name_or_path, None, f"neither a shipped hardware profile ({', '.join(shipped)}) nor a file")
    data = read_mapping(path)
    given = data.get("step")
    kv_token = given.get("per_kv_token") if isinstance(given, dict) else None
    step = _numbers(data, "step", STEP_TERMS, source, OPTIONAL_STEP_TERMS | {"per_kv_reread": kv_token})
    memory = _numbers(data, "memory", MEMORY_TERMS, source)
    max_len = data.get("max_model_len")
    if not isinstance(max_len, int) or max_len <= 0:
        raise ConfigError(source, "max_model_len", "must be a positive integer")
    tokenizer = data.get("tokenizer")
    if tokenizer is not None and tokenizer not in MODEL_NAMES:
        raise ConfigError(source, "tokenizer", f"must be one of {', '.join(MODEL_NAMES)}, got {tokenizer!r}")
    http = _numbers(data, "http", HTTP_TERMS, source, {"servers": 1}) if "http" in data else None
    if http is not None and (http["servers"] < 1 or not http["servers"].is_integer()):
        raise ConfigError(source, "http.servers", f"must be a whole number >= 1, got {http['servers']:g}")
    profile = HardwareProfile(str(data.get("name", path.stem)), step, memory, max_len, tokenizer, http)
    if profile.num_kv_blocks <= 0:
        raise ConfigError(source, "memory", "no memory left for the KV cache")
    return profile


def _numbers(data: dict, key: str, names: tuple[str, ...], source: str,
             defaults: dict[str, object] | None = None) -> dict[str, float]:
    section = data.get(key)
    if not isinstance(section, dict):
        raise ConfigError(source, key, "missing or not a mapping")
    out = {}
    for name in names:
        value = section.get(name, (defaults or {}).get(name))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(source, f"{key}.{name}", f"must be a number >= 0, got {value!r}")
        out[name] = float(value)
    return out


def save_profile(profile: HardwareProfile, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False))
