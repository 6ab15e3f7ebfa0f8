"""Configure's work: the engine and the Server the parameters describe, loaded in a thread of its own; cleanup's:
the engine released in another thread once the server loop has stopped."""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from rclpy.parameter import Parameter

from timely_llm.clock import WallClock
from timely_llm.core.features import Features
from timely_llm.core.policies import serving_policy
from timely_llm.core.tuf import DEFAULT_TUFS, TUF
from timely_llm.engines.base import Engine
from timely_llm.engines.keeper import EngineKeeper
from timely_llm.engines.registry import ENGINE_PREFIXES, ENGINES, EngineKind, EngineSettings, engine_kind
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.ros.fleet_file import Fleet, load_fleet, open_fleet
from timely_llm.ros.goal_desk import GoalDesk
from timely_llm.ros.goals import GoalRules
from timely_llm.ros.parameters import (
    foreign_engine_parameters,
    foreign_engine_refusal,
    unknown_parameters,
    unknown_refusal,
)
from timely_llm.ros.server_loop import ServerLoop
from timely_llm.ros.server_node import ServerNode
from timely_llm.server import Server
from timely_llm.serving import ServerConfig, build_server
from timely_llm.traces import load_catalog

CATEGORIES = tuple(DEFAULT_TUFS)
LOAD_PROGRESS_S = 10.0
"""While configure loads the engine, progress is logged this often."""
LOAD_POLL_S = 0.1
"""A configure waiting for the engine notices a shutdown request within this."""


