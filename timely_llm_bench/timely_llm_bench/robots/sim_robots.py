"""Simulated robots for a fleet replay: Tello simulators flown through djitellopy, simulated arms and
simulated mobile bases (on an open map: every place reachable).

Every skill takes the time its skill model gives; scene-dependent (sampled) times are
drawn per segment with the same seeded generator :class:`SimulatedSkills` uses, so a
replay stays comparable with ``timely-llm bench``. Each drone gets a
:class:`TelloSimulator` on a loopback address of its own (127.0.0.2, 127.0.0.3, ...:
djitellopy files replies by drone IP) and a :class:`TelloExecutor` that takes off
before its first plan; the scene shows every object the catalog's plans look for,
so every skill call of a plan runs, as the bench assumes.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import djitellopy.tello as djitellopy_tello
from djitellopy import Tello

from timely_llm.plan.skills import SkillModel
from timely_llm.ros.interfaces import Segment as SegmentMsg
from timely_llm.traces import TraceCatalog
from timely_llm_bench.robots.simulated import SimulatedSkills, segment_rng
from timely_llm_bench.robots.tello_sim import TelloSimulator, free_udp_port, tello_command_duration
from timely_llm_robot.executors.arm import SimulatedArm
from timely_llm_robot.executors.base import SegmentRunner, calls_runner
from timely_llm_robot.executors.minispec import Value
from timely_llm_robot.executors.mobile_base import SimulatedMobileBase
from timely_llm_robot.executors.tello import FakeScene, SceneObject, TelloExecutor, tello_runner, use_client_ports

FIRST_DRONE_IP = ipaddress.IPv4Address("127.0.0.2")
SCENE_DISTANCE_CM = 100.0
TELLO_PORTS = (8889, 8890)
_COMMAND_SKILLS = {"forward": "mf", "back": "mb", "left": "ml", "right": "mr", "up": "mu", "down": "md",
                   "cw": "tc", "ccw": "tu"}
_VISION_ARGS = frozenset({"s", "iv", "g", "ox", "oy", "ow", "oh", "od"})


@dataclass
class SkillTimes:
    """One robot's skill times from its model; sampled ones are drawn per segment, then used in call order."""

    model: SkillModel
    seed: int = 0
    _drawn: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque))

    def draw(self, segment: SegmentMsg, label: str) -> None:
        """Draw the segment's sampled times, exactly as SimulatedSkills draws them."""
        rng = segment_rng(self.seed, label, segment.index)
        for call in self.model.find_calls(segment.text):
            time_model = self.model.skills[call.name].time
            seconds = time_model.sample(call.numeric_arg, rng)
            if time_model.kind == "samples":
                self._drawn[call.name].append(seconds)

    def seconds(self, abbr: str, arg: float | None = None) -> float:
        """How long skill ``abbr`` takes now: its next drawn time if sampled, else the model's."""
        drawn = self._drawn[abbr]
        return drawn.popleft() if drawn else self.model.skills[abbr].time.lower_bound(arg)

    def timed(self, runner: SegmentRunner) -> SegmentRunner:
        """``runner`` with this segment's times drawn before it runs."""
        def run(segment: SegmentMsg, label: str):  # noqa: ANN202 - SegmentResult
            self.draw(segment, label)
            return runner(segment, label)

        return run


class SimulatedDrone:
    """A Tello simulator on ``host`` and the djitellopy executor flying it, both timed by ``times``."""

    def __init__(self, host: str, times: SkillTimes, scene: FakeScene, time_scale: float = 1.0) -> None:
        self.times = times
        self.scene = scene
        self.time_scale = time_scale
        self._by_name = {skill.name: abbr for abbr, skill in times.model.skills.items()}
        self.simulator = TelloSimulator(host, state_port=Tello.STATE_UDP_PORT, duration=self._command_seconds,
                                        time_scale=time_scale)
        self.executor = TelloExecutor(self.simulator.address, vision=self._see, time_scale=time_scale,
                                      auto_takeoff=True)

    def start(self) -> None:
        """Start the simulator, connect djitellopy and take off (so no plan pays for the takeoff)."""
        self.simulator.start()
        self.executor.connect()
        self.executor.dispatch("takeoff", [])

    def stop(self) -> None:
        self.executor.close()
        self.simulator.stop()

    def runner(self) -> SegmentRunner:
        return self.times.timed(tello_runner(self.executor))

    def _command_seconds(self, command: str, value: float | None) -> float:
        if command in _COMMAND_SKILLS:
            return self.times.seconds(_COMMAND_SKILLS[command], value)
        return tello_command_duration(command, value)

    def _see(self, skill: str, args: Sequence[Value]) -> Value:
        time.sleep(self.times.seconds(self._by_name[skill]) * self.time_scale)
        return self.scene(skill, args)


