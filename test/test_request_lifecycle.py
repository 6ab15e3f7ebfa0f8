"""The request state machine (core/request.py) and the server keeping status and place together."""

from __future__ import annotations

import pytest

from timely_llm.clock import VirtualClock
from timely_llm.core.policies import POLICIES
from timely_llm.core.request import ENDED, TRANSITIONS, IllegalTransition, Request, Status
from timely_llm.core.tuf import NORMAL_TUF
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.server import PlanRequest, Server
from timely_llm.serving import Driver, ServerConfig, build_server
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.harness import SimulatedRobots

SKILLS = load_skill_models()
CATALOG = load_catalog()
LATENCY = 0.008


def bare_request(rid: str = "r") -> Request:
    return Request(rid, "agent", SKILLS["tello"], NORMAL_TUF, 0.0, [1, 2, 3], 64)


def test_only_the_drawn_transitions_are_allowed() -> None:
    for came_from in Status:
        for to in Status:
            request = bare_request()
            request.path[:] = [came_from]  # put it there directly, to try every edge
            if to in TRANSITIONS[came_from]:
                assert request.advance(to) is came_from and request.status is to
            else:
                with pytest.raises(IllegalTransition):
                    request.advance(to)
                assert request.status is came_from  # a refused move changes nothing


def test_ended_statuses_are_final_and_every_live_one_can_be_canceled() -> None:
    assert all(not TRANSITIONS[s] for s in ENDED)
    live = [s for s in Status if not s.ended]
    assert all({Status.ABORTED, Status.CANCELED} <= TRANSITIONS[s] for s in live)
    assert [s for s in Status if Status.SUCCEEDED in TRANSITIONS[s]] == [Status.GENERATED]


def test_status_cannot_be_set_around_the_state_machine() -> None:
    request = bare_request()
    with pytest.raises(AttributeError):
        request.status = Status.SUCCEEDED  # type: ignore[misc]


def new_server(policy: str, max_batch: int | None = None) -> tuple[Server, Driver, SimEngine, list[Request]]:
    engine = SimEngine(load_profile("rtx4090-llama3-8b"))
    clock = VirtualClock()
    ended: list[Request] = []
    driver = Driver(clock)
    robots = SimulatedRobots(SKILLS, LATENCY, 0, driver.at)
    server = build_server(ServerConfig(policy, LATENCY, max_batch=max_batch), engine, SKILLS, clock,
                          on_segment=robots.on_segment, on_finish=ended.append)
    return server, driver, engine, ended


def plan(engine: SimEngine, rid: str, trace_id: int, arrival: float = 0.0) -> PlanRequest:
    trace = CATALOG[trace_id]
    tok = engine.tokenizer
    return PlanRequest(rid, rid, trace.robot, tok.encode(CATALOG.prompt_text(trace.robot, trace.prompt)),
                       NORMAL_TUF, forced_ids=tok.encode(trace.plan), trace=trace_id, arrival=arrival)


def multi_segment_traces() -> list[int]:
    return [t for t in sorted(CATALOG.traces) if CATALOG[t].plan.count(";") > 2][:6]


@pytest.mark.parametrize("policy", ["timelyllm", "vllm"])
def test_every_request_walks_the_diagram_and_leaves_nothing_behind(policy: str) -> None:
    server, driver, engine, ended = new_server(policy)
    traces = multi_segment_traces()
    for i, trace_id in enumerate(traces):
        p = plan(engine, f"r{i}", trace_id, arrival=0.05 * i)
        driver.arrive(p)
    driver.run(server)
    assert sorted(r.id for r in ended) == sorted(f"r{i}" for i in range(len(traces)))
    for request in ended:
        assert all(b in TRANSITIONS[a] for a, b in zip(request.path, request.path[1:], strict=False)), request.path
        assert request.path[-2:] == [Status.GENERATED, Status.SUCCEEDED]
        assert (Status.PARKED in request.path) == POLICIES[policy].segmented
    assert not server.running and len(server.queue) == 0 and not engine.running_ids()
    for request in ended:
        with pytest.raises(KeyError):  # the engine holds nothing for an ended request
            engine.release(request.id)


