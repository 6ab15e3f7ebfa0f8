"""``timely-llm load-bench``: the node under hundreds of robots at once.

The node runs as a process of its own (``python -m timely_llm.ros.node``, sim engine),
so its CPU time and resident memory are read from ``/proc`` alone. A swarm of simulated
robots shares one client node: every robot sends a goal, executes each segment as it
arrives (its skill-model time, scaled, on a timer rather than a thread per robot),
reports it done on its own ``<agent>/segment_done``, and sends its next goal once the result
is in, so every robot always has a goal in flight. Measured: goals in flight, goal-accept latency (from sending the
goal to its acceptance reaching the robot), goals ended per second, the node's CPU and
RSS; and the node's RSS after 1,000 and after 10,000 goals.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from action_msgs.msg import GoalStatus
from rclpy.node import Node
from rclpy.publisher import Publisher
from timely_llm_interfaces.names import report_topic

from timely_llm.engines.registry import SIM_ENGINE
from timely_llm.plan.skills import SkillModel
from timely_llm.ros.interfaces import RequestPlan, SegmentDone
from timely_llm.ros.messages import duration_msg, status_name
from timely_llm.traces import TraceCatalog
from timely_llm_bench.robots.fleet import ros_session
from timely_llm_bench.robots.simulated import simulated_value
from timely_llm_robot.client import MATCH_POLL_S, PlanLink, robot_publisher

SERVER_WAIT_S = 60.0
DRAIN_S = 120.0
SAMPLE_S = 0.5
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NO_GOAL_RESPONSE, NO_RESULT = "no goal response", "no result"
UNANSWERED = (NO_GOAL_RESPONSE, NO_RESULT)


@dataclass
class NodeProcess:
    """The node's process and what ``/proc`` says about it."""

    process: subprocess.Popen
    log: str
    """Its stdout and stderr; removed when the node is done with, unless ``keep_log``."""
    keep_log: bool = False

    def cpu_seconds(self) -> float:
        fields = open(f"/proc/{self.process.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime

    def rss_mib(self) -> float:
        for line in open(f"/proc/{self.process.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGINT, as Ctrl-C would; the exit code."""
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout_s)


@contextmanager
def node_process(domain_id: int, **params: object) -> Iterator[NodeProcess]:
    """The node on the sim engine and ``domain_id`` with parameter overrides, its output in a log file."""
    # max_batch 0: the sim engine's own cap (256), as the node was measured under load (docs/node.md)
    given = {"engine": SIM_ENGINE.name, "max_batch": 0, **params}
    overrides = [arg for k, v in given.items() for arg in ("-p", f"{k}:={v}")]
    env = os.environ | {"ROS_DOMAIN_ID": str(domain_id)}
    log_fd, log = tempfile.mkstemp(prefix="timely-llm-load-node-", suffix=".log")
    with os.fdopen(log_fd, "w") as log_file:
        process = subprocess.Popen([sys.executable, "-m", "timely_llm.ros.node", "--ros-args", *overrides],
                                   env=env, stdout=log_file, stderr=subprocess.STDOUT)
    node = NodeProcess(process, log)
    try:
        yield node
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if not node.keep_log:
            os.remove(log)


class Timers:
    """Runs callbacks at monotonic times, on one thread (a robot executing a segment is just a timer)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="swarm-timers", daemon=True)
        self._thread.start()

    def at(self, when: float, action: Callable[[], None]) -> None:
        with self._ready:
            heapq.heappush(self._heap, (when, next(self._order), action))
            self._ready.notify()

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._ready.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                if self._stopped:
                    return
                action = heapq.heappop(self._heap)[2]
            action()


@dataclass
class GoalTimes:
    sent: float
    accepted: float | None = None
    ended: float | None = None
    status: str = ""

    @property
    def outcome(self) -> str:
        """The plan's status, or which answer never came: the goal's response, or its result."""
        if self.accepted is None:
            return NO_GOAL_RESPONSE
        return self.status or NO_RESULT


@dataclass
class Swarm:
    """``agents`` robots on one client node, each with one goal in flight until ``stop_sending``."""

    link: PlanLink
    skills: dict[str, SkillModel]
    catalog: TraceCatalog
    agents: int
    time_scale: float = 0.05
    seed: int = 0
    goals: list[GoalTimes] = field(default_factory=list)
    _lane_free: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sending: bool = True
    _timers: Timers = field(default_factory=Timers)
    _report_pubs: list[Publisher] = field(default_factory=list)

    def start(self) -> None:
        self._report_pubs = [robot_publisher(self.link.node, SegmentDone, report_topic(_agent_id(agent)))
                             for agent in range(self.agents)]
        for agent in range(self.agents):
            self._send(agent)

    def stop_sending(self) -> None:
        self._sending = False

    def close(self) -> None:
        self._timers.stop()

    def counts(self) -> tuple[int, int]:
        """(goals sent, goals ended)."""
        with self._lock:
            return len(self.goals), sum(g.ended is not None for g in self.goals)

    def _traces(self, agent: int) -> list[int]:
        """The traces of the agent's robot type (agents take the catalog's robot types in turn)."""
        robots = sorted({t.robot for t in self.catalog.traces.values()})
        robot = robots[agent % len(robots)]
        return sorted(t.id for t in self.catalog.traces.values() if t.robot == robot)

    def _send(self, agent: int) -> None:
        traces = self._traces(agent)
        trace = self.catalog[traces[len(self.goals) % len(traces)]]
        goal = RequestPlan.Goal(agent_id=_agent_id(agent), robot_type=trace.robot, task=trace.prompt,
                                trace_id=trace.id)
        times = GoalTimes(time.monotonic())
        with self._lock:
            self.goals.append(times)
        sent = self.link.action.send_goal_async(goal, feedback_callback=functools.partial(self._on_feedback, agent))
        sent.add_done_callback(functools.partial(self._on_response, agent, times))

    def _on_response(self, agent: int, times: GoalTimes, future) -> None:  # noqa: ANN001 - rclpy Future
        handle = future.result()
        times.accepted = time.monotonic()
        if not handle.accepted:  # the node is not serving (its log says why): this robot stops asking
            times.ended, times.status = time.monotonic(), "rejected"
            return
        self.link.action.get_result_async(handle).add_done_callback(
            lambda f: self._ended(agent, times, _plan_status(f.result()), handle.goal_id.uuid.tobytes().hex()))

    def _on_feedback(self, agent: int, feedback) -> None:  # noqa: ANN001 - FeedbackMessage
        segment = feedback.feedback.segment
        if not segment.request_id:  # an infeasibility notice, no segment
            return
        model = self.skills[self.catalog[self._traces(agent)[0]].robot]
        rng = random.Random(zlib.crc32(f"{self.seed}/{segment.request_id}/{segment.index}".encode()))
        seconds = model.sample_exec_time(segment.text, rng) * self.time_scale
        with self._lock:
            start = max(time.monotonic(), self._lane_free.get(segment.request_id, 0.0))
            self._lane_free[segment.request_id] = start + seconds
        value = simulated_value(model, segment, rng)  # the arm's scan waits for one
        report = SegmentDone(agent_id=_agent_id(agent), request_id=segment.request_id, index=segment.index,
                             duration=duration_msg(seconds), success=True, result=value or "")
        self._timers.at(start + seconds, functools.partial(self._report, agent, report))

    def _report(self, agent: int, report: SegmentDone) -> None:
        """Publish once the node reads the robot's topic (it subscribes as it accepts the robot's first goal)."""
        publisher = self._report_pubs[agent]
        if publisher.get_subscription_count():
            publisher.publish(report)
        else:
            self._timers.at(time.monotonic() + MATCH_POLL_S, functools.partial(self._report, agent, report))

    def _ended(self, agent: int, times: GoalTimes, status: str, request_id: str = "") -> None:
        times.ended, times.status = time.monotonic(), status
        with self._lock:
            self._lane_free.pop(request_id, None)
        if self._sending:
            self._send(agent)


def _agent_id(agent: int) -> str:
    return f"robot_{agent}"


@dataclass
class LoadResult:
    agents: int
    goals: int
    in_flight_mean: float
    in_flight_max: int
    burst_accept_ms: tuple[float, float]
    """p50, p99 of the first goals, all sent at once."""
    steady_accept_ms: tuple[float, float]
    """p50, p99 of the goals sent after them, each as soon as its robot's previous goal ended."""
    goals_per_s: float
    node_cpu_percent: float
    node_rss_mib: float
    statuses: Counter
    exit_code: int
    node_log: str
    """Kept only where a goal went unanswered."""

    HEADER = ("agents  goals  in flight     accept ms: burst p50/p99  steady p50/p99  goals/s  node cpu %"
              "  cpu ms/goal  rss MiB  ended")

    @property
    def cpu_ms_per_goal(self) -> float:
        """The node's CPU time per goal ended in the measured window."""
        return 10 * self.node_cpu_percent / self.goals_per_s if self.goals_per_s else math.nan

    def row(self) -> str:
        ended = ", ".join(f"{v} {k}" for k, v in sorted(self.statuses.items()))
        return (f"{self.agents:6d} {self.goals:6d} {self.in_flight_mean:6.0f} (max {self.in_flight_max:4d})"
                f" {self.burst_accept_ms[0]:12.0f} /{self.burst_accept_ms[1]:6.0f}"
                f" {self.steady_accept_ms[0]:11.0f} /{self.steady_accept_ms[1]:6.0f}"
                f" {self.goals_per_s:8.1f} {self.node_cpu_percent:11.1f} {self.cpu_ms_per_goal:12.1f}"
                f" {self.node_rss_mib:8.0f}  {ended}; "
                f"exit {self.exit_code}{self._log_note()}")

    def _log_note(self) -> str:
        unanswered = sum(self.statuses[s] for s in UNANSWERED)
        return f"; {unanswered} unanswered, node log: {self.node_log}" if unanswered else ""


