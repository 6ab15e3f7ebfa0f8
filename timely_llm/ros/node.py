"""The ``timely_llm_server`` ROS 2 node: a managed (lifecycle) front end over :class:`timely_llm.server.Server`.

Robots send ``RequestPlan`` goals; each plan segment comes back as feedback the moment
the server dispatches it, and the result once the robot has reported every segment
executed (``segment_done`` topic), or, for a goal with ``no_execution_reports``, once the
last segment's estimated execution end has passed. All scheduling happens in the Server,
whose loop runs in a thread of its own on the wall clock.

Parameters have descriptors with ranges; a change at run time applies at once (live ones),
waits for the next configure (configure-time ones, refused while configured) or is
refused (read-only): see ``timely_llm.ros.parameters``. ``/diagnostics`` says once a
second what the node serves with and how loaded it is (``timely_llm.ros.diagnostics``).

No executor thread or task waits on a goal, nor on the server. Executor callbacks check
and time-stamp what arrives (goals, reports, cancels, watchdog aborts) and queue it in
the server loop's inbox, which the loop applies between engine steps; the loop is the only
caller of the Server. What the Server has to say (segments dispatched, requests ended) it
queues in an outbox and a guard condition wakes the executor, which publishes the feedback
and, for an ended request, runs the goal's execute callback once: it sets the final state
and returns the result. A goal stays ACCEPTED until then. (rclpy's executor re-runs every
pending coroutine task on every wake-up, so an ``async`` execute callback awaiting a
future per goal costs O(goals) per message: at 300 goals in flight it could not keep up
with 10 messages a second.)

Lifecycle: configure loads the engine and starts the server loop, activate accepts
goals, deactivate ends the goals in flight (aborted, "server deactivated"), cleanup
frees the engine, shutdown aborts what is in flight ("server shutting down") and waits
briefly for the results to go out. No transition blocks the executor, which in the node's
own process has one thread: ChangeState's callback is a coroutine awaiting its transition
in a thread, and a configure waits there while another thread loads the engine, so
get_state, the parameter services and the status keep answering; a failed configure
leaves the node unconfigured, with the reason logged and on ``/diagnostics``. Parameter
``autostart`` (default true) configures and activates in a thread once the node spins (a
one-shot timer starts it), so no lifecycle manager is needed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import math
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import rclpy
import rclpy.executors
import rclpy.task
from builtin_interfaces.msg import Time as TimeMsg
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.context import Context
from rclpy.duration import Duration
from rclpy.exceptions import InvalidHandle, InvalidParameterValueException
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.signals import SignalHandlerOptions

from timely_llm.clock import WallClock
from timely_llm.core.features import Features
from timely_llm.core.priority import make_policy
from timely_llm.core.request import Outcome, Request, Segment, Status
from timely_llm.core.skills import load_skill_models
from timely_llm.core.tuf import DEFAULT_TUFS, TUF
from timely_llm.engines.base import DEFAULT_MAX_NEW_TOKENS, Engine
from timely_llm.engines.vllm_args import PREFIX as VLLM_PREFIX
from timely_llm.engines.vllm_args import engine_args, from_parameters
from timely_llm.errors import ConfigError, RequestRejected
from timely_llm.models.hub import check_if_hub_id
from timely_llm.ros.diagnostics import Snapshot, diagnostic_array
from timely_llm.ros.goals import MAX_ID_CHARS, GoalRules, plan_from_goal
from timely_llm.ros.interfaces import RequestPlan, SegmentDone, ServerStatus, SkillCall, TaskRequest
from timely_llm.ros.interfaces import Segment as SegmentMsg
from timely_llm.ros.parameters import descriptor, refuse_while_configured
from timely_llm.ros.qos import DEEP_RELIABLE, SERVER_STATUS_QOS, action_server_qos
from timely_llm.ros.reports import ReportBook
from timely_llm.ros.topic_requests import TopicRequests
from timely_llm.server import POLICIES, PlanRequest, Server, ServingPolicy
from timely_llm.serving import ServerConfig, build_server
from timely_llm.workloads.traces import load_catalog

IDLE_WAIT_S = 0.05
WATCHDOG_PERIOD_S = 0.1
CATEGORIES = tuple(DEFAULT_TUFS)
EXECUTOR_THREADS = 8
"""A session shared with clients that may wait (tests, fleet, demo): one thread per callback group (goals and
results, reports, watchdog, status and diagnostics, lifecycle transitions, lifecycle queries, parameters) and
one spare, so no goal holds a thread."""
NODE_EXECUTOR_THREADS = 1
"""The node's own process (``main``) spins a SingleThreadedExecutor: no callback of the node waits (transitions
run in threads of their own), and Jazzy's MultiThreadedExecutor costs several times the node's CPU per goal in
its own bookkeeping (README, "The loop's own cost")."""
SPIN_WAKE_S = 0.1
"""The executor re-examines its work at least this often: a lost wake-up costs this, not a stalled node."""
SHUTDOWN_TIMEOUT_S = 1.5
"""Shutdown waits at most this long for the results of the goals it aborts to be handed to rclpy ..."""
RESULT_FLUSH_S = 0.3
"""... and then this long for rclpy to send them and for result requests still in flight to arrive."""
MAX_REASON_CHARS = 200
LOAD_PROGRESS_S = 10.0
"""While configure loads the engine, progress is logged this often."""
LOAD_POLL_S = 0.1
"""A configure waiting for the engine notices a shutdown request within this."""
DIAGNOSTICS_PERIOD_S = 1.0
START_TIMEOUT_S = 1800.0
"""wait_active's default: a vLLM engine start takes minutes on a CPU."""
PRIMARY_STATES = ("unconfigured", "inactive", "active", "finalized")

