"""``timely-llm traffic-bench``: what each robot host receives, on the action and on the topic interface.

The node runs as a process of its own (sim engine), and so does every robot: a robot process
is one robot with a client of each interface, as a robot host would be. For each interface in
turn, every robot sends ``goals`` tasks one after the other (segments executed in a fraction of
their skill-model time and reported), all robots at once; then each says what its readers took
in while it did: its own segments, and every message (count and serialized bytes) on the
topics that interface has it subscribe to. Those are, for the action, the feedback topic
(``request_plan/_action/feedback``, one for all goals: every client's reader takes every goal's
feedback, and rclpy deserializes each before dropping the others') and the goal status topic
(``request_plan/_action/status``, every goal's state, to every client); for the topic interface,
the robot's own ``<agent>/segments`` and ``<agent>/plan_result``. The robot counts them with
raw subscriptions of its own beside the client's, with the client's QoS.

A parent process drives the robots through their stdin and reads one line back per step
(``ready``, ``done``, then the counts as JSON), each step bounded in time.
"""

from __future__ import annotations

import argparse
import builtins
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timely_llm.traces import Trace
    from timely_llm_robot.client import RobotClient, TaskOutcome

INTERFACES = ("action", "topic")
READY_S = 120.0
"""Bound on every robot process being up and matched with the node."""
PHASE_S = 120.0
"""Bound on every robot's tasks of one interface ending."""
SETTLE_S = 1.0
"""After the last robot's last result, messages still on their way may arrive before the counts are read."""
RESULT_TIMEOUT_S = 60.0


@dataclass
class Heard:
    """Messages and serialized bytes a robot's readers took on one topic."""

    messages: int = 0
    bytes: int = 0

    def add(self, raw: builtins.bytes) -> None:  # builtins': ``bytes`` here is the field
        self.messages += 1
        self.bytes += len(raw)


@dataclass
class InterfaceTraffic:
    """One point: ``robots`` processes on one interface, the mean over robots of what each received."""

    robots: int
    interface: str
    tasks: int
    succeeded: int
    seconds: float
    node_cpu_s: float
    """CPU seconds the node's process used during the phase."""
    first_segment_s: float
    """Mean over tasks: from sending a task to its first segment's arrival."""
    own_segments: float
    segment_messages: float
    """Messages on the segment-carrying topic: the action's feedback topic, or the robot's own segments."""
    segment_kib: float
    other_messages: float
    """Messages on the interface's other topic: the action's goal status, or the robot's own plan_result."""
    other_kib: float

    HEADER = ("robots  interface  tasks  ok     s  node cpu s  1st seg s | per robot: own segs  segment msgs (KiB)"
              "    status/result msgs (KiB)  total KiB")

    def row(self) -> str:
        return (f"{self.robots:6d}  {self.interface:9s} {self.tasks:6d} {self.succeeded:3d} {self.seconds:5.1f}"
                f" {self.node_cpu_s:11.1f} {self.first_segment_s:10.2f} |"
                f" {self.own_segments:19.1f} {self.segment_messages:13.1f} ({self.segment_kib:6.1f})"
                f" {self.other_messages:18.1f} ({self.other_kib:6.1f}) {self.segment_kib + self.other_kib:10.1f}")


def run_traffic(robots: int, goals: int, domain_id: int, time_scale: float = 0.02,
                interfaces: tuple[str, ...] = INTERFACES) -> list[InterfaceTraffic]:
    """``robots`` robot processes against a fresh node, each interface in turn."""
    from timely_llm_bench.robots.load_bench import node_process

    with node_process(domain_id, segment_timeout_margin=60.0) as node, \
            _robot_processes(robots, goals, domain_id, time_scale) as fleet:
        fleet.expect("ready", READY_S)
        found = []
        for interface in interfaces:
            start, cpu = time.monotonic(), node.cpu_seconds()
            fleet.send(f"go {interface}")
            fleet.expect("done", PHASE_S)
            seconds, cpu = time.monotonic() - start, node.cpu_seconds() - cpu
            time.sleep(SETTLE_S)
            fleet.send("count")
            counts = [json.loads(line) for line in fleet.expect("", PHASE_S)]
            found.append(_summary(robots, interface, seconds, cpu, counts))
        fleet.send("exit")
        node.stop()
    return found