def run_load(agents: int, duration_s: float, skills: dict[str, SkillModel], catalog: TraceCatalog,
             domain_id: int, time_scale: float = 0.05) -> LoadResult:
    """``agents`` robots, each keeping a goal in flight, for ``duration_s`` seconds against a fresh node."""
    with node_process(domain_id, segment_timeout_margin=60.0) as node, _swarm(domain_id, agents, skills, catalog,
                                                                               time_scale) as swarm:
        cpu0, t0 = node.cpu_seconds(), time.monotonic()
        swarm.start()
        in_flight, rss = [], []
        while time.monotonic() < t0 + duration_s:
            time.sleep(SAMPLE_S)
            sent, ended = swarm.counts()
            in_flight.append(sent - ended)
            rss.append(node.rss_mib())
        cpu, wall = node.cpu_seconds() - cpu0, time.monotonic() - t0
        ended_in_window = swarm.counts()[1]
        swarm.stop_sending()
        _drain(swarm)
        exit_code = node.stop()
        outcomes = Counter(g.outcome for g in swarm.goals)
        node.keep_log = any(outcomes[s] for s in UNANSWERED)
    return LoadResult(agents, len(swarm.goals), sum(in_flight) / len(in_flight), max(in_flight),
                      _accept_ms(swarm.goals[:agents]), _accept_ms(swarm.goals[agents:]), ended_in_window / wall,
                      100 * cpu / wall, max(rss), outcomes, exit_code, node.log)


