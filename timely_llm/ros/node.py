"""The ``timely_llm_server`` ROS 2 node: a managed (lifecycle) front end over :class:`timely_llm.server.Server`.

Robots send ``RequestPlan`` goals; each plan segment comes back as feedback the moment
the server dispatches it, and the result once the robot has reported every segment
executed (``segment_done`` topic). All scheduling happens in the Server, whose loop
runs in a thread of its own on the wall clock.

No executor thread or task waits on a goal. A goal accepted by the action server is
handed to the Server and stays ACCEPTED while it is planned and executed; the Server's
callbacks (its loop thread) only queue what they have to say in an outbox and trigger a
guard condition, and the executor drains it: it publishes feedback, and for an ended
request runs the goal's execute callback once, which sets the final state and returns
the result. (rclpy's executor re-runs every pending coroutine task on every wake-up, so
an ``async`` execute callback awaiting a future per goal costs O(goals) per message:
at 300 goals in flight it could not keep up with 10 messages a second.)

Lifecycle: configure loads the engine and starts the server loop, activate accepts
goals, deactivate ends the goals in flight (aborted, "server deactivated"), cleanup
frees the engine, shutdown aborts what is in flight ("server shutting down") and waits
briefly for the results to go out. Parameter ``autostart`` (default true) configures and
activates at construction, so no lifecycle manager is needed.
"""

from __future__ import annotations

import collections
import functools
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import rclpy
import rclpy.executors
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.signals import SignalHandlerOptions

from timely_llm.clock import WallClock
from timely_llm.core.request import Outcome, Request, Segment, Status
from timely_llm.core.skills import load_skill_models
from timely_llm.core.tuf import DEFAULT_TUFS, TUF
from timely_llm.engines.base import DEFAULT_MAX_NEW_TOKENS, Engine
from timely_llm.errors import RequestRejected
from timely_llm.ros.interfaces import RequestPlan, SegmentDone, ServerStatus, SkillCall
from timely_llm.ros.interfaces import Segment as SegmentMsg
from timely_llm.ros.qos import DEEP_RELIABLE, SERVER_STATUS_QOS, action_server_qos
from timely_llm.server import POLICIES, PlanRequest, Server
from timely_llm.workloads.traces import TraceCatalog, load_catalog

IDLE_WAIT_S = 0.05
WATCHDOG_PERIOD_S = 0.1
CATEGORIES = tuple(DEFAULT_TUFS)
EXECUTOR_THREADS = 5
"""One per callback group (goals and results, reports, watchdog, status, lifecycle and parameters): no goal holds
a thread."""
SPIN_WAKE_S = 0.1
"""The executor re-examines its work at least this often: a lost wake-up costs this, not a stalled node."""
SHUTDOWN_TIMEOUT_S = 1.5
"""Shutdown waits at most this long for the results of the goals it aborts to be handed to rclpy ..."""
RESULT_FLUSH_S = 0.3
"""... and then this long for rclpy to send them and for result requests still in flight to arrive."""

MAX_ID_CHARS = 256
MAX_ERT_S = 3600.0
MAX_TUF_SLOPE = 1e6
MAX_TUF_BETA = 1e6
REPORT_SLACK_S = 1.0
"""A reported duration may exceed the time since its segment was dispatched by this much (clock granularity)."""
MAX_REASON_CHARS = 200