@pytest.mark.parametrize("stop_in", [s for s in Status if not s.ended])
def test_cancel_in_any_live_status_frees_queue_batch_and_engine(stop_in: Status) -> None:
    server, _, engine, ended = new_server("timelyllm", max_batch=2)
    requests = [server.submit(plan(engine, f"c{i}", t)) for i, t in enumerate(multi_segment_traces())]
    requests.append(server.submit(blocking_plan(engine, "look")))
    for _ in range(10_000):  # robot reports are not delivered, so GENERATED and BLOCKED last
        target = next((r for r in requests if r.status is stop_in), None)
        if target is not None:
            break
        server.step()
    assert target is not None, f"no request reached {stop_in}"
    assert server.cancel(target.id, "test")
    assert target.status is Status.CANCELED and target.reason == "test" and ended == [target]
    assert target.id not in server.running and target.id not in server.parked and target.id not in server.queue
    assert target.id not in server.scheduler.blocked
    with pytest.raises(KeyError):
        engine.release(target.id)
    assert not server.cancel(target.id)  # a second cancel finds nothing live and changes nothing
    assert ended == [target]
    for _ in range(10_000):  # the others are unaffected: they all get their plans generated
        if not server.step():
            break
    for request in requests:  # a plan waiting for a value (the arm's scan, "look") waits on: none comes
        if request is not target:
            assert request.status is (Status.BLOCKED if request.robot.has_blocking else Status.GENERATED)


def blocking_plan(engine: SimEngine, rid: str) -> PlanRequest:
    """A mobile base's plan whose second segment waits for the value of look_for."""
    tok = engine.tokenizer
    prompt = tok.encode(SKILLS["mobile_base"].prompt_text("Scene: [kitchen, cup], Task: find the cup."))
    return PlanRequest(rid, rid, "mobile_base", prompt, NORMAL_TUF,
                       forced_ids=tok.encode("go_to('kitchen');look_for('cup');say('Found it.');"))


def test_a_queue_row_is_updated_in_place() -> None:
    server, _, engine, _ = new_server("timelyllm")
    a = server.submit(plan(engine, "a", multi_segment_traces()[0]))
    b = server.submit(plan(engine, "b", multi_segment_traces()[1]))
    order = list(server.queue)
    a.arrival = 42.0  # the first segment's TUF counts from the arrival
    server.queue.update(a)
    assert list(server.queue) == order and len(server.queue) == 2
    assert server.queue._columns.column("origin")[order.index(a)] == 42.0
    assert b in list(server.queue)


def test_the_docstring_diagram_names_every_status_and_its_place() -> None:
    import timely_llm.core.request as module

    diagram, places = module.__doc__.split("Where each status lives")
    assert all(s.name in diagram for s in Status if not s.ended or s is Status.SUCCEEDED)
    assert "CANCELED | ABORTED" in diagram
    assert all(s.name in places for s in Status if not s.ended)


def test_a_start_the_engine_refuses_ends_that_request_and_the_next_one_runs() -> None:
    server, driver, engine, ended = new_server("timelyllm")
    refused = PlanRequest("refused", "a1", "tello", engine.tokenizer.encode("fly up"), NORMAL_TUF, arrival=0.0,
                          constrained=False)  # no recorded plan: the simulator refuses to start it
    driver.arrive(refused)
    driver.arrive(plan(engine, "served", multi_segment_traces()[0]))
    driver.run(server)
    outcome = {r.id: r for r in ended}
    assert outcome["refused"].status is Status.ABORTED
    assert outcome["refused"].reason.startswith("engine rejected the request")
    assert outcome["served"].status is Status.SUCCEEDED
    assert not server.requests and not server.running and not engine.running_ids()