PARAMETERS: dict[str, tuple[object, str]] = {
    "autostart": (True, "configure and activate at startup (else wait for lifecycle transitions)"),
    "engine": ("sim", "sim (calibrated simulator, needs trace_id goals) or vllm (the shipped params file's)"),
    "model": ("smollm2", "engine vllm: smollm2 (SmolLM2-135M-Instruct), tiny (random test model), a directory "
                         "or a Hugging Face model id"),
    "kv_cache_gib": (1.0, "engine vllm: KV cache size in GiB; 0 = vLLM sizes it (vllm.gpu_memory_utilization)"),
    "hw_profile": ("rtx4090-llama3-8b", "hardware profile name or YAML file for engine sim"),
    "estimator_profile": ("", "features timebill, deferred_prefill and ala's prior: the engine's step-time profile "
                              "(name or YAML file from timely-llm profile); empty = hw_profile on sim, the shipped "
                              "SmolLM2 fit on vllm"),
    "skill_models": (Parameter.Type.STRING_ARRAY, "skill-model YAML files; empty = the shipped ones"),
    "policy": ("timelyllm", f"serving policy: {', '.join(POLICIES)}"),
    "features": ("default", f"scheduler parts on: comma list of {', '.join(Features.names())}; all, none, default"),
    "max_batch": (0, "maximum batch size; 0 = the policy's default"),
    "network_latency": (0.008, "one-way robot<->server latency in seconds"),
    "max_task_chars": (2000, "goals whose task text is longer are rejected"),
    "max_prompt_tokens": (1792, "goals whose prompt is longer are rejected (vllm: + max_new_tokens <= max_model_len)"),
    "max_new_tokens": (DEFAULT_MAX_NEW_TOKENS, "default cap on a plan's tokens"),
    "segment_timeout_factor": (3.0, "a segment times out after factor x its estimated execution time ..."),
    "segment_timeout_margin": (5.0, "... plus this many seconds"),
    "status_period": (1.0, "seconds between ServerStatus messages"),
    "result_timeout": (10.0, "seconds an ended goal's result stays available to result requests (ROS: 900)"),
    **{f"tuf.{c}.{k}": (v, f"default TUF {k} for {c} goals that give none")
       for c, tuf in DEFAULT_TUFS.items() for k, v in tuf.to_dict().items()},
}

Command = Callable[[Server], None]
"""Something the server loop applies to the Server between engine steps."""


class NodeStartError(RuntimeError):
    """The node cannot start (a parameter out of range, no robot type installed), or its autostart failed."""


@dataclass
class CategoryTotals:
    """What the status topic reports about ended requests, kept as running totals."""

    count: int = 0
    utility_sum: float = 0.0
    with_utility: int = 0

    def add(self, utility: float | None) -> None:
        self.count += 1
        if utility is not None:
            self.utility_sum += utility
            self.with_utility += 1

    @property
    def mean_utility(self) -> float:
        return self.utility_sum / self.with_utility if self.with_utility else math.nan


