"""``timely-llm abuse-bench``: honest robots' response times with and without attackers (issue 45's acceptance).

The node runs in-process on the sim engine at a batch cap of 8; every honest robot is a ``RobotClient`` on the
action that sends one task after the other (urgent traces, the category's default TUF) for the run's duration,
executing its segments at 0.2x their skill-model time. Two scenarios, each run without and with its attackers:

- ``defaults`` (no fleet file): 10 honest urgent robots; the attacker is one agent sending 40 goals a second that
  claim beta 1e6 and ERT 1 ms.
- ``fleet`` (a fleet file of 20 declared robots: 10 urgent, 10 normal, of which ``cheat_01`` attacks): the 10
  urgent ones ask as above and 9 normal ones ask normal tasks; the attackers are a client flooding task requests
  from 2,000 made-up ids (200 a second on the shared ``task_requests``, and goals on the action from made-up ids,
  10 a second) and ``cheat_01`` sending 20 goals a second that claim beta 1e6 and ERT 0, beyond its class.

Measured: the honest urgent robots' goals ended and succeeded, and their mean response time (the node's
``response_time``: arrival to the first segment's action start); the attackers' goals sent and accepted.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from timely_llm_interfaces.fields import duration_msg
from timely_llm_interfaces.names import TASK_REQUESTS
from timely_llm_interfaces.qos import TASK_REQUESTS_QOS

from timely_llm.core.tuf import TUF
from timely_llm.plan.skills import SkillModel
from timely_llm.ros.interfaces import TaskRequest
from timely_llm.ros.messages import duration_seconds
from timely_llm.traces import TraceCatalog
from timely_llm_bench.robots.fleet import ros_session, server_node
from timely_llm_bench.robots.simulated import SimulatedSkills
from timely_llm_robot.client import PlanLink, RobotClient, TaskOutcome

URGENT_TRACES, NORMAL_TRACES = (6, 7, 8), (1, 3, 4, 5)
CLAIM = TUF(0.001, -1e6, 1e6)
BATCH_CAP = 8
TIME_SCALE = 0.2
RESULT_TIMEOUT_S = 120.0


@dataclass
class AbuseResult:
    scenario: str
    attackers: bool
    honest_goals: int
    honest_succeeded: int
    urgent_mean_s: float
    attack_sent: int
    attack_accepted: int

    HEADER = "| scenario | attackers | honest urgent goals | succeeded | urgent mean response (s) | attack goals " \
             "sent | accepted |\n|---|---|---|---|---|---|---|"

    def row(self) -> str:
        return (f"| {self.scenario} | {'yes' if self.attackers else 'no'} | {self.honest_goals} | "
                f"{self.honest_succeeded} | {self.urgent_mean_s:.3f} | {self.attack_sent} | {self.attack_accepted} |")


def fleet_yaml() -> str:
    """20 declared robots: urgent_00..09 (class urgent), normal_00..08 and cheat_01 (class normal)."""
    robots = [f"  - {{id: urgent_{i:02d}, types: [tello], class: urgent}}" for i in range(10)]
    robots += [f"  - {{id: normal_{i:02d}, types: [tello], class: normal}}" for i in range(9)]
    robots += ["  - {id: cheat_01, types: [tello], class: normal}"]
    return "robots:\n" + "\n".join(robots) + "\n"


class Asker:
    """Robots that each send one task after the other until ``stop``; their outcomes."""

    def __init__(self, robots: list[RobotClient], traces: tuple[int, ...], catalog: TraceCatalog) -> None:
        self.outcomes: list[TaskOutcome] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(robot, traces, catalog), daemon=True)
                         for robot in robots]
        for thread in self._threads:
            thread.start()

    def _loop(self, robot: RobotClient, traces: tuple[int, ...], catalog: TraceCatalog) -> None:
        i = 0
        while not self._stop.is_set():
            trace = traces[i % len(traces)]
            outcome = robot.request(catalog[trace].prompt, None, trace)
            self.outcomes.append(outcome)
            outcome.wait(RESULT_TIMEOUT_S)
            i += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(RESULT_TIMEOUT_S)


class Attack:
    """Attackers sending at their rates on a thread of their own until ``stop``; what they sent and got accepted."""

    def __init__(self, senders: list[tuple[float, Callable[[int], TaskOutcome | None]]]) -> None:
        self.sent, self.outcomes = 0, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=s, daemon=True) for s in senders]
        for thread in self._threads:
            thread.start()

    def _loop(self, per_s: float, send: Callable[[int], TaskOutcome | None]) -> None:
        start, n = time.monotonic(), 0
        while not self._stop.is_set():
            outcome = send(n)
            self.sent += 1
            if outcome is not None:
                self.outcomes.append(outcome)
            n += 1
            time.sleep(max(0.0, start + n / per_s - time.monotonic()))

    def stop(self) -> int:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        return sum(o.accepted for o in self.outcomes)


def run_abuse(scenario: str, attackers: bool, duration: float, skills: dict[str, SkillModel],
              catalog: TraceCatalog, domain_id: int) -> AbuseResult:
    """One run of ``scenario`` (defaults or fleet), with or without its attackers."""
    made: list[RobotClient] = []
    with _node(scenario, domain_id) as (link, shared):
        def robot(agent: str) -> RobotClient:
            made.append(RobotClient(link, agent, "tello", SimulatedSkills(skills["tello"], time_scale=TIME_SCALE)))
            return made[-1]

        prefix = "urgent" if scenario == "fleet" else "honest"
        urgent = Asker([robot(f"{prefix}_{i:02d}") for i in range(10)], URGENT_TRACES, catalog)
        normal = Asker([robot(f"normal_{i:02d}") for i in range(9)] if scenario == "fleet" else [],
                       NORMAL_TRACES, catalog)
        attack = Attack(_attackers(scenario, link, shared, robot, catalog) if attackers else [])
        time.sleep(duration)
        accepted = attack.stop()
        urgent.stop()
        normal.stop()
        for client in made:
            client.close()
        ended = [o.result for o in urgent.outcomes if o.finished.done() and o.result is not None]
        done = [duration_seconds(r.response_time) for r in ended if r.status == r.STATUS_SUCCEEDED]
        mean = statistics.fmean(done) if done else float("nan")
        return AbuseResult(scenario, attackers, len(ended), len(done), mean, attack.sent, accepted)


def _attackers(scenario: str, link: PlanLink, shared: object, robot: Callable[[str], RobotClient],
               catalog: TraceCatalog) -> list[tuple[float, Callable[[int], TaskOutcome | None]]]:
    def claim(client: RobotClient) -> Callable[[int], TaskOutcome]:
        return lambda n: client.request(catalog[7].prompt, CLAIM, 7)

    if scenario == "defaults":
        return [(40.0, claim(robot("flooder")))]
    made_up = [robot(f"fake_{i:04d}") for i in range(100)]

    def rotating(n: int) -> None:
        shared.publish(TaskRequest(  # type: ignore[attr-defined]
            request_id=f"x{n}", agent_id=f"made_up_{n % 2000:04d}", robot_type="tello", task=catalog[7].prompt,
            trace_id=7, tuf_ert=duration_msg(0.0), tuf_alpha=CLAIM.alpha, tuf_beta=CLAIM.beta))

    return [(200.0, rotating), (10.0, lambda n: claim(made_up[n % len(made_up)])(n)),
            (20.0, claim(robot("cheat_01")))]


@contextmanager
def _node(scenario: str, domain_id: int) -> Iterator[tuple[PlanLink, object]]:
    with tempfile.TemporaryDirectory() as tmp, ros_session(domain_id) as (context, executor):
        params: dict[str, Any] = {"max_batch": BATCH_CAP}
        if scenario == "fleet":
            path = Path(tmp) / "fleet.yaml"
            path.write_text(fleet_yaml())
            params["fleet_file"] = str(path)
        with server_node(executor, context, **params):
            from rclpy.node import Node

            node = Node("abuse_bench_robots", context=context)
            executor.add_node(node)
            link = PlanLink(node)
            link.wait_for_server()
            yield link, node.create_publisher(TaskRequest, TASK_REQUESTS, TASK_REQUESTS_QOS)
            executor.remove_node(node)
            node.destroy_node()