def _summary(robots: int, interface: str, seconds: float, cpu: float, counts: list[dict]) -> InterfaceTraffic:
    def mean(key: str, scale: float = 1.0) -> float:
        return statistics.fmean(c[key] for c in counts) / scale

    return InterfaceTraffic(robots, interface, sum(c["tasks"] for c in counts), sum(c["succeeded"] for c in counts),
                            seconds, cpu, _mean_or_nan([s for c in counts for s in c["first_segment_s"]]),
                            mean("own_segments"), mean("segment_messages"), mean("segment_bytes", 1024),
                            mean("other_messages"), mean("other_bytes", 1024))


def _read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None  # started with stdout=PIPE
    return process.stdout.readline().strip()


def _mean_or_nan(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


class _Fleet:
    """The robot processes, driven a line at a time."""

    def __init__(self, processes: list[subprocess.Popen[str]], log: str) -> None:
        self.processes = processes
        self.log = log

    def send(self, line: str) -> None:
        for process in self.processes:
            assert process.stdin is not None  # started with stdin=PIPE
            process.stdin.write(line + "\n")
            process.stdin.flush()

    def expect(self, word: str, timeout_s: float) -> list[str]:
        """Every robot's next line, which must start with ``word``; the robots are killed past ``timeout_s``."""
        timer = threading.Timer(timeout_s, self._kill)
        timer.start()
        try:
            lines = [_read_line(process) for process in self.processes]
        finally:
            timer.cancel()
        bad = [line for line in lines if not line or not line.startswith(word)]
        if bad:
            raise RuntimeError(f"a robot answered {bad[0]!r} where {word or 'its counts'!r} was due "
                               f"(within {timeout_s:.0f} s); robots' log: {self.log}")
        return lines

    def _kill(self) -> None:
        for process in self.processes:
            process.kill()


@contextmanager
def _robot_processes(robots: int, goals: int, domain_id: int, time_scale: float) -> Iterator[_Fleet]:
    env = os.environ | {"ROS_DOMAIN_ID": str(domain_id)}
    log_fd, log = tempfile.mkstemp(prefix="timely-llm-traffic-robots-", suffix=".log")
    with os.fdopen(log_fd, "w") as log_file:
        processes = [subprocess.Popen([sys.executable, "-m", "timely_llm_bench.robots.traffic_bench", f"robot_{i:03d}",
                                       str(goals), str(time_scale)], env=env, text=True, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=log_file)
                     for i in range(robots)]
    failed = True
    try:
        yield _Fleet(processes, log)
        failed = False
    finally:
        for process in processes:
            if process.poll() is None and failed:
                process.kill()
            try:
                process.wait(10.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if not failed:
            os.remove(log)


# ----- one robot process -----

def robot_main(agent: str, goals: int, time_scale: float) -> int:
    """One robot host: answer the parent's lines on stdin (see the module's docstring) until ``exit``."""
    from rclpy.node import Node

    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.traces import load_catalog
    from timely_llm_bench.robots.fleet import ros_session
    from timely_llm_bench.robots.simulated import SimulatedSkills
    from timely_llm_robot.client import PlanLink, RobotClient
    from timely_llm_robot.topic_client import TopicPlanLink, TopicRobotClient

    catalog, skills = load_catalog(), load_skill_models()
    robot = "tello"
    traces = [catalog[i] for i in sorted(t.id for t in catalog.traces.values() if t.robot == robot)]
    heard = {"action": (Heard(), Heard()), "topic": (Heard(), Heard())}
    with ros_session(int(os.environ.get("ROS_DOMAIN_ID", "0"))) as (context, executor):
        node = Node(f"traffic_{agent}", context=context)
        executor.add_node(node)
        for topic, kind, qos, tally in _taps(agent, heard):
            node.create_subscription(kind, topic, tally.add, qos, raw=True)
        runner = SimulatedSkills(skills[robot], time_scale=time_scale)
        action_link, topic_link = PlanLink(node), TopicPlanLink(node)
        clients: dict[str, RobotClient] = {"action": RobotClient(action_link, agent, robot, runner),
                                           "topic": TopicRobotClient(topic_link, agent, robot, runner)}
        ready = action_link.wait_for_server(READY_S) and topic_link.wait_for_server(READY_S)
        print("ready" if ready else "no node", flush=True)
        if ready:
            _answer_parent(clients, heard, [traces[i % len(traces)] for i in range(goals)])
        for client in clients.values():
            client.close()
        executor.remove_node(node)
        node.destroy_node()
    return 0 if ready else 1


def _taps(agent: str, heard: dict[str, tuple[Heard, Heard]]) -> tuple[tuple, ...]:
    """(topic, message type, QoS, tally) of what a robot hears on each interface: the action's feedback and
    status, the agent's segments and results."""
    from action_msgs.msg import GoalStatusArray
    from rclpy.qos import qos_profile_action_status_default
    from timely_llm_interfaces.names import agent_topics
    from timely_llm_interfaces.qos import AGENT_QOS, DEEP_RELIABLE

    from timely_llm.ros.interfaces import PlanResult, RequestPlan
    from timely_llm.ros.interfaces import Segment as SegmentMsg

    segments, results = agent_topics(agent)
    return (("request_plan/_action/feedback", RequestPlan.Impl.FeedbackMessage, DEEP_RELIABLE, heard["action"][0]),
            ("request_plan/_action/status", GoalStatusArray, qos_profile_action_status_default, heard["action"][1]),
            (segments, SegmentMsg, AGENT_QOS, heard["topic"][0]), (results, PlanResult, AGENT_QOS, heard["topic"][1]))


def _answer_parent(clients: dict[str, RobotClient], heard: dict[str, tuple[Heard, Heard]], tasks: list[Trace]) -> None:
    """The parent's commands on stdin: ``go INTERFACE`` runs ``tasks`` through that interface's client,
    ``count`` prints what was heard meanwhile; anything else ends."""
    counts: dict = {}
    interface = "action"
    for line in sys.stdin:
        command = line.split()
        if command[:1] == ["go"] and command[1:] and command[1] in clients:
            interface = command[1]
            for tally in heard[interface]:
                tally.messages = tally.bytes = 0
            outcomes = [_run_task(clients[interface], trace) for trace in tasks]
            counts = {"tasks": len(outcomes), "succeeded": sum(o.status == "succeeded" for o in outcomes),
                      "own_segments": sum(len(o.segments) for o in outcomes),
                      "first_segment_s": [o.first_segment_at - o.sent for o in outcomes if o.first_segment_at]}
            print("done", flush=True)
        elif command == ["count"]:
            segment_tally, other_tally = heard[interface]
            print(json.dumps(counts | {"segment_messages": segment_tally.messages, "segment_bytes": segment_tally.bytes,
                                       "other_messages": other_tally.messages, "other_bytes": other_tally.bytes}),
                  flush=True)
        else:
            return


def _run_task(client: RobotClient, trace: Trace) -> TaskOutcome:
    """Send the trace's task and wait for its end; one that does not end in time counts as not succeeded."""
    outcome = client.request(trace.prompt, None, trace.id)
    try:
        return outcome.wait(RESULT_TIMEOUT_S)
    except TimeoutError:
        return outcome


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one robot process of timely-llm traffic-bench")
    parser.add_argument("agent")
    parser.add_argument("goals", type=int)
    parser.add_argument("time_scale", type=float)
    args = parser.parse_args()
    sys.exit(robot_main(args.agent, args.goals, args.time_scale))
