"""A Tello SDK 2.0 drone simulated over UDP, for djitellopy and tests; no hardware needed.

It answers commands on ``(host, port)`` the way a Tello does on 192.168.10.1:8889,
taking simulated time per command, and streams the state string to the client's
state port at about 10 Hz once the client has sent ``command``.

Frame: x forward and y right of the takeoff heading, z up, all in cm; yaw in
degrees, clockwise positive, in [-180, 180) like the drone reports it.
"""

from __future__ import annotations

import functools
import math
import os
import socket
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TypeGuard

from timely_llm.plan.robot_file import load_skill_model, skill_model_dir
from timely_llm.plan.skills import TimeModel

DurationFunction = Callable[[str, float | None], float]
"""Seconds of simulated time a command takes, given its keyword and numeric argument."""

DEFAULT_STATE_PORT = 8890
STATE_PERIOD_S = 0.1
TAKEOFF_HEIGHT_CM = 80
MOVE_RANGE_CM = (20, 500)
TURN_RANGE_DEG = (1, 360)
SPEED_RANGE_CM_S = (10, 100)
BATTERY_DRAIN_PER_S = 100 / (13 * 60)  # a full battery flies about 13 minutes
TAKEOFF_LAND_S = 3.0  # not skills of the plans, so not in the skill model
FLIP_S = 2.0
RTPS_PORT_BASE = 7400
RTPS_DOMAIN_GAIN = 250

# Tello answers these with "ok" and nothing changes in the simulation.
_SETTINGS = frozenset({
    "streamon", "streamoff", "keepalive", "motoron", "motoroff", "downvision",
    "setfps", "setbitrate", "setresolution", "mon", "moff", "mdirection",
})
_MOVES = {"forward": 0.0, "back": 180.0, "right": 90.0, "left": -90.0}
_VERTICAL = {"up": 1, "down": -1}
_TURNS = {"cw": 1, "ccw": -1}


# The SDK command each MiniSpec movement skill sends (executors/tello.py).
_SKILL_OF_COMMAND = {
    "forward": "move_forward", "back": "move_backward", "left": "move_left", "right": "move_right",
    "up": "move_up", "down": "move_down", "cw": "turn_cw", "ccw": "turn_ccw",
}


def tello_command_duration(command: str, value: float | None) -> float:
    """Seconds a real Tello takes: moves and turns as the tello skill model times their skills
    (skill_models/tello.yaml, TimelyLLM's profiling), takeoff, land and flip as measured."""
    model = _command_times().get(command)
    if model is not None:
        return model.lower_bound(value)
    if command in ("takeoff", "land"):
        return TAKEOFF_LAND_S
    if command == "flip":
        return FLIP_S
    return 0.0


@functools.cache
def _command_times() -> dict[str, TimeModel]:
    tello = load_skill_model(skill_model_dir() / "tello.yaml")
    by_name = {skill.name: skill.time for skill in tello.skills.values()}
    return {command: by_name[skill] for command, skill in _SKILL_OF_COMMAND.items()}


def dds_ports(domain: int) -> range:
    """The UDP ports of a ROS 2 domain's DDS participants (the RTPS port mapping: 250 from 7400 + 250 x domain).
    Participants send discovery to all of them, so a drone client's socket on one reads RTPS packets as answers."""
    first = RTPS_PORT_BASE + RTPS_DOMAIN_GAIN * domain
    return range(first, first + RTPS_DOMAIN_GAIN)


def free_udp_port(domain: int | None = None) -> int:
    """A UDP port free on every local address now (for a client or simulator to bind next), outside the DDS ports
    of ROS domain ``domain`` (default ``$ROS_DOMAIN_ID``, else 0): above domain 100 those are ephemeral ports, the
    ones the kernel hands out."""
    avoid = dds_ports(_ros_domain() if domain is None else domain)
    with ExitStack() as probes:
        while True:  # a probe on an avoided port stays bound, so each draw is new; the kernel's range runs out first
            probe = probes.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            probe.bind(("", 0))
            port: int = probe.getsockname()[1]
            if port not in avoid:
                return port


