"""The ``timely_llm_server`` ROS 2 node: a thin front end over :class:`timely_llm.server.Server`.

Robots send ``RequestPlan`` goals; each plan segment comes back as feedback the moment
the server dispatches it, and the result once the robot has reported every segment
executed (``segment_done`` topic). All scheduling happens in the Server, whose loop
runs in a thread of its own on the wall clock.
"""

from __future__ import annotations

import math
import queue
import threading
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import rclpy
import rclpy.executors
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.parameter import Parameter

from timely_llm.clock import WallClock
from timely_llm.core.request import Outcome, Request, Segment, Status
from timely_llm.core.skills import load_skill_models
from timely_llm.core.tuf import DEFAULT_TUFS, TUF
from timely_llm.engines.base import DEFAULT_MAX_NEW_TOKENS, Engine
from timely_llm.errors import RequestRejected
from timely_llm.ros.interfaces import RequestPlan, SegmentDone, ServerStatus, SkillCall
from timely_llm.ros.interfaces import Segment as SegmentMsg
from timely_llm.server import POLICIES, PlanRequest, Server
from timely_llm.workloads.traces import TraceCatalog, load_catalog

IDLE_WAIT_S = 0.05
WATCHDOG_PERIOD_S = 0.1
CATEGORIES = tuple(DEFAULT_TUFS)
EXECUTOR_THREADS = 64
"""Each goal being served holds an executor thread for its whole life, so there must be plenty."""

PARAMETERS: dict[str, tuple[object, str]] = {
    "engine": ("sim", "sim (calibrated simulator, needs trace_id goals) or vllm"),
    "model": ("", "model directory for engine vllm; empty = the shipped tiny model"),
    "max_model_len": (2048, "engine vllm: longest prompt + plan in tokens"),
    "kv_cache_gib": (1.0, "engine vllm: KV cache size in GiB"),
    "hw_profile": ("rtx4090-llama3-8b", "hardware profile name or YAML file for engine sim"),
    "skill_models": (Parameter.Type.STRING_ARRAY, "skill-model YAML files; empty = the shipped ones"),
    "policy": ("timelyllm", f"serving policy: {', '.join(POLICIES)}"),
    "max_batch": (0, "maximum batch size; 0 = the policy's default"),
    "network_latency": (0.008, "one-way robot<->server latency in seconds"),
    "max_prompt_tokens": (1792, "goals whose prompt is longer are rejected (vllm: + max_new_tokens <= max_model_len)"),
    "max_new_tokens": (DEFAULT_MAX_NEW_TOKENS, "default cap on a plan's tokens"),
    "segment_timeout_factor": (3.0, "a segment times out after factor x its estimated execution time ..."),
    "segment_timeout_margin": (5.0, "... plus this many seconds"),
    "status_period": (1.0, "seconds between ServerStatus messages"),
    **{f"tuf.{c}.{k}": (v, f"default TUF {k} for {c} goals that give none")
       for c, tuf in DEFAULT_TUFS.items() for k, v in tuf.to_dict().items()},
}


@dataclass(frozen=True)
class GoalRules:
    """What a goal is checked against before it is accepted."""

    robots: Collection[str]
    catalog: TraceCatalog
    encode: Callable[[str], list[int]]
    max_prompt_tokens: int
    default_tufs: dict[str, TUF]
    trace_required: bool


def plan_from_goal(goal: RequestPlan.Goal, request_id: str, rules: GoalRules) -> PlanRequest:
    """The PlanRequest for a goal; RequestRejected says why a malformed goal cannot be served."""
    if not goal.task.strip():
        raise RequestRejected("empty task")
    if goal.robot_type not in rules.robots:
        raise RequestRejected(f"unknown robot type {goal.robot_type!r} (known: {', '.join(sorted(rules.robots))})")
    trace = _goal_trace(goal, rules)
    category = trace.category if trace else ("arm" if goal.robot_type == "arm" else "normal")
    prompt_ids = rules.encode(rules.catalog.prompt_text(goal.robot_type, goal.task))
    if len(prompt_ids) > rules.max_prompt_tokens:
        raise RequestRejected(f"prompt of {len(prompt_ids)} tokens exceeds max_prompt_tokens {rules.max_prompt_tokens}")
    return PlanRequest(request_id, goal.agent_id, goal.robot_type, prompt_ids, _goal_tuf(goal, category, rules),
                       category, goal.max_new_tokens, forced_ids=rules.encode(trace.plan) if trace else None,
                       trace=trace.id if trace else None)


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
        return TUF(goal.tuf_ert, goal.tuf_alpha, goal.tuf_beta)
    except ValueError as exc:
        raise RequestRejected(str(exc)) from exc


