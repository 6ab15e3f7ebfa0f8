"""Configure's work: the engine and the Server the parameters describe, loaded in a thread of its own; cleanup's:
the engine released in another thread once the server loop has stopped."""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable, Hashable

from rclpy.parameter import Parameter

from timely_llm.clock import WallClock
from timely_llm.core.features import Features
from timely_llm.core.policies import serving_policy
from timely_llm.core.tuf import DEFAULT_TUFS, TUF
from timely_llm.engines.base import Engine
from timely_llm.engines.keeper import EngineKeeper
from timely_llm.engines.vllm_args import engine_args, from_parameters
from timely_llm.models.hub import check_if_hub_id
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.ros.goal_desk import GoalDesk
from timely_llm.ros.goals import GoalRules
from timely_llm.ros.parameters import ENGINE_PREFIXES, foreign_engine_parameters, foreign_engine_refusal
from timely_llm.ros.server_loop import ServerLoop
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

    def __init__(self, node: object, clock: WallClock, desk: GoalDesk, shutting_down: threading.Event,
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
        what = f"engine {self._param('engine')}" + {"sim": "", "remote": f" at {self._param('remote.url')}"}.get(
            self._param("engine"), f" model {self._param('model')}")
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

    def goal_rules(self, server: Server) -> GoalRules:
        return GoalRules(server.robots, self._catalog, server.engine.tokenizer.encode,
                         self._param("max_prompt_tokens"), default_tufs(self._param), self._param("engine") == "sim",
                         self._param("max_task_chars"))

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
            server = self._make_server()
            try:
                loading.set_result((server, self.goal_rules(server)))
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

    def _check_engine_parameters(self) -> None:
        """ValueError naming the parameters of another engine than this node's, set to other than their default."""
        engine, node = self._param("engine"), self._node
        values = {f"{prefix}{name}": p.value for prefix in ENGINE_PREFIXES.values()
                  for name, p in node.get_parameters_by_prefix(prefix.rstrip(".")).items()}
        foreign = foreign_engine_parameters(engine, values, node.defaults)
        if foreign:
            raise ValueError(foreign_engine_refusal(engine, foreign))

    def _server_config(self, policy: str) -> ServerConfig:
        """The server the parameters describe; its step-time profile is the one bench would use
        (``estimator_profile``). Refused before the engine loads if a part needs a profile there is none of."""
        from timely_llm.engines.hardware import estimator_profile

        model = self._param("remote.model") if self._param("engine") == "remote" else self._param("model")
        profile = estimator_profile(self._param("estimator_profile"), self._param("engine"), model or None,
                                    self._param("hw_profile"))
        return ServerConfig(policy, self._param("network_latency"), Features.parse(self._param("features")),
                            self._param("max_batch") or None, self._param("max_new_tokens"), step_profile=profile,
                            step_profile_source=f"parameter estimator_profile for model {model!r} "
                                                "(write one with timely-llm profile)")

    def _make_engine(self, config: ServerConfig) -> Engine:
        """The engine the parameters describe: a new one, or the keeper's where it has one of those parameters."""
        key: Hashable
        make: Callable[[], Engine]
        if self._param("engine") == "vllm":
            vllm = self._node.get_parameters_by_prefix("vllm")
            given = from_parameters({n: p.value for n, p in vllm.items()})
            set_by_policy = {name: ("parameter policy", value) for name, value in config.vllm_args().items()}
            args = engine_args(given, set_by_policy)
            key = ("vllm", self._param("model"), self._param("kv_cache_gib"), config.max_batch,
                   repr(sorted(args.items())))
            make = functools.partial(self._vllm_engine, config, args)
        else:
            remote = self._node.get_parameters_by_prefix("remote")
            key = (self._param("engine"), self._param("hw_profile"),
                   repr(sorted((n, p.value) for n, p in remote.items())))
            make = self._other_engine
        return self._keeper.take(key, functools.partial(self._made, make)) if self._keeper is not None else make()

    def _made(self, make: Callable[[], Engine]) -> Engine:
        """``make()``, remembered as loaded by this loader (so its log can tell a kept engine from a new one)."""
        self._loaded_engine = make()
        return self._loaded_engine

    def _vllm_engine(self, config: ServerConfig, args: dict) -> Engine:
        check_if_hub_id(self._param("model"))  # before vLLM's import: an unreachable Hub fails in seconds
        from timely_llm.engines.vllm_engine import VllmEngine

        return VllmEngine(self._param("model") or None, kv_cache_gib=self._param("kv_cache_gib"),
                          max_batch=config.max_batch, **args)

    def _other_engine(self) -> Engine:
        if self._param("engine") == "remote":
            from timely_llm.engines.remote import RemoteEngine
            from timely_llm.engines.remote_settings import PREFIX, RemoteSettings

            given = self._node.get_parameters_by_prefix(PREFIX.rstrip("."))
            return RemoteEngine(RemoteSettings.parse({n: p.value for n, p in given.items()}))
        if self._param("engine") != "sim":
            raise ValueError(f"parameter engine must be sim, vllm or remote, got {self._param('engine')!r}")
        from timely_llm.engines.hardware import load_profile
        from timely_llm.engines.sim import SimEngine

        return SimEngine(load_profile(self._param("hw_profile")))


def default_tufs(param: Callable[[str], object]) -> dict[str, TUF]:
    """The default TUF of each category, from the ``tuf.<category>.<field>`` parameters."""
    return {c: TUF(*(param(f"tuf.{c}.{k}") for k in ("ert", "alpha", "beta"))) for c in CATEGORIES}


def _close_loaded(dispose: Callable[[Engine], None], loading: concurrent.futures.Future) -> None:
    """A loader's server nobody waits for any more: its engine is closed (or handed back)."""
    if not loading.cancelled() and loading.exception() is None:
        dispose(loading.result()[0].engine)