class TimelyLlmNode(LifecycleNode):
    def __init__(self, **node_kwargs: object) -> None:
        super().__init__("timely_llm_server", **node_kwargs)
        self._declare_parameters()
        self._declare_vllm_parameters()
        self.clock = WallClock()
        self.server: Server | None = None
        self._loop: threading.Thread | None = None
        self._serving = False
        self._lock = threading.Lock()
        self._goals: dict[str, object] = {}  # request id -> rclpy ServerGoalHandle, until its result is handed over
        self._concluding: set[str] = set()  # requests whose goal's execute callback has yet to run
        self._reports = ReportBook(0.0, 0.0)
        self._checked: tuple[int, PlanRequest] | None = None  # the goal just checked, for its accepted callback
        self._totals: dict[str, CategoryTotals] = collections.defaultdict(CategoryTotals)
        self._finished = 0
        self._inbox: collections.deque[Command] = collections.deque()
        self._outbox: collections.deque[tuple[str, object]] = collections.deque()
        self.finalized = threading.Event()
        self._transition_lock = threading.RLock()  # one lifecycle transition at a time, from whichever thread
        self._shutting_down = threading.Event()  # a configure still loading the engine gives up
        self._teardown: threading.Thread | None = None  # releasing the last engine, off the executor
        self._phase = "unconfigured"
        self._configure_error = ""
        self._start_error = ""
        self._started = threading.Event()  # autostart has run (or there is none)
        self._last_step_s = math.nan
        self._kv_blocks = -1

        self._transitions = MutuallyExclusiveCallbackGroup()  # ChangeState and autostart: may wait for the engine
        self._regroup_lifecycle_services()
        self._goals_group = MutuallyExclusiveCallbackGroup()  # goal, cancel, result requests, outbox: one at a time
        self._action: ActionServer | None = None
        self._outbox_ready = self.create_guard_condition(self._guarded(self._drain_outbox),
                                                         callback_group=self._goals_group)
        self._topics = TopicRequests(self, self._start_topic_request, self._goals_group)
        self.create_subscription(SegmentDone, "segment_done", self._guarded(self._on_segment_done), DEEP_RELIABLE,
                                 callback_group=MutuallyExclusiveCallbackGroup())
        self._status_pub = self.create_lifecycle_publisher(ServerStatus, "status", SERVER_STATUS_QOS)
        reporting = MutuallyExclusiveCallbackGroup()
        self._status_timer = self.create_timer(self._param("status_period"), self._guarded(self._publish_status),
                                               callback_group=reporting)
        self._diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(DIAGNOSTICS_PERIOD_S, self._guarded(self._publish_diagnostics), callback_group=reporting)
        self.create_timer(WATCHDOG_PERIOD_S, self._guarded(self._check_watchdog),
                          callback_group=MutuallyExclusiveCallbackGroup())
        self.add_on_set_parameters_callback(self._check_parameters)
        self.add_post_set_parameters_callback(self._guarded(self._apply_parameters))
        self._check_skill_models()
        if self._param("autostart"):
            self._autostart_timer = self.create_timer(0.0, self._autostart, callback_group=self._transitions)
        else:
            self._open_request_interfaces()
            self._started.set()

    # ----- setup -----

    def _param(self, name: str):  # noqa: ANN202 - the parameter's value
        return self.get_parameter(name).value

    def _guarded(self, callback: Callable, on_error: object = None) -> Callable:
        """``callback`` that logs an exception instead of raising it into the executor (which would stop spinning)."""
        @functools.wraps(callback)
        def run(*args: object) -> object:
            try:
                return callback(*args)
            except Exception as exc:  # noqa: BLE001 - each callback ends what it concerns before this
                self.get_logger().error(f"{callback.__name__} failed: {exc!r}")
                return on_error
        return run

    def _declare_parameters(self) -> None:
        for name, (default, description) in PARAMETERS.items():
            try:
                self.declare_parameter(name, default, descriptor(name, description))
            except InvalidParameterValueException as exc:
                raise NodeStartError(f"parameter {name}: {exc}") from exc

    def _regroup_lifecycle_services(self) -> None:
        """ChangeState in the transitions' callback group, the lifecycle queries in one of their own.

        rclpy puts every lifecycle service in the node's default callback group, with the parameter
        services: a configure loading the engine for minutes would hold get_state and the parameters
        unanswered. ChangeState is also guarded: rclpy raises an invalid transition's RCLError out of
        the service callback, which would stop the executor.
        """
        queries = MutuallyExclusiveCallbackGroup()
        for service in self._service_change_state, self._service_get_state, self._service_get_available_states, \
                self._service_get_available_transitions, self._service_get_transition_graph:
            group = self._transitions if service is self._service_change_state else queries
            service.callback_group.entities.discard(weakref.ref(service))
            service.callback_group = group
            group.add_entity(service)
        change_state = self._service_change_state.callback

        def guarded_change_state(request: object, response: object) -> object:
            with self._transition_lock:
                try:
                    return change_state(request, response)
                except _rclpy.RCLError as exc:
                    transition = request.transition.label or request.transition.id
                    self.get_logger().warning(f"refused lifecycle transition {transition!r}: {exc}")
                    response.success = False
                    return response

        async def change_state_off_the_executor(request: object, response: object) -> object:
            # A coroutine callback: the executor polls it between other callbacks, so even a single-threaded
            # executor keeps answering get_state and the parameters while a configure loads the engine.
            return await _in_thread("timely_llm_transition", guarded_change_state, request, response)

        self._service_change_state.callback = change_state_off_the_executor

    def _check_skill_models(self) -> None:
        """With no skill_models given, the installation must ship some: else no restart could help."""
        if not [f for f in self.get_parameter_or("skill_models", Parameter("", value=[])).value or [] if f]:
            try:
                load_skill_models()
            except ConfigError as exc:
                raise NodeStartError(str(exc)) from exc

    def _open_request_interfaces(self) -> None:
        """The ``request_plan`` action and the ``task_requests`` topic. With ``autostart`` they open once autostart
        has run, so a client that waits for the server (as most do) finds the node active, not loading its engine."""
        self._topics.open()
        self._action = ActionServer(self, RequestPlan, "request_plan", execute_callback=self._conclude,
                                    callback_group=self._goals_group,
                                    goal_callback=self._guarded(self._on_goal, GoalResponse.REJECT),
                                    handle_accepted_callback=self._guarded(self._on_accepted),
                                    cancel_callback=self._guarded(self._on_cancel, CancelResponse.REJECT),
                                    result_timeout=float(self._param("result_timeout")), **action_server_qos())

    def _autostart(self) -> None:
        """Once the node spins (a one-shot timer), configure and activate in a thread: off the executor, which
        may be single-threaded."""
        self._autostart_timer.cancel()
        threading.Thread(target=self._run_autostart, name="timely_llm_autostart", daemon=True).start()

    def _run_autostart(self) -> None:
        try:
            with self._transition_lock:
                if self._shutting_down.is_set():
                    self._start_error = "shut down before autostart"
                elif self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                    self._start_error = f"configure failed: {self._configure_error}"
                    self.get_logger().error(f"autostart: {self._start_error}; the node stays unconfigured "
                                            "(set its parameters and configure it again)")
                elif self._shutting_down.is_set() or self.trigger_activate() != TransitionCallbackReturn.SUCCESS:
                    self._start_error = "activate failed"
        except Exception as exc:  # noqa: BLE001 - raised into the executor, it would stop spinning
            self._start_error = f"autostart failed: {exc!r}"
            self.get_logger().error(self._start_error)
        finally:
            if not self._shutting_down.is_set():
                self._open_request_interfaces()
            self._started.set()

    def wait_active(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until autostart has run; NodeStartError, with the reason, if it did not leave the node active."""
        if not self._started.wait(timeout_s):
            raise NodeStartError(f"autostart did not end in {timeout_s} s (is the node spinning?)")
        if self._start_error:
            raise NodeStartError(self._start_error)

    def trigger_configure(self) -> TransitionCallbackReturn:
        with self._transition_lock:
            return super().trigger_configure()

    def trigger_activate(self) -> TransitionCallbackReturn:
        with self._transition_lock:
            return super().trigger_activate()

    def trigger_deactivate(self) -> TransitionCallbackReturn:
        with self._transition_lock:
            return super().trigger_deactivate()

    def trigger_cleanup(self) -> TransitionCallbackReturn:
        with self._transition_lock:
            return super().trigger_cleanup()

    @property
    def lifecycle_state(self) -> str:
        """The lifecycle state's label: unconfigured, configuring, inactive, active, ..."""
        return self._state_machine.current_state[1]

    def _declare_vllm_parameters(self) -> None:
        """Declare each ``vllm.<field>`` given (params file, ``-p``, launch): any vLLM EngineArgs field, checked
        by vLLM at configure, so which ones exist is vLLM's to say. (rclpy keeps the overrides in
        ``_parameter_overrides``; its public alternative would declare every override, not only these.)"""
        for name, parameter in self._parameter_overrides.items():
            if name.startswith(VLLM_PREFIX):
                self.declare_parameter(name, parameter.value, ParameterDescriptor(
                    description="vLLM engine argument (EngineArgs field)", dynamic_typing=True))

    def _make_engine(self, config: ServerConfig) -> Engine:
        if self._param("engine") == "vllm":
            check_if_hub_id(self._param("model"))  # before vLLM's import: an unreachable Hub fails in seconds
            from timely_llm.engines.vllm_engine import VllmEngine

            given = from_parameters({n: p.value for n, p in self.get_parameters_by_prefix("vllm").items()})
            set_by_policy = {name: ("parameter policy", value) for name, value in config.vllm_args().items()}
            return VllmEngine(self._param("model") or None, kv_cache_gib=self._param("kv_cache_gib"),
                              **engine_args(given, set_by_policy))
        if self._param("engine") != "sim":
            raise ValueError(f"parameter engine must be sim or vllm, got {self._param('engine')!r}")
        from timely_llm.engines.hardware import load_profile
        from timely_llm.engines.sim import SimEngine

        return SimEngine(load_profile(self._param("hw_profile")))

    def _make_server(self) -> Server:
        policy = self._param("policy")
        if policy not in POLICIES:
            raise ValueError(f"parameter policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.catalog = load_catalog()
        files = [f for f in self.get_parameter_or("skill_models", Parameter("", value=[])).value if f]
        skills = load_skill_models(files or None)
        config = self._server_config(policy)
        engine = self._make_engine(config)
        server = build_server(config, engine, skills, self.clock, on_segment=self._on_segment,
                              on_finish=self._on_finish, on_infeasible=self._on_infeasible)
        for robot in sorted(skills):
            server.warm_prefix(engine.tokenizer.encode(skills[robot].prompt_text("")))
        for trace in self.catalog.traces.values():  # plans' tokens first, before any task text (see SimTokenizer)
            engine.tokenizer.encode(trace.plan)
        return server

    def _server_config(self, policy: str) -> ServerConfig:
        """The server the parameters describe; its step-time profile is the one bench would use
        (``estimator_profile``). Refused before the engine loads if a part needs a profile there is none of."""
        from timely_llm.engines.hardware import estimator_profile

        model = self._param("model")
        profile = estimator_profile(self._param("estimator_profile"), self._param("engine"), model or None,
                                    self._param("hw_profile"))
        return ServerConfig(policy, self._param("network_latency"), Features.parse(self._param("features")),
                            self._param("max_batch") or None, self._param("max_new_tokens"), step_profile=profile,
                            step_profile_source=f"parameter estimator_profile for model {model!r} "
                                                "(write one with timely-llm profile)")

    def _goal_rules(self, server: Server) -> GoalRules:
        tufs = {c: TUF(*(self._param(f"tuf.{c}.{k}") for k in ("ert", "alpha", "beta"))) for c in CATEGORIES}
        return GoalRules(server.robots, self.catalog, server.engine.tokenizer.encode,
                         self._param("max_prompt_tokens"), tufs, self._param("engine") == "sim",
                         self._param("max_task_chars"))

    # ----- lifecycle -----

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load the engine in a thread of its own and wait for it here. Transitions run off the executor (ChangeState
        in a thread its coroutine callback awaits, autostart in a thread of its own), so lifecycle queries,
        parameters and status keep answering meanwhile, on a single-threaded executor too."""
        try:
            server, rules = self._load_server()
        except Exception as exc:  # noqa: BLE001 - any reason is reported and the node stays unconfigured
            self._configure_error = str(exc) or repr(exc)
            self._phase = f"configure failed: {self._configure_error}"
            self.get_logger().error(self._phase)
            return TransitionCallbackReturn.FAILURE
        self._configure_error = ""
        self._rules = rules
        self._reports = ReportBook(self._param("segment_timeout_factor"), self._param("segment_timeout_margin"))
        self._engine_name = self._param("engine")
        self._kv_blocks = server.engine.free_kv_blocks()
        server.step = self._timed(server.step)
        self.server = server
        self._running = threading.Event()
        self._running.set()
        self._loop = threading.Thread(target=self._serve, args=(server, self._running), name="timely_llm_server_loop",
                                      daemon=True)
        self._loop.start()
        self._phase = "inactive: configured, not accepting goals"
        self.get_logger().info(f"configured: engine {self._engine_name}, policy {server.policy.name}, "
                               f"robots {', '.join(sorted(server.robots))}")
        return TransitionCallbackReturn.SUCCESS

    def _load_server(self) -> tuple[Server, GoalRules]:
        """The server and its goal rules, built in a loader thread; logs progress while waiting for it.

        A shutdown requested meanwhile ends the wait (RuntimeError): the loader finishes on its own and its
        engine is closed then.
        """
        loading: concurrent.futures.Future = concurrent.futures.Future()
        threading.Thread(target=self._build_server, args=(loading,), name="timely_llm_engine_load",
                         daemon=True).start()
        began = time.monotonic()
        what = f"engine {self._param('engine')}" + (f" model {self._param('model')}"
                                                     if self._param("engine") != "sim" else "")
        self._phase = f"configuring: loading {what}"
        self.get_logger().info(f"{self._phase} ...")
        next_log = began + LOAD_PROGRESS_S
        while True:
            try:
                server, rules = loading.result(timeout=LOAD_POLL_S)
                break
            except concurrent.futures.TimeoutError:
                pass
            if self._shutting_down.is_set():
                loading.add_done_callback(_close_loaded)
                raise RuntimeError("shutdown requested while loading the engine")
            self._phase = f"configuring: loading {what} ({time.monotonic() - began:.0f} s)"
            if time.monotonic() >= next_log:
                self.get_logger().info(f"{self._phase} ...")
                next_log += LOAD_PROGRESS_S
        self.get_logger().info(f"{what} loaded in {time.monotonic() - began:.1f} s")
        return server, rules

    def _build_server(self, loading: concurrent.futures.Future) -> None:
        """Loader thread: the previous engine released first, then the new server and its goal rules."""
        try:
            if self._teardown is not None:
                self._teardown.join()
            server = self._make_server()
            try:
                loading.set_result((server, self._goal_rules(server)))
            except BaseException:
                server.engine.close()
                raise
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting configure
            if not loading.done():
                loading.set_exception(exc)

    def _timed(self, step: Callable[[], bool]) -> Callable[[], bool]:
        """``server.step`` timing each engine step it runs, for the diagnostics."""
        @functools.wraps(step)
        def timed() -> bool:
            began = time.monotonic()
            stepped = step()
            if stepped:
                self._last_step_s = time.monotonic() - began
            return stepped
        return timed

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._serving = True
        self._phase = "active: accepting goals"
        self.get_logger().info(self._phase)
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop taking goals and abort those in flight, "server deactivated": a deactivate must answer at once,
        and draining could take as long as the robots take to execute their plans."""
        self._serving = False
        self._send(functools.partial(self._abort_all, "server deactivated"))
        self._phase = "inactive: configured, not accepting goals"
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release_later()
        self._phase = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Abort what is in flight ("server shutting down"); a thread waits for the results to go out, releases
        the engine and sets ``finalized`` (the transition itself waits for nothing)."""
        self._serving = False
        self._shutting_down.set()
        self._send(functools.partial(self._abort_all, "server shutting down"))
        self._phase = "shutting down"
        threading.Thread(target=self._finalize, name="timely_llm_finalize", daemon=True).start()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._serving = False
        self._send(functools.partial(self._abort_all, "server error"))
        self._release_later()
        self._phase = "unconfigured after an error"
        return TransitionCallbackReturn.SUCCESS

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S + RESULT_FLUSH_S + 10.0) -> None:
        """The lifecycle's shutdown from whatever state the node is in (goals in flight end aborted, an engine
        still loading is given up), then wait until it is final."""
        self._shutting_down.set()
        with self._transition_lock:
            if not self.finalized.is_set() and self.lifecycle_state != "finalized":
                self.trigger_shutdown()
        if not self.finalized.wait(timeout_s):
            self.get_logger().warning(f"shutdown not final after {timeout_s} s")

    def destroy_node(self) -> None:
        if self._action is not None:
            self._action.destroy()
        super().destroy_node()

    def _finalize(self) -> None:
        self._await_results(time.monotonic() + SHUTDOWN_TIMEOUT_S)
        self._release_later()
        if self._teardown is not None:
            self._teardown.join()
        self.finalized.set()

    def _await_results(self, deadline: float) -> None:
        """Wait until every goal's final state is set, then a moment for rclpy to send the results."""
        while time.monotonic() < deadline:
            with self._lock:
                if not self._goals and not self._outbox and not self._concluding:
                    break
            time.sleep(0.01)
        time.sleep(RESULT_FLUSH_S)

    def _release_later(self) -> None:
        """Forget the server now; a thread stops its loop (which applies what is left in its inbox first) and
        frees the engine. The next configure's loader waits for it."""
        server, self.server = self.server, None
        if server is None:
            return
        self._running.clear()
        self.clock.wake()
        loop, previous = self._loop, self._teardown
        self._teardown = threading.Thread(target=self._release, args=(server, loop, previous),
                                          name="timely_llm_release", daemon=True)
        self._teardown.start()

    def _release(self, server: Server, loop: threading.Thread, previous: threading.Thread | None) -> None:
        if previous is not None:
            previous.join()
        loop.join()
        server.engine.close()
        self.get_logger().info("engine released")

    # ----- the server loop (its own thread): the only caller of the Server -----

    def _serve(self, server: Server, running: threading.Event) -> None:
        while running.is_set():
            try:
                self._apply_inbox(server)
                if not server.step():
                    self.clock.idle_until(self.clock.now() + IDLE_WAIT_S)
            except Exception as exc:  # noqa: BLE001 - a bug in one step must not stop serving everyone
                self.get_logger().error(f"server step failed: {exc!r}")
                self.clock.idle_until(self.clock.now() + IDLE_WAIT_S)
        self._apply_inbox(server)  # no longer serving: goals still waiting to be submitted end aborted

    def _send(self, command: Command) -> None:
        self._inbox.append(command)
        self.clock.wake()

    def _apply_inbox(self, server: Server) -> None:
        while self._inbox:
            command = self._inbox.popleft()
            try:
                command(server)
            except Exception as exc:  # noqa: BLE001 - one command's failure must not hold up the rest
                self.get_logger().error(f"server command failed: {exc!r}")

    def _submit(self, plan: PlanRequest, server: Server) -> None:
        try:
            self._check_serving()
            server.submit(plan)
        except Exception as exc:  # noqa: BLE001 - RequestRejected or not, this goal ends with the reason
            self._end_unserved(plan.id, str(exc) if isinstance(exc, RequestRejected) else f"internal error: {exc!r}")

    def _abort_all(self, reason: str, server: Server) -> None:
        with self._lock:
            live = self._reports.live()
        for request_id in live:
            if not server.abort(request_id, reason):
                self._end_unserved(request_id, reason)

    def _end_unserved(self, request_id: str, reason: str) -> None:
        """End a goal whose request the Server does not have."""
        with self._lock:
            self._reports.close(request_id)
        self._post(request_id, aborted_result(reason))

    # ----- server callbacks (server loop thread, holding the server lock): queue and wake the executor -----

    def _on_segment(self, request: Request, segment: Segment) -> None:
        try:
            message = segment_message(request, segment, self._ros_time)
            with self._lock:
                self._reports.dispatched(request.id, segment.index, segment.est_exec_time, self.clock.now(),
                                         request.prev_end_est)
        except Exception as exc:  # noqa: BLE001 - this request only, and not in the middle of the step
            reason = f"internal error sending segment {segment.index}: {exc!r}"
            self._send(lambda server: server.abort(request.id, reason))
            return
        self._post(request.id, RequestPlan.Feedback(segment=message, infeasible=request.infeasible_at is not None))

    def _on_infeasible(self, request: Request) -> None:
        """The notice to a goal that keeps waiting though its deadline cannot be met: a feedback without a segment."""
        self._post(request.id, RequestPlan.Feedback(
            segment=SegmentMsg(request_id="", agent_id=request.agent), infeasible=True))

    def _on_finish(self, request: Request) -> None:
        try:
            outcome = Outcome.of(request)
            result, utility = result_message(outcome), outcome.utility
        except Exception as exc:  # noqa: BLE001 - the goal must still get a result
            result, utility = aborted_result(f"internal error: {exc!r}"), None
        with self._lock:
            self._reports.close(request.id)
            self._totals[request.category].add(utility)
            self._finished += 1
        self._post(request.id, result)

    def _ros_time(self, t: float) -> TimeMsg:
        """The node's ROS time (``use_sim_time`` included) at server-clock time ``t``."""
        ago = Duration(nanoseconds=round((self.clock.now() - t) * 1e9))
        return (self.get_clock().now() - ago).to_msg()

    def _post(self, request_id: str, item: object) -> None:
        self._outbox.append((request_id, item))
        self._outbox_ready.trigger()

    # ----- action server (one callback group: goals, cancels, results and the outbox never overlap) -----

    def _on_goal(self, goal: RequestPlan.Goal) -> GoalResponse:
        try:
            self._check_serving()
            plan = plan_from_goal(goal, "", self._rules)
        except RequestRejected as exc:
            self.get_logger().warning(f"rejected goal from {goal.agent_id[:MAX_ID_CHARS]!r}: {exc}")
            return GoalResponse.REJECT
        self._checked = (id(goal), plan)  # rclpy passes no goal id here; its accepted callback comes next
        return GoalResponse.ACCEPT

    def _check_serving(self) -> None:
        if not self._serving:
            raise RequestRejected("server is not active")

    def _on_accepted(self, goal_handle) -> None:  # noqa: ANN001 - rclpy ServerGoalHandle
        request_id = goal_handle.goal_id.uuid.tobytes().hex()
        checked, self._checked = self._checked, None
        with self._lock:
            self._goals[request_id] = goal_handle
            self._reports.open(request_id, goal_handle.request.agent_id, not goal_handle.request.no_execution_reports)
        try:
            plan = checked[1] if checked and checked[0] == id(goal_handle.request) else plan_from_goal(
                goal_handle.request, "", self._rules)
        except RequestRejected as exc:
            self._end_unserved(request_id, str(exc))
            return
        self._send(functools.partial(self._submit, dataclasses.replace(plan, id=request_id, arrival=self.clock.now())))

    def _start_topic_request(self, request: TaskRequest, request_id: str) -> None:
        """Serve a task request from the topic as a goal is served; RequestRejected says why it cannot be."""
        self._check_serving()
        plan = plan_from_goal(request, request_id, self._rules)
        with self._lock:
            self._reports.open(request_id, request.agent_id, not request.no_execution_reports)
        self._send(functools.partial(self._submit, dataclasses.replace(plan, arrival=self.clock.now())))

    def _on_cancel(self, goal_handle) -> CancelResponse:  # noqa: ANN001 - rclpy ServerGoalHandle
        request_id = goal_handle.goal_id.uuid.tobytes().hex()
        with self._lock:
            if request_id not in self._reports:
                return CancelResponse.REJECT
        # The result reaches the outbox, which this callback group drains once the goal is CANCELING.
        self._send(lambda server: server.cancel(request_id))
        return CancelResponse.ACCEPT

    def _drain_outbox(self) -> None:
        while self._outbox:
            request_id, item = self._outbox.popleft()
            try:
                self._deliver(request_id, item)
            except Exception as exc:  # noqa: BLE001 - one goal's failure must not hold up the rest
                self.get_logger().error(f"could not deliver to goal {request_id}: {exc!r}")

    def _deliver(self, request_id: str, item: object) -> None:
        if self._topics.deliver(request_id, item):
            return
        if isinstance(item, RequestPlan.Feedback):
            goal_handle = self._goals.get(request_id)
            if goal_handle is not None:
                goal_handle.publish_feedback(item)
            return
        with self._lock:
            goal_handle = self._goals.pop(request_id, None)
            if goal_handle is not None:
                self._concluding.add(request_id)
        if goal_handle is not None:
            goal_handle.execute(functools.partial(self._conclude_with, item))

    def _conclude(self, goal_handle) -> RequestPlan.Result:  # noqa: ANN001 - rclpy ServerGoalHandle
        """rclpy needs a default execute callback; every goal is executed with ``_conclude_with`` instead."""
        goal_handle.abort()
        return aborted_result("executed without a result")

    def _conclude_with(self, result: RequestPlan.Result, goal_handle) -> RequestPlan.Result:  # noqa: ANN001
        """Execute callback of an ended request: set the goal's final state and return its result."""
        request_id = goal_handle.goal_id.uuid.tobytes().hex()
        try:
            if result.status == Status.SUCCEEDED.value:
                goal_handle.succeed()
            elif result.status == Status.CANCELED.value and goal_handle.is_cancel_requested:
                goal_handle.canceled()
            else:
                goal_handle.abort()
        finally:
            with self._lock:
                self._concluding.discard(request_id)
        log = self.get_logger().debug if result.status == Status.SUCCEEDED.value else self.get_logger().info
        log(f"request {request_id} {result.status} {result.reason}".rstrip())
        return result

    # ----- robots, watchdog and status -----

    def _on_segment_done(self, report: SegmentDone) -> None:
        report = self._topics.to_node(report)
        now = self.clock.now()
        with self._lock:
            refused = self._reports.take(report, now)
        if refused:
            self.get_logger().warning(f"ignored SegmentDone from {report.agent_id[:MAX_ID_CHARS]!r} for goal "
                                      f"{report.request_id[:MAX_ID_CHARS]!r} segment {report.index}: {refused}")
            return
        self._send(functools.partial(self._apply_report, report, now))

    def _apply_report(self, report: SegmentDone, received: float, server: Server) -> None:
        exec_end = received - server.network_latency
        try:
            server.segment_done(report.request_id, report.index, exec_end - report.duration, exec_end,
                                report.success, report.reason[:MAX_REASON_CHARS])
        except Exception as exc:  # noqa: BLE001 - ends this goal only
            server.abort(report.request_id, f"internal error handling the report of segment {report.index}: {exc!r}")

    def _check_watchdog(self) -> None:
        with self._lock:
            now = self.clock.now()
            overdue, due = self._reports.expired(now), self._reports.due(now)
        for request_id, index, start, end in due:  # goals without reports: executed as estimated
            self._send(functools.partial(_executed, request_id, index, start, end))
        for request_id, index in overdue:
            reason = f"robot did not report segment {index} done in time"
            self.get_logger().warning(f"aborting request {request_id}: {reason}")
            self._send(functools.partial(_abort, request_id, reason))

    def _publish_status(self) -> None:
        server = self.server
        if server is None or not self._serving:
            return
        with server.lock:  # read only, and brief: the loop holds it for a scheduling decision at most
            queued, running = len(server.queue), len(server.running)
            suspended = sum(r.status in (Status.PARKED, Status.SUSPENDED) for r in server.requests.values())
        with self._lock:
            totals = sorted((c, t.count, t.mean_utility) for c, t in self._totals.items())
            msg = ServerStatus(queue_length=queued, running=running, suspended=suspended,
                               executing=self._reports.executing(), finished=self._finished,
                               policy=server.policy.name, engine=self._engine_name)
        msg.stamp = self.get_clock().now().to_msg()
        for category, count, mean in totals:
            msg.categories.append(category)
            msg.count.append(count)
            msg.mean_utility.append(mean)
        self._status_pub.publish(msg)


    # ----- parameters changed at run time -----

    def _check_parameters(self, params: list[Parameter]) -> SetParametersResult:
        """Refuse what cannot apply now, with the reason (see timely_llm/ros/parameters.py)."""
        result = refuse_while_configured(params, self.lifecycle_state)
        if not result.successful:
            return result
        for p in params:
            if p.name == "policy":
                reason = self._policy_refusal(str(p.value))
                if reason:
                    return SetParametersResult(successful=False, reason=f"policy: {reason}")
        return result

    def _policy_refusal(self, name: str) -> str:
        if name not in POLICIES:
            return f"must be one of {', '.join(POLICIES)}, got {name!r}"
        server = self.server
        if server is not None and _serving_mode(POLICIES[name]) != _serving_mode(server.policy):
            return (f"{name} serves in another mode than {server.policy.name} (segmented, streaming, adaptive "
                    "batch): set it while the node is unconfigured")
        return ""

    def _apply_parameters(self, params: list[Parameter]) -> None:
        """Apply live parameters (configure-time ones wait for the next configure)."""
        names = {p.name for p in params}
        if self.server is not None and (names & {"max_task_chars", "max_prompt_tokens"}
                                        or any(n.startswith("tuf.") for n in names)):
            self._rules = dataclasses.replace(self._rules, **self._live_rules())
        with self._lock:
            self._reports.factor = self._param("segment_timeout_factor")
            self._reports.margin = self._param("segment_timeout_margin")
        if "status_period" in names:
            self._status_timer.timer_period_ns = round(self._param("status_period") * 1e9)
            self._status_timer.reset()
        if "max_new_tokens" in names:
            self._send(functools.partial(_set_max_new_tokens, self._param("max_new_tokens")))
        if "policy" in names:
            self._send(functools.partial(_use_policy, POLICIES[self._param("policy")]))
        self.get_logger().info(f"parameters set: {', '.join(sorted(names))}")

    def _live_rules(self) -> dict[str, object]:
        """The goal rules' fields that follow live parameters."""
        return {"default_tufs": {c: TUF(*(self._param(f"tuf.{c}.{k}") for k in ("ert", "alpha", "beta")))
                                 for c in CATEGORIES},
                "max_prompt_tokens": self._param("max_prompt_tokens"), "max_task_chars": self._param("max_task_chars")}

    # ----- diagnostics -----

    def _publish_diagnostics(self) -> None:
        self._diagnostics_pub.publish(diagnostic_array(self._snapshot(), self.get_clock().now().to_msg()))

    def _snapshot(self) -> Snapshot:
        state = self.lifecycle_state
        snap = Snapshot(node=self.get_fully_qualified_name(), lifecycle=state,
                        phase=self._phase if state != "unconfigured" or self._configure_error else "unconfigured",
                        failed=bool(self._configure_error) and state == "unconfigured",
                        engine=self._param("engine"), model=self._param("model"), device=self._device(),
                        policy=self._param("policy"))
        server = self.server
        if server is None:
            return snap
        with server.lock:
            snap.queue, snap.running = len(server.queue), len(server.running)
            snap.policy, snap.batch_cap = server.policy.name, server.batch.max_batch or 0
            snap.kv_free_blocks, snap.kv_blocks = server.engine.free_kv_blocks(), self._kv_blocks
        with self._lock:
            snap.executing = self._reports.executing()
        snap.last_step_s = self._last_step_s
        snap.loop_alive = self._loop is not None and self._loop.is_alive()
        return snap

    def _device(self) -> str:
        if self._param("engine") == "sim":
            return f"simulated ({self._param('hw_profile')})"
        engine = self.server.engine if self.server is not None else None
        return str(getattr(engine, "device", "") or "")


def _serving_mode(policy: ServingPolicy) -> tuple[bool, bool, bool]:
    return policy.segmented, policy.streaming, policy.adaptive_batch


def _use_policy(policy: ServingPolicy, server: Server) -> None:
    """Another policy of the same serving mode: only the queue's order (and vLLM-priority's engine priority) differ,
    so switching between engine steps is safe for the requests in flight."""
    server.policy = policy
    server.queue.policy = make_policy(policy.priority, server.network_latency)


def _set_max_new_tokens(value: int, server: Server) -> None:
    server.default_max_new_tokens = value


def _close_loaded(loading: concurrent.futures.Future) -> None:
    """A loader's server nobody waits for any more: its engine is closed."""
    if not loading.cancelled() and loading.exception() is None:
        loading.result()[0].engine.close()


def _executed(request_id: str, index: int, exec_start: float, exec_end: float, server: Server) -> None:
    server.segment_done(request_id, index, exec_start, exec_end)


def _in_thread(name: str, function: Callable[..., object], *args: object) -> rclpy.task.Future:
    """``function(*args)`` run in a thread of its own; the future an executor's coroutine callback can await."""
    done = rclpy.task.Future()

    def run() -> None:
        try:
            done.set_result(function(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits it
            done.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return done


def _abort(request_id: str, reason: str, server: Server) -> None:
    server.abort(request_id, reason)


def segment_message(request: Request, segment: Segment, stamp: Callable[[float], TimeMsg]) -> SegmentMsg:
    """The feedback message for a dispatched segment; ``stamp`` turns a server-clock time into ROS time."""
    return SegmentMsg(
        request_id=request.id, agent_id=request.agent, index=segment.index, text=segment.text,
        skills=[SkillCall(name=c.name, args=list(c.args)) for c in segment.calls],
        estimated_exec_time=float(segment.est_exec_time), gen_start=stamp(segment.gen_start),
        gen_end=stamp(segment.gen_end), dispatch_time=stamp(segment.gen_end), final=segment.final)


def result_message(outcome: Outcome) -> RequestPlan.Result:
    """The action result for how a request ended; a shed one's response time is the best it could still have had."""
    response = outcome.best_response if outcome.shed else outcome.response_time
    return RequestPlan.Result(
        status=outcome.status.value, reason=outcome.reason, plan=outcome.plan, num_segments=len(outcome.segments),
        response_time=_float_or_nan(response), waiting_time=_float_or_nan(outcome.waiting_time),
        utility=_float_or_nan(outcome.utility))


def aborted_result(reason: str) -> RequestPlan.Result:
    """The result of a goal that ends before its request could start."""
    return RequestPlan.Result(status=Status.ABORTED.value, reason=reason,
                              **dict.fromkeys(("response_time", "waiting_time", "utility"), math.nan))


def _float_or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def spin(executor: rclpy.executors.Executor, stop: threading.Event) -> None:
    """``executor.spin()`` until ``stop`` is set, but never waiting for work longer than SPIN_WAKE_S.

    Seen under load with rclpy Jazzy's MultiThreadedExecutor: a wait that began while a
    timer's callback group was busy was not woken when the group became free, and the
    node's timers stopped until some message happened to arrive.

    A task that met an entity destroyed since the executor's wait (``InvalidHandle``, re-raised
    here by ``spin_once``) concerned a node already gone: the spinning goes on for the others.
    Join the thread running this before ``executor.shutdown()`` (:func:`spinning` does): Jazzy's
    shutdown destroys the executor's guard condition without waiting for callbacks in flight,
    and every task a ``spin_once`` still makes triggers it.
    """
    while not stop.is_set() and executor.context.ok():
        try:
            executor.spin_once(timeout_sec=SPIN_WAKE_S)
        except rclpy.executors.ExternalShutdownException:
            return
        except InvalidHandle:
            continue


@contextmanager
def spinning(context: Context | None = None, threads: int = EXECUTOR_THREADS) -> Iterator[rclpy.executors.Executor]:
    """An executor spinning in a thread of its own; stopped, then shut down, when the block ends. ``threads`` 1:
    a SingleThreadedExecutor, else a MultiThreadedExecutor (a session shared with clients that may wait)."""
    executor = (rclpy.executors.SingleThreadedExecutor(context=context) if threads == 1
                else rclpy.executors.MultiThreadedExecutor(num_threads=threads, context=context))
    stop = threading.Event()
    spinner = threading.Thread(target=spin, args=(executor, stop), name="executor", daemon=True)
    spinner.start()
    try:
        yield executor
    finally:
        stop.set()
        spinner.join()  # before the shutdown: see spin
        executor.shutdown()


def main(args: list[str] | None = None) -> int:
    """Run the node until SIGINT or SIGTERM; ``args`` are ROS arguments (e.g. ``--ros-args --params-file F``).

    On a signal the node goes through its lifecycle shutdown: every goal in flight ends
    ABORTED ("server shutting down") and its client gets the result, the engine is
    released, and the process exits 0. Exit code 1 if the node cannot start (a parameter out
    of its range, no robot type installed); a configure that fails leaves it running, unconfigured.
    """
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        node = TimelyLlmNode()
    except NodeStartError as exc:
        rclpy.logging.get_logger("timely_llm_server").fatal(str(exc))
        rclpy.try_shutdown()
        return 1
    with spinning(threads=NODE_EXECUTOR_THREADS) as executor:
        executor.add_node(node)
        while not stop.wait(0.2) and not node.finalized.is_set():
            pass
        node.shutdown()
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
