"""The remote engine's network side (remote.py): its completion streams and server probes, on an asyncio loop in a
thread of its own.

A stream's chunks, or the one cause it failed of, become events in a queue that the engine's step takes, so the
caller's thread waits on the network for ``STEP_WAIT_S`` at most. A server that fails a stream (connection refused or
lost, HTTP 5xx) is taken out and probed (``/health``, with backoff) until it answers again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import queue
import threading
import time
from collections.abc import Callable

import httpx

from timely_llm.engines.remote_servers import (
    PROBE_TIMEOUT_S,
    Chunk,
    RemoteServer,
    ServerGarbage,
    failure_cause,
    parse_line,
    probe,
)

STEP_WAIT_S = 0.005
"""A step with streams open waits at most this long for a token (the server loop holds its lock meanwhile), so a
goal or a robot's report that comes meanwhile waits as long: at 20 ms a plan started 3.7 ms after its goal on
average at the light peer point, at 5 ms 1.1 ms. A step ends at the first token to arrive, so a busy server is
not polled faster."""
PROBE_TICK_S = 0.25
CONNECT_TIMEOUT_S = 5.0

Event = tuple[str, int, Chunk | None, str | None]
"""What a stream tells the loop: (generation, stream number, a chunk or None, the cause it failed of or None)."""


class RemoteStreams:
    """Streaming completions on the engine's own asyncio loop, their events queued for the engine's step; and the
    prober, which takes a server back once it answers (``describe`` learns what one that never answered serves)."""

    def __init__(self, headers: dict[str, str], timeout: httpx.Timeout, servers: list[RemoteServer],
                 describe: Callable[[RemoteServer], None]) -> None:
        self._timeout = timeout
        self._servers = servers
        self._describe = describe
        self._events: queue.Queue[Event] = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="timely_llm_remote", daemon=True)
        self._thread.start()
        self._client: httpx.AsyncClient = self._call(_async_client(headers, timeout))
        self._prober = asyncio.run_coroutine_threadsafe(self._probe_forever(), self._loop)

    def open(self, gen_id: str, stream: int, server: RemoteServer, body: dict) -> concurrent.futures.Future:
        """Stream number ``stream`` of ``gen_id``: the completion ``body`` asks of ``server``; cancel it to close."""
        return asyncio.run_coroutine_threadsafe(self._stream(gen_id, stream, server, body), self._loop)

    def events(self, wait: bool) -> list[Event]:
        """The events that arrived, with ``wait`` waiting up to ``STEP_WAIT_S`` for one."""
        events: list[Event] = []
        if wait:
            try:
                events.append(self._events.get(timeout=STEP_WAIT_S))
            except queue.Empty:
                pass
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def close(self) -> None:
        """Every stream and the prober ended, the connections closed and the loop stopped."""
        self._prober.cancel()
        if self._loop.is_running():
            self._call(self._shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()

    async def _stream(self, gen_id: str, stream: int, server: RemoteServer, body: dict) -> None:
        """One completion's events into the queue: a Chunk each, or one cause it failed of."""
        api = server.api
        try:
            async with self._client.stream("POST", f"{server.url}/v1/completions", json=body) as answer:
                if answer.status_code != 200:
                    text = (await answer.aread()).decode(errors="replace")
                    if answer.status_code >= 500:
                        server.failed(f"HTTP {answer.status_code}", time.monotonic())
                    self._fail(gen_id, stream, f"{server.url} refused the completion: HTTP {answer.status_code} "
                                               f"{_message(text)}")
                    return
                async for line in answer.aiter_lines():
                    chunk = parse_line(line, api)
                    if chunk is None:
                        continue
                    self._events.put((gen_id, stream, chunk, None))
                    if chunk.finish_reason is not None:
                        return
            self._fail(gen_id, stream, f"{server.url} closed the stream before the completion ended")
        except httpx.TimeoutException:
            self._fail(gen_id, stream, f"{server.url} sent nothing for {self._timeout.read:g} s")
        except httpx.TransportError as exc:  # refused, reset, closed mid-stream: the server is gone
            server.failed(failure_cause(exc), time.monotonic())
            self._fail(gen_id, stream, f"{server.url} failed: {failure_cause(exc)}")
        except ServerGarbage as exc:
            self._fail(gen_id, stream, f"{server.url} answered garbage: {exc}")
        except Exception as exc:  # noqa: BLE001 - whatever it was, the generation must learn it failed
            self._fail(gen_id, stream, f"{server.url}: {failure_cause(exc)}")

    def _fail(self, gen_id: str, stream: int, cause: str) -> None:
        self._events.put((gen_id, stream, None, cause))

    async def _probe_forever(self) -> None:
        """Servers taken out are probed when due; one that answers is taken back."""
        while True:
            now = time.monotonic()
            due = [s for s in self._servers if s.down is not None and s.next_probe <= now]
            for server in due:
                await probe(self._client, server)
                if server.down is None and server.served is None:
                    await asyncio.to_thread(self._describe, server)
            await asyncio.sleep(PROBE_TICK_S)

    async def _shutdown(self) -> None:
        """Every stream and the prober ended, then the connections closed."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()

    def _call(self, coroutine):  # noqa: ANN001, ANN202 - a coroutine and its result
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CONNECT_TIMEOUT_S + PROBE_TIMEOUT_S)


async def _async_client(headers: dict[str, str], timeout: httpx.Timeout) -> httpx.AsyncClient:
    """Made on the engine's loop, which its connections belong to; no connection limit (a stream each)."""
    return httpx.AsyncClient(headers=headers, timeout=timeout, limits=httpx.Limits(max_connections=None,
                                                                                    max_keepalive_connections=64))


def _message(text: str) -> str:
    """The error message of a server's JSON error answer, else the start of its text."""
    try:
        data = json.loads(text)
        message = data.get("error", {}).get("message") or data.get("message") or data.get("detail")
    except (ValueError, AttributeError):
        message = None
    return str(message or text)[:300]
