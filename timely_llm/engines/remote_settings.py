"""The remote engine's settings, one source for the node's ``remote.*`` parameters and ``bench --remote``.

Light on purpose (no HTTP client): the node declares its parameters from here before any engine loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

PREFIX = "remote."
APIS = ("auto", "structured_outputs", "guided_grammar")


@dataclass(frozen=True)
class RemoteSettings:
    """The remote engine's settings: node parameters ``remote.<field>``, ``bench --remote FIELD=VALUE``."""

    url: tuple[str, ...]
    """Base URLs of the servers (``http://host:port`` or ``.../v1``)."""
    model: str = ""
    """The served model to use; "" = the server's only one."""
    api_key_env: str = ""
    """Name of the environment variable holding the servers' bearer token; "" = none."""
    tokenizer: str = ""
    """The served model's tokenizer files (directory or tokenizer.json); "" = the server's /tokenize."""
    max_num_seqs: int = 256
    """Most generations streaming from one server at once (its ``--max-num-seqs``)."""
    api: str = "auto"
    """How requests carry the grammar: structured_outputs (vLLM >= 0.10.2), guided_grammar (older), auto
    (by the server's /version)."""
    timeout: float = 60.0
    """Seconds a stream may go without a token before its generation fails."""

    def __post_init__(self) -> None:
        if not self.url or not all(self.url):
            raise ValueError("remote.url: give the base URL of at least one server (http://host:port/v1)")
        bad = [u for u in self.url if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"remote.url: not an http(s) URL: {bad[0]!r}")
        if self.api not in APIS:
            raise ValueError(f"remote.api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.max_num_seqs < 1 or self.timeout <= 0:
            raise ValueError("remote.max_num_seqs and remote.timeout must be positive")

    @classmethod
    def parse(cls, values: dict[str, object]) -> RemoteSettings:
        """From ``{field: value}`` (``remote.`` prefix optional); ``url`` a list or a comma/space separated string."""
        given: dict[str, Any] = {name.removeprefix(PREFIX): value for name, value in values.items()}
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ValueError(f"{PREFIX}{unknown[0]}: no such setting (known: {', '.join(known)})")
        url = given.get("url", ())
        urls = re.split(r"[,\s]+", url.strip()) if isinstance(url, str) else [str(u) for u in url]
        given["url"] = tuple(u for u in urls if u)
        for name, kind in (("max_num_seqs", int), ("timeout", float)):
            if name in given:
                given[name] = kind(given[name])
        return cls(**given)


def parameters() -> dict[str, tuple[object, str]]:
    """The node's ``remote.<field>`` parameters: (default, description) of each setting but ``url``'s default
    ("" where the node has no server)."""
    described = {f.name: (f.default if f.name != "url" else "", _DESCRIPTIONS[f.name]) for f in fields(RemoteSettings)}
    return {PREFIX + name: value for name, value in described.items()}


_DESCRIPTIONS = {
    "url": "engine remote: base URL of an OpenAI-compatible server (vllm serve), e.g. http://127.0.0.1:8000/v1; "
           "several comma separated",
    "model": "engine remote: the served model to use; empty = the server's only one",
    "api_key_env": "engine remote: name of the environment variable holding the servers' bearer token (the key "
                   "itself is never a parameter); empty = none",
    "tokenizer": "engine remote: the served model's tokenizer files (directory or tokenizer.json); empty = the "
                 "server's /tokenize and /detokenize",
    "max_num_seqs": "engine remote: most generations streaming from one server at once (its --max-num-seqs); "
                    "the node's batch cap is max_batch, at most this x servers",
    "api": "engine remote: how requests carry the grammar: auto (by the server's /version), structured_outputs "
           "(vLLM >= 0.10.2) or guided_grammar (older vLLM)",
    "timeout": "engine remote: seconds a stream may go without a token before its goal is aborted",
}
