"""Profile a server behind HTTP (``vllm serve``) through its streams, for the simulator of the remote path.

What is measured, one request at a time on an otherwise idle server but for the decode batches:

- first tokens (``max_tokens`` 1) of fresh prompts of several lengths, and of short tails after a cached prefix:
  the server's own queue and prefill seconds (vLLM's ``/metrics`` histograms, their sums' growth) are the step;
  what the client waited beyond them is the request's overhead plus its token's delay;
- the token delay: half the round trip of ``/health`` (one HTTP exchange and nothing else);
- decode steps: ``b`` streams at once for several ``b``, the seconds per token each stream received once every
  stream had its first (vLLM's ``ignore_eos``, so none ends early); and of streams sharing all but a short tail
  of their prompts, as a fleet's robots share their robot prompt.

Nothing here imports vLLM or torch: the node on the remote engine runs where neither is installed.
"""

from __future__ import annotations

import random
import re
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx

from timely_llm.engines.hardware import HardwareProfile
from timely_llm.engines.profile_fit import Sample, fit_profile
from timely_llm.engines.remote_servers import (
    RemoteServer,
    ServedModel,
    bearer_headers,
    failure_cause,
    parse_line,
    request_body,
)
from timely_llm.errors import ConfigError
from timely_llm.models import MODEL_NAMES

FRESH_PREFILLS = (64, 256, 512, 1024)
CACHED_CONTEXT = 512
CACHED_TAILS = (16, 64)
DECODE_BATCHES = (1, 2, 4, 8)
DECODE_CONTEXTS = (256, 768)
DECODE_TOKENS = 16
SHARED_DECODE_BATCHES = (2, 4, 8)
SHARED_TAIL = 32
REPEATS = 3
"""Each first-token measurement is the median of this many requests."""
ROUND_TRIPS = 20
VOCAB_FLOOR = 10
_METRIC_LINE = r"^{name}(?:\{{[^}}]*\}})? (?P<value>\S+)$"
QUEUE_METRIC = "vllm:request_queue_time_seconds_sum"
PREFILL_METRIC = "vllm:request_prefill_time_seconds_sum"


@dataclass(frozen=True)
class ServerTimings:
    """What ``measure_server`` measured: the step samples, and per first-token measurement the seconds the client
    waited beyond the server's queue and prefill (the request's overhead plus the token's delay)."""

    served: ServedModel
    samples: list[Sample]
    first_token_extras: list[float]
    token_delay: float


