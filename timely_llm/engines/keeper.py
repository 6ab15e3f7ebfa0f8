"""One engine kept across the nodes a process starts one after another (``timely-llm demo`` compares policies on
one model load): a node given an ``EngineKeeper`` takes its engine from it at configure and hands it back at cleanup
or shutdown instead of closing it. The keeper loads again only when a node asks for an engine of other parameters
(the old one is closed first); what earlier requests left cached is forgotten on the way back
(``Engine.reset_cache``), so each node finds the engine as a freshly loaded one would be, model weights aside."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

from timely_llm.engines.base import Engine


class EngineKeeper:
    """Lends one engine to one node at a time; ``loads`` is how long each load it did took (seconds)."""

    def __init__(self) -> None:
        self.loads: list[float] = []
        self._engine: Engine | None = None
        self._key: Hashable = None
        self._lent = False
        self._returned = threading.Condition()

    def take(self, key: Hashable, make: Callable[[], Engine]) -> Engine:
        """The kept engine if it was made for ``key``, else a new one from ``make``; waits while another node has
        it."""
        with self._returned:
            self._returned.wait_for(lambda: not self._lent)
            if self._engine is not None and self._key != key:
                self._engine.close()
                self._engine = None
            if self._engine is None:
                began = time.monotonic()
                self._engine, self._key = make(), key
                self.loads.append(time.monotonic() - began)
            self._lent = True
            return self._engine

    def give_back(self, engine: Engine) -> None:
        """A node is done with ``engine``: kept for the next (an engine the keeper did not lend is closed)."""
        with self._returned:
            if engine is not self._engine:
                engine.close()
                return
            try:
                engine.reset_cache()
            except Exception:  # noqa: BLE001 - an engine that cannot be reset is not lent again
                self._engine = None
                engine.close()
                raise
            finally:
                self._lent = False
                self._returned.notify_all()

    def close(self) -> None:
        """Close the kept engine (once no node has it)."""
        with self._returned:
            self._returned.wait_for(lambda: not self._lent)
            if self._engine is not None:
                self._engine.close()
                self._engine = None
