"""The fleet file (``timely_llm/ros/fleet_file.py``): one-line errors naming the field, who matches which entry,
class bounds clamping a claimed TUF, and the quotas and log budget that hold under abuse (no ROS needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from timely_llm.core.tuf import DEFAULT_TUFS, TUF
from timely_llm.errors import ConfigError
from timely_llm.ros.fleet_file import DEFAULT_CLASSES, Quotas, load_fleet, open_fleet
from timely_llm.ros.goals import token_budget
from timely_llm.ros.quotas import AgentQuotas
from timely_llm.ros.throttle import ThrottledLog

FLEET = """
classes:
  rush: {max_beta: 3.0, max_slope: 10.0, min_ert: 0.1}
defaults: {in_flight: 2, rate: 1.0, burst: 2}
robots:
  - {id: drone_01, types: [tello], class: urgent, in_flight: 1, max_new_tokens: 64}
  - {id: "drone_*", types: tello}
  - {id: arm_01, types: ["arm", "tello"], class: rush}
  - {id: "*", types: "*", class: background}
"""


def fleet_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return str(path)


def test_an_agent_gets_its_own_entry_else_the_first_pattern_matching_it(tmp_path: Path) -> None:
    fleet = load_fleet(fleet_file(tmp_path, FLEET))
    assert fleet.entry("drone_01").quotas == Quotas(in_flight=1, rate=1.0, burst=2, max_new_tokens=64)
    assert fleet.entry("drone_07").priority.name == "normal" and fleet.entry("drone_07").quotas.in_flight == 2
    assert fleet.entry("arm_01").priority == DEFAULT_CLASSES["urgent"].__class__("rush", 3.0, 10.0, 0.1)
    assert fleet.entry("anyone").priority.name == "background"
    assert fleet.screen("drone_07", "arm") == "agent 'drone_07' may not ask for robot type 'arm' (its fleet entry " \
                                              "allows tello)"
    assert fleet.screen("arm_01", "tello") is None and fleet.named == ["arm_01", "drone_01"]
    strict = load_fleet(fleet_file(tmp_path, "robots: [{id: d1, types: tello}]"))
    assert strict.screen("d2", "tello") == "agent 'd2' is not in the fleet file"


@pytest.mark.parametrize(("text", "error"), [
    ("robots: []", "robots: expected a non-empty list"),
    ("robots: [{id: d1}]", "robots[0].types: expected a robot type"),
    ("robots: [{id: d-1, types: tello}]", "robots[0].id: agent id 'd-1' is not a ROS name token"),
    ("robots: [{id: d1, types: tello, class: vip}]", "robots[0].class: unknown class 'vip' (known: background, "
                                                     "normal, urgent)"),
    ("robots: [{id: d1, types: tello, in_flight: 0}]", "robots[0].in_flight: expected an integer >= 1, got 0"),
    ("robots: [{id: d1, types: tello, rate: -1}]", "robots[0].rate: requests per second must be > 0"),
    ("robots: [{id: d1, types: tello, speed: 1}]", "robots[0].speed: unknown field"),
    ("robots: [{id: d1, types: tello}, {id: d1, types: arm}]", "robots[1].id: 'd1' is listed twice"),
    ("classes: {vip: {max_beta: 0, max_slope: 1, min_ert: 0}}\nrobots: [{id: d1, types: tello}]",
     "classes.vip: max_beta must be > 0"),
    ("classes: {vip: {max_beta: 1, max_slope: 1}}\nrobots: [{id: d1, types: tello}]",
     "classes.vip.min_ert: expected a finite number, got None"),
    ("defaults: {burst: x}\nrobots: [{id: d1, types: tello}]", "defaults.burst: expected an integer >= 1"),
    ("fleet: []", "fleet: unknown field (known: classes, defaults, robots)"),
])
def test_a_malformed_fleet_file_is_refused_with_one_line_naming_the_field(tmp_path: Path, text: str,
                                                                           error: str) -> None:
    path = fleet_file(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_fleet(path)
    assert str(raised.value).startswith(f"{path}: {error}") and "\n" not in str(raised.value)


def test_unknown_robot_types_are_named_at_configure(tmp_path: Path) -> None:
    fleet = load_fleet(fleet_file(tmp_path, "robots: [{id: d1, types: [tello, boat]}]"))
    with pytest.raises(ConfigError, match=r"robots\[0\].types: unknown robot type 'boat' \(served: arm, tello\)"):
        fleet.check_types({"tello", "arm"})


def test_a_claim_above_its_class_is_clamped_and_the_defaults_of_the_class_pass_unchanged() -> None:
    urgent, normal = DEFAULT_CLASSES["urgent"], DEFAULT_CLASSES["normal"]
    assert urgent.clamp(DEFAULT_TUFS["urgent"]) == (DEFAULT_TUFS["urgent"], "")
    assert normal.clamp(DEFAULT_TUFS["normal"]) == (DEFAULT_TUFS["normal"], "")
    clamped, note = normal.clamp(TUF(0.0, -1e6, 1e6))
    assert clamped == DEFAULT_TUFS["normal"]
    assert note == "TUF clamped to class 'normal': ert 0 -> 1, alpha -1e+06 -> -2, beta 1e+06 -> 1"
    assert urgent.clamp(TUF(5.0, -0.5, 0.5)) == (TUF(5.0, -0.5, 0.5), "")  # less urgent than the class: as asked
    assert open_fleet().entry("anyone").priority == urgent  # no fleet file: the urgent bounds for every agent


def test_the_in_flight_quota_and_the_rate_refuse_with_the_reason_and_refill() -> None:
    held, clock = {"a": 0}, [0.0]
    quotas = AgentQuotas(lambda agent: held.get(agent, 0), now=lambda: clock[0])
    limits = Quotas(in_flight=2, rate=2.0, burst=3)
    assert [quotas.refusal("a", limits) for _ in range(3)] == [None] * 3
    assert quotas.refusal("a", limits) == "over quota: 'a' asks faster than its rate of 2 requests/s (burst 3)"
    assert quotas.refusal("b", limits) is None  # another agent's bucket is its own
    clock[0] = 0.5  # one token back
    held["a"] = 2
    assert quotas.refusal("a", limits) == "over quota: 2 requests of 'a' in flight (its in_flight quota is 2)"
    held["a"] = 1
    assert quotas.refusal("a", limits) is None and quotas.refusal("a", limits) is not None


def test_a_plans_token_budget_is_the_goals_within_the_nodes_cap_and_the_quota() -> None:
    assert token_budget(0, 512, 0) == 0  # the node's default
    assert token_budget(100_000, 512, 0) == 512
    assert token_budget(100, 512, 0) == 100
    assert token_budget(0, 512, 64) == 64 and token_budget(100, 512, 64) == 64


def test_the_log_budget_bounds_lines_whatever_ids_a_client_rotates() -> None:
    lines: list[str] = []
    clock = [0.0]
    log = ThrottledLog(lines.append, period_s=10.0, now=lambda: clock[0], budget=5)
    for i in range(2000):
        log.warn(f"fake_{i}", f"rejected goal from 'fake_{i}'")
    assert len(lines) == 5
    clock[0] = 10.0
    log.warn("real", "rejected goal from 'real'")
    assert lines[5:] == ["1995 more lines about clients' messages suppressed in the last 10 s (at most 5 per 10 s)",
                         "rejected goal from 'real'"]