PARAMETERS: dict[str, tuple[object, str]] = {
    "autostart": (True, "configure and activate at startup (else wait for lifecycle transitions)"),
    "engine": ("sim", "sim (calibrated simulator, needs trace_id goals) or vllm"),
    "model": ("", "model directory for engine vllm; empty = the shipped tiny model"),
    "max_model_len": (2048, "engine vllm: longest prompt + plan in tokens"),
    "kv_cache_gib": (1.0, "engine vllm: KV cache size in GiB"),
    "hw_profile": ("rtx4090-llama3-8b", "hardware profile name or YAML file for engine sim"),
    "skill_models": (Parameter.Type.STRING_ARRAY, "skill-model YAML files; empty = the shipped ones"),
    "policy": ("timelyllm", f"serving policy: {', '.join(POLICIES)}"),
    "max_batch": (0, "maximum batch size; 0 = the policy's default"),
    "network_latency": (0.008, "one-way robot<->server latency in seconds"),
    "max_task_chars": (2000, "goals whose task text is longer are rejected"),
    "max_prompt_tokens": (1792, "goals whose prompt is longer are rejected (vllm: + max_new_tokens <= max_model_len)"),
    "max_new_tokens": (DEFAULT_MAX_NEW_TOKENS, "default cap on a plan's tokens"),
    "segment_timeout_factor": (3.0, "a segment times out after factor x its estimated execution time ..."),
    "segment_timeout_margin": (5.0, "... plus this many seconds"),
    "status_period": (1.0, "seconds between ServerStatus messages"),
    "result_timeout": (60.0, "seconds a goal's result stays available to result requests after it ends"),
    **{f"tuf.{c}.{k}": (v, f"default TUF {k} for {c} goals that give none")
       for c, tuf in DEFAULT_TUFS.items() for k, v in tuf.to_dict().items()},
}


class NodeStartError(RuntimeError):
    """The node could not be configured and activated at startup (autostart)."""


@dataclass(frozen=True)
class GoalRules:
    """What a goal is checked against before it is accepted."""

    robots: Collection[str]
    catalog: TraceCatalog
    encode: Callable[[str], list[int]]
    max_prompt_tokens: int
    default_tufs: dict[str, TUF]
    trace_required: bool
    max_task_chars: int = 2000


def plan_from_goal(goal: RequestPlan.Goal, request_id: str, rules: GoalRules) -> PlanRequest:
    """The PlanRequest for a goal; RequestRejected says why a malformed goal cannot be served."""
    if not goal.agent_id.strip():
        raise RequestRejected("empty agent id")
    if len(goal.agent_id) > MAX_ID_CHARS:
        raise RequestRejected(f"agent id longer than {MAX_ID_CHARS} characters")
    if not goal.task.strip():
        raise RequestRejected("empty task")
    if len(goal.task) > rules.max_task_chars:
        raise RequestRejected(f"task of {len(goal.task)} characters exceeds max_task_chars {rules.max_task_chars}")
    if goal.robot_type not in rules.robots:
        raise RequestRejected(f"unknown robot type {goal.robot_type[:MAX_ID_CHARS]!r} "
                              f"(known: {', '.join(sorted(rules.robots))})")
    trace = _goal_trace(goal, rules)
    category = trace.category if trace else ("arm" if goal.robot_type == "arm" else "normal")
    tuf = _goal_tuf(goal, category, rules)
    prompt_ids = rules.encode(rules.catalog.prompt_text(goal.robot_type, goal.task))
    if len(prompt_ids) > rules.max_prompt_tokens:
        raise RequestRejected(f"prompt of {len(prompt_ids)} tokens exceeds max_prompt_tokens {rules.max_prompt_tokens}")
    return PlanRequest(request_id, goal.agent_id, goal.robot_type, prompt_ids, tuf, category, goal.max_new_tokens,
                       forced_ids=rules.encode(trace.plan) if trace else None, trace=trace.id if trace else None)


def _goal_trace(goal: RequestPlan.Goal, rules: GoalRules):  # noqa: ANN202 - Trace | None
    if goal.trace_id < 0 or (goal.trace_id == 0 and rules.trace_required):
        raise RequestRejected(f"trace_id {goal.trace_id} invalid: the sim engine replays LRTrace plans (trace_id > 0)")
    if goal.trace_id == 0:
        return None
    if goal.trace_id not in rules.catalog.traces:
        raise RequestRejected(f"unknown trace_id {goal.trace_id}")
    trace = rules.catalog[goal.trace_id]
    if trace.robot != goal.robot_type:
        raise RequestRejected(f"trace {trace.id} is for robot {trace.robot!r}, not {goal.robot_type!r}")
    return trace


