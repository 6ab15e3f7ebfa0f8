"""Runs MiniSpec plan segments on a Tello drone (real, or ``tello_sim``) through djitellopy.

Skills follow TypeFly's MiniSpec abbreviations (as in ``skill_models/tello.yaml``):

=====  ===============  ===========================================
abbr   skill            carried out by
=====  ===============  ===========================================
mf mb  move fwd/back    ``forward/back X`` (cm, the drone checks 20..500)
ml mr  move left/right  ``left/right X``
mu md  move up/down     ``up/down X``
tc tu  turn cw/ccw      ``cw/ccw X`` (degrees, the drone checks 1..360)
d      delay            waiting, in **seconds** (the unit skill_models/tello.yaml times)
g      goto             flying forward the object's distance (20..500 cm)
l      log              the executor's log
rp     re_plan          failing the segment, so the server plans again
iv ox oy ow oh od       vision: is_visible, object_x/y/width/height, object_distance
s sa p tp               vision: scan, scan_abstract, probe, take_picture
=====  ===============  ===========================================

``takeoff`` and ``land`` are accepted by their full names too (TypeFly plans
assume a drone already in the air; ``auto_takeoff`` takes off before a plan if it is not).

djitellopy quirks this module works around (djitellopy 2.5.0):

* The first ``Tello()`` of a process binds the local UDP ports ``Tello.CONTROL_UDP_PORT``
  (8889) and ``Tello.STATE_UDP_PORT`` (8890) on all interfaces for good; call
  :func:`use_client_ports` before connecting to pick others. Two processes cannot
  share them, so tests flying through djitellopy must not run in parallel on the same ports.
* Responses and state are filed under the sender's IP in a module-level dict, and
  ``Tello.end()`` deletes that entry: one connected executor per drone IP per process
  (simulate several drones on 127.0.0.2, 127.0.0.3, ...).
* A reply counts as success if it contains "ok" anywhere, and a failed command is
  retried ``retry_count`` times; the executor uses one try so an error fails at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

import djitellopy.tello as djitellopy_tello
from djitellopy import Tello, TelloException

from timely_llm_robot.executors.base import (
    CallList,
    SegmentResult,
    SegmentRunner,
    number_arg,
    run_calls,
    run_timed,
    text_arg,
)
from timely_llm_robot.executors.minispec import SkillFailed, StreamedPlan, Value

Vision = Callable[[str, Sequence[Value]], Value]
"""Answers a perception skill, given its full name (e.g. ``"is_visible"``) and arguments."""

LOGGER = logging.getLogger(__name__)

_MOTIONS = {
    "mf": "move_forward", "mb": "move_back", "ml": "move_left", "mr": "move_right",
    "mu": "move_up", "md": "move_down", "tc": "rotate_clockwise", "tu": "rotate_counter_clockwise",
}
_PERCEPTIONS = {
    "iv": "is_visible", "ox": "object_x", "oy": "object_y", "ow": "object_width", "oh": "object_height",
    "od": "object_distance", "s": "scan", "sa": "scan_abstract", "p": "probe", "tp": "take_picture",
}
GOTO_RANGE_CM = (20, 500)


@dataclass(frozen=True)
class SceneObject:
    """An object in the camera's view: box centre and size as fractions of the image, distance in cm."""

    x: float = 0.5
    y: float = 0.5
    width: float = 0.2
    height: float = 0.3
    distance: float = 100.0


DEFAULT_SCENE = {
    "person": SceneObject(x=0.3, y=0.5, width=0.15, height=0.6, distance=250.0),
    "chair": SceneObject(x=0.7, y=0.7, width=0.2, height=0.3, distance=150.0),
    "bottle": SceneObject(x=0.5, y=0.6, width=0.05, height=0.15, distance=80.0),
}


class FakeScene:
    """Deterministic vision: fixed objects in view and fixed answers to probe questions."""

    def __init__(self, objects: dict[str, SceneObject] | None = None,
                 answers: dict[str, Value] | None = None) -> None:
        self.objects = DEFAULT_SCENE if objects is None else objects
        self.answers = answers or {}
        self.pictures = 0

    def __call__(self, skill: str, args: Sequence[Value]) -> Value:
        if skill == "take_picture":
            self.pictures += 1
            return True
        subject = text_arg(skill, args)
        if skill in ("probe", "scan_abstract"):
            return self.answers.get(subject, False)
        seen = self.objects.get(subject)
        if skill in ("is_visible", "scan"):
            return seen is not None
        if seen is None:
            return False
        return {"object_x": seen.x, "object_y": seen.y, "object_width": seen.width,
                "object_height": seen.height, "object_distance": seen.distance}[skill]


def use_client_ports(control_port: int, state_port: int) -> None:
    """Choose the local ports djitellopy binds; only before the process's first Tello exists."""
    bound = (Tello.CONTROL_UDP_PORT, Tello.STATE_UDP_PORT)
    if djitellopy_tello.threads_initialized:
        if bound != (control_port, state_port):
            raise RuntimeError(f"djitellopy already listens on {bound} in this process")
        return
    Tello.CONTROL_UDP_PORT, Tello.STATE_UDP_PORT = control_port, state_port


