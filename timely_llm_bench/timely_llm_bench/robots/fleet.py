"""Replays a workload through real robot clients over ROS 2, in wall-clock time.

Each agent of the workload is a :class:`RobotClient` executing its segments with
:class:`SimulatedSkills` (the bench harness's execution-time draws) or a runner of
``sim_robots`` (Tello simulators through djitellopy, simulated arms, timed alike), so a
replay against the node on the sim engine is comparable with ``timely-llm bench``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import rclpy
from rclpy.context import Context
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from timely_llm_interfaces.rclpy_compat import spinning

from timely_llm.core.overload import INFEASIBLE_REASON
from timely_llm.core.request import Status
from timely_llm.engines.keeper import EngineKeeper
from timely_llm.engines.registry import SIM_ENGINE
from timely_llm.errors import RunIncomplete
from timely_llm.plan.skills import SkillModel
from timely_llm.ros.messages import optional_seconds
from timely_llm.ros.node import TimelyLlmNode
from timely_llm.traces import TraceCatalog
from timely_llm_bench.evaluation.metrics import summarize
from timely_llm_bench.robots.simulated import SimulatedSkills
from timely_llm_bench.workloads.generator import Workload
from timely_llm_robot.client import PlanLink, RobotClient, SegmentRunner, TaskOutcome
from timely_llm_robot.topic_client import TopicPlanLink, TopicRobotClient, ros_agent_id

RESULT_GRACE_S = 120.0
NOT_ENDED = "not ended"
"""A partial run's status for a request with no result yet."""


@contextmanager
def ros_session(domain_id: int) -> Iterator[tuple[Context, MultiThreadedExecutor]]:
    """An rclpy context on ``domain_id`` with a multi-threaded executor spinning in a thread."""
    context = Context()
    rclpy.init(context=context, domain_id=domain_id)
    try:
        with spinning(context) as executor:
            yield context, executor
    finally:
        rclpy.try_shutdown(context=context)


@contextmanager
def server_node(executor: MultiThreadedExecutor, context: Context, namespace: str = "", engine: str = SIM_ENGINE.name,
                engines: EngineKeeper | None = None, **params: object) -> Iterator:
    """A ``timely_llm_server`` node with parameter overrides, spun by ``executor``; active unless ``autostart``
    is false (NodeStartError if its autostart fails). Its ``engine`` is sim unless given: what replays workloads'
    LRTrace plans; with ``engines`` it takes the engine from that keeper and gives it back when it ends."""
    node = TimelyLlmNode(engines=engines, context=context, namespace=namespace,
                         parameter_overrides=[Parameter(k, value=v) for k, v in {"engine": engine, **params}.items()])
    executor.add_node(node)
    try:
        node.wait_active()
        yield node
    finally:
        node.shutdown()  # while still spun, so the goals it aborts get their results
        executor.remove_node(node)
        node.destroy_node()


def cut(workload: Workload, duration: float | None) -> Workload:
    """The workload's requests arriving in its first ``duration`` seconds (all if None)."""
    if duration is None:
        return workload
    return replace(workload, requests=tuple(r for r in workload.requests if r.arrival < duration))


def fleet_agents(workload: Workload, catalog: TraceCatalog) -> dict[str, str]:
    """The workload's agents and their robot types."""
    return {r.agent: catalog[r.trace].robot for r in workload.requests}