class EngineLoader:
    """Builds the server from the node's parameters (``load``) and releases it (``release_later``). With a
    ``keeper`` the engine is taken from it and handed back to it, not loaded and closed."""

    def __init__(self, node: ServerNode, clock: WallClock, desk: GoalDesk, shutting_down: threading.Event,
                 keeper: EngineKeeper | None = None) -> None:
        self._node, self._clock, self._desk, self._shutting_down = node, clock, desk, shutting_down
        self._keeper = keeper
        self._loaded_engine: Engine | None = None  # the last engine this loader made itself (not the keeper's)
        self._param = node.param
        self._teardown: threading.Thread | None = None  # releasing the last engine, off the executor

    def load(self, set_phase: Callable[[str], None]) -> tuple[Server, GoalRules]:
        """The server and its goal rules, built in a loader thread; logs progress while waiting for it.

        A shutdown requested meanwhile ends the wait (RuntimeError): the loader finishes on its own and its
        engine is closed then.
        """
        loading: concurrent.futures.Future = concurrent.futures.Future()
        threading.Thread(target=self._build, args=(loading,), name="timely_llm_engine_load", daemon=True).start()
        began, log = time.monotonic(), self._node.get_logger()
        kind = ENGINES.get(self._param("engine"))  # an unknown one: the loader says so
        what = kind.loading(self._param) if kind else f"engine {self._param('engine')}"
        set_phase(f"configuring: loading {what}")
        log.info(f"configuring: loading {what} ...")
        next_log = began + LOAD_PROGRESS_S
        while True:
            try:
                server, rules = loading.result(timeout=LOAD_POLL_S)
                break
            except concurrent.futures.TimeoutError:
                pass
            if self._shutting_down.is_set():
                loading.add_done_callback(functools.partial(_close_loaded, self.dispose))
                raise RuntimeError("shutdown requested while loading the engine")
            set_phase(phase := f"configuring: loading {what} ({time.monotonic() - began:.0f} s)")
            if time.monotonic() >= next_log:
                log.info(f"{phase} ...")
                next_log += LOAD_PROGRESS_S
        kept = self._keeper is not None and server.engine is not self._loaded_engine
        log.info(f"{what} {'taken from the keeper (loaded before), server built' if kept else 'loaded'} in "
                 f"{time.monotonic() - began:.1f} s")
        return server, rules

    def release_later(self, server: Server, loop: ServerLoop) -> None:
        """A thread stops the server's loop (which applies what is left in its inbox first) and frees the engine.
        The next configure's loader waits for it."""
        thread, previous = loop.stop(), self._teardown
        self._teardown = threading.Thread(target=self._release, args=(server, thread, previous),
                                          name="timely_llm_release", daemon=True)
        self._teardown.start()

    def join(self) -> None:
        """Until the last engine released is."""
        if self._teardown is not None:
            self._teardown.join()

    def goal_rules(self, server: Server, fleet: Fleet) -> GoalRules:
        fleet.check_types(set(server.robots))
        return GoalRules(server.robots, self._catalog, server.engine.tokenizer.encode,
                         self._param("max_prompt_tokens"), default_tufs(self._param),
                         engine_kind(self._param("engine")).simulated,
                         self._param("max_task_chars"), fleet, self._param("max_new_tokens"))

    def _fleet(self) -> Fleet:
        """The fleet file's robots (parameter ``fleet_file``), or every agent with the default quotas."""
        path = str(self._param("fleet_file") or "")
        return load_fleet(path) if path else open_fleet()

    def _release(self, server: Server, loop: threading.Thread, previous: threading.Thread | None) -> None:
        if previous is not None:
            previous.join()
        loop.join()
        self.dispose(server.engine)
        self._node.get_logger().info("engine released" + (" (kept for the next node)" if self._keeper else ""))

    def dispose(self, engine: Engine) -> None:
        """Close ``engine``, or hand it back to the keeper."""
        if self._keeper is not None:
            self._keeper.give_back(engine)
        else:
            engine.close()

    def _build(self, loading: concurrent.futures.Future) -> None:
        """Loader thread: the previous engine released first, then the new server and its goal rules."""
        try:
            self.join()
            fleet = self._fleet()  # before the engine: a bad fleet file fails configure at once
            server = self._make_server()
            try:
                loading.set_result((server, self.goal_rules(server, fleet)))
            except BaseException:
                self.dispose(server.engine)
                raise
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting configure
            if not loading.done():
                loading.set_exception(exc)

    def _make_server(self) -> Server:
        policy = self._param("policy")
        try:
            serving_policy(policy)
        except ValueError as exc:
            raise ValueError(f"parameter policy {exc}") from None
        engine_kind(self._param("engine"))
        self._check_known_parameters()
        self._check_engine_parameters()
        self._catalog = load_catalog()
        files = [f for f in self._node.get_parameter_or("skill_models", Parameter("", value=[])).value if f]
        skills = load_skill_models(files or None)
        config = self._server_config(policy)
        engine = self._make_engine(config)
        desk = self._desk
        server = build_server(config, engine, skills, self._clock, on_segment=desk.on_segment,
                              on_finish=desk.on_finish, on_infeasible=desk.on_infeasible, on_start=desk.on_start)
        for robot in sorted(skills):
            server.warm_prefix(engine.tokenizer.encode(skills[robot].prompt_text("")))
        for trace in self._catalog.traces.values():  # plans' tokens first, before any task text (see SimTokenizer)
            engine.tokenizer.encode(trace.plan)
        return server

    def _check_known_parameters(self) -> None:
        """ValueError naming the parameters given (params file, ``-p``, launch) that the node does not take: rclpy
        declares whatever it is given, so a misspelt name would otherwise be ignored silently."""
        given, known = self._node.parameters_by_prefix(""), self._node.defaults
        unknown = unknown_parameters(given, known)
        if unknown:
            raise ValueError(unknown_refusal(unknown, known))

    def _check_engine_parameters(self) -> None:
        """ValueError naming the parameters of another engine than this node's, set to other than their default."""
        engine, node = self._param("engine"), self._node
        values = {f"{prefix}{name}": p.value for prefix in ENGINE_PREFIXES.values()
                  for name, p in node.parameters_by_prefix(prefix.rstrip(".")).items()}
        foreign = foreign_engine_parameters(engine, values, node.defaults)
        if foreign:
            raise ValueError(foreign_engine_refusal(engine, foreign))

    def _server_config(self, policy: str) -> ServerConfig:
        """The server the parameters describe; its step-time profile is the one bench would use
        (``estimator_profile``). Refused before the engine loads if a part needs a profile there is none of."""
        from timely_llm.engines.hardware import estimator_profile

        kind = engine_kind(self._param("engine"))
        model = self._param(kind.model_parameter)
        profile = estimator_profile(self._param("estimator_profile"), kind.simulated, model or None,
                                    self._param("hw_profile"))
        return ServerConfig(policy, self._param("network_latency"), Features.parse(self._param("features")),
                            self._param("max_batch") or None, self._param("max_new_tokens"), step_profile=profile,
                            step_profile_source=f"parameter estimator_profile for model {model!r} "
                                                "(write one with timely-llm profile)")

    def _make_engine(self, config: ServerConfig) -> Engine:
        """The engine the ``engine`` parameter names, built by its registry entry (``engines/registry.py``), or the
        keeper's where it holds one built from the same parameters."""
        kind = engine_kind(self._param("engine"))
        own = self._node.parameters_by_prefix(kind.section) if kind.section else {}
        set_by_policy = {name: ("parameter policy", value) for name, value in config.vllm_args().items()}
        settings = EngineSettings(self._param, {n: p.value for n, p in own.items()}, config.max_batch, set_by_policy)
        if self._keeper is None:
            return kind.factory(settings)
        key: Hashable = (kind.name, self._param(kind.model_parameter), self._param("kv_cache_gib"),
                         self._param("hw_profile"), config.max_batch, repr(sorted(settings.own.items())),
                         repr(sorted(set_by_policy.items())))
        return self._keeper.take(key, functools.partial(self._made, kind, settings))

    def _made(self, kind: EngineKind, settings: EngineSettings) -> Engine:
        """The engine built, remembered as loaded by this loader (so its log can tell a kept engine from a new one)."""
        self._loaded_engine = kind.factory(settings)
        return self._loaded_engine


def default_tufs(param: Callable[[str], Any]) -> dict[str, TUF]:
    """The default TUF of each category, from the ``tuf.<category>.<field>`` parameters."""
    return {c: TUF(*(param(f"tuf.{c}.{k}") for k in ("ert", "alpha", "beta"))) for c in CATEGORIES}


def _close_loaded(dispose: Callable[[Engine], None], loading: concurrent.futures.Future) -> None:
    """A loader's server nobody waits for any more: its engine is closed (or handed back)."""
    if not loading.cancelled() and loading.exception() is None:
        dispose(loading.result()[0].engine)