class TelloExecutor:
    """One drone at ``address`` ((ip, command port)); use as a context manager or connect()/close()."""

    def __init__(self, address: tuple[str, int] = (Tello.TELLO_IP, 8889), vision: Vision | None = None,
                 time_scale: float = 1.0, auto_takeoff: bool = False) -> None:
        self.address = address
        self.vision = vision or FakeScene()
        self.time_scale = time_scale
        """Multiplies ``d`` delays, to match a simulator's time_scale."""
        self.auto_takeoff = auto_takeoff
        """Take off before running a plan's text if the drone is on the ground (plans assume it flies)."""
        self.log: list[str] = []
        self._tello: Tello | None = None
        self._plans: dict[str, StreamedPlan] = {}
        self._last_value: Value = None

    @property
    def tello(self) -> Tello:
        if self._tello is None:
            raise RuntimeError("TelloExecutor is not connected")
        return self._tello

    def connect(self) -> None:
        """Enter SDK mode and wait for the first state packet."""
        host = self.address[0]
        if host in djitellopy_tello.drones:
            raise RuntimeError(f"another djitellopy Tello for {host} is open in this process")
        tello = Tello(host=host, retry_count=1)
        tello.address = self.address
        self._tello = tello
        try:
            tello.connect()
        except TelloException:
            self.close()
            raise

    def close(self) -> None:
        """Land if flying and release the drone's entry in djitellopy."""
        if self._tello is not None:
            self._tello.end()
            self._tello = None

    def __enter__(self) -> TelloExecutor:
        self.connect()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def execute_calls(self, calls: CallList) -> SegmentResult:
        """Run a segment given as parsed skill calls, in order (no control flow)."""
        return run_calls(self.dispatch, calls)

    def execute_text(self, text: str, request_id: str = "", final: bool = False) -> SegmentResult:
        """Run a segment's MiniSpec text, continuing the plan ``request_id`` from earlier segments.

        Statements left unfinished by this segment (an open ``{`` block) run with the
        segment that completes them; ``final`` runs whatever is left and ends the plan,
        as does a failure.
        """
        plan = self._plans.setdefault(request_id, StreamedPlan(self.dispatch))
        self._last_value = None

        def body() -> Value:
            self._take_off_if_landed()
            return plan.feed(text, final).value

        result = run_timed(body, lambda: self._last_value)
        if final or not result.success:
            del self._plans[request_id]
        return result

    def _take_off_if_landed(self) -> None:
        if self.auto_takeoff and not self.tello.is_flying:
            self.dispatch("takeoff", [])

    def dispatch(self, name: str, args: Sequence[Value]) -> Value:
        """Carry out one skill; SkillFailed with the reason if it cannot. Its value is the segment's last value
        until another call returns (what the robot reports for a segment ending in a blocking call)."""
        self._last_value = self._carry_out(name, args)
        return self._last_value

    def _carry_out(self, name: str, args: Sequence[Value]) -> Value:
        if name in _MOTIONS:
            self._command(name, getattr(self.tello, _MOTIONS[name]), round(number_arg(name, args)))
            return None
        if name in _PERCEPTIONS:
            return self.vision(_PERCEPTIONS[name], args)
        handlers: dict[str, Callable[[Sequence[Value]], Value]] = {
            "takeoff": lambda _: self._command("takeoff", self.tello.takeoff),
            "land": lambda _: self._command("land", self.tello.land),
            "d": self._delay, "g": self._goto, "l": self._log, "rp": self._re_plan,
        }
        if name not in handlers:
            raise SkillFailed(f"unknown skill {name!r}")
        return handlers[name](args)

    def _command(self, name: str, method: Callable[..., None], *args: int) -> None:
        try:
            method(*args)
        except TelloException as exc:
            raise SkillFailed(f"{name}({', '.join(map(str, args))}) failed: {exc}") from exc

    def _delay(self, args: Sequence[Value]) -> None:
        time.sleep(number_arg("d", args, low=0) * self.time_scale)

    def _goto(self, args: Sequence[Value]) -> None:
        target = text_arg("g", args)
        if not self.vision("is_visible", [target]):
            raise SkillFailed(f"g({target!r}): {target} is not visible")
        distance = self.vision("object_distance", [target])
        if not isinstance(distance, int | float) or isinstance(distance, bool):
            raise SkillFailed(f"g({target!r}): no distance to {target}")
        if distance >= GOTO_RANGE_CM[0]:
            self._command("g", self.tello.move_forward, round(min(distance, GOTO_RANGE_CM[1])))

    def _log(self, args: Sequence[Value]) -> None:
        message = text_arg("l", args)
        self.log.append(message)
        LOGGER.info("drone %s: %s", self.address[0], message)

    def _re_plan(self, _: Sequence[Value]) -> None:
        raise SkillFailed("re-plan requested by the plan (rp)")


def tello_runner(tello: TelloExecutor) -> SegmentRunner:
    """Fly each segment's MiniSpec on a connected Tello, continuing the plan across segments."""
    return lambda segment, label: tello.execute_text(segment.text, segment.request_id, segment.final)
