"""Closed-loop plans: blocking skills in the robot file, and the waiting queue on the simulator (a segment
ending in a blocking call is dispatched, the generation waits for the robot's value, the value is written
into its context as forced tokens and it resumes from there)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from timely_llm.clock import VirtualClock
from timely_llm.core.request import Outcome, Request, Segment, Status
from timely_llm.core.tuf import NORMAL_TUF, URGENT_TUF
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.errors import ConfigError
from timely_llm.plan.robot_file import load_skill_model, load_skill_models
from timely_llm.server import PlanRequest, Server
from timely_llm.serving import Driver, ServerConfig, build_server

SKILLS = load_skill_models()
MOBILE = SKILLS["mobile_base"]
LATENCY = 0.008
PLAN = "go_to('kitchen');look_for('cup');say('I found the cup.');go_to('dock');"
VALUE = "on the counter, next to the sink"


# ----- the robot file -----

def robot_file(tmp_path: Path, **changes: object) -> Path:
    """mobile_base.yaml with top-level ``changes`` and look_for's fields replaced by ``look_for`` (a dict)."""
    data = yaml.safe_load(Path(MOBILE.source).read_text())
    look_for = next(s for s in data["skills"] if s["abbr"] == "look_for")
    look_for.update(changes.pop("look_for", {}))  # type: ignore[arg-type]
    data.update(changes)
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"look_for": {"blocking": "yes"}}, "skills[2].blocking", "must be true or false"),
    ({"look_for": {"returns": None}}, "skills[2].blocking", "needs returns"),
    ({"language": "sentence"}, "skills", "only minispec and calls plans"),
    ({"observation": {"form": " # the answer\n"}}, "observation.form", "holding {value} exactly once"),
    ({"observation": {"form": " # {value}\nnext: "}}, "observation.form", "one line"),
    ({"observation": {"form": " # {value}"}}, "observation.form", "text after {value}"),
    ({"observation": {"max_tokens": 0}}, "observation.max_tokens", "positive integer"),
    ({"observation": {"shape": "x"}}, "observation.shape", "unknown field"),
    ({"observation": "# {value}"}, "observation", "expected a mapping"),
])
def test_blocking_and_observation_fields_are_checked_with_one_line_errors(
        tmp_path: Path, changes: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_skill_model(robot_file(tmp_path, **changes))
    message = str(caught.value)
    assert f": {field}: " in message and words in message and "\n" not in message


def test_a_worked_example_may_show_observations_only_after_blocking_calls(tmp_path: Path) -> None:
    data = yaml.safe_load(Path(MOBILE.source).read_text())
    data["prompt"]["examples"][0]["plan"] = "go_to('kitchen'); # in the kitchen\nsay('Here.');"
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"prompt\.examples\[0\]\.plan: observation ' # in the kitchen\\n' does "
                                          r"not follow a blocking call"):
        load_skill_model(path)


def test_the_prompt_shows_how_a_value_comes_back_in_the_robots_form(tmp_path: Path) -> None:
    assert "The plan waits after a call to look_for" in MOBILE.system_prompt
    assert "look_for('alice'); # by the coat rack" in MOBILE.system_prompt  # a worked example shows one
    prompt = yaml.safe_load(Path(MOBILE.source).read_text())["prompt"]
    for example in prompt["examples"]:
        example["plan"] = example["plan"].replace(" # not found\n", " => look_for says not found;")
    prompt["examples"] = prompt["examples"][:1]
    custom = load_skill_model(robot_file(tmp_path, observation={"form": " => {skill} says {value};"}, prompt=prompt))
    assert "look_for('open_fridge_door'); => look_for says not found;say(" in custom.system_prompt
    assert 'as in "look_for(...); => look_for says VALUE;"' in custom.system_prompt
    assert custom.observation.text("look_for", "on the\n  table") == " => look_for says on the table;"
    prompt["examples"] = yaml.safe_load(Path(MOBILE.source).read_text())["prompt"]["examples"][2:]
    never = load_skill_model(robot_file(tmp_path, look_for={"blocking": False}, prompt=prompt))
    assert "The plan waits" not in never.system_prompt  # no blocking skill: the prompt is as it was
    assert not any(s.blocking for s in SKILLS["arm"].skills.values()) or "waits" in SKILLS["arm"].system_prompt


def test_a_segment_waits_only_when_it_ends_in_a_blocking_call() -> None:
    assert MOBILE.blocking_call("look_for('cup');").args == ("cup",)
    assert MOBILE.blocking_call("go_to('kitchen');") is None
    assert MOBILE.blocking_call("say('look_for(cup);');") is None  # a call inside a quote is no call