def run_fleet(workload: Workload, catalog: TraceCatalog, skills: dict[str, SkillModel], executor: MultiThreadedExecutor,
              context: Context, seed: int = 0, runners: dict[str, SegmentRunner] | None = None,
              progress: Callable[[int], None] | None = None, generate: bool = False,
              max_new_tokens: int = 0, interface: str = "action", grace_s: float = RESULT_GRACE_S,
              sent: list | None = None, partial: bool = False) -> list[dict]:
    """Send every request at its arrival time from its agent's robot client; the per-request records.

    ``runners`` executes each agent's segments (default: SimulatedSkills for all); ``progress`` is
    called with the number of requests ended so far, each time one ends. With ``generate`` a
    request carries its trace's task text but no trace id, so the node generates the plan (at
    most ``max_new_tokens``, 0: the node's default) instead of replaying the recorded one. Robots ask over
    ``interface``: the ``request_plan`` action or the ``task_requests`` topic, as :func:`ros_agent_id` of their names.
    ``sent``: a list each (request, TaskOutcome) is appended to as it is sent (for :func:`waiting_for`). A request
    still open ``grace_s`` after the last arrival raises RunIncomplete, or with ``partial`` is recorded with status
    ``not ended``.
    """
    node = Node("timely_llm_fleet", context=context)
    executor.add_node(node)
    agents = fleet_agents(workload, catalog)
    runners = runners or {agent: SimulatedSkills(skills[robot], seed) for agent, robot in agents.items()}
    link, robots = _robots(node, interface, agents, runners, workload.network_latency)
    try:
        if not link.wait_for_server():
            raise RuntimeError(f"no timely_llm_server answers on the {interface} interface")
        sent = [] if sent is None else sent
        start = _replay(workload, catalog, robots, _counter(progress), sent, generate, max_new_tokens)
        if partial:
            _wait_all(sent, grace_s)
            return [_record(req, outcome, catalog, start) for req, outcome in sent]
        return [_record(req, outcome, catalog, start) for req, outcome in _ended(sent, grace_s)]
    finally:
        for robot in robots.values():
            robot.close()
        executor.remove_node(node)
        node.destroy_node()


def _ended(sent: list, grace_s: float) -> list:
    """(request, outcome) of every sent request once all ended; RunIncomplete if any is still open after
    ``grace_s``."""
    deadline = time.monotonic() + grace_s
    try:
        return [(req, outcome.wait(max(0.0, deadline - time.monotonic()))) for req, outcome in sent]
    except TimeoutError:
        open_ = sum(not outcome.finished.done() for _, outcome in sent)
        raise RunIncomplete(f"{open_} of {len(sent)} requests had not ended {grace_s:.0f} s after the last arrival: "
                            "the node cannot keep up with this workload on this machine") from None


def _wait_all(sent: list, grace_s: float) -> None:
    """Until every sent request ended, or ``grace_s`` passed."""
    deadline = time.monotonic() + grace_s
    for _, outcome in sent:
        with contextlib.suppress(TimeoutError):
            outcome.wait(max(0.0, deadline - time.monotonic()))


def _robots(node: Node, interface: str, agents: dict[str, str], runners: dict[str, SegmentRunner],
            network_delay: float) -> tuple[PlanLink | TopicPlanLink, dict[str, RobotClient]]:
    """The link of ``interface`` (action or topic) on ``node``, and a robot client per agent on it."""
    if interface == "topic":
        topic_link = TopicPlanLink(node)
        return topic_link, {agent: TopicRobotClient(topic_link, ros_agent_id(agent), robot, runners[agent],
                                                    network_delay=network_delay) for agent, robot in agents.items()}
    if interface != "action":
        raise ValueError(f"interface must be action or topic, got {interface!r}")
    link = PlanLink(node)
    return link, {agent: RobotClient(link, ros_agent_id(agent), robot, runners[agent], network_delay=network_delay)
                  for agent, robot in agents.items()}


def _replay(workload: Workload, catalog: TraceCatalog, robots: dict[str, RobotClient],
            on_end: Callable[[object], None], sent: list, generate: bool = False, max_new_tokens: int = 0) -> float:
    """Send every request at its arrival, appending (request, outcome) to ``sent``; the monotonic time arrivals
    count from."""
    start = time.monotonic()
    for r in workload.requests:
        time.sleep(max(0.0, start + r.arrival - time.monotonic()))
        trace = catalog[r.trace]
        outcome = robots[r.agent].request(trace.prompt, r.tuf, 0 if generate else trace.id,
                                          max_new_tokens=max_new_tokens, label=r.id, overrun_strategy=r.overrun)
        outcome.finished.add_done_callback(on_end)
        sent.append((r, outcome))
    return start