@dataclass
class Watchdog:
    """Deadlines for the segment each request's robot is executing now (robots run segments in order)."""

    factor: float
    margin: float
    _pending: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)
    _deadline: dict[str, float] = field(default_factory=dict)

    def dispatched(self, request_id: str, index: int, est_exec_time: float, now: float) -> None:
        lane = self._pending.setdefault(request_id, deque())
        lane.append((index, est_exec_time))
        if len(lane) == 1:
            self._arm(request_id, now)

    def done(self, request_id: str, index: int, now: float) -> None:
        lane = self._pending.get(request_id)
        while lane and lane[0][0] <= index:
            lane.popleft()
        self._deadline.pop(request_id, None)
        if lane:
            self._arm(request_id, now)

    def forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)
        self._deadline.pop(request_id, None)

    def expired(self, now: float) -> list[tuple[str, int]]:
        """(request, segment index) pairs whose robot is overdue."""
        return [(rid, self._pending[rid][0][0]) for rid, t in self._deadline.items() if now > t]

    def _arm(self, request_id: str, now: float) -> None:
        est = self._pending[request_id][0][1]
        self._deadline[request_id] = now + self.factor * est + self.margin


class TimelyLlmNode(Node):
    def __init__(self, **node_kwargs: object) -> None:
        super().__init__("timely_llm_server", **node_kwargs)
        for name, (default, description) in PARAMETERS.items():
            self.declare_parameter(name, default, ParameterDescriptor(description=description))
        self.clock = WallClock()
        self.server = self._make_server()
        self.rules = self._goal_rules()
        self.watchdog = Watchdog(self._param("segment_timeout_factor"), self._param("segment_timeout_margin"))
        self._lock = threading.Lock()
        self._channels: dict[str, queue.Queue] = {}
        self._outcomes: list[Outcome] = []
        group = ReentrantCallbackGroup()
        self._action = ActionServer(self, RequestPlan, "request_plan", self._execute, callback_group=group,
                                    goal_callback=self._on_goal, cancel_callback=self._on_cancel)
        self.create_subscription(SegmentDone, "segment_done", self._on_segment_done, 100, callback_group=group)
        self._status_pub = self.create_publisher(ServerStatus, "status", 10)
        self.create_timer(self._param("status_period"), self._publish_status, callback_group=group)
        self.create_timer(WATCHDOG_PERIOD_S, self._check_watchdog, callback_group=group)
        self._running = True
        self._loop = threading.Thread(target=self._serve, name="timely_llm_server_loop", daemon=True)
        self._loop.start()

    # ----- setup -----

    def _param(self, name: str):  # noqa: ANN202 - the parameter's value
        return self.get_parameter(name).value

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
        server = Server(self._make_engine(), skills, POLICIES[policy], self.clock, self._param("network_latency"),
                        self._param("max_batch") or None, self._param("max_new_tokens"),
                        on_segment=self._on_segment, on_finish=self._on_finish)
        for robot in sorted(skills):
            server.warm_prefix(server.engine.tokenizer.encode(self.catalog.prompt_text(robot, "")))
        return server

    def _goal_rules(self) -> GoalRules:
        tufs = {c: TUF(*(self._param(f"tuf.{c}.{k}") for k in ("ert", "alpha", "beta"))) for c in CATEGORIES}
        return GoalRules(set(self.server.robots), self.catalog, self.server.engine.tokenizer.encode,
                         self._param("max_prompt_tokens"), tufs, self._param("engine") == "sim")

    def _serve(self) -> None:
        while self._running:
            if not self.server.step():
                self.clock.idle_until(self.clock.now() + IDLE_WAIT_S)

    def shutdown(self) -> None:
        """Stop the server loop and release the engine (then destroy the node)."""
        self._running = False
        self.clock.wake()
        self._loop.join()
        self.server.engine.close()
        self._action.destroy()

    # ----- server callbacks (server loop or any thread holding the server lock) -----

    def _on_segment(self, request: Request, segment: Segment) -> None:
        with self._lock:
            self.watchdog.dispatched(request.id, segment.index, segment.est_exec_time, self.clock.now())
            channel = self._channels.get(request.id)
        if channel is not None:
            channel.put(segment_message(request, segment))

    def _on_finish(self, request: Request) -> None:
        outcome = Outcome.of(request)
        with self._lock:
            self.watchdog.forget(request.id)
            self._outcomes.append(outcome)
            channel = self._channels.get(request.id)
        if channel is not None:
            channel.put(outcome)

    # ----- action server -----

    def _on_goal(self, goal: RequestPlan.Goal) -> GoalResponse:
        # rclpy passes no goal id here, so the execute callback builds the request again under its id.
        try:
            plan_from_goal(goal, "check", self.rules)
        except RequestRejected as exc:
            self.get_logger().warning(f"rejected goal from {goal.agent_id!r}: {exc}")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _on_cancel(self, goal_handle) -> CancelResponse:  # noqa: ANN001 - rclpy ServerGoalHandle
        self._wake_goal(goal_handle.goal_id.uuid.tobytes().hex())
        return CancelResponse.ACCEPT

    def _wake_goal(self, request_id: str) -> None:
        with self._lock:
            channel = self._channels.get(request_id)
        if channel is not None:
            channel.put(None)

    def _execute(self, goal_handle) -> RequestPlan.Result:  # noqa: ANN001 - rclpy ServerGoalHandle
        request_id = goal_handle.goal_id.uuid.tobytes().hex()
        channel: queue.Queue = queue.Queue()
        with self._lock:
            self._channels[request_id] = channel
        try:
            self.server.submit(plan_from_goal(goal_handle.request, request_id, self.rules))
            outcome = self._relay(goal_handle, request_id, channel)
        except RequestRejected as exc:
            goal_handle.abort()
            self.get_logger().info(f"request {request_id} rejected: {exc}")
            return RequestPlan.Result(status=Status.ABORTED.value, reason=str(exc),
                                      **dict.fromkeys(("response_time", "waiting_time", "utility"), math.nan))
        finally:
            with self._lock:
                del self._channels[request_id]
        return self._conclude(goal_handle, outcome)

    def _relay(self, goal_handle, request_id: str, channel: queue.Queue) -> Outcome:  # noqa: ANN001
        """Forward segments as feedback until the request ends; returns its outcome."""
        while True:
            try:
                item = channel.get(timeout=IDLE_WAIT_S)
            except queue.Empty:
                item = None
            if isinstance(item, Outcome):
                return item
            if isinstance(item, SegmentMsg):
                goal_handle.publish_feedback(RequestPlan.Feedback(segment=item))
            elif goal_handle.is_cancel_requested:
                self.server.cancel(request_id)

    def _conclude(self, goal_handle, outcome: Outcome) -> RequestPlan.Result:  # noqa: ANN001
        status = outcome.status
        if status is Status.SUCCEEDED:
            goal_handle.succeed()
        elif status is Status.CANCELED and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        else:
            goal_handle.abort()
        log = self.get_logger().debug if status is Status.SUCCEEDED else self.get_logger().info
        log(f"request {outcome.id} {status.value} {outcome.reason}".rstrip())
        return RequestPlan.Result(
            status=status.value, reason=outcome.reason, plan=outcome.plan, num_segments=len(outcome.segments),
            response_time=_float_or_nan(outcome.response_time), waiting_time=_float_or_nan(outcome.waiting_time),
            utility=_float_or_nan(outcome.utility))

    # ----- robots and watchdog -----

    def _on_segment_done(self, msg: SegmentDone) -> None:
        exec_end = self.clock.now() - self.server.network_latency
        with self._lock:
            self.watchdog.done(msg.request_id, msg.index, self.clock.now())
        self.server.segment_done(msg.request_id, msg.index, exec_end - msg.duration, exec_end, msg.success,
                                 msg.reason)

    def _check_watchdog(self) -> None:
        with self._lock:
            overdue = self.watchdog.expired(self.clock.now())
        for request_id, index in overdue:
            reason = f"robot did not report segment {index} done in time"
            self.get_logger().warning(f"aborting request {request_id}: {reason}")
            self.server.abort(request_id, reason)

    def _publish_status(self) -> None:
        with self.server.lock:
            states = [r.status for r in self.server.requests.values()]
            queued, running = len(self.server.queue), len(self.server.running)
        with self._lock:
            outcomes = list(self._outcomes)
        msg = ServerStatus(queue_length=queued, running=running,
                           suspended=sum(s in (Status.PARKED, Status.SUSPENDED) for s in states),
                           finished=sum(s.ended for s in states), policy=self.server.policy.name,
                           engine=self._param("engine"))
        msg.stamp = self.get_clock().now().to_msg()
        for category in sorted({o.category for o in outcomes}):
            utilities = [o.utility for o in outcomes if o.category == category and o.utility is not None]
            msg.categories.append(category)
            msg.mean_utility.append(math.fsum(utilities) / len(utilities) if utilities else math.nan)
            msg.count.append(sum(o.category == category for o in outcomes))
        self._status_pub.publish(msg)


def segment_message(request: Request, segment: Segment) -> SegmentMsg:
    """The feedback message for a dispatched segment (times on the server's clock)."""
    return SegmentMsg(
        request_id=request.id, agent_id=request.agent, index=segment.index, text=segment.text,
        skills=[SkillCall(name=c.name, args=list(c.args)) for c in segment.calls],
        estimated_exec_time=float(segment.est_exec_time), gen_start=float(segment.gen_start),
        gen_end=float(segment.gen_end), dispatch_time=float(segment.gen_end), final=request.finished_generating)


def _float_or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def main(args: list[str] | None = None) -> None:
    """Run the node until interrupted; ``args`` are ROS arguments (e.g. ``--ros-args --params-file F``)."""
    rclpy.init(args=args)
    node = TimelyLlmNode()
    executor = rclpy.executors.MultiThreadedExecutor(num_threads=EXECUTOR_THREADS)
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, rclpy.executors.ExternalShutdownException):
        pass
    finally:
        node.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
