"""The execution check of a robot's SegmentDone (timely_llm/ros/reports.py) and where the node places the execution
on the server's clock (robot_reports.server_window): a stamped report by its stamp (the robot's clock), a report
with the zero stamp by its arrival, as before stamps. Pure: no ROS session (the interfaces must be built)."""

from __future__ import annotations

import math

import pytest
from builtin_interfaces.msg import Time as TimeMsg

from timely_llm.ros.interfaces import SegmentDone
from timely_llm.ros.messages import duration_msg
from timely_llm.ros.reports import REPORT_SLACK_S, Instant, ReportBook, ReportRefused, clock_speed
from timely_llm.ros.robot_reports import server_window

DISPATCHED = Instant(node=1000.0, server=50.0)
"""Segment 0's dispatch: node clock 1000 s (ROS time), server clock 50 s."""


def _book() -> ReportBook:
    book = ReportBook(factor=2.0, margin=5.0)
    book.open("r1", "tello_1")
    book.dispatched("r1", 0, 3.0, DISPATCHED, est_end=0.0)
    return book


def _report(duration: float, stamp: float | None = None) -> SegmentDone:
    ended = TimeMsg() if stamp is None else TimeMsg(sec=int(stamp), nanosec=round(stamp % 1 * 1e9))
    return SegmentDone(stamp=ended, agent_id="tello_1", request_id="r1", index=0, duration=duration_msg(duration),
                       success=True)


def test_a_stamped_report_places_its_execution_by_the_stamp_not_its_arrival() -> None:
    """Executed from 1001 to 1004 on the robot's clock, arriving at 1010 (6 s of network and queueing)."""
    arrived = Instant(node=1010.0, server=60.0)
    executed = _book().take(_report(3.0, stamp=1004.0), arrived)
    assert (executed.dispatched, executed.duration, executed.ended) == (DISPATCHED, 3.0, 1004.0)
    duration, ended_ago = server_window(executed, arrived)
    assert duration == pytest.approx(3.0) and ended_ago == pytest.approx(6.0)


def test_a_stamped_report_in_sim_time_scales_to_the_servers_seconds() -> None:
    """The node on a 5x /clock: 10 node seconds since the dispatch took 2 server seconds."""
    arrived = Instant(node=1010.0, server=52.0)
    duration, ended_ago = server_window(_book().take(_report(5.0, stamp=1008.0), arrived), arrived)
    assert duration == pytest.approx(1.0) and ended_ago == pytest.approx(0.4)


def test_a_stamp_slightly_ahead_of_the_nodes_clock_ends_at_the_arrival() -> None:
    arrived = Instant(node=1010.0, server=60.0)
    executed = _book().take(_report(2.0, stamp=1010.0 + REPORT_SLACK_S / 2), arrived)
    assert server_window(executed, arrived)[1] == 0.0


def test_the_zero_stamp_falls_back_to_the_arrival() -> None:
    """No stamp: the duration must fit in the time since the dispatch, and the execution ended network_latency
    before the arrival (ended_ago None tells the server loop so)."""
    arrived = Instant(node=1004.0, server=54.0)
    executed = _book().take(_report(3.5), arrived)
    assert executed.ended is None and server_window(executed, arrived) == (pytest.approx(3.5), None)
    with pytest.raises(ReportRefused, match=r"duration 5.5 s exceeds the 4.000 s since its dispatch"):
        _book().take(_report(5.5), arrived)


@pytest.mark.parametrize(("duration", "stamp", "reason"), [
    (1.0, 1012.0, "stamp 1012.000 s is ahead of the node's clock (1010.000 s)"),
    (3.0, 1001.5, "execution from 998.500 s (stamp minus duration) starts before its dispatch at 1000.000 s"),
    (0.5, 1.0, "starts before its dispatch"),  # a wall-clock robot's stamp would be far ahead; a small one behind
    (-0.5, 1005.0, "duration -0.5 s is negative"),
])
def test_a_stamped_execution_outside_dispatch_to_arrival_is_refused(duration: float, stamp: float,
                                                                    reason: str) -> None:
    book = _book()
    with pytest.raises(ReportRefused) as refused:
        book.take(_report(duration, stamp), Instant(node=1010.0, server=60.0))
    assert reason in str(refused.value) and "\n" not in str(refused.value)
    book.take(_report(1.0, 1005.0), Instant(node=1010.0, server=60.0))  # nothing changed: a good one still counts


def test_on_a_fast_sim_clock_the_slack_is_wall_seconds_at_the_clocks_speed() -> None:
    """A 5x /clock: 10 node seconds since the dispatch took 2 server seconds. Each node's sim clock lags /clock by its
    own delivery delay, so a robot's stamp 0.4 wall seconds behind the node's (2 simulated seconds) is skew, not a
    made-up execution; 1.5 wall seconds behind is refused as at real time."""
    fast = Instant(node=1010.0, server=52.0)
    executed = _book().take(_report(3.0, stamp=1001.0), fast)  # from 998: 2 s before the dispatch
    assert (executed.duration, executed.ended) == (3.0, 1001.0)
    assert _book().take(_report(12.0), fast).duration == 12.0  # unstamped: 2 s over the 10 s since the dispatch
    with pytest.raises(ReportRefused, match="starts before its dispatch"):
        _book().take(_report(3.0, stamp=997.5), fast)  # from 994.5: 5.5 s before
    with pytest.raises(ReportRefused, match="starts before its dispatch"):
        _book().take(_report(3.0, stamp=1001.0), Instant(node=1010.0, server=60.0))  # the same report at 1x


@pytest.mark.parametrize(("now", "speed"), [
    (Instant(node=1010.0, server=52.0), 5.0),  # a 5x sim clock
    (Instant(node=1001.0, server=54.0), 0.25),  # a slow one
    (Instant(node=1000.0, server=55.0), None),  # a paused one: the node's clock did not advance
    (Instant(node=1003.0, server=50.0), math.inf),  # only the node's clock advanced
])
def test_the_clock_speed_is_node_seconds_per_server_second(now: Instant, speed: float | None) -> None:
    assert clock_speed(DISPATCHED, now) == speed


def test_when_the_clock_speed_is_unknown_a_duration_keeps_its_seconds() -> None:
    """A paused sim clock gives no speed to scale by: the reported duration is taken as server seconds."""
    arrived = Instant(node=1000.0, server=53.0)
    executed = _book().take(_report(0.5, stamp=1000.5), arrived)
    assert server_window(executed, arrived) == (pytest.approx(0.5), 0.0)


def test_out_of_range_nanoseconds_are_refused() -> None:
    report = _report(1.0, 1005.0)
    report.stamp.nanosec = 1_500_000_000
    with pytest.raises(ReportRefused, match="stamp nanosec 1500000000 is not below 1e9"):
        _book().take(report, Instant(node=1010.0, server=60.0))
    report = _report(1.0)
    report.duration.nanosec = 1_000_000_000
    with pytest.raises(ReportRefused, match="duration nanosec 1000000000 is not below 1e9"):
        _book().take(report, Instant(node=1010.0, server=60.0))