class HttpProbe:
    """Timed requests to one server."""

    def __init__(self, url: str, model: str = "", api_key_env: str = "", timeout: float = 120.0) -> None:
        try:
            self.headers = bearer_headers(api_key_env)
        except ValueError as exc:
            raise ConfigError("--api-key-env", None, str(exc)) from None
        self.client = httpx.Client(headers=self.headers, timeout=timeout)
        self.server = RemoteServer(url)
        try:
            self.served = self.server.describe(self.client, model, "auto")
        except (httpx.HTTPError, ValueError) as exc:
            raise ConfigError("--url", None, f"{url} does not answer as a vLLM server: {failure_cause(exc)}") from None
        self._metrics_sum(PREFILL_METRIC)  # a server without vLLM's metrics is refused before measuring

    def first_token(self, prompt: list[int]) -> tuple[float, float]:
        """(server queue + prefill seconds, client seconds to the first token) of a one-token completion."""
        queued, prefilled = self._metrics_sum(QUEUE_METRIC), self._metrics_sum(PREFILL_METRIC)
        began = time.perf_counter()
        self._stream(self.client, self._body(prompt, 1), lambda _: None)
        waited = time.perf_counter() - began
        server = self._metrics_sum(QUEUE_METRIC) - queued + self._metrics_sum(PREFILL_METRIC) - prefilled
        return server, waited

    def round_trip(self) -> float:
        began = time.perf_counter()
        self.client.get(f"{self.server.url}/health").raise_for_status()
        return time.perf_counter() - began

    def seconds_per_token(self, prompts: list[list[int]], tokens: int) -> float:
        """``len(prompts)`` streams at once: the mean seconds per token a stream got once all had their first."""
        arrivals: list[list[tuple[float, int]]] = [[] for _ in prompts]

        def run(j: int) -> None:
            with httpx.Client(headers=self.headers, timeout=self.client.timeout) as client:
                body = self._body(prompts[j], tokens) | {"ignore_eos": True, "min_tokens": tokens}
                self._stream(client, body, lambda n: arrivals[j].append((time.perf_counter(), n)))

        threads = [threading.Thread(target=run, args=(j,)) for j in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        all_started = max(a[0][0] for a in arrivals)
        rates = []
        for stream in arrivals:
            steady = [(t, n) for t, n in _cumulative(stream) if t >= all_started]
            if len(steady) >= 2 and steady[-1][1] > steady[0][1]:
                rates.append((steady[-1][0] - steady[0][0]) / (steady[-1][1] - steady[0][1]))
        if not rates:
            raise RuntimeError(f"no stream of {len(prompts)} gave two tokens after all had their first")
        return statistics.fmean(rates)

    def _body(self, prompt: list[int], max_tokens: int) -> dict:
        return request_body(self.served.model, self.served.api, prompt, max_tokens, None, 0)

    def _stream(self, client: httpx.Client, body: dict, on_tokens: Callable[[int], None]) -> None:
        with client.stream("POST", f"{self.server.url}/v1/completions", json=body) as answer:
            if answer.status_code != 200:
                raise RuntimeError(f"{self.server.url}: HTTP {answer.status_code} {answer.read()[:200]!r}")
            for line in answer.iter_lines():
                chunk = parse_line(line, self.served.api)
                if chunk is not None and chunk.token_ids:
                    on_tokens(len(chunk.token_ids))

    def _metrics_sum(self, name: str) -> float:
        text = self.client.get(f"{self.server.url}/metrics").text
        values = re.findall(_METRIC_LINE.format(name=re.escape(name)), text, re.MULTILINE)
        if not values:
            raise ConfigError("--url", None, f"{self.server.url}/metrics has no {name}: the profile needs vLLM's "
                                             "request metrics (do not start it with --disable-log-stats)")
        return sum(float(v) for v in values)


def _cumulative(stream: list[tuple[float, int]]) -> list[tuple[float, int]]:
    total, out = 0, []
    for t, n in stream:
        total += n
        out.append((t, total))
    return out


def _tokens(seed: int, n: int) -> list[int]:
    return [VOCAB_FLOOR + (seed * 7919 + k) % 5000 for k in range(n)]


def measure_server(probe: HttpProbe) -> ServerTimings:
    """Every measurement of the module docstring, on ``probe``'s server."""
    limit = (probe.served.max_model_len or 2048) - DECODE_TOKENS - 8
    salt = random.randrange(1 << 30)  # prompts no earlier run left in the server's prefix cache
    samples: list[Sample] = []
    extras: list[float] = []

    def first(new: int, context: int, prompts: list[list[int]]) -> None:
        timed = sorted((probe.first_token(p) for p in prompts), key=lambda t: t[1])[len(prompts) // 2]
        samples.append(([(new, context)], [], 0, timed[0]))
        extras.append(timed[1] - timed[0])

    for i, n in enumerate(p for p in FRESH_PREFILLS if p <= limit):
        first(n, n, [_tokens(salt + 100 * i + r, n) for r in range(REPEATS)])
    prefix = _tokens(salt - 1, min(CACHED_CONTEXT, limit))
    probe.first_token(prefix)  # cached from here on
    for n in CACHED_TAILS:
        first(n, len(prefix) + n, [prefix + _tokens(salt + 50 + 3 * r + n, n) for r in range(REPEATS)])
    for context in (c for c in DECODE_CONTEXTS if c <= limit):
        for b in DECODE_BATCHES:
            prompts = [_tokens(salt + 1000 * b + 10 * context + j, context) for j in range(b)]
            seconds = probe.seconds_per_token(prompts, DECODE_TOKENS)
            samples.append(([], [context + DECODE_TOKENS // 2] * b, 0, seconds))
    samples += _shared_decodes(probe, salt, min(max(DECODE_CONTEXTS), limit))
    delay = statistics.median(probe.round_trip() for _ in range(ROUND_TRIPS)) / 2
    return ServerTimings(probe.served, samples, extras, delay)


def _shared_decodes(probe: HttpProbe, salt: int, context: int) -> list[Sample]:
    """Decode steps of streams whose prompts share all but a ``SHARED_TAIL``-token tail, in whole blocks of the
    server's, as a fleet's robots share their robot prompt: a CPU reads a shared block once per step, so without
    these the fit prices every attended token alike and the simulator runs slow (``per_kv_reread``)."""
    block = probe.served.block_size or 16
    shared = (context - SHARED_TAIL) // block * block
    prefix = _tokens(salt - 2, shared)
    samples: list[Sample] = []
    for b in SHARED_DECODE_BATCHES:
        prompts = [prefix + _tokens(salt + 7000 + 10 * b + j, context - shared) for j in range(b)]
        seconds = probe.seconds_per_token(prompts, DECODE_TOKENS)
        samples.append(([], [context + DECODE_TOKENS // 2] * b, (b - 1) * shared, seconds))
    return samples


def fit_server_profile(timings: ServerTimings, name: str, memory: dict[str, float]) -> HardwareProfile:
    """The step terms fitted to the server's steps, the KV memory the server says it has (``memory`` gives the
    bytes per token and what is not KV), and the http section: the token delay, and the request overhead as the
    median first-token extra less that delay."""
    served = timings.served
    block = float(served.block_size or memory["block_tokens"])
    memory = dict(memory, block_tokens=block)
    if served.kv_blocks:  # what the KV memory holds: the server's blocks, half a block of margin for the floor
        kv_gib = (served.kv_blocks + 0.5) * block * memory["kv_bytes_per_token"] / 2**30
        memory["total_gib"] = memory["weights_gib"] + memory["reserved_gib"] + kv_gib
    profile = fit_profile(timings.samples, name, memory, served.max_model_len or 2048, relative=True)
    overhead = max(statistics.median(timings.first_token_extras) - timings.token_delay, 0.0)
    http = {"request_overhead": overhead, "token_delay": timings.token_delay, "servers": 1.0}
    return replace(profile, http=http, tokenizer=served.model if served.model in MODEL_NAMES else None)