WAITING_SHOWN = 3
"""A progress line names at most this many open requests."""


def waiting_for(sent: list) -> str:
    """What the open requests among ``sent`` ((request, TaskOutcome) pairs) wait for, e.g. "drone-03 (generating
    its first segment), drone-05 (robot executing segment 2 of 2 received)"; "" when none is open."""
    open_ = [(request, outcome) for request, outcome in list(sent) if not outcome.finished.done()]
    named = [f"{request.agent} ({_stage(outcome)})" for request, outcome in open_[:WAITING_SHOWN]]
    more = f" and {len(open_) - WAITING_SHOWN} more" if len(open_) > WAITING_SHOWN else ""
    return ", ".join(named) + more


def _stage(outcome: TaskOutcome) -> str:
    """Where one open request is: at the node, generating, at the robot, or its result on the way."""
    received, executed = len(outcome.segments), outcome.executed
    if not outcome.accepted:
        return "the node has not accepted it yet"
    if not received:
        return "its plan: generating the first segment"
    final = outcome.segments[-1].final
    if executed < received:
        return f"robot executing segment {executed + 1} of {received}{'' if final else ' received so far'}"
    if not final:
        return f"its plan: generating segment {received + 1} (robot done with {executed})"
    return "its result: the robot executed the whole plan"


def _counter(progress: Callable[[int], None] | None) -> Callable[[object], None]:
    """A done-callback counting ended requests (from any thread) into ``progress``."""
    lock = threading.Lock()
    ended = [0]

    def count(_: object) -> None:
        with lock:
            ended[0] += 1
            if progress is not None:
                progress(ended[0])

    return count


def _record(request, outcome: TaskOutcome, catalog: TraceCatalog, start: float) -> dict:  # noqa: ANN001
    """``timely-llm bench``'s record of a request (WorkloadRequest), from what its robot saw: times count from
    ``start`` (the replay's), except the node's response and waiting time. A shed request (aborted, reason
    INFEASIBLE_REASON) was told when its result came; the node's result gives the best response it could
    still have had then. A request not ended (a partial run) has the response its robot saw, if it got a segment."""
    result = outcome.result
    shed = result is not None and outcome.status == Status.ABORTED.value and result.reason == INFEASIBLE_REASON
    ended = outcome.finished.done()
    record = {"id": request.id, "agent": request.agent, "trace": request.trace,
              "category": catalog[request.trace].category, "arrival": request.arrival, "tuf": request.tuf.to_dict(),
              "status": outcome.status if ended else NOT_ENDED,
              "reason": result.reason if result else "goal rejected" if ended else f"no result: {_stage(outcome)}",
              "num_segments": len(outcome.segments)}
    response = optional_seconds(result.response_time) if result else None
    if not ended and outcome.first_segment_at is not None:
        response = outcome.first_segment_at - outcome.sent
    record["response_time"] = None if shed else response
    record["waiting_time"] = None if shed or not result else optional_seconds(result.waiting_time)
    record["utility"] = None if shed or not result or not math.isfinite(result.utility) else result.utility
    waiting = record["waiting_time"]
    record["completion_time"] = None if waiting is None else waiting + outcome.exec_time
    record["shed"] = shed
    record["infeasible_at"] = outcome.ended_at - start if shed and outcome.ended_at is not None else None
    record["best_response"] = response if shed else None
    return record


def fleet_result(workload: Workload, records: list[dict], policy: str, seed: int) -> dict:
    """Records and per-category summary in ``timely-llm bench``'s result layout."""
    records.sort(key=lambda r: (r["arrival"], r["id"]))
    return {"policy": policy, "workload": workload.name, "hw": "ros2", "seed": seed,
            "network_latency": workload.network_latency, "requests": records, "summary": summarize(records)}
