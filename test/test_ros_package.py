"""What a ROS 2 engineer meets adopting the node, over real rclpy and Fast DDS on the sim engine: a lifecycle
that answers while the engine loads and survives a failed configure, parameters that apply or are refused with a
reason, goals that need no execution reports, namespaced fleets, /diagnostics and ROS time."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from builtin_interfaces.msg import Time as TimeMsg
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from guards import wait_until
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rcl_interfaces.msg import Log
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import QoSProfile
from rclpy.task import Future
from rosgraph_msgs.msg import Clock
from spun_nodes import spun_node
from timely_llm_interfaces.names import report_topic
from timely_llm_interfaces.qos import DEEP_RELIABLE, SERVER_STATUS_QOS, action_client_qos
from timely_llm_interfaces.rclpy_compat import spinning

from timely_llm.core.kv_reuse import KvReuse
from timely_llm.core.tuf import TUF
from timely_llm.engines.base import ServerHealth
from timely_llm.engines.remote_servers import RemoteServer
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.ros.diagnostics import Snapshot, diagnostic_array, level_of
from timely_llm.ros.interfaces import RequestPlan, SegmentDone, ServerStatus
from timely_llm.ros.messages import duration_seconds
from timely_llm.ros.node import NODE_EXECUTOR_THREADS, NodeStartError, TimelyLlmNode
from timely_llm.ros.parameters import when_applied
from timely_llm.server import Server
from timely_llm.traces import load_catalog
from timely_llm_bench.robots.fleet import server_node
from timely_llm_bench.robots.simulated import SimulatedSkills
from timely_llm_robot.client import PlanLink, RobotClient

pytestmark = pytest.mark.ros

CATALOG = load_catalog()
SKILLS = load_skill_models()
TIMEOUT_S = 60.0
ANSWER_S = 2.0
"""The acceptance bound: a lifecycle or parameter query answers within this while the engine loads."""
TELLO_TRACE = 1
URGENT_TRACE = 6


def answered(future: object, timeout_s: float, what: str) -> object:
    wait_until(future.done, timeout_s, what)
    return future.result()


class SlowLoadNode(TimelyLlmNode):
    """The node on the sim engine whose load takes until the test says (a vLLM start takes minutes): the real load
    runs then."""

    def __init__(self, loaded: threading.Event, parameter_overrides: list[Parameter] = (), **kwargs: object) -> None:
        super().__init__(parameter_overrides=[Parameter("engine", value="sim"), *parameter_overrides], **kwargs)
        make_server = self._loader._make_server

        def slow_make_server() -> Server:
            loaded.wait(TIMEOUT_S)
            return make_server()

        self._loader._make_server = slow_make_server


def answered_in_time(send: Callable[[], Future], what: str | Callable[[], object]) -> tuple[object, float]:
    """The answer to an idempotent query to a server just discovered, and how long it took.

    Right after discovery Fast DDS may lose a request or its response: the server's response writer has not yet
    matched the client's reader (rmw_fastrtps: "client will not receive response"), or the client's request went
    out before the server's request reader matched it. So a query unanswered within ANSWER_S is sent again. A
    server answers one client's requests in order, so an earlier query still unanswered when a later one is
    answered was lost, not slow; one answered late fails the test, saying ``what``.
    """
    asked: list[tuple[Future, float]] = []
    while len(asked) < int(TIMEOUT_S / ANSWER_S):
        asked.append((send(), time.monotonic()))
        future, sent = asked[-1]
        while not future.done() and time.monotonic() < sent + ANSWER_S:
            time.sleep(0.01)
        if future.done():
            late = [i for i, (earlier, _) in enumerate(asked[:-1]) if earlier.done()]
            assert not late, (f"queries {late} answered after {ANSWER_S} s", what() if callable(what) else what)
            return future.result(), time.monotonic() - sent
    raise AssertionError(f"no answer in {TIMEOUT_S} s: {what() if callable(what) else what}")


def _state(node: Node, server: str) -> str:
    client = node.create_client(GetState, f"{server}/get_state")
    assert client.wait_for_service(TIMEOUT_S)
    return answered_in_time(lambda: client.call_async(GetState.Request()), "get_state")[0].current_state.label


def _change(node: Node, server: str, transition: int) -> bool:
    client = node.create_client(ChangeState, f"{server}/change_state")
    assert client.wait_for_service(TIMEOUT_S)
    request = ChangeState.Request(transition=Transition(id=transition))
    return answered(client.call_async(request), TIMEOUT_S, "change_state").success


# ----- lifecycle -----

def test_lifecycle_and_parameter_services_answer_while_the_engine_loads(session: tuple) -> None:
    context, executor = session
    loaded = threading.Event()
    node = SlowLoadNode(loaded, context=context)
    executor.add_node(node)
    try:
        with spun_node(session, "package_test") as client:
            wait_until(lambda: node.lifecycle_state == "configuring", TIMEOUT_S, "autostart's configure")
            for _ in range(3):  # each answered within ANSWER_S while the load goes on
                assert _state(client, "/timely_llm_server") == "configuring"
                params = AsyncParameterClient(client, "/timely_llm_server")
                assert params.wait_for_services(TIMEOUT_S)
                answer, _ = answered_in_time(functools.partial(params.get_parameters, ["policy"]), "get_parameters")
                assert answer.values[0].string_value == "timelyllm"
            loaded.set()
            node.wait_active(TIMEOUT_S)
            assert _state(client, "/timely_llm_server") == "active"
    finally:
        loaded.set()
        node.shutdown()
        executor.remove_node(node)
        node.destroy_node()


def test_a_configure_requested_over_the_service_leaves_a_single_threaded_executor_answering(session: tuple) -> None:
    """The node's own process spins one thread (NODE_EXECUTOR_THREADS): a lifecycle manager's configure, which
    loads the engine, must not hold that thread."""
    context, _ = session
    loaded = threading.Event()
    node = SlowLoadNode(loaded, context=context, parameter_overrides=[Parameter("autostart", value=False)])
    try:
        with spinning(context, threads=NODE_EXECUTOR_THREADS) as own_executor, \
                spun_node(session, "package_test") as client:
            assert isinstance(own_executor, SingleThreadedExecutor)
            own_executor.add_node(node)
            change = client.create_client(ChangeState, "/timely_llm_server/change_state")
            assert change.wait_for_service(TIMEOUT_S)
            configure = ChangeState.Request(transition=Transition(id=Transition.TRANSITION_CONFIGURE))
            configured = change.call_async(configure)
            wait_until(lambda: node.lifecycle_state == "configuring", TIMEOUT_S, "the requested configure")
            for _ in range(3):  # each answered within ANSWER_S while the load goes on
                assert _state(client, "/timely_llm_server") == "configuring"
            assert not configured.done()
            loaded.set()
            assert answered(configured, TIMEOUT_S, "change_state configure").success
            assert _state(client, "/timely_llm_server") == "inactive"
            node.shutdown()
            own_executor.remove_node(node)
    finally:
        loaded.set()
        node.destroy_node()


def test_a_failed_configure_leaves_the_node_unconfigured_and_able_to_configure_again(session: tuple,
                                                                                    link: PlanLink) -> None:
    with pytest.raises(NodeStartError, match="no-such-profile"), \
            server_node(session[1], session[0], hw_profile="no-such-profile") as node:
        pass
    with server_node(session[1], session[0], autostart=False, hw_profile="no-such-profile") as node:
        server = "/timely_llm_server"
        assert not _change(link.node, server, Transition.TRANSITION_CONFIGURE)
        assert _state(link.node, server) == "unconfigured"
        assert not _change(link.node, server, Transition.TRANSITION_ACTIVATE)  # not from unconfigured: refused
        params = AsyncParameterClient(link.node, server)
        assert params.wait_for_services(TIMEOUT_S)
        result = answered(params.set_parameters([Parameter("hw_profile", value="rtx4090-llama3-8b")]),
                          TIMEOUT_S, "set_parameters").results[0]
        assert result.successful, result.reason
        assert _change(link.node, server, Transition.TRANSITION_CONFIGURE)
        assert _change(link.node, server, Transition.TRANSITION_ACTIVATE)
        robot = RobotClient(link, "tello_1", "tello", SimulatedSkills(SKILLS["tello"], time_scale=0.1))
        try:
            outcome = robot.request(CATALOG[TELLO_TRACE].prompt, None, TELLO_TRACE).wait(TIMEOUT_S)
        finally:
            robot.close()
        assert outcome.status == "succeeded"
        assert node.lifecycle_state == "active"


def test_a_shutdown_during_the_load_gives_it_up(session: tuple) -> None:
    context, executor = session
    loaded = threading.Event()
    node = SlowLoadNode(loaded, context=context)
    executor.add_node(node)
    try:
        wait_until(lambda: node.lifecycle_state == "configuring", TIMEOUT_S, "autostart's configure")
        began = time.monotonic()
        node.shutdown()
        assert node.finalized.is_set() and time.monotonic() - began < 10.0
        assert node.lifecycle_state == "finalized"
        with pytest.raises(NodeStartError):
            node.wait_active(1.0)
    finally:
        loaded.set()
        executor.remove_node(node)
        node.destroy_node()


@pytest.mark.parametrize(("given", "says"), [
    ({"no_such_param": 1}, "unknown parameter no_such_param: not a parameter of this node"),
    ({"polcy": "edf"}, "unknown parameter polcy (did you mean policy?)"),
    ({"remote.urll": "http://x"}, "unknown parameter remote.urll (did you mean remote.url?)"),
    ({"tuf.urgent.ertt": 0.5, "zzz": 1}, "unknown parameters tuf.urgent.ertt (did you mean tuf.urgent.ert?), zzz:"),
])
def test_a_parameter_the_node_does_not_take_fails_configure_naming_it(session: tuple, given: dict,
                                                                     says: str) -> None:
    """rclpy declares whatever a node is given; configure refuses what the node does not take, in one line.
    use_sim_time and the QoS overrides are rclpy's own, and taken."""
    with server_node(session[1], session[0], autostart=False, use_sim_time=False, **given,
                     **{"qos_overrides./parameter_events.publisher.depth": 100}) as node:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert node.lifecycle_state == "unconfigured"
        assert says in node.configure_error and "\n" not in node.configure_error, node.configure_error
        assert "use_sim_time" not in node.configure_error and "qos_overrides" not in node.configure_error


