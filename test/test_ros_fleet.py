"""Adversaries against the node (issue 45), over real rclpy and Fast DDS on the sim engine: impostor ids, urgency
claimed beyond the class, floods from one agent and from 2,000 rotating ids, guessed request ids, endpoint slots.
Declared robots keep being served, nothing is lost, the node stays up and its log stays bounded. These assert
behaviour only; response times with and without attackers: ``timely-llm abuse-bench`` (docs/node.md, "Fleet")."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from guards import wait_until
from timely_llm_interfaces.fields import duration_msg
from timely_llm_interfaces.names import TASK_REQUESTS
from timely_llm_interfaces.qos import TASK_REQUESTS_QOS

from timely_llm.core.tuf import TUF
from timely_llm.ros import agents as agent_endpoints
from timely_llm.ros import throttle
from timely_llm.ros.interfaces import TaskRequest
from timely_llm.ros.throttle import BUDGET_LINES
from timely_llm.traces import load_catalog
from timely_llm_bench.robots.fleet import server_node
from timely_llm_robot.client import RobotClient, TaskOutcome
from timely_llm_robot.topic_client import TopicPlanLink

pytestmark = pytest.mark.ros

RESULT_TIMEOUT_S = 90.0
CATALOG = load_catalog()
CLAIM = TUF(0.0, -1e6, 1e6)
"""The most urgent TUF a goal can state: beta 1e6, ERT 0, slope 1e6."""
FLEET = """
defaults: {in_flight: 2, rate: 20.0, burst: 20}
robots:
  - {id: drone_01, types: [tello], class: urgent}
  - {id: drone_02, types: [tello], class: urgent}
  - {id: drone_03, types: [tello], class: normal}
  - {id: arm_01, types: [arm], class: normal}
  - {id: slow_01, types: [tello], in_flight: 1, rate: 0.1, burst: 1}
  - {id: "scout_*", types: [tello], class: background}
