"""The Tello simulator over real loopback UDP, and TelloExecutor flying it through real djitellopy.

djitellopy binds its client ports once per process and never frees them, so this module
picks free ones for the whole process; tests here must not run in parallel with another
process that uses djitellopy on the same ports.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from djitellopy import Tello

from timely_llm_bench.cli.ros import MAX_ROS_DOMAIN_ID
from timely_llm_bench.robots.tello_sim import (
    DroneState,
    TelloSimulator,
    dds_ports,
    format_state,
    free_udp_port,
    tello_command_duration,
)
from timely_llm_robot.executors.tello import (
    FakeScene,
    SceneObject,
    TelloExecutor,
)

TIME_SCALE = 0.01
CAT_AHEAD = FakeScene({"cat": SceneObject(distance=120.0)})
NO_CAT = FakeScene({})


@pytest.fixture
def client_ports(tello_client_ports: tuple[int, int]) -> tuple[int, int]:
    return tello_client_ports


@pytest.fixture
def sim(client_ports: tuple[int, int]) -> Iterator[TelloSimulator]:
    with TelloSimulator(state_port=client_ports[1], time_scale=TIME_SCALE) as simulator:
        yield simulator


@pytest.fixture
def connect(sim: TelloSimulator) -> Iterator[Callable[[FakeScene], TelloExecutor]]:
    executors: list[TelloExecutor] = []

    def connect_with(vision: FakeScene) -> TelloExecutor:
        executor = TelloExecutor(sim.address, vision=vision, time_scale=TIME_SCALE)
        executor.connect()
        executors.append(executor)
        return executor

    yield connect_with
    for executor in executors:
        executor.close()


@pytest.fixture
def drone(connect: Callable[[FakeScene], TelloExecutor]) -> TelloExecutor:
    return connect(CAT_AHEAD)


class RawClient:
    """Talks to the simulator with plain UDP, as the Tello SDK describes."""

    def __init__(self, sim: TelloSimulator) -> None:
        self.sim = sim
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.settimeout(2.0)

    def send(self, command: str) -> str:
        self.socket.sendto(command.encode(), self.sim.address)
        return self.socket.recv(1024).decode()

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def raw(sim: TelloSimulator) -> Iterator[RawClient]:
    client = RawClient(sim)
    assert client.send("command") == "ok"
    yield client
    client.close()


def wait_for(condition: Callable[[], bool], timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- simulator alone -------------------------------------------------------------------------

def test_simulator_flies_and_tracks_pose(raw: RawClient) -> None:
    for command in ("takeoff", "forward 100", "cw 90", "forward 50", "up 40", "ccw 45"):
        assert raw.send(command) == "ok", command
    state = raw.sim.state
    assert state.flying
    assert (state.x, state.y, state.z, state.yaw) == pytest.approx((100, 50, 120, 45))


def test_simulator_rejects_out_of_range_and_bad_arguments(raw: RawClient) -> None:
    assert raw.send("takeoff") == "ok"
    for command in ("forward 10", "forward 501", "cw 0", "ccw 361", "left", "up x", "speed 200"):
        assert raw.send(command) == "error out of range", command
    assert raw.send("fly away") == "error unknown command"
    assert raw.sim.state.x == 0


def test_simulator_refuses_to_move_on_the_ground(raw: RawClient) -> None:
    assert raw.send("forward 50") == "error not flying"
    assert raw.send("land") == "error not flying"


def test_simulator_answers_read_commands(raw: RawClient) -> None:
    assert raw.send("battery?") == "100"
    assert raw.send("streamon") == "ok"
    assert raw.send("speed 50") == "ok"
    assert raw.send("speed?") == "50.0"
    assert raw.send("height?") == "0dm"


def test_simulator_ignores_commands_before_sdk_mode(sim: TelloSimulator) -> None:
    client = RawClient(sim)
    client.socket.settimeout(0.3)
    with pytest.raises(TimeoutError):
        client.send("takeoff")
    client.close()


def test_simulator_takes_the_duration_function_time_scaled(client_ports: tuple[int, int]) -> None:
    asked: list[tuple[str, float | None]] = []

    def two_seconds(command: str, value: float | None) -> float:
        asked.append((command, value))
        return 2.0

    with TelloSimulator(state_port=client_ports[1], duration=two_seconds, time_scale=0.1) as sim:
        client = RawClient(sim)
        client.send("command")
        started = time.monotonic()
        client.send("takeoff")
        elapsed = time.monotonic() - started
        client.close()
        assert sim.state.flight_time == pytest.approx(2.0)
    assert asked == [("takeoff", None)]
    assert 0.2 <= elapsed < 2.0  # the scaled time at least; under the unscaled 2 s however loaded the machine


def test_a_free_port_for_a_drone_client_is_never_one_of_the_ros_domains_dds_ports() -> None:
    """On a domain whose DDS ports lie among the ports the kernel hands out, 2000 draws meet about 18 of them
    without the check (CI once read a discovery packet as a takeoff's answer)."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    domain = next(d for d in range(MAX_ROS_DOMAIN_ID + 1) if dds_ports(d).start >= low)
    blocked = dds_ports(domain)
    assert blocked.stop <= high + 1
    drawn = {free_udp_port(domain) for _ in range(2000)}
    assert not drawn & set(blocked) and all(low <= p <= high for p in drawn)


def test_default_durations_follow_the_profiled_fits() -> None:
    assert tello_command_duration("forward", 100) == pytest.approx(0.0072 * 100 + 1.8144)
    assert tello_command_duration("cw", 90) == pytest.approx(0.0165 * 90 + 0.784)
    assert tello_command_duration("takeoff", None) == pytest.approx(3.0)


def test_state_line_parses_with_djitellopy() -> None:
    state = Tello.parse_state(format_state(DroneState(z=80, yaw=-90, battery=87.6, flying=True)))
    assert (state["h"], state["yaw"], state["bat"], state["tof"]) == (80, -90, 87, 80)
    assert state["agz"] == pytest.approx(-1000.0)


def test_yaw_wraps_like_the_drone_reports_it(raw: RawClient) -> None:
    raw.send("takeoff")
    raw.send("cw 270")
    assert raw.sim.state.yaw == pytest.approx(-90)


# --- TelloExecutor through djitellopy ---------------------------------------------------------

FLIGHT = "takeoff;mf(50);tc(90);?iv('cat')==True{mf(30)};land"


def test_executor_flies_a_plan_with_a_conditional(drone: TelloExecutor, sim: TelloSimulator) -> None:
    result = drone.execute_text(FLIGHT, final=True)

    assert result.success, result.reason
    state = sim.state
    assert not state.flying
    assert (state.x, state.y, state.yaw) == pytest.approx((50, 30, 90), abs=1e-6)
    assert sim.commands == ["command", "takeoff", "forward 50", "cw 90", "forward 30", "land"]


def test_executor_skips_the_conditional_when_the_cat_is_not_there(
        connect: Callable[[FakeScene], TelloExecutor], sim: TelloSimulator) -> None:
    result = connect(NO_CAT).execute_text(FLIGHT, final=True)

    assert result.success, result.reason
    assert (sim.state.x, sim.state.y) == pytest.approx((50, 0), abs=1e-6)


def test_out_of_range_move_fails_with_the_drones_reason(drone: TelloExecutor, sim: TelloSimulator) -> None:
    result = drone.execute_text("takeoff;mf(600);tc(90)", final=True)

    assert not result.success
    assert "mf" in result.reason and "out of range" in result.reason
    assert sim.state.yaw == 0
    assert "cw 90" not in sim.commands


def test_djitellopy_receives_the_state_stream(drone: TelloExecutor, sim: TelloSimulator) -> None:
    assert drone.tello.get_battery() == 100
    assert drone.tello.get_height() == 0

    assert drone.execute_calls([("takeoff", [])]).success
    assert wait_for(lambda: drone.tello.get_height() == 80)
    assert drone.tello.get_distance_tof() == 80


def test_segments_stream_into_one_plan(drone: TelloExecutor, sim: TelloSimulator) -> None:
    first = drone.execute_text("takeoff;mf(50);?iv('cat')==True{", request_id="r1")
    commands_after_first = list(sim.commands)
    second = drone.execute_text("tc(90);}->True", request_id="r1", final=True)

    assert first.success and second.success
    assert commands_after_first[-2:] == ["takeoff", "forward 50"]
    assert sim.commands[-1] == "cw 90"
    assert second.returned is True


def test_a_segment_reports_what_its_last_call_returned(drone: TelloExecutor, sim: TelloSimulator) -> None:
    """The value a robot sends back for a segment ending in a blocking call is its last call's."""
    looked = drone.execute_text("takeoff;iv('cat');", request_id="r1")
    moved = drone.execute_text("mf(30);", request_id="r1", final=True)

    assert looked.success and looked.last_value is True
    assert moved.success and moved.last_value is None
    assert sim.commands[-1] == "forward 30"


def test_a_conditional_block_flies_segment_by_segment_as_the_node_dispatches_it(drone: TelloExecutor,
                                                                                sim: TelloSimulator) -> None:
    drone.execute_text("takeoff;?iv('cat')==True{", request_id="r1")
    drone.execute_text("tc(90);", request_id="r1")
    flown_before_close = list(sim.commands)
    closed = drone.execute_text("}", request_id="r1", final=True)

    assert closed.success and flown_before_close[-2:] == ["takeoff", "cw 90"]
    assert sim.commands == flown_before_close


def test_parsed_calls_with_string_arguments_run_in_order(drone: TelloExecutor, sim: TelloSimulator) -> None:
    result = drone.execute_calls([("takeoff", []), ("mu", ["40"]), ("tu", ["90"]), ("d", ["0.5"])])

    assert result.success, result.reason
    assert (sim.state.z, sim.state.yaw) == pytest.approx((120, -90))


def test_goto_flies_to_the_object(drone: TelloExecutor, sim: TelloSimulator) -> None:
    assert drone.execute_text("takeoff;g('cat')", final=True).success
    assert sim.state.x == pytest.approx(120)


def test_goto_fails_when_the_object_is_not_visible(drone: TelloExecutor) -> None:
    result = drone.execute_text("takeoff;g('unicorn')", final=True)
    assert not result.success and "not visible" in result.reason


def test_perception_log_and_picture_skills(drone: TelloExecutor) -> None:
    result = drone.execute_text("_1=ox('cat');l(_1);tp;?oh('cat')>0.2{->od('cat')}", final=True)

    assert result.success, result.reason
    assert result.returned == pytest.approx(120)
    assert drone.log == ["0.5"]
    assert CAT_AHEAD.pictures >= 1


def test_re_plan_and_unknown_skills_fail_with_reasons(drone: TelloExecutor) -> None:
    replan = drone.execute_text("rp", final=True)
    unknown = drone.execute_calls([("zz", [])])
    malformed = drone.execute_text("mf(50", final=True)

    assert not replan.success and "re-plan" in replan.reason
    assert not unknown.success and "unknown skill" in unknown.reason
    assert not malformed.success and "malformed" in malformed.reason


def test_delay_is_in_seconds_scaled_by_time_scale(drone: TelloExecutor) -> None:
    result = drone.execute_calls([("d", [20])])
    assert result.success
    assert 20 * TIME_SCALE <= result.duration < 20 * 0.1  # scaled: far under the 20 s of a real delay


def test_duration_measures_the_segment(drone: TelloExecutor) -> None:
    result = drone.execute_text("takeoff;mf(100)", final=True)
    simulated = (tello_command_duration("takeoff", None) + tello_command_duration("forward", 100)) * TIME_SCALE
    assert result.duration >= simulated
    assert math.isfinite(result.duration)


def test_close_lands_the_drone(connect: Callable[[FakeScene], TelloExecutor], sim: TelloSimulator) -> None:
    drone = connect(CAT_AHEAD)
    drone.execute_calls([("takeoff", [])])
    drone.close()
    assert not sim.state.flying


def test_a_second_executor_for_the_same_drone_ip_is_refused(drone: TelloExecutor, sim: TelloSimulator) -> None:
    with pytest.raises(RuntimeError, match="another djitellopy Tello"):
        TelloExecutor(sim.address).connect()


def test_auto_takeoff_takes_off_once_before_the_first_plan(connect: Callable, sim: TelloSimulator) -> None:
    drone = connect(CAT_AHEAD)
    drone.auto_takeoff = True
    assert drone.execute_text("mf(50);", request_id="r1", final=True).success
    assert drone.execute_text("mu(30);", request_id="r2", final=True).success
    assert sim.commands[1:] == ["takeoff", "forward 50", "up 30"]