def test_a_misspelt_parameter_on_the_command_line_fails_configure_and_the_node_stays_up(
        session: tuple, link: PlanLink, ros_domain: int, tmp_path: Path) -> None:
    """``-p no_such_param:=1``: autostart's configure fails naming it, as does a lifecycle client's."""
    log = tmp_path / "node.log"
    with node_process(ros_domain, log, "engine:=sim", "no_such_param:=1") as process:
        wait_until(lambda: "configure failed" in log.read_text(), TIMEOUT_S, "the failed configure")
        assert "unknown parameter no_such_param" in log.read_text()
        assert _state(link.node, "/timely_llm_server") == "unconfigured" and process.poll() is None
        assert not _change(link.node, "/timely_llm_server", Transition.TRANSITION_CONFIGURE)
        assert log.read_text().count("unknown parameter no_such_param") >= 2


@contextmanager
def node_process(domain: int, log: Path, *overrides: str) -> Iterator[subprocess.Popen]:
    """``python -m timely_llm.ros.node`` on ``domain``; SIGINT at the end, and it must exit 0."""
    args = [a for o in overrides for a in ("-p", o)]
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "timely_llm.ros.node", "--ros-args", *args],
                                   env=os.environ | {"ROS_DOMAIN_ID": str(domain)}, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        yield process
        process.send_signal(signal.SIGINT)
        assert process.wait(60.0) == 0, log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.vllm