# ----- the waiting queue on the simulator -----

class Robots:
    """Robots that take ``exec_s`` per segment and answer a blocking call with ``values[request]`` (None: report
    without a value; missing: never report that segment), recording what the server had generated then."""

    def __init__(self, driver: Driver, values: dict[str, str | None], exec_s: float = 2.0) -> None:
        self.driver, self.values, self.exec_s = driver, values, exec_s
        self.reported_at: dict[tuple[str, int], float] = {}
        self.text_at_report: dict[str, str] = {}
        self.status_after_report: dict[str, Status] = {}
        self.origin_after_report: dict[str, float] = {}

    def on_segment(self, request: Request, segment: Segment) -> None:
        start = segment.gen_end + LATENCY
        end = start + self.exec_s
        if segment.waits_for is not None and request.id not in self.values:
            return  # a robot that never answers
        value = self.values.get(request.id) if segment.waits_for is not None else None

        def report(server: Server) -> None:
            self.reported_at[(request.id, segment.index)] = server.clock.now()
            if segment.waits_for is not None:
                self.text_at_report[request.id] = server.engine.tokenizer.decode(request.output_ids)
            server.segment_done(request.id, segment.index, start, end, result=value)
            if segment.waits_for is not None:
                self.status_after_report[request.id] = request.status
                self.origin_after_report[request.id] = request.segment_tuf(request.seg_index)[0]

        self.driver.at(end + LATENCY, report)


Served = tuple[Server, SimEngine, "Robots", dict[str, Outcome]]


def serve(plans: list[tuple[str, str, str]], values: dict[str, str | None], in_place: bool = False,
          until: float | None = None, policy: str = "timelyllm") -> Served:
    """Serve ``(id, robot, plan)`` requests on the simulator, robots answering with ``values``."""
    engine = SimEngine(load_profile("rtx4090-llama3-8b"), suspends_in_place=in_place)
    clock = VirtualClock()
    driver = Driver(clock)
    robots = Robots(driver, values)
    ended: dict[str, Outcome] = {}
    server = build_server(ServerConfig(policy, LATENCY), engine, SKILLS, clock, on_segment=robots.on_segment,
                          on_finish=lambda r: ended.__setitem__(r.id, Outcome.of(r)))
    tok = engine.tokenizer
    for i, (rid, robot, plan) in enumerate(plans):
        prompt = tok.encode(SKILLS[robot].prompt_text(f"Scene: [kitchen, cup, dock], Task: task {i}"))
        tuf = URGENT_TUF if i == 0 else NORMAL_TUF
        driver.arrive(PlanRequest(rid, rid, robot, prompt, tuf, forced_ids=tok.encode(plan), arrival=0.01 * i))
    if until is not None:
        driver.at(until, lambda s: None)
    driver.run(server)
    return server, engine, robots, ended


@pytest.mark.parametrize(("in_place", "policy"), [(False, "timelyllm"), (True, "timelyllm"), (True, "vllm-stream")])
def test_the_next_segment_is_generated_after_the_report_from_the_observation(in_place: bool, policy: str) -> None:
    server, engine, robots, ended = serve([("r", "mobile_base", PLAN)], {"r": VALUE}, in_place, policy=policy)
    outcome = ended["r"]
    assert outcome.status is Status.SUCCEEDED, outcome.reason
    assert [s.text for s in outcome.segments] == ["go_to('kitchen');", "look_for('cup');", "say('I found the cup.');",
                                                  "go_to('dock');"]
    # nothing past the blocking call was generated before the robot's report, and the segment after it
    # started generating only once the report was in
    assert robots.text_at_report["r"].endswith("look_for('cup');")
    assert outcome.segments[2].gen_start >= robots.reported_at[("r", 1)]
    # the plan text shows the value where it came in; the robot was sent only the plan's own statements
    observation = f" # {VALUE}\n"
    assert outcome.plan == f"go_to('kitchen');look_for('cup');{observation}say('I found the cup.');go_to('dock');"
    assert outcome.segments[1].observation == observation and outcome.segments[1].waits_for.name == "look_for"
    assert outcome.output_tokens == len(engine.tokenizer.encode(PLAN))  # observations are not generated tokens
    # by the engine's cache report, the resume prefilled the observation and the call's last token where the
    # KV was kept in place, else at most the engine's partial block more
    prefill, observed = outcome.segments[1].resume_prefill, len(engine.tokenizer.encode_continuation(observation))
    if in_place:
        assert prefill == observed + 1
    else:
        assert observed < prefill <= observed + engine.block_size
    assert server.counters["preemptions"] == 0


