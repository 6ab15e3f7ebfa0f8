"""The servers behind the remote engine: what each one serves, whether it answers, and how its stream reads.

Nothing here imports vLLM or torch: the node on a remote engine runs where neither is installed.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass

import httpx

PROBE_FIRST_S = 1.0
"""A server that failed is asked again after this, then twice as long each time it still fails ..."""
PROBE_MAX_S = 30.0
"""... up to this."""
PROBE_TIMEOUT_S = 2.0
STRUCTURED_OUTPUTS = "structured_outputs"
GUIDED_GRAMMAR = "guided_grammar"
FIRST_STRUCTURED_OUTPUTS = (0, 10, 2)
"""The first vLLM release with the ``structured_outputs`` field and ``return_token_ids``; older ones take
``guided_grammar`` and give token ids only as logprobs' ``token_id:N`` strings."""
_CACHE_INFO = re.compile(r'^vllm:cache_config_info\{(?P<labels>[^}]*)\}', re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def bearer_headers(api_key_env: str) -> dict[str, str]:
    """The bearer header from the named environment variable (none where no variable is named); the key itself is
    never logged nor a parameter. ValueError where the variable is not set."""
    if not api_key_env:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise ValueError(f"environment variable {api_key_env} is not set")
    return {"Authorization": f"Bearer {key}"}


class ServerGarbage(ValueError):
    """A server's answer is not what an OpenAI-compatible completion stream says."""


@dataclass(frozen=True)
class ServedModel:
    """What a server told about itself when the engine started."""

    model: str
    max_model_len: int | None
    api: str
    """``structured_outputs`` or ``guided_grammar``: how requests carry the grammar and get token ids."""
    version: str | None
    block_size: int | None
    """Its KV block size in tokens and ..."""
    kv_blocks: int | None
    """... how many blocks its KV cache holds (vLLM's ``vllm:cache_config_info`` metric), where it says."""


def base_url(url: str) -> str:
    """The server's root from a URL given with or without the OpenAI ``/v1`` suffix."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class RemoteServer:
    """One server: its root URL, what it serves, the streams open on it and whether it answers."""

    def __init__(self, url: str) -> None:
        self.url = base_url(url)
        self.served: ServedModel | None = None
        self.open = 0
        """Streams open on it now."""
        self.quiet_since = 0.0
        """When (``time.monotonic``) its open streams last sent a token, or the first of them opened."""
        self.stalled_since: float | None = None
        """Since when its streams have sent no token, once that lasted long enough to stall it; None again at its
        next token."""
        self.down: str | None = None
        """Why it is taken out (None while it answers) ..."""
        self.down_since: float | None = None
        """... and since when (wall clock, for the node's diagnostics)."""
        self._backoff = PROBE_FIRST_S
        self.next_probe = 0.0

    @property
    def api(self) -> str:
        """The completion API of what it serves (a server is placed on only once described)."""
        assert self.served is not None
        return self.served.api

    def describe(self, client: httpx.Client, model: str, api: str) -> ServedModel:
        """Ask the server what it serves (``model``: the one to use, "" for its only one); raises httpx errors
        or ServerGarbage."""
        models = _json(client.get(f"{self.url}/v1/models"), "/v1/models")
        try:
            cards = {card["id"]: card for card in models["data"]}
        except (KeyError, TypeError) as exc:
            raise ServerGarbage(f"/v1/models without a list of models: {exc!r}") from None
        if not model:
            if len(cards) != 1:
                raise ServerGarbage(f"serves {len(cards)} models ({', '.join(cards)}): set remote.model")
            model = next(iter(cards))
        elif model not in cards:
            raise ServerGarbage(f"does not serve model {model!r} (it serves {', '.join(cards) or 'none'})")
        version = _version(client, self.url)
        block_size, kv_blocks = _cache_info(client, self.url)
        max_len = cards[model].get("max_model_len")
        self.served = ServedModel(model, max_len if isinstance(max_len, int) else None, _api(api, version),
                                  version, block_size, kv_blocks)
        return self.served

    def opened(self, now: float) -> None:
        """A stream opened on it."""
        if self.open == 0:
            self.quiet_since = now
        self.open += 1

    def closed(self) -> None:
        self.open -= 1

    def heard(self, now: float) -> None:
        """One of its streams sent a token."""
        self.quiet_since = now
        self.stalled_since = None

    def stalled(self, now: float, silence: float) -> bool:
        """Whether it is stalled: its open streams went ``silence`` seconds without a token, and none came since."""
        if self.open and now - self.quiet_since >= silence:
            self.stalled_since = self.quiet_since
        return self.stalled_since is not None

    def failed(self, cause: str, now: float) -> None:
        """Take the server out until a probe finds it answering again."""
        if self.down is None:
            self._backoff = PROBE_FIRST_S
            self.down_since = time.time()
        self.down = cause
        self.next_probe = now + self._backoff

    def probed(self, answered: bool, now: float) -> None:
        if answered:
            self.down = self.down_since = None
            return
        self._backoff = min(2 * self._backoff, PROBE_MAX_S)
        self.next_probe = now + self._backoff


def stalled_beside_one_answering(servers: list[RemoteServer], now: float, silence: float) -> bool:
    """Whether a server is stalled (``RemoteServer.stalled``) while another answers."""
    stalled = [s.stalled(now, silence) for s in servers]
    return any(stalled) and any(not stuck and s.down is None and s.served is not None
                                for s, stuck in zip(servers, stalled, strict=True))


def failure_cause(exc: Exception) -> str:
    """How a server failed, in words: what ServerGarbage says, else the exception's type and message."""
    if isinstance(exc, ServerGarbage):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def probe(client: httpx.AsyncClient, server: RemoteServer) -> None:
    """Ask a server that was taken out whether it answers again (``/health``)."""
    try:
        answer = await client.get(f"{server.url}/health", timeout=PROBE_TIMEOUT_S)
        answered = answer.status_code == 200
    except httpx.HTTPError:
        answered = False
    server.probed(answered, time.monotonic())


def request_body(model: str, api: str, context: list[int], max_tokens: int, grammar: str | None,
                 priority: int) -> dict:
    """A streaming, greedy completion of ``context`` (token ids) that returns token ids, in ``api``'s words."""
    body: dict = {"model": model, "prompt": context, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    if api == STRUCTURED_OUTPUTS:
        body["return_token_ids"] = True
        if grammar is not None:
            body["structured_outputs"] = {"grammar": grammar}
    else:
        body |= {"logprobs": 0, "return_tokens_as_token_ids": True}
        if grammar is not None:
            body["guided_grammar"] = grammar
    if priority:  # a server without priority scheduling refuses any other value
        body["priority"] = priority
    return body


@dataclass(frozen=True)
class Chunk:
    """One event of a completion stream."""

    token_ids: list[int]
    finish_reason: str | None
    stop_reason: object = None
    """What stopped it: a stop string or token id; None at EOS (vLLM)."""


def parse_line(line: str, api: str) -> Chunk | None:
    """The chunk a server-sent event line carries; None for lines that carry none (blank, comments, [DONE]).
    Raises ServerGarbage for anything else."""
    line = line.strip()
    if not line or line.startswith(":") or line.startswith(("event:", "id:", "retry:")):
        return None
    if not line.startswith("data:"):
        raise ServerGarbage(f"not a server-sent event: {line[:80]!r}")
    data = line[5:].strip()
    if data == "[DONE]":
        return None
    try:
        event = json.loads(data)
    except ValueError:
        raise ServerGarbage(f"not JSON: {data[:80]!r}") from None
    if not isinstance(event, dict):
        raise ServerGarbage(f"not a completion chunk: {data[:80]!r}")
    if "error" in event:
        raise ServerGarbage(f"error in the stream: {str(event['error'])[:200]}")
    try:
        choice = event["choices"][0]
        ids = choice["token_ids"] if api == STRUCTURED_OUTPUTS else _logprob_ids(choice)
        if ids is None:
            ids = []
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise TypeError("token ids that are not non-negative integers")
        return Chunk(list(ids), choice.get("finish_reason"), choice.get("stop_reason"))
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ServerGarbage(f"a chunk without token ids ({exc!r}): {data[:80]!r}") from None


def _logprob_ids(choice: dict) -> list[int]:
    """Token ids of an older vLLM's chunk: ``logprobs.tokens`` as ``token_id:N`` strings."""
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return []
    tokens = logprobs["tokens"]
    try:
        return [int(t.removeprefix("token_id:")) for t in tokens]
    except ValueError:
        raise ServerGarbage(f"tokens not given as token_id:N: {tokens[:3]!r}") from None


def _json(answer: httpx.Response, what: str) -> dict:
    if answer.status_code in (401, 403):
        raise ServerGarbage(f"{what}: HTTP {answer.status_code}, the API key is missing or wrong (remote.api_key_env)")
    if answer.status_code != 200:
        raise ServerGarbage(f"{what}: HTTP {answer.status_code} {answer.text[:200]!r}")
    try:
        data = answer.json()
    except ValueError:
        raise ServerGarbage(f"{what}: not JSON: {answer.text[:80]!r}") from None
    if not isinstance(data, dict):
        raise ServerGarbage(f"{what}: not a JSON object: {answer.text[:80]!r}")
    return data


def _version(client: httpx.Client, url: str) -> str | None:
    """vLLM's version (``/version``); None from servers without one."""
    try:
        answer = client.get(f"{url}/version")
        version = answer.json().get("version") if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return version if isinstance(version, str) else None


def _api(api: str, version: str | None) -> str:
    if api != "auto":
        return api
    numbers = [int(n) for n in re.findall(r"\d+", version or "")[:3]]
    if version is None or len(numbers) < 2:
        return STRUCTURED_OUTPUTS  # not vLLM, or a build that does not say: the current field
    return STRUCTURED_OUTPUTS if tuple(numbers) >= FIRST_STRUCTURED_OUTPUTS else GUIDED_GRAMMAR


def _cache_info(client: httpx.Client, url: str) -> tuple[int | None, int | None]:
    """(block size, blocks) of the server's KV cache from its Prometheus metrics; Nones where it does not say."""
    try:
        answer = client.get(f"{url}/metrics")
    except httpx.HTTPError:
        return None, None
    match = _CACHE_INFO.search(answer.text) if answer.status_code == 200 else None
    if match is None:
        return None, None
    labels = dict(_LABEL.findall(match["labels"]))
    try:
        return int(labels["block_size"]), int(labels["num_gpu_blocks"])
    except (KeyError, ValueError):
        return None, None
