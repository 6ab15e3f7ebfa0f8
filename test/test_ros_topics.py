"""Task requests over topics (``task_requests`` in, ``<agent_id>/segments`` and ``<agent_id>/plan_result`` out),
over real rclpy and Fast DDS on the sim engine, beside robots on the action."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from builtin_interfaces.msg import Duration as DurationMsg
from guards import wait_until
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.node import Node
from rclpy.parameter import Parameter
from spun_nodes import Heard
from timely_llm_interfaces.names import agent_id_error

from timely_llm.plan.robot_file import load_skill_models
from timely_llm.ros import agents as agent_endpoints
from timely_llm.ros.interfaces import PlanResult, TaskRequest
from timely_llm.ros.messages import duration_seconds, optional_seconds
from timely_llm.ros.node import TimelyLlmNode
from timely_llm.traces import load_catalog
from timely_llm_bench.robots.fleet import cut, run_fleet, server_node
from timely_llm_bench.robots.simulated import SimulatedSkills
from timely_llm_bench.workloads.generator import BUILTIN, generate
from timely_llm_robot.client import RobotClient, TaskOutcome
from timely_llm_robot.topic_client import TopicPlanLink, TopicRobotClient, ros_agent_id

pytestmark = pytest.mark.ros

RESULT_TIMEOUT_S = 60.0
VLLM_RESULT_TIMEOUT_S = 300.0
CATALOG = load_catalog()
SKILLS = load_skill_models()


def ask(robot: RobotClient, trace_id: int) -> TaskOutcome:
    return robot.request(CATALOG[trace_id].prompt, None, trace_id)


def test_each_robot_gets_only_its_own_segments_and_its_plan_succeeds(
        session: tuple, topic_link: TopicPlanLink, topic_robots: Callable, robots: Callable) -> None:
    heard = {agent: Heard(topic_link.node, agent) for agent in ("d1", "d2")}
    with server_node(session[1], session[0]):
        assert topic_link.wait_for_server()
        outcomes = {"d1": ask(topic_robots("d1"), 2), "d2": ask(topic_robots("d2"), 7)}
        by_action = ask(robots("d3"), 8)  # the action beside, at the same time
        results = {agent: o.wait(RESULT_TIMEOUT_S) for agent, o in outcomes.items()}
        assert by_action.wait(RESULT_TIMEOUT_S).status == "succeeded"

    for agent, trace in (("d1", 2), ("d2", 7)):
        outcome = results[agent]
        assert outcome.status == "succeeded", outcome.result.reason
        assert outcome.result.plan == CATALOG[trace].plan == "".join(s.text for s in outcome.segments)
        assert [s.index for s in outcome.segments] == list(range(outcome.result.num_segments))
        assert outcome.segments[-1].final and outcome.result_after_segments
        assert outcome.result.utility > 0 and duration_seconds(outcome.result.response_time) >= 0
        request_id = outcome.segments[0].request_id
        # The robot's own request id, echoed; nothing of d3's, nor of the other topic robot's, arrives here.
        assert request_id and not request_id.startswith("topic-")
        assert len(heard[agent].segments) == outcome.result.num_segments
        assert {(s.agent_id, s.request_id) for s in heard[agent].segments} == {(agent, request_id)}
        assert [(r.agent_id, r.request_id, r.status) for r in heard[agent].results] == [
            (agent, request_id, PlanResult.STATUS_SUCCEEDED)]


def test_malformed_requests_end_aborted_on_their_topic_and_the_node_serves_on(
        session: tuple, topic_link: TopicPlanLink, topic_robots: Callable) -> None:
    heard, twice = Heard(topic_link.node, "m1"), Heard(topic_link.node, "m2")
    good = {"agent_id": "m1", "robot_type": "tello", "task": CATALOG[7].prompt, "trace_id": 7}
    malformed = {
        "r-robot": ({"robot_type": "submarine"}, "unknown robot type 'submarine'"),
        "r-trace": ({"trace_id": 0}, "trace_id 0 invalid"),
        "r-task": ({"task": " "}, "empty task"),
        "r-tuf": ({"tuf_ert": DurationMsg(sec=-5)}, "ert must be >= 0"),
        "r-tuf-ns": ({"tuf_ert": DurationMsg(sec=1, nanosec=2**32 - 1)}, "tuf_ert nanosec 4294967295 is not below 1e9"),
        "r-tuf-alpha": ({"tuf_alpha": math.nan}, "finite"),
        "r-overrun": ({"overrun_strategy": 3}, "unknown overrun_strategy 3 (known: 0 none, 1 kill, 2 skip-next)"),
        "": ({}, "empty request id"),
    }
    with server_node(session[1], session[0], segment_timeout_margin=60.0):
        assert topic_link.wait_for_server()
        for agent in ("", "bad-name", "9lives", "a__b", "a/b"):  # no topic to answer on: logged only
            topic_link.request_pub.publish(TaskRequest(**good | {"agent_id": agent, "request_id": "r0"}))
        for request_id, (change, _) in malformed.items():
            topic_link.request_pub.publish(TaskRequest(**good | change | {"request_id": request_id}))
        wait_until(lambda: len(heard.results) >= len(malformed), RESULT_TIMEOUT_S, "every refusal")

        served = ask(topic_robots("m1"), 7).wait(RESULT_TIMEOUT_S)
        assert served.status == "succeeded", served.result.reason

        for _ in range(2):  # the same id again while the first is in flight (its robot never reports)
            topic_link.request_pub.publish(TaskRequest(**good | {"agent_id": "m2", "request_id": "same"}))
        topic_link.request_pub.publish(TaskRequest(**good | {"agent_id": "m2", "request_id": "next",
                                                             "robot_type": "submarine"}))
        # the one writer of m2's plan_result would have sent a refusal of the duplicate before next's
        wait_until(lambda: twice.results and twice.segments, RESULT_TIMEOUT_S, "next's refusal")
        assert [r.request_id for r in twice.results] == ["next"]  # not a word about the duplicate

    refusals = {r.request_id: r for r in heard.results if r.status == PlanResult.STATUS_ABORTED}
    for request_id, (_, reason) in malformed.items():
        assert reason in refusals[request_id[:256]].reason
        assert optional_seconds(refusals[request_id[:256]].response_time) is None
    assert all(r.agent_id == "m1" and "\n" not in r.reason for r in heard.results)
    assert len(heard.results) == len(malformed) + 1  # the refusals and the plan's own end
    assert {s.request_id for s in twice.segments} == {"same"}  # the first one went on


def test_a_silent_robot_is_aborted_by_the_watchdog_with_a_plan_result(
        session: tuple, topic_link: TopicPlanLink, topic_robots: Callable) -> None:
    with server_node(session[1], session[0], segment_timeout_factor=1.0, segment_timeout_margin=0.5):
        assert topic_link.wait_for_server()
        muted = ask(topic_robots("mute", report=False), 3).wait(RESULT_TIMEOUT_S)
        other = ask(topic_robots("speaks"), 2).wait(RESULT_TIMEOUT_S)
    assert muted.status == "aborted" and "did not report segment 0" in muted.result.reason
    assert other.status == "succeeded", other.result.reason


def test_an_inactive_node_refuses_and_deactivate_aborts_a_request_in_flight(
        session: tuple, topic_link: TopicPlanLink, topic_robots: Callable) -> None:
    with server_node(session[1], session[0], autostart=False, segment_timeout_margin=60.0) as node:
        assert topic_link.wait_for_server()
        robot = topic_robots("lc", report=False)
        early = ask(robot, 7).wait(RESULT_TIMEOUT_S)
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        in_flight = ask(robot, 7)
        wait_until(lambda: in_flight.segments, RESULT_TIMEOUT_S, "a segment")
        assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
        in_flight.wait(RESULT_TIMEOUT_S)
    assert early.status == "aborted" and early.result.reason == "server is not active"
    assert in_flight.status == "aborted" and in_flight.result.reason == "server deactivated"


def test_fleet_replays_a_workload_over_topics(session: tuple) -> None:
    workload = cut(generate(BUILTIN["WID1"], CATALOG, SKILLS, seed=0), 15.0)
    with server_node(session[1], session[0], network_latency=workload.network_latency):
        records = run_fleet(workload, CATALOG, SKILLS, session[1], session[0], interface="topic")
    assert len(records) == len(workload.requests) > 3
    assert [r["status"] for r in records] == ["succeeded"] * len(records), [r["reason"] for r in records]
    assert all(r["num_segments"] >= 1 and r["utility"] is not None for r in records)


def test_two_fleets_in_two_namespaces_each_get_their_plans_from_their_own_node(session: tuple) -> None:
    context, executor = session
    servers, clients, robots = [], [], {}
    try:
        for fleet in ("fleet_a", "fleet_b"):
            servers.append(TimelyLlmNode(context=context, namespace=fleet,
                                         parameter_overrides=[Parameter("engine", value="sim")]))
            clients.append(Node("robots", namespace=fleet, context=context))
            for node in (servers[-1], clients[-1]):
                executor.add_node(node)
            link = TopicPlanLink(clients[-1])
            assert link.wait_for_server()
            robots[fleet] = TopicRobotClient(link, "d1", "tello", SimulatedSkills(SKILLS["tello"], time_scale=0.2))
        heard = Heard(clients[0], "d1")
        outcomes = {fleet: ask(robot, trace) for (fleet, robot), trace in zip(robots.items(), (2, 7), strict=True)}
        results = {fleet: outcome.wait(RESULT_TIMEOUT_S) for fleet, outcome in outcomes.items()}
    finally:
        for robot in robots.values():
            robot.close()
        for server in servers:
            server.shutdown()
        for node in servers + clients:
            executor.remove_node(node)
            node.destroy_node()
    assert [r.status for r in results.values()] == ["succeeded"] * 2
    assert results["fleet_a"].result.plan == CATALOG[2].plan and results["fleet_b"].result.plan == CATALOG[7].plan
    assert [r.plan for r in heard.results] == [CATALOG[2].plan]  # /fleet_a/d1 hears fleet_a's node only


@pytest.mark.vllm
def test_a_free_text_task_over_topics_is_planned_on_the_embedded_vllm_engine(
        session: tuple, topic_link: TopicPlanLink, topic_robots: Callable) -> None:
    heard = Heard(topic_link.node, "free")
    with server_node(session[1], session[0], engine="vllm", model="tiny", kv_cache_gib=0.25):
        assert topic_link.wait_for_server()
        outcome = topic_robots("free").request("find the cat", max_new_tokens=96).wait(VLLM_RESULT_TIMEOUT_S)
    assert outcome.status == "succeeded", outcome.result.reason
    assert outcome.result.plan == "".join(s.text for s in outcome.segments) and outcome.segments[-1].final
    assert len(heard.segments) == outcome.result.num_segments and len(heard.results) == 1


@pytest.mark.parametrize(("agent", "error"), [
    ("drone_01", None), ("d1", None), ("", "empty agent id"), ("drone-01", "not a ROS name token"),
    ("1d", "not a ROS name token"), ("a__b", "not a ROS name token"), ("a/b", "not a ROS name token"),
    ("x" * 257, "longer than 256"),
])
def test_agent_ids_must_name_topics(agent: str, error: str | None) -> None:
    found = agent_id_error(agent)
    assert found is None if error is None else error in found


@pytest.mark.parametrize(("name", "token"), [("drone-01", "drone_01"), ("arm.3", "arm_3"), ("7up", "r7up"),
                                             ("a--b", "a_b"), ("ok_1", "ok_1")])
def test_any_name_becomes_a_valid_agent_id(name: str, token: str) -> None:
    assert ros_agent_id(name) == token and agent_id_error(token) is None


def test_each_robot_process_receives_every_goals_feedback_on_the_action_and_its_own_on_topics(ros_domain: int) -> None:
    from timely_llm_bench.robots.traffic_bench import run_traffic

    action, topic = run_traffic(3, 2, ros_domain, time_scale=0.01)
    for point in (action, topic):
        assert point.tasks == point.succeeded == 6 and point.own_segments > 0
    assert action.own_segments == topic.own_segments  # the same plans on both interfaces
    assert action.segment_messages == 3 * action.own_segments  # every robot's feedback reaches every robot
    assert topic.segment_messages == topic.own_segments and topic.other_messages == 2  # its own, and its 2 ends


def test_publishers_of_idle_robots_are_dropped_past_the_cap_and_busy_ones_kept(
        session: tuple, topic_link: TopicPlanLink, topic_robots: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_endpoints, "MAX_AGENTS", 2)
    node = topic_link.node
    idle = ("x1", "x2", "x3")
    heard = {agent: Heard(node, agent) for agent in idle}
    with server_node(session[1], session[0], segment_timeout_margin=60.0):
        assert topic_link.wait_for_server()
        busy = ask(topic_robots("busy", report=False), 7)
        wait_until(lambda: busy.segments, RESULT_TIMEOUT_S, "the busy robot's first segment")
        for agent in idle:
            topic_link.request_pub.publish(TaskRequest(request_id="r", agent_id=agent, robot_type="submarine",
                                                       task="t", trace_id=7))
            wait_until(lambda: heard[agent].results, RESULT_TIMEOUT_S, f"{agent}'s refusal")  # noqa: B023
        wait_until(lambda: not node.count_publishers("x2/plan_result"), RESULT_TIMEOUT_S, "x2's publisher gone")
        assert node.count_publishers("x1/plan_result") == 0  # x1 went when x2 came, x2 when x3 came
        assert node.count_publishers("x3/plan_result") == node.count_publishers("busy/segments") == 1
    assert all("unknown robot type" in heard[agent].results[0].reason for agent in idle)