def test_get_state_answers_while_vllm_loads_and_a_bad_model_leaves_the_node_alive(
        session: tuple, link: PlanLink, ros_domain: int, tmp_path: Path) -> None:
    get_state = link.node.create_client(GetState, "/timely_llm_server/get_state")
    with node_process(ros_domain, tmp_path / "bad.log", "engine:=vllm", "model:=/nonexistent/model") as process:
        assert get_state.wait_for_service(TIMEOUT_S)
        wait_until(lambda: "configure failed" in (tmp_path / "bad.log").read_text(), 600.0, "the failed configure")
        assert _state(link.node, "/timely_llm_server") == "unconfigured" and process.poll() is None
        assert not _change(link.node, "/timely_llm_server", Transition.TRANSITION_CONFIGURE)  # tried again
        assert _state(link.node, "/timely_llm_server") == "unconfigured" and process.poll() is None
    wait_until(lambda: not get_state.service_is_ready(), TIMEOUT_S, "the first node's get_state to leave the graph")

    log = tmp_path / "good.log"
    with node_process(ros_domain, log, "engine:=vllm", "model:=tiny", "kv_cache_gib:=0.25"):
        assert get_state.wait_for_service(TIMEOUT_S)
        first, seconds = answered_in_time(lambda: get_state.call_async(GetState.Request()), log.read_text)
        answers = [(first.current_state.label, seconds)]
        deadline = time.monotonic() + 900.0
        while answers[-1][0] != "active":
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            asked = time.monotonic()
            future = get_state.call_async(GetState.Request())
            wait_until(future.done, 30.0,
                       lambda: f"get_state after {answers}; the node's log: {log.read_text()[-4000:]}")
            answers.append((future.result().current_state.label, time.monotonic() - asked))
            time.sleep(0.5)
    loading = [seconds for label, seconds in answers if label == "configuring"]
    print(f"get_state during the vLLM load: {len(loading)} answers, slowest {max(loading):.3f} s")
    assert len(loading) >= 10 and max(loading) < ANSWER_S, answers