"""


def fleet_file(tmp_path: Path, text: str = FLEET) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return str(path)


def ask(robot: RobotClient, trace_id: int, tuf: TUF | None = None) -> TaskOutcome:
    return robot.request(CATALOG[trace_id].prompt, tuf, trace_id)


def request(agent: str, request_id: str, trace_id: int, tuf: TUF = CLAIM, robot_type: str = "") -> TaskRequest:
    return TaskRequest(request_id=request_id, agent_id=agent, robot_type=robot_type or CATALOG[trace_id].robot,
                       task=CATALOG[trace_id].prompt, trace_id=trace_id, tuf_ert=duration_msg(tuf.ert),
                       tuf_alpha=tuf.alpha, tuf_beta=tuf.beta)


def lines(log: str, text: str) -> list[str]:
    return [line for line in log.splitlines() if text in line]


def test_declared_robots_are_served_amid_2000_impostor_ids_and_an_urgency_claim_beyond_the_class(
        session: tuple, tmp_path: Path, topic_link: TopicPlanLink, topic_robots: Callable, robots: Callable,
        server_log: Callable[[], str]) -> None:
    shared = topic_link.node.create_publisher(TaskRequest, TASK_REQUESTS, TASK_REQUESTS_QOS)
    with server_node(session[1], session[0], fleet_file=fleet_file(tmp_path), max_batch=8) as node:
        assert topic_link.wait_for_server()
        declared = [topic_robots(agent) for agent in ("drone_01", "drone_02", "drone_03")]
        on_action = robots("arm_01", "arm")
        for i in range(2000):  # made-up ids, each claiming the most urgent TUF there is
            shared.publish(request(f"fake_{i}", f"f{i}", 7))
        impostors = [ask(robots(f"fake_action_{i}"), 7, CLAIM) for i in range(20)]
        honest = [ask(declared[0], 7), ask(declared[1], 8), ask(on_action, 9)]
        cheat = ask(declared[2], 6, CLAIM)  # class normal, claiming beyond it
        wrong_type = ask(topic_robots("drone_01", "arm"), 9)  # drone_01 may ask for tello only
        for outcome in [*honest, cheat]:
            assert outcome.wait(RESULT_TIMEOUT_S).status == "succeeded", outcome.result.reason
        assert [o.wait(RESULT_TIMEOUT_S).status for o in impostors] == ["rejected"] * 20
        assert wrong_type.wait(RESULT_TIMEOUT_S).status == "aborted"
        assert "agent 'drone_01' may not ask for robot type 'arm'" in wrong_type.result.reason
        assert node.lifecycle_state == "active"
        # no endpoint was made for any made-up id
        made_up = [name for name, _ in topic_link.node.get_topic_names_and_types() if "/fake_" in name]
        assert all(name.endswith("/segment_done") for name in made_up)  # the clients' own report publishers
        assert not any(topic_link.node.count_subscribers(name) for name in made_up)
    log = server_log()
    assert lines(log, "TUF clamped to class 'normal': ert 0 -> 1, alpha -1e+06 -> -2, beta 1e+06 -> 1")
    about_impostors = lines(log, "fake_")
    assert len(about_impostors) <= BUDGET_LINES + 1, len(about_impostors)  # 2,020 refusals, a bounded log
    assert any("is not in the fleet file" in line for line in about_impostors)


def test_an_agent_over_its_in_flight_quota_or_rate_is_refused_with_the_reason_while_others_are_served(
        session: tuple, tmp_path: Path, topic_link: TopicPlanLink, topic_robots: Callable) -> None:
    with server_node(session[1], session[0], fleet_file=fleet_file(tmp_path)):
        assert topic_link.wait_for_server()
        slow = topic_robots("slow_01", report=False)  # never reports: its first request stays in flight
        first, second = ask(slow, 7), ask(slow, 8)
        other = ask(topic_robots("drone_01"), 6)
        assert second.wait(RESULT_TIMEOUT_S).status == "aborted"
        assert second.result.reason == "over quota: 1 requests of 'slow_01' in flight (its in_flight quota is 1)"
        assert other.wait(RESULT_TIMEOUT_S).status == "succeeded"
        slow.cancel(first)
        assert first.wait(RESULT_TIMEOUT_S).status == "canceled"
        third = ask(slow, 7)  # its burst of 1 is spent, and 0.1 request/s refills it slowly
        assert third.wait(RESULT_TIMEOUT_S).status == "aborted"
        assert "asks faster than its rate of 0.1 requests/s (burst 1)" in third.result.reason


def test_a_request_id_guessed_on_the_shared_topic_cannot_preempt_the_robots_own(
        session: tuple, tmp_path: Path, topic_link: TopicPlanLink, topic_robots: Callable,
        server_log: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throttle, "PERIOD_S", 0.0)  # every line logged
    shared = topic_link.node.create_publisher(TaskRequest, TASK_REQUESTS, TASK_REQUESTS_QOS)
    with server_node(session[1], session[0], fleet_file=fleet_file(tmp_path)):
        assert topic_link.wait_for_server()
        # before the node knows the victim's own topic: the impostor's request takes the id, until the robot asks
        wait_until(lambda: shared.get_subscription_count(), RESULT_TIMEOUT_S, "the node's task_requests reader")
        shared.publish(request("drone_01", "v-1", 8, robot_type="tello"))
        time.sleep(1.0)  # the node takes it first
        victim = topic_robots("drone_01")
        victim._ids = "v-"  # the id the impostor guessed
        mine = ask(victim, 7)
        assert mine.wait(RESULT_TIMEOUT_S).status == "succeeded", mine.result.reason
        assert mine.result.plan == CATALOG[7].plan == "".join(s.text for s in mine.segments)
        # once the node reads the robot's own topic, its name on the shared topic is ignored
        shared.publish(request("drone_01", "v-2", 8, robot_type="tello"))
        wait_until(lambda: lines(server_log(), "ignored task request 'v-2'"), RESULT_TIMEOUT_S, server_log)
        again = ask(victim, 6)  # its id is v-2: free
        assert again.wait(RESULT_TIMEOUT_S).status == "succeeded", again.result.reason
        assert again.result.plan == CATALOG[6].plan


def test_made_up_ids_cannot_take_the_endpoint_slots_kept_for_the_named_robots(
        session: tuple, tmp_path: Path, topic_link: TopicPlanLink, topic_robots: Callable, robots: Callable,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_endpoints, "MAX_AGENTS", 8)  # 5 named: 3 left for scout_* ids
    with server_node(session[1], session[0], fleet_file=fleet_file(tmp_path)):
        assert topic_link.wait_for_server()
        scouts = [ask(robots(f"scout_{i}", report=False), 7) for i in range(6)]  # hold their slots
        statuses = [o.wait(RESULT_TIMEOUT_S).status if i >= 3 else "held" for i, o in enumerate(scouts)]
        assert statuses == ["held"] * 3 + ["rejected"] * 3
        named = [ask(topic_robots("drone_01"), 7), ask(robots("drone_02"), 8), ask(robots("arm_01", "arm"), 9)]
        assert [o.wait(RESULT_TIMEOUT_S).status for o in named] == ["succeeded"] * 3


def test_without_a_fleet_file_one_agent_flooding_urgent_claims_is_bounded_and_honest_urgent_robots_are_served(
        session: tuple, topic_link: TopicPlanLink, topic_robots: Callable, server_log: Callable[[], str]) -> None:
    shared = topic_link.node.create_publisher(TaskRequest, TASK_REQUESTS, TASK_REQUESTS_QOS)
    with server_node(session[1], session[0], max_batch=8) as node:
        assert topic_link.wait_for_server()
        honest = [topic_robots(f"honest_{i}") for i in range(4)]
        for i in range(40):
            shared.publish(request("flooder", f"x{i}", 7, TUF(0.001, -1e6, 1e6)))
        outcomes = [ask(robot, 6 + i % 3) for i, robot in enumerate(honest)]
        assert [o.wait(RESULT_TIMEOUT_S).status for o in outcomes] == ["succeeded"] * 4
        assert node.lifecycle_state == "active"
    log = server_log()
    flood = lines(log, "'flooder'")
    assert len(flood) <= 2, flood  # one line per period for the agent (and the budget's count)
    assert "over quota" in flood[0] or "TUF clamped to class 'urgent'" in flood[0]


def test_without_a_fleet_file_rotating_ids_cannot_flood_the_log_and_a_robot_is_still_served(
        session: tuple, topic_link: TopicPlanLink, topic_robots: Callable, server_log: Callable[[], str]) -> None:
    shared = topic_link.node.create_publisher(TaskRequest, TASK_REQUESTS, TASK_REQUESTS_QOS)
    with server_node(session[1], session[0]) as node:
        assert topic_link.wait_for_server()
        for i in range(300):  # each id new, each request refused (no such trace)
            shared.publish(TaskRequest(request_id="r", agent_id=f"rot_{i}", robot_type="tello", task="fly",
                                       trace_id=9999))
        wait_until(lambda: lines(server_log(), "unknown trace_id 9999"), RESULT_TIMEOUT_S, server_log)
        outcome = ask(topic_robots("honest"), 7)
        assert outcome.wait(RESULT_TIMEOUT_S).status == "succeeded", outcome.result.reason
        assert node.lifecycle_state == "active"
    about_rotation = lines(server_log(), "rot_")
    assert 1 <= len(about_rotation) <= BUDGET_LINES + 1, len(about_rotation)