def drone_scene(catalog: TraceCatalog, model: SkillModel) -> FakeScene:
    """Every object the catalog's drone plans look for, in view at SCENE_DISTANCE_CM."""
    names = {c.args[0] for t in catalog.traces.values() if t.robot == model.robot
             for c in model.find_calls(t.plan) if c.name in _VISION_ARGS and c.args}
    return FakeScene({n: SceneObject(distance=SCENE_DISTANCE_CM) for n in names})


def arm_objects(catalog: TraceCatalog, model: SkillModel) -> dict[str, str]:
    """Every object the catalog's arm plans pick, lying on the table."""
    return {c.args[0]: "table" for t in catalog.traces.values() if t.robot == model.robot
            for c in model.find_calls(t.plan) if c.name == "pick" and c.args}


def ensure_client_ports(domain: int | None = None) -> tuple[int, int]:
    """Free local ports for djitellopy, outside ROS domain ``domain``'s DDS ports (default ``$ROS_DOMAIN_ID``),
    unless it listens already or others were chosen; the ports in use."""
    if not djitellopy_tello.threads_initialized and (Tello.CONTROL_UDP_PORT, Tello.STATE_UDP_PORT) == TELLO_PORTS:
        use_client_ports(free_udp_port(domain), free_udp_port(domain))
    return Tello.CONTROL_UDP_PORT, Tello.STATE_UDP_PORT


@contextmanager
def simulated_robots(agents: dict[str, str], skills: dict[str, SkillModel], catalog: TraceCatalog, seed: int = 0,
                     max_drones: int | None = None, time_scale: float = 1.0,
                     domain: int | None = None) -> Iterator[dict[str, SegmentRunner]]:
    """A runner per agent (agent -> robot type): the first ``max_drones`` tello agents fly Tello simulators
    through djitellopy, arms are SimulatedArms, mobile bases SimulatedMobileBases, and every other agent
    sleeps SimulatedSkills times; ``time_scale`` multiplies every skill's time. ``domain``: the ROS domain whose DDS
    ports djitellopy's client must not take (default ``$ROS_DOMAIN_ID``)."""
    tello_agents = sorted(a for a, robot in agents.items() if robot == "tello")[:max_drones]
    runners: dict[str, SegmentRunner] = {a: SimulatedSkills(skills[robot], seed, time_scale)
                                         for a, robot in agents.items()}
    runners |= {a: _arm(skills["arm"], catalog, seed, time_scale) for a, robot in agents.items() if robot == "arm"}
    runners |= {a: mobile_base(skills["mobile_base"], seed, time_scale)
                for a, robot in agents.items() if robot == "mobile_base"}
    with ExitStack() as stack:
        if tello_agents:
            ensure_client_ports(domain)
            drones = _start_drones(len(tello_agents), skills["tello"], seed, catalog, time_scale, stack)
            runners |= {a: d.runner() for a, d in zip(tello_agents, drones, strict=True)}
        yield runners


def _arm(model: SkillModel, catalog: TraceCatalog, seed: int, time_scale: float) -> SegmentRunner:
    times = SkillTimes(model, seed)
    arm = SimulatedArm(arm_objects(catalog, model), duration=lambda skill, args: times.seconds(skill),
                       time_scale=time_scale)
    return times.timed(calls_runner(arm.execute_calls))


def mobile_base(model: SkillModel, seed: int = 0, time_scale: float = 1.0,
                world: dict[str, set[str]] | None = None) -> SegmentRunner:
    """A SimulatedMobileBase timed by ``model`` (sampled drive times drawn per segment, as SimulatedSkills draws)."""
    times = SkillTimes(model, seed)
    base = SimulatedMobileBase(world, duration=lambda skill, args: times.seconds(skill, _first_number(args)),
                               time_scale=time_scale)
    return times.timed(calls_runner(base.execute_calls))


def _first_number(args: Sequence[Value]) -> float | None:
    return next((float(a) for a in args if isinstance(a, int | float) and not isinstance(a, bool)), None)


def _start_drones(count: int, model: SkillModel, seed: int, catalog: TraceCatalog, time_scale: float,
                  stack: ExitStack) -> list[SimulatedDrone]:
    Tello.LOGGER.setLevel(logging.WARNING)  # djitellopy logs every command at INFO
    scene = drone_scene(catalog, model)
    drones = [SimulatedDrone(str(FIRST_DRONE_IP + i), SkillTimes(model, seed), scene, time_scale)
              for i in range(count)]
    pool = stack.enter_context(ThreadPoolExecutor(max_workers=min(count, 32)))
    stack.callback(lambda: list(pool.map(SimulatedDrone.stop, drones)))
    drones[0].start()  # the first Tello() starts djitellopy's receivers, unguarded against a race
    list(pool.map(SimulatedDrone.start, drones[1:]))
    return drones