# ----- parameters -----

@pytest.mark.no_vllm
def test_parameters_apply_live_or_are_refused_with_a_reason(session: tuple, link: PlanLink) -> None:
    statuses: list[ServerStatus] = []
    link.node.create_subscription(ServerStatus, "status", statuses.append, SERVER_STATUS_QOS)
    with server_node(session[1], session[0], status_period=0.2) as node:
        params = AsyncParameterClient(link.node, "/timely_llm_server")
        assert params.wait_for_services(TIMEOUT_S)

        def set_one(name: str, value: object) -> object:
            return answered(params.set_parameters([Parameter(name, value=value)]), TIMEOUT_S, name).results[0]

        refused = {f"{name}={value}": set_one(name, value) for name, value in (
            ("result_timeout", 5.0), ("engine", "vllm"), ("max_batch", 8), ("max_new_tokens", 0),
            ("policy", "vllm"), ("policy", "nonsense"))}
        assert not any(r.successful for r in refused.values()), refused
        assert "read-only" in refused["result_timeout=5.0"].reason
        assert "configure-time" in refused["engine=vllm"].reason and "clean up" in refused["engine=vllm"].reason
        assert "configure-time" in refused["max_batch=8"].reason
        assert "range" in refused["max_new_tokens=0"].reason
        assert "another mode" in refused["policy=vllm"].reason
        assert "must be one of" in refused["policy=nonsense"].reason

        assert set_one("policy", "fcfs").successful
        seen = len(statuses)
        wait_until(lambda: any(s.policy == "fcfs" for s in statuses[seen:]), TIMEOUT_S, "status with policy fcfs")
        assert set_one("tuf.normal.ert", 0.75).successful
        assert node.goal_rules.default_tufs["normal"].ert == 0.75  # the next goal's default TUF
        assert node.server.policy.name == "fcfs" and node.get_parameter("engine").value == "sim"  # noqa: SLF001


@pytest.mark.no_vllm
def test_a_live_switch_that_would_need_the_engine_restarted_is_refused(session: tuple, link: PlanLink) -> None:
    """vllm-stream and vllm-priority serve in one mode, but vllm-priority needs the engine's own priority
    scheduling, set when the engine starts: switched live, the priorities would be dropped, so it is refused."""
    with server_node(session[1], session[0], policy="vllm-stream") as node:
        params = AsyncParameterClient(link.node, "/timely_llm_server")
        assert params.wait_for_services(TIMEOUT_S)
        refused = answered(params.set_parameters([Parameter("policy", value="vllm-priority")]), TIMEOUT_S,
                           "policy").results[0]
        assert not refused.successful
        assert refused.reason == ("policy: vllm-priority and vllm-stream differ in the engine's own scheduling "
                                  "(vLLM's scheduling_policy, fixed when the engine starts): set it while the node "
                                  "is unconfigured")
        assert node.server.policy.name == "vllm-stream"


def test_every_vllm_parameter_is_configure_time() -> None:
    assert when_applied("vllm.gpu_memory_utilization") == when_applied("engine") == "configure-time"
    assert when_applied("tuf.urgent.ert") == when_applied("policy") == "live"


def test_a_lowered_timeout_applies_to_the_next_goal(session: tuple, robots: Callable) -> None:
    with server_node(session[1], session[0], segment_timeout_margin=600.0) as node:
        node.set_parameters([Parameter("segment_timeout_factor", value=0.0),
                             Parameter("segment_timeout_margin", value=0.5)])
        outcome = robots("mute", report=False).request(CATALOG[TELLO_TRACE].prompt, None, TELLO_TRACE)
        assert outcome.wait(TIMEOUT_S).status == "aborted"
    assert "did not report segment 0" in outcome.result.reason


