"""The one loop (``serving.Driver``): until no action is left in the benchmarks, until stopped on the node's thread,
where actions come from other threads and one failing action or step does not stop it."""

from __future__ import annotations

import threading

import pytest
from guards import wait_until

from timely_llm.clock import VirtualClock, WallClock
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.server import Server
from timely_llm.serving import Driver, ServerConfig, build_server

SKILLS = load_skill_models()


def new_server(clock: VirtualClock | WallClock) -> Server:
    engine = SimEngine(load_profile("rtx4090-llama3-8b"))
    return build_server(ServerConfig("timelyllm", network_latency=0.0), engine, SKILLS, clock)


def test_without_a_stop_flag_the_run_ends_when_no_action_is_left() -> None:
    clock = VirtualClock()
    driver, seen = Driver(clock), []
    driver.at(5.0, lambda server: seen.append(clock.now()))
    driver.run(new_server(clock))
    assert seen == [5.0] and clock.now() == 5.0


def test_with_a_stop_flag_it_runs_what_other_threads_send_until_stopped() -> None:
    clock = WallClock()
    errors: list[tuple[str, Exception]] = []
    driver, applied = Driver(clock, on_error=lambda what, exc: errors.append((what, exc))), []
    stop = threading.Event()
    stop.set()
    loop = threading.Thread(target=driver.run, args=(new_server(clock), stop))
    loop.start()
    driver.send(lambda server: 1 / 0)  # a failing command is told and the loop goes on
    driver.send(lambda server: applied.append("first"))
    wait_until(lambda: applied == ["first"], 10.0, "the command sent from this thread")
    assert loop.is_alive() and [(what, type(exc)) for what, exc in errors] == [("action", ZeroDivisionError)]
    driver.send(lambda server: applied.append("last"))
    stop.clear()  # what was sent before is applied before the loop ends
    loop.join(10.0)
    assert not loop.is_alive() and applied == ["first", "last"]


def test_without_on_error_a_failing_action_ends_the_run() -> None:
    clock = VirtualClock()
    driver = Driver(clock)
    driver.at(1.0, lambda server: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        driver.run(new_server(clock))