def test_the_next_segment_counts_its_deadline_from_the_report() -> None:
    server, _, robots, ended = serve([("r", "mobile_base", PLAN)], {"r": VALUE})
    # queued again at the report, its next segment's TUF counted from the robot's report (it waits, idle)
    assert robots.origin_after_report["r"] == ended["r"].segments[1].exec_end
    assert robots.status_after_report["r"] is Status.SUSPENDED


def test_a_report_without_the_value_ends_the_plan_naming_the_skill() -> None:
    _, _, _, ended = serve([("r", "mobile_base", PLAN)], {"r": None})
    outcome = ended["r"]
    assert outcome.status is Status.ABORTED
    assert outcome.reason == ("robot reported segment 1 without a value (its plan was waiting for the value of "
                              "look_for('cup'))")
    assert len(outcome.segments) == 2  # nothing after the blocking call was sent


def test_a_value_too_long_ends_the_plan_naming_the_skill() -> None:
    limit = MOBILE.observation.max_tokens
    _, _, _, ended = serve([("r", "mobile_base", PLAN)], {"r": "word " * (limit + 1)})
    outcome = ended["r"]
    assert outcome.status is Status.ABORTED
    assert "look_for('cup')" in outcome.reason and f"more than the {limit}" in outcome.reason
    assert len(outcome.segments) == 2


def test_a_flood_of_a_value_is_refused_before_it_is_tokenized() -> None:
    _, _, _, ended = serve([("r", "mobile_base", PLAN)], {"r": "x" * 10_000_000})
    outcome = ended["r"]
    assert outcome.status is Status.ABORTED
    assert "10000000 characters" in outcome.reason and "look_for('cup')" in outcome.reason


def test_a_robot_that_never_answers_is_ended_by_the_watchdog_and_the_others_go_on() -> None:
    arm_plan = "scan('cup');goto('cup');pick('cup');goto('shelf');drop('shelf');"
    plans = [("silent", "mobile_base", PLAN), ("other", "mobile_base", PLAN), ("arm", "arm", arm_plan)]
    answers = {"other": VALUE, "arm": "true"}  # the arm waits for its scan too
    alone = serve(plans[1:], answers)[3]
    server, _, _, ended = serve(plans, answers, until=60.0)
    assert set(ended) == {"other", "arm"}  # the silent robot's goal waits, holding nothing back
    assert server.requests["silent"].status is Status.BLOCKED
    for rid in ("other", "arm"):
        assert ended[rid].status is Status.SUCCEEDED
        assert ended[rid].plan == alone[rid].plan
    assert server.abort("silent", "robot silent for 10.0 s (watchdog)")  # as the node's watchdog does
    reason = ended["silent"].reason
    assert ended["silent"].status is Status.ABORTED
    assert reason == "robot silent for 10.0 s (watchdog) (its plan was waiting for the value of look_for('cup'))"
    assert not server.scheduler.blocked and not server.requests


def test_a_value_reported_before_the_engine_suspended_the_generation_resumes_it_in_order() -> None:
    engine = SimEngine(load_profile("rtx4090-llama3-8b"), suspends_in_place=True)
    ended: dict[str, Outcome] = {}
    server = build_server(ServerConfig("timelyllm", LATENCY), engine, SKILLS, VirtualClock(),
                          on_finish=lambda r: ended.__setitem__(r.id, Outcome.of(r)))
    tok = engine.tokenizer
    request = server.submit(PlanRequest("r", "r", "mobile_base", tok.encode(MOBILE.prompt_text("find the cup")),
                                        NORMAL_TUF, forced_ids=tok.encode(PLAN)))
    while request.status is not Status.BLOCKED:
        server.step()
    assert "r" in engine.running_ids()  # suspended only at the next scheduling point
    for segment in request.segments:  # the robot answers at once, before any scheduling point
        server.segment_done("r", segment.index, 0.0, 0.0, result=VALUE)
    assert request.status is Status.SUSPENDED
    while request.status is not Status.GENERATED:
        server.step()
    for segment in request.segments:
        server.segment_done("r", segment.index, 0.0, 0.0)
    assert ended["r"].status is Status.SUCCEEDED
    assert ended["r"].plan == f"go_to('kitchen');look_for('cup'); # {VALUE}\nsay('I found the cup.');go_to('dock');"