# ----- goals without execution reports -----

def test_a_goal_without_execution_reports_succeeds_with_its_plan(session: tuple, link: PlanLink) -> None:
    """The goal `ros2 action send_goal /request_plan timely_llm_interfaces/action/RequestPlan "{...}" --feedback` sends:
    a plain action client, no SegmentDone ever published."""
    reports: list[SegmentDone] = []
    link.node.create_subscription(SegmentDone, report_topic("cli"), reports.append, DEEP_RELIABLE)
    client = ActionClient(link.node, RequestPlan, "request_plan", **action_client_qos())
    with server_node(session[1], session[0], segment_timeout_factor=0.0, segment_timeout_margin=0.01):
        assert client.wait_for_server(TIMEOUT_S)
        feedback: list[RequestPlan.Feedback] = []
        goal = RequestPlan.Goal(agent_id="cli", robot_type="tello", task=CATALOG[TELLO_TRACE].prompt,
                                trace_id=TELLO_TRACE, no_execution_reports=True)
        handle = answered(client.send_goal_async(goal, feedback_callback=lambda m: feedback.append(m.feedback)),
                          TIMEOUT_S, "goal response")
        assert handle.accepted
        result = answered(handle.get_result_async(), TIMEOUT_S, "result").result
    client.destroy()
    assert result.status == RequestPlan.Result.STATUS_SUCCEEDED, result.reason
    assert result.plan == CATALOG[TELLO_TRACE].plan and result.num_segments == len(feedback) > 1
    assert 0 <= duration_seconds(result.response_time) < TIMEOUT_S and not reports


# ----- namespaces -----

def test_two_namespaced_nodes_serve_their_own_fleets_at_once(session: tuple) -> None:
    context, executor = session
    with server_node(executor, context, namespace="fleet_a", policy="fcfs") as a, \
            server_node(executor, context, namespace="fleet_b", policy="edf") as b, \
            spun_node(session, "robots", "fleet_a") as node_a, spun_node(session, "robots", "fleet_b") as node_b:
        fleets = {"fleet_a": PlanLink(node_a), "fleet_b": PlanLink(node_b)}
        made = [RobotClient(link, f"{ns}_tello_{i}", "tello", SimulatedSkills(SKILLS["tello"], time_scale=0.1))
                for ns, link in fleets.items() for i in range(2)]
        try:
            outcomes = [robot.request(CATALOG[TELLO_TRACE].prompt, None, TELLO_TRACE) for robot in made]
            assert [o.wait(TIMEOUT_S).status for o in outcomes] == ["succeeded"] * 4
        finally:
            for robot in made:
                robot.close()
        assert (a.get_fully_qualified_name(), b.get_fully_qualified_name()) == ("/fleet_a/timely_llm_server",
                                                                                 "/fleet_b/timely_llm_server")
        assert a.finished == b.finished == 2  # each served its own fleet's two goals


# ----- /diagnostics and ROS time -----

def test_diagnostics_report_state_at_1_hz_with_levels(session: tuple, link: PlanLink) -> None:
    arrays: list[DiagnosticArray] = []
    link.node.create_subscription(DiagnosticArray, "/diagnostics", arrays.append, QoSProfile(depth=50))

    def ours() -> list:
        return [s for a in arrays for s in a.status if s.hardware_id == "/timely_llm_server"]

    with server_node(session[1], session[0], autostart=False, hw_profile="no-such-profile") as node:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        wait_until(lambda: ours() and ours()[-1].level == DiagnosticStatus.ERROR, TIMEOUT_S, "ERROR status")
        assert "no-such-profile" in ours()[-1].message
        node.set_parameters([Parameter("hw_profile", value="rtx4090-llama3-8b")])
        assert node.trigger_configure() == node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        seen = len(ours())
        wait_until(lambda: len(ours()) >= seen + 3, 3 * 2.0 + 5.0, "three more statuses")
        last = ours()[-1]
    values = {kv.key: kv.value for kv in last.values}
    assert last.level == DiagnosticStatus.OK and values["lifecycle state"] == "active"
    assert values["engine"] == "sim" and values["policy"] == "timelyllm" and int(values["batch cap"]) > 0
    assert {"queue", "running", "executing", "last step time (s)", "KV free blocks", "device", "model"} <= set(values)