def _goal_tuf(goal: RequestPlan.Goal, category: str, rules: GoalRules) -> TUF:
    if goal.tuf_ert == goal.tuf_alpha == goal.tuf_beta == 0.0:
        return rules.default_tufs[category]
    try:
        tuf = TUF(goal.tuf_ert, goal.tuf_alpha, goal.tuf_beta)
    except ValueError as exc:
        raise RequestRejected(str(exc)) from exc
    if tuf.ert > MAX_ERT_S:
        raise RequestRejected(f"TUF ert {tuf.ert} s exceeds {MAX_ERT_S} s")
    if -tuf.alpha > MAX_TUF_SLOPE:
        raise RequestRejected(f"TUF alpha {tuf.alpha} is steeper than -{MAX_TUF_SLOPE}")
    if tuf.beta > MAX_TUF_BETA:
        raise RequestRejected(f"TUF beta {tuf.beta} exceeds {MAX_TUF_BETA}")
    return tuf


@dataclass
class _Awaited:
    """A dispatched segment whose SegmentDone has not come yet."""

    est_exec_time: float
    dispatched_at: float
    deadline: float


@dataclass
class _Lane:
    agent: str
    dispatched: int = 0
    awaited: dict[int, _Awaited] = field(default_factory=dict)
    """By segment index, in dispatch order."""