def rss_after_goals(marks: list[int], agents: int, skills: dict[str, SkillModel], catalog: TraceCatalog,
                    domain_id: int, time_scale: float = 0.01) -> list[tuple[int, float]]:
    """The node's RSS (MiB) once ``marks[i]`` goals have ended, ``agents`` robots keeping it busy."""
    found = []
    with node_process(domain_id, segment_timeout_margin=60.0) as node, _swarm(domain_id, agents, skills, catalog,
                                                                               time_scale) as swarm:
        swarm.start()
        for mark in marks:
            while swarm.counts()[1] < mark:
                time.sleep(SAMPLE_S)
            found.append((mark, node.rss_mib()))
        swarm.stop_sending()
        _drain(swarm)
        node.stop()
    return found


@contextmanager
def _swarm(domain_id: int, agents: int, skills: dict[str, SkillModel], catalog: TraceCatalog,
           time_scale: float) -> Iterator[Swarm]:
    with ros_session(domain_id) as (context, executor):
        client = Node("timely_llm_load_bench", context=context)
        executor.add_node(client)
        link = PlanLink(client)
        if not link.wait_for_server(SERVER_WAIT_S):
            raise RuntimeError("the node did not come up")
        swarm = Swarm(link, skills, catalog, agents, time_scale)
        try:
            yield swarm
        finally:
            swarm.stop_sending()
            swarm.close()
            executor.remove_node(client)
            client.destroy_node()


def _plan_status(response) -> str:  # noqa: ANN001 - GetResult response
    """The plan's status; a result the node no longer held (ended over result_timeout ago), or one with no
    plan status (the node's execute callback raised), says so."""
    if response.status == GoalStatus.STATUS_UNKNOWN:
        return "result expired"
    code = response.result.status
    return status_name(code) if code else f"no plan status (ROS status {response.status})"


def _drain(swarm: Swarm) -> None:
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline and swarm.counts()[1] < swarm.counts()[0]:
        time.sleep(SAMPLE_S)


def _accept_ms(goals: list[GoalTimes]) -> tuple[float, float]:
    """p50 and p99 of the goals' accept latencies in ms."""
    latencies = sorted(1e3 * (g.accepted - g.sent) for g in goals if g.accepted is not None)
    return _quantile(latencies, 0.5), _quantile(latencies, 0.99)


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)] if values else math.nan