def _values(status: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


def test_diagnostics_count_goals_per_robot_type_and_warn_when_urgent_goals_miss_their_deadline(
        session: tuple, link: PlanLink, tmp_path: Path) -> None:
    """A status per robot type (goals served, misses in the last minute, mean response); an urgent goal whose first
    response came after its TUF's ert makes its type's status and the node's WARN, and the node log it at WARN.
    The robot's class allows a 1 ms ert (the default urgent class would clamp it to the category's 0.2 s)."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("classes:\n  strict: {max_beta: 2.0, max_slope: 6.67, min_ert: 0.001}\n"
                     "robots:\n  - {id: tello_1, types: [tello], class: strict}\n")
    arrays: list[DiagnosticArray] = []
    logs: list[Log] = []
    link.node.create_subscription(DiagnosticArray, "/diagnostics", arrays.append, QoSProfile(depth=50))
    link.node.create_subscription(Log, "/rosout", logs.append, QoSProfile(depth=100))

    def latest(name: str) -> DiagnosticStatus | None:
        return next((s for a in reversed(arrays) for s in a.status if s.name == name), None)

    server, tello, arm = (f"/timely_llm_server: {what}" for what in ("server", "robot type tello", "robot type arm"))
    with server_node(session[1], session[0], fleet_file=str(fleet)):
        robot = RobotClient(link, "tello_1", "tello", SimulatedSkills(SKILLS["tello"], time_scale=0.1))
        try:
            for trace in (1, 2):
                assert robot.request(CATALOG[trace].prompt, None, trace).wait(TIMEOUT_S).status == "succeeded"
            wait_until(lambda: (s := latest(tello)) is not None and _values(s)["goals served"] == "2", TIMEOUT_S,
                       "tello's status counting two goals")
            status, arm_status = latest(tello), latest(arm)
            assert status is not None and arm_status is not None and status.hardware_id == ""
            assert status.level == DiagnosticStatus.OK and _values(status)["urgent deadline misses (last 60 s)"] == "0"
            assert float(_values(status)["mean response (s)"]) > 0 and "2 goals served" in status.message
            assert _values(arm_status)["goals served"] == "0" and "none yet" in arm_status.message
            late = TUF(ert=0.001, alpha=-0.01, beta=1.0)  # urgent (trace 6), and answered later than 1 ms
            assert robot.request(CATALOG[URGENT_TRACE].prompt, late, URGENT_TRACE).wait(TIMEOUT_S).status \
                == "succeeded"
            wait_until(lambda: (s := latest(tello)) is not None and s.level == DiagnosticStatus.WARN, TIMEOUT_S,
                       "tello's status at WARN")
        finally:
            robot.close()
        wait_until(lambda: any(lg.level == Log.WARN and "urgent goals missed" in lg.msg for lg in logs), TIMEOUT_S,
                   "a WARN log line")
        time.sleep(3.0)
    status, node_status = latest(tello), latest(server)
    assert status is not None and node_status is not None
    assert _values(status)["urgent deadline misses (last 60 s)"] == "1" and "(1 urgent)" in status.message
    assert node_status.level == DiagnosticStatus.WARN and "urgent goals missed their deadline" in node_status.message
    assert "tello 1" in node_status.message and node_status.hardware_id == "/timely_llm_server"
    assert sum(lg.level == Log.WARN and "urgent goals missed" in lg.msg for lg in logs) == 1  # throttled


def test_a_remote_servers_status_says_up_silent_or_down_since_when_with_its_open_streams() -> None:
    down_since = time.time() - 30.0
    snapshot = Snapshot(node="/n", lifecycle="active", phase="active: accepting goals", servers=[
        ServerHealth("http://a:8000", None, None, 3, "m"),
        ServerHealth("http://b:8000", "ConnectError: refused", down_since, 0, "m"),
        ServerHealth("http://c:8000", None, None, 2, "m", silent_s=21.4)])
    up, down, silent = diagnostic_array(snapshot, TimeMsg()).status[1:]
    assert silent.level == DiagnosticStatus.WARN and _values(silent)["stalled, silent for (s)"] == "21"
    assert silent.message == "up, stalled: its streams silent for 21 s (new goals go elsewhere)"
    assert _values(up)["stalled, silent for (s)"] == ""
    assert (up.name, up.level, up.hardware_id, up.message) == ("/n: remote server http://a:8000",
                                                                DiagnosticStatus.OK, "http://a:8000", "up")
    assert _values(up)["open streams"] == "3" and _values(up)["up"] == "True"
    assert down.level == DiagnosticStatus.ERROR and "ConnectError: refused" in down.message
    assert down.message.startswith(f"down since {time.strftime('%Y-%m-%dT%H:%M', time.localtime(down_since))}")
    assert 29 <= int(_values(down)["down for (s)"]) <= 40


def test_the_server_status_says_what_resumes_reused_once_the_engine_reported_one() -> None:
    snapshot = Snapshot(node="/n", lifecycle="active", phase="active: accepting goals",
                        kv_reuse=KvReuse(resumes=3, reusable=2000, reused=1950))
    values = _values(diagnostic_array(snapshot, TimeMsg()).status[0])
    assert values["resumed context from kept or cached KV (%)"] == "97.5"
    assert values["resumed context tokens recomputed"] == "50"
    snapshot.kv_reuse = KvReuse(0, 0, 0)
    assert "resumed context tokens recomputed" not in _values(diagnostic_array(snapshot, TimeMsg()).status[0])


def test_a_remote_server_is_down_since_its_first_failure_until_a_probe_answers() -> None:
    server = RemoteServer("http://a:8000/v1")
    server.failed("ConnectError", 1.0)
    first = server.down_since
    assert first is not None and abs(first - time.time()) < 5.0
    server.failed("ReadError", 2.0)
    server.probed(False, 3.0)
    assert server.down_since == first and server.down == "ReadError"
    server.probed(True, 4.0)
    assert server.down is None and server.down_since is None


@pytest.mark.parametrize(("change", "level", "says"), [
    ({}, DiagnosticStatus.OK, "active"),
    ({"lifecycle": "unconfigured", "failed": True, "phase": "configure failed: no model"}, DiagnosticStatus.ERROR,
     "no model"),
    ({"loop_alive": False}, DiagnosticStatus.ERROR, "server loop stopped"),
    ({"lifecycle": "configuring", "phase": "configuring: loading engine vllm (40 s)"}, DiagnosticStatus.WARN,
     "40 s"),
    ({"queue": 33}, DiagnosticStatus.WARN, "queue of 33"),
    ({"last_step_s": 2.5}, DiagnosticStatus.WARN, "slow engine step"),
])
def test_diagnostic_levels_say_why(change: dict, level: bytes, says: str) -> None:
    snapshot = Snapshot(node="/n", lifecycle="active", phase="active: accepting goals", batch_cap=8, queue=32,
                        last_step_s=0.1)
    for key, value in change.items():
        setattr(snapshot, key, value)
    assert level_of(snapshot)[0] == level and says in level_of(snapshot)[1]


def test_segment_times_follow_ros_time(session: tuple, link: PlanLink) -> None:
    """use_sim_time: segment and status stamps come from /clock, not the wall clock; so do the reports' stamps of
    a robot on sim time too, which the node takes."""
    clock_pub = link.node.create_publisher(Clock, "/clock", 10)
    robot_node = Node("sim_robot", context=session[0], parameter_overrides=[Parameter("use_sim_time", value=True)])
    session[1].add_node(robot_node)
    sim_now = 1_000_000.0
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.02):
            clock_pub.publish(Clock(clock=TimeMsg(sec=int(sim_now))))

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        with server_node(session[1], session[0], use_sim_time=True) as node:
            for on_sim_time in (node, robot_node):
                wait_until(lambda n=on_sim_time: n.get_clock().now().nanoseconds >= sim_now * 1e9, TIMEOUT_S,
                           "sim time")
            robot = RobotClient(PlanLink(robot_node), "tello_1", "tello",
                                SimulatedSkills(SKILLS["tello"], time_scale=0.1))
            try:
                outcome = robot.request(CATALOG[TELLO_TRACE].prompt, None, TELLO_TRACE).wait(TIMEOUT_S)
            finally:
                robot.close()
    finally:
        stop.set()
        ticker.join()
        session[1].remove_node(robot_node)
        robot_node.destroy_node()
    assert outcome.status == "succeeded"
    for segment in outcome.segments:
        for stamp in (segment.gen_start, segment.gen_end, segment.dispatch_time):
            assert abs(stamp.sec + stamp.nanosec * 1e-9 - sim_now) < 30.0, (segment.index, stamp)