def _ros_domain() -> int:
    try:
        return int(os.environ.get("ROS_DOMAIN_ID", "0"))
    except ValueError:
        return 0


@dataclass(frozen=True)
class DroneState:
    x: float = 0.0
    y: float = 0.0
    z: float = 0.0
    yaw: float = 0.0
    battery: float = 100.0
    flying: bool = False
    flight_time: float = 0.0
    speed: float = 10.0


class TelloSimulator:
    """One simulated Tello; use as a context manager, or call start() and stop().

    ``port=0`` picks a free port (see ``address``). ``time_scale`` multiplies
    every command's duration, e.g. 0.01 to run 100 times faster than a drone.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, state_port: int = DEFAULT_STATE_PORT,
                 duration: DurationFunction = tello_command_duration, time_scale: float = 1.0,
                 initial_state: DroneState | None = None) -> None:
        self.state_port = state_port
        self.duration = duration
        self.time_scale = time_scale
        self.commands: list[str] = []
        self._state = initial_state or DroneState()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._client_host: str | None = None
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((host, port))
        self._socket.settimeout(STATE_PERIOD_S)
        self._handlers = self._build_handlers()
        self._threads = [threading.Thread(target=self._serve_commands, daemon=True),
                         threading.Thread(target=self._stream_state, daemon=True)]

    @property
    def address(self) -> tuple[str, int]:
        """Where to send commands: (host, port)."""
        return self._socket.getsockname()

    @property
    def state(self) -> DroneState:
        with self._lock:
            return self._state

    def start(self) -> TelloSimulator:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()
        self._socket.close()

    def __enter__(self) -> TelloSimulator:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def _serve_commands(self) -> None:
        while not self._stopping.is_set():
            try:
                data, client = self._socket.recvfrom(1024)
            except TimeoutError:
                continue
            command = data.decode("utf-8", errors="replace").strip()
            self.commands.append(command)
            reply = self.handle(command, client[0])
            if reply is not None and not self._stopping.is_set():
                self._socket.sendto(reply.encode("utf-8"), client)

    def handle(self, command: str, client_host: str) -> str | None:
        """Carry out one command (taking its simulated time); return the reply, None for none.

        The new state shows from the start of the command's time, not gradually.
        """
        if not command.split():
            return "error unknown command"
        keyword, *args = command.split()
        if keyword == "command":
            self._client_host = client_host
            return "ok"
        if self._client_host is None:
            return None  # a Tello ignores everything until it is put in SDK mode
        if keyword.endswith("?"):
            return self._read(keyword)
        if keyword == "emergency":
            self._apply_emergency()
            return None
        if keyword == "rc":
            return None  # joystick input; a Tello does not answer it
        return self._control(keyword, args)

    def _control(self, keyword: str, args: list[str]) -> str:
        if keyword in _SETTINGS:
            return "ok"
        handler = self._handlers.get(keyword)
        if handler is None:
            return "error unknown command"
        value = _single_number(args)
        error = handler(value)
        if error:
            return f"error {error}"
        self._take_time(keyword, value)
        return "ok"

    def _build_handlers(self) -> dict[str, Callable[[float | None], str | None]]:
        handlers: dict[str, Callable[[float | None], str | None]] = {
            "takeoff": self._takeoff, "land": self._land, "speed": self._set_speed, "flip": self._flip,
        }
        for direction, heading in _MOVES.items():
            handlers[direction] = functools.partial(self._move, heading_offset=heading)
        for direction, sign in _VERTICAL.items():
            handlers[direction] = functools.partial(self._climb, sign=sign)
        for direction, sign in _TURNS.items():
            handlers[direction] = functools.partial(self._turn, sign=sign)
        return handlers

    def _take_time(self, keyword: str, value: float | None) -> None:
        seconds = self.duration(keyword, value)
        self._stopping.wait(seconds * self.time_scale)
        with self._lock:
            if self._state.flying:
                self._state = replace(self._state, flight_time=self._state.flight_time + seconds,
                                      battery=max(0.0, self._state.battery - seconds * BATTERY_DRAIN_PER_S))

    def _takeoff(self, _: float | None) -> str | None:
        with self._lock:
            if self._state.flying:
                return "already flying"
            self._state = replace(self._state, flying=True, z=TAKEOFF_HEIGHT_CM)
        return None

    def _land(self, _: float | None) -> str | None:
        with self._lock:
            if not self._state.flying:
                return "not flying"
            self._state = replace(self._state, flying=False, z=0.0)
        return None

    def _set_speed(self, value: float | None) -> str | None:
        if not _in_range(value, SPEED_RANGE_CM_S):
            return "out of range"
        with self._lock:
            self._state = replace(self._state, speed=value)
        return None

    def _flip(self, _: float | None) -> str | None:
        return None if self.state.flying else "not flying"

    def _move(self, distance: float | None, heading_offset: float) -> str | None:
        def moved(state: DroneState, d: float) -> DroneState:
            heading = math.radians(state.yaw + heading_offset)
            return replace(state, x=state.x + d * math.cos(heading), y=state.y + d * math.sin(heading))

        return self._fly(distance, MOVE_RANGE_CM, moved)

    def _climb(self, distance: float | None, sign: int) -> str | None:
        def climbed(state: DroneState, d: float) -> DroneState | None:
            return None if state.z + sign * d < 0 else replace(state, z=state.z + sign * d)

        return self._fly(distance, MOVE_RANGE_CM, climbed)

    def _turn(self, degrees: float | None, sign: int) -> str | None:
        def turned(state: DroneState, deg: float) -> DroneState:
            return replace(state, yaw=(state.yaw + sign * deg + 180) % 360 - 180)

        return self._fly(degrees, TURN_RANGE_DEG, turned)

    def _fly(self, value: float | None, valid: tuple[float, float],
             change: Callable[[DroneState, float], DroneState | None]) -> str | None:
        """Apply an in-flight command: its argument in range, the drone airborne, the result allowed."""
        if not _in_range(value, valid):
            return "out of range"
        assert value is not None
        with self._lock:
            if not self._state.flying:
                return "not flying"
            changed = change(self._state, value)
            if changed is None:
                return "out of range"
            self._state = changed
        return None

    def _apply_emergency(self) -> None:
        with self._lock:
            self._state = replace(self._state, flying=False, z=0.0)

    def _read(self, keyword: str) -> str:
        state = self.state
        readings = {
            "battery?": f"{int(state.battery)}", "speed?": f"{state.speed:.1f}",
            "time?": f"{int(state.flight_time)}s", "height?": f"{round(state.z / 10)}dm",
            "temp?": "63~65C", "attitude?": f"pitch:0;roll:0;yaw:{round(state.yaw)};",
            "baro?": "0.000000", "tof?": f"{_tof_cm(state) * 10}mm", "wifi?": "90", "sdk?": "20",
            "sn?": "0TQSIMULATED0", "active?": "ok",
        }
        return readings.get(keyword, "error unknown command")

    def _stream_state(self) -> None:
        while not self._stopping.wait(STATE_PERIOD_S):
            if self._client_host is not None:
                packet = format_state(self.state).encode("ascii")
                self._socket.sendto(packet, (self._client_host, self.state_port))


def format_state(state: DroneState) -> str:
    """The state line a Tello streams (no mission pad in sight)."""
    return (
        "mid:-1;x:-100;y:-100;z:-100;mpry:-1,-1,-1;pitch:0;roll:0;"
        f"yaw:{round(state.yaw)};vgx:0;vgy:0;vgz:0;templ:63;temph:65;tof:{_tof_cm(state)};"
        f"h:{round(state.z)};bat:{int(state.battery)};baro:0.00;time:{int(state.flight_time)};"
        "agx:0.00;agy:0.00;agz:-1000.00;\r\n"
    )


def _tof_cm(state: DroneState) -> int:
    # The downward time-of-flight sensor reads about 10 cm on the ground.
    return max(10, round(state.z))


def _single_number(args: list[str]) -> float | None:
    if len(args) != 1:
        return None
    try:
        return float(args[0])
    except ValueError:
        return None


def _in_range(value: float | None, bounds: tuple[float, float]) -> TypeGuard[float]:
    return value is not None and bounds[0] <= value <= bounds[1]