@dataclass
class ReportBook:
    """Per request in flight: its agent and every dispatched segment still awaiting its report, each with a deadline.

    A robot executes its segments in order, so a segment's deadline allows for the awaited
    segments before it: ``factor`` x their estimated times plus its own, plus ``margin``,
    counted from its dispatch; a report moves the deadlines of the segments after it (never
    before it) to count from the report. Each segment is cleared only by its own report, so
    a robot that skips one is caught however it reports the others.
    """

    factor: float
    margin: float
    _lanes: dict[str, _Lane] = field(default_factory=dict)

    def open(self, request_id: str, agent: str) -> None:
        self._lanes[request_id] = _Lane(agent)

    def close(self, request_id: str) -> None:
        self._lanes.pop(request_id, None)

    def live(self) -> list[str]:
        return list(self._lanes)

    def dispatched(self, request_id: str, index: int, est_exec_time: float, now: float) -> None:
        lane = self._lanes.get(request_id)
        if lane is None:
            return
        lane.dispatched = index + 1
        ahead = math.fsum(s.est_exec_time for s in lane.awaited.values()) + est_exec_time
        lane.awaited[index] = _Awaited(est_exec_time, now, now + self.factor * ahead + self.margin)

    def take(self, report: SegmentDone, now: float) -> str | None:
        """Record a report, or say why it is refused (then nothing changes)."""
        lane = self._lanes.get(report.request_id)
        if lane is None:
            return "no such goal in flight"
        if report.agent_id != lane.agent:
            return f"agent {report.agent_id[:MAX_ID_CHARS]!r} did not send this goal"
        if report.index >= lane.dispatched:
            return f"segment {report.index} was not dispatched ({lane.dispatched} so far)"
        segment = lane.awaited.get(report.index)
        if segment is None:
            return f"segment {report.index} was already reported"
        duration = report.duration
        if not math.isfinite(duration) or duration < 0:
            return f"duration {duration!r} is not a finite, non-negative number of seconds"
        if duration > now - segment.dispatched_at + REPORT_SLACK_S:
            return f"duration {duration:.6g} s exceeds the {now - segment.dispatched_at:.3f} s since its dispatch"
        del lane.awaited[report.index]
        ahead = 0.0
        for index, later in lane.awaited.items():
            if index > report.index:
                ahead += later.est_exec_time
                later.deadline = max(later.deadline, now + self.factor * ahead + self.margin)
        return None

    def expired(self, now: float) -> list[tuple[str, int]]:
        """(request, first overdue segment) for every request whose robot missed a deadline."""
        overdue = []
        for request_id, lane in self._lanes.items():
            late = [index for index, s in lane.awaited.items() if now > s.deadline]
            if late:
                overdue.append((request_id, min(late)))
        return overdue

    def executing(self) -> int:
        """Requests with a dispatched segment their robot has not reported yet."""
        return sum(1 for lane in self._lanes.values() if lane.awaited)


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
        for name, (default, description) in PARAMETERS.items():
            self.declare_parameter(name, default, ParameterDescriptor(description=description))
        self.clock = WallClock()
        self.server: Server | None = None
        self._loop: threading.Thread | None = None
        self._serving = False
        self._lock = threading.Lock()
        self._goals: dict[str, object] = {}  # request id -> rclpy ServerGoalHandle, until its result is handed over
        self._reports = ReportBook(0.0, 0.0)
        self._faulted: dict[str, str] = {}  # requests a server callback could not handle -> reason, aborted next tick
        self._totals: dict[str, CategoryTotals] = collections.defaultdict(CategoryTotals)
        self._finished = 0
        self._outbox: collections.deque[tuple[str, object]] = collections.deque()
        self.finalized = threading.Event()

        goals = MutuallyExclusiveCallbackGroup()  # goal, cancel and result requests and the outbox: one at a time
        self._action = ActionServer(self, RequestPlan, "request_plan", execute_callback=self._conclude,
                                    callback_group=goals,
                                    goal_callback=self._guarded(self._on_goal, GoalResponse.REJECT),
                                    handle_accepted_callback=self._guarded(self._on_accepted),
                                    cancel_callback=self._guarded(self._on_cancel, CancelResponse.REJECT),
                                    result_timeout=float(self._param("result_timeout")), **action_server_qos())
        self._outbox_ready = self.create_guard_condition(self._guarded(self._drain_outbox), callback_group=goals)
        self.create_subscription(SegmentDone, "segment_done", self._guarded(self._on_segment_done), DEEP_RELIABLE,
                                 callback_group=MutuallyExclusiveCallbackGroup())
        self._status_pub = self.create_lifecycle_publisher(ServerStatus, "status", SERVER_STATUS_QOS)
        self.create_timer(self._param("status_period"), self._guarded(self._publish_status),
                          callback_group=MutuallyExclusiveCallbackGroup())
        self.create_timer(WATCHDOG_PERIOD_S, self._guarded(self._check_watchdog),
                          callback_group=MutuallyExclusiveCallbackGroup())
        if self._param("autostart"):
            self._autostart()

    # ----- setup -----

    def _param(self, name: str):  # noqa: ANN202 - the parameter's value
        return self.get_parameter(name).value

    def _guarded(self, callback: Callable, on_error: object = None) -> Callable:
        """``callback`` that logs an exception instead of raising it into the executor (which would stop spinning)."""
        @functools.wraps(callback)
        def run(*args: object) -> object:
            try:
                return callback(*args)
            except Exception as exc:  # noqa: BLE001 - the request concerned is ended by the callback's caller
                self.get_logger().error(f"{callback.__name__} failed: {exc!r}")
                return on_error
        return run

    def _autostart(self) -> None:
        if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
            raise NodeStartError(f"configure failed: {self._configure_error}")
        if self.trigger_activate() != TransitionCallbackReturn.SUCCESS:
            raise NodeStartError("activate failed")

    def _make_engine(self) -> Engine:
        if self._param("engine") == "vllm":
            from timely_llm.engines.vllm_engine import VllmEngine

            return VllmEngine(self._param("model") or None, max_model_len=self._param("max_model_len"),
                              kv_cache_gib=self._param("kv_cache_gib"))
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
        if not skills:
            raise ValueError("no skill models: the node would know no robot type")
        engine = self._make_engine()
        server = Server(engine, skills, POLICIES[policy], self.clock, self._param("network_latency"),
                        self._param("max_batch") or None, self._param("max_new_tokens"),
                        on_segment=self._on_segment, on_finish=self._on_finish)
        for robot in sorted(skills):
            server.warm_prefix(engine.tokenizer.encode(self.catalog.prompt_text(robot, "")))
        for trace in self.catalog.traces.values():  # plans' tokens first, before any task text (see SimTokenizer)
            engine.tokenizer.encode(trace.plan)
        return server

    def _goal_rules(self, server: Server) -> GoalRules:
        tufs = {c: TUF(*(self._param(f"tuf.{c}.{k}") for k in ("ert", "alpha", "beta"))) for c in CATEGORIES}
        return GoalRules(set(server.robots), self.catalog, server.engine.tokenizer.encode,
                         self._param("max_prompt_tokens"), tufs, self._param("engine") == "sim",
                         self._param("max_task_chars"))

    def _serve(self, server: Server, running: threading.Event) -> None:
        while running.is_set():
            try:
                if not server.step():
                    self.clock.idle_until(self.clock.now() + IDLE_WAIT_S)
            except Exception as exc:  # noqa: BLE001 - a bug in one step must not stop serving everyone
                self.get_logger().error(f"server step failed: {exc!r}")
                self.clock.idle_until(self.clock.now() + IDLE_WAIT_S)

    # ----- lifecycle -----

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            server = self._make_server()
            self._rules = self._goal_rules(server)
        except Exception as exc:  # noqa: BLE001 - any reason is reported and the node stays unconfigured
            self._configure_error = str(exc)
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        self._reports = ReportBook(self._param("segment_timeout_factor"), self._param("segment_timeout_margin"))
        self._engine_name = self._param("engine")
        self.server = server
        self._running = threading.Event()
        self._running.set()
        self._loop = threading.Thread(target=self._serve, args=(server, self._running), name="timely_llm_server_loop",
                                      daemon=True)
        self._loop.start()
        self.get_logger().info(f"configured: engine {self._engine_name}, policy {server.policy.name}, "
                               f"robots {', '.join(sorted(server.robots))}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._serving = True
        self.get_logger().info("active: accepting goals")
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._serving = False
        self._abort_all("server deactivated")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._serving = False
        self._abort_all("server shutting down")
        self._await_results(time.monotonic() + SHUTDOWN_TIMEOUT_S)
        self._release()
        self.finalized.set()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._serving = False
        self._abort_all("server error")
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def shutdown(self) -> None:
        """The lifecycle's shutdown from whatever state the node is in (goals in flight end aborted)."""
        if not self.finalized.is_set():
            self.trigger_shutdown()

    def destroy_node(self) -> None:
        self._action.destroy()
        super().destroy_node()

    def _abort_all(self, reason: str) -> None:
        if self.server is None:
            return
        with self._lock:
            live = self._reports.live()
        for request_id in live:
            self.server.abort(request_id, reason)

    def _await_results(self, deadline: float) -> None:
        """Wait until every goal's result is with rclpy, then a moment for rclpy to send the results."""
        while time.monotonic() < deadline:
            with self._lock:
                if not self._goals and not self._outbox:
                    break
            time.sleep(0.01)
        time.sleep(RESULT_FLUSH_S)

    def _release(self) -> None:
        """Stop the server loop and free the engine."""
        server, self.server = self.server, None
        if server is None:
            return
        self._running.clear()
        self.clock.wake()
        self._loop.join()
        server.engine.close()
        self.get_logger().info("engine released")

    # ----- server callbacks (server loop thread, holding the server lock): queue and wake the executor -----

    def _on_segment(self, request: Request, segment: Segment) -> None:
        try:
            message = segment_message(request, segment)
            with self._lock:
                self._reports.dispatched(request.id, segment.index, segment.est_exec_time, self.clock.now())
        except Exception as exc:  # noqa: BLE001 - this request only; the loop must go on
            with self._lock:
                self._faulted[request.id] = f"internal error sending segment {segment.index}: {exc!r}"
            return
        self._post(request.id, message)

    def _on_finish(self, request: Request) -> None:
        try:
            outcome = Outcome.of(request)
            result, utility = result_message(outcome), outcome.utility
        except Exception as exc:  # noqa: BLE001 - the goal must still get a result
            result, utility = aborted_result(f"internal error: {exc!r}"), None
        with self._lock:
            self._reports.close(request.id)
            self._faulted.pop(request.id, None)
            self._totals[request.category].add(utility)
            self._finished += 1
        self._post(request.id, result)

    def _post(self, request_id: str, item: object) -> None:
        self._outbox.append((request_id, item))
        self._outbox_ready.trigger()

    # ----- action server (one callback group: goals, cancels, results and the outbox never overlap) -----

    def _on_goal(self, goal: RequestPlan.Goal) -> GoalResponse:
        # rclpy passes no goal id here, so the accepted callback builds the request again under its id.
        try:
            self._check_serving()
            plan_from_goal(goal, "check", self._rules)
        except RequestRejected as exc:
            self.get_logger().warning(f"rejected goal from {goal.agent_id[:MAX_ID_CHARS]!r}: {exc}")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _check_serving(self) -> None:
        if not self._serving or self.server is None:
            raise RequestRejected("server is not active")

    def _on_accepted(self, goal_handle) -> None:  # noqa: ANN001 - rclpy ServerGoalHandle
        request_id = goal_handle.goal_id.uuid.tobytes().hex()
        with self._lock:
            self._goals[request_id] = goal_handle
            self._reports.open(request_id, goal_handle.request.agent_id)
        try:
            self._check_serving()
            self.server.submit(plan_from_goal(goal_handle.request, request_id, self._rules))
        except Exception as exc:  # noqa: BLE001 - RequestRejected or not, this goal ends with the reason
            reason = str(exc) if isinstance(exc, RequestRejected) else f"internal error: {exc!r}"
            with self._lock:
                self._goals.pop(request_id, None)
                self._reports.close(request_id)
            goal_handle.execute(functools.partial(self._conclude_with, aborted_result(reason)))

    def _on_cancel(self, goal_handle) -> CancelResponse:  # noqa: ANN001 - rclpy ServerGoalHandle
        server = self.server
        if server is not None and server.cancel(goal_handle.goal_id.uuid.tobytes().hex()):
            return CancelResponse.ACCEPT  # its result is in the outbox, drained after this cancel completes
        return CancelResponse.REJECT

    def _drain_outbox(self) -> None:
        while self._outbox:
            request_id, item = self._outbox.popleft()
            try:
                self._deliver(request_id, item)
            except Exception as exc:  # noqa: BLE001 - one goal's failure must not hold up the rest
                self.get_logger().error(f"could not deliver to goal {request_id}: {exc!r}")

    def _deliver(self, request_id: str, item: object) -> None:
        if isinstance(item, SegmentMsg):
            goal_handle = self._goals.get(request_id)
            if goal_handle is not None:
                goal_handle.publish_feedback(RequestPlan.Feedback(segment=item))
            return
        with self._lock:
            goal_handle = self._goals.pop(request_id, None)
        if goal_handle is not None:
            goal_handle.execute(functools.partial(self._conclude_with, item))

    def _conclude(self, goal_handle) -> RequestPlan.Result:  # noqa: ANN001 - rclpy ServerGoalHandle
        """rclpy needs a default execute callback; every goal is executed with ``_conclude_with`` instead."""
        goal_handle.abort()
        return aborted_result("executed without a result")

    def _conclude_with(self, result: RequestPlan.Result, goal_handle) -> RequestPlan.Result:  # noqa: ANN001
        """Execute callback of an ended request: set the goal's final state and return its result."""
        if result.status == Status.SUCCEEDED.value:
            goal_handle.succeed()
        elif result.status == Status.CANCELED.value and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        else:
            goal_handle.abort()
        log = self.get_logger().debug if result.status == Status.SUCCEEDED.value else self.get_logger().info
        log(f"request {goal_handle.goal_id.uuid.tobytes().hex()} {result.status} {result.reason}".rstrip())
        return result

    # ----- robots, watchdog and status -----

    def _on_segment_done(self, report: SegmentDone) -> None:
        server = self.server
        now = self.clock.now()
        with self._lock:
            refused = "the server is not configured" if server is None else self._reports.take(report, now)
        if refused:
            self.get_logger().warning(f"ignored SegmentDone from {report.agent_id[:MAX_ID_CHARS]!r} for goal "
                                      f"{report.request_id[:MAX_ID_CHARS]!r} segment {report.index}: {refused}")
            return
        exec_end = now - server.network_latency
        try:
            server.segment_done(report.request_id, report.index, exec_end - report.duration, exec_end, report.success,
                                report.reason[:MAX_REASON_CHARS])
        except Exception as exc:  # noqa: BLE001 - ends this goal only
            server.abort(report.request_id, f"internal error handling the report of segment {report.index}: {exc!r}")

    def _check_watchdog(self) -> None:
        server = self.server
        if server is None:
            return
        with self._lock:
            overdue = [(rid, f"robot did not report segment {i} done in time")
                       for rid, i in self._reports.expired(self.clock.now())]
            overdue += self._faulted.items()
            self._faulted = {}
        for request_id, reason in overdue:
            self.get_logger().warning(f"aborting request {request_id}: {reason}")
            server.abort(request_id, reason)

    def _publish_status(self) -> None:
        server = self.server
        if server is None or not self._serving:
            return
        with server.lock:
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


def segment_message(request: Request, segment: Segment) -> SegmentMsg:
    """The feedback message for a dispatched segment (times on the server's clock)."""
    return SegmentMsg(
        request_id=request.id, agent_id=request.agent, index=segment.index, text=segment.text,
        skills=[SkillCall(name=c.name, args=list(c.args)) for c in segment.calls],
        estimated_exec_time=float(segment.est_exec_time), gen_start=float(segment.gen_start),
        gen_end=float(segment.gen_end), dispatch_time=float(segment.gen_end), final=segment.final)


def result_message(outcome: Outcome) -> RequestPlan.Result:
    """The action result for how a request ended."""
    return RequestPlan.Result(
        status=outcome.status.value, reason=outcome.reason, plan=outcome.plan, num_segments=len(outcome.segments),
        response_time=_float_or_nan(outcome.response_time), waiting_time=_float_or_nan(outcome.waiting_time),
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
    """
    while not stop.is_set() and executor.context.ok():
        try:
            executor.spin_once(timeout_sec=SPIN_WAKE_S)
        except rclpy.executors.ExternalShutdownException:
            return


def main(args: list[str] | None = None) -> int:
    """Run the node until SIGINT or SIGTERM; ``args`` are ROS arguments (e.g. ``--ros-args --params-file F``).

    On a signal the node goes through its lifecycle shutdown: every goal in flight ends
    ABORTED ("server shutting down") and its client gets the result, the engine is
    released, and the process exits 0. Exit code 1 if the node cannot start.
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
    executor = rclpy.executors.MultiThreadedExecutor(num_threads=EXECUTOR_THREADS)
    executor.add_node(node)
    spun = threading.Event()
    spinner = threading.Thread(target=spin, args=(executor, spun), name="executor", daemon=True)
    spinner.start()
    while not stop.wait(0.2) and not node.finalized.is_set():
        pass
    node.shutdown()
    spun.set()
    executor.shutdown()
    spinner.join()
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
