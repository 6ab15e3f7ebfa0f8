"""What a ``RequestPlan`` goal or a ``TaskRequest`` (same field names) must satisfy before the node accepts it,
and the request it becomes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from timely_llm_interfaces.fields import oversized
from timely_llm_interfaces.names import MAX_ID_CHARS, agent_id_error

from timely_llm.core.tuf import TUF
from timely_llm.engines.base import DEFAULT_MAX_NEW_TOKENS
from timely_llm.errors import RequestRejected
from timely_llm.plan.skills import SkillModel
from timely_llm.ros.fleet_file import Fleet, FleetEntry, open_fleet
from timely_llm.ros.interfaces import RequestPlan, TaskRequest
from timely_llm.ros.messages import FieldError, duration_seconds, overrun_name
from timely_llm.server import PlanRequest
from timely_llm.traces import Trace, TraceCatalog

MAX_ERT_S = 3600.0
MAX_TUF_SLOPE = 1e6
MAX_TUF_BETA = 1e6

Goal: TypeAlias = RequestPlan.Goal | TaskRequest
"""A request from either interface: the action's goal or the topic's message."""


@dataclass(frozen=True)
class GoalRules:
    """What a goal is checked against before it is accepted."""

    robots: Mapping[str, SkillModel]
    """The robot types served; a goal's prompt is its robot's (built from the skill-model file)."""
    catalog: TraceCatalog
    encode: Callable[[str], list[int]]
    max_prompt_tokens: int
    default_tufs: dict[str, TUF]
    trace_required: bool
    max_task_chars: int = 2000
    fleet: Fleet = field(default_factory=open_fleet)
    """Who may ask, for which robot types, in which priority class, with which quotas (``fleet_file``)."""
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    """The node's cap on a plan's tokens: a goal's own ``max_new_tokens`` may ask for less, never more."""


def screen(goal: Goal, rules: GoalRules) -> FleetEntry:
    """The fleet entry of the goal's agent; RequestRejected if a string is over its bound, the agent id is
    malformed, the fleet file does not name the agent or it may not ask for the goal's robot type. Cheap: checked
    before anything else."""
    too_long = oversized(goal)
    if too_long:
        raise RequestRejected(too_long)
    unnamed = agent_id_error(goal.agent_id)
    if unnamed:
        raise RequestRejected(unnamed)
    refused = rules.fleet.screen(goal.agent_id, goal.robot_type[:MAX_ID_CHARS])
    if refused:
        raise RequestRejected(refused)
    entry = rules.fleet.entry(goal.agent_id)
    assert entry is not None  # screened
    return entry


def plan_from_goal(goal: Goal, request_id: str, rules: GoalRules, notes: list[str] | None = None) -> PlanRequest:
    """The PlanRequest for a goal; RequestRejected says why a malformed goal cannot be served. Its TUF is
    clamped to its agent's priority class and its max_new_tokens to the node's and its quota's; ``notes`` gets a
    line saying what was clamped."""
    entry = screen(goal, rules)
    if not goal.task.strip():
        raise RequestRejected("empty task")
    if len(goal.task) > rules.max_task_chars:
        raise RequestRejected(f"task of {len(goal.task)} characters exceeds max_task_chars {rules.max_task_chars}")
    if goal.robot_type not in rules.robots:
        raise RequestRejected(f"unknown robot type {goal.robot_type[:MAX_ID_CHARS]!r} "
                              f"(known: {', '.join(sorted(rules.robots))})")
    if goal.no_execution_reports and rules.robots[goal.robot_type].has_blocking:
        raise RequestRejected(f"no_execution_reports: robot type {goal.robot_type!r} has blocking skills, whose "
                              f"values only execution reports can bring")
    trace = _goal_trace(goal, rules)
    category = trace.category if trace else ("arm" if goal.robot_type == "arm" else "normal")
    tuf, clamped = entry.priority.clamp(_goal_tuf(goal, category, rules))
    if clamped and notes is not None:
        notes.append(clamped)
    prompt_ids = rules.encode(rules.robots[goal.robot_type].prompt_text(goal.task))
    if len(prompt_ids) > rules.max_prompt_tokens:
        raise RequestRejected(f"prompt of {len(prompt_ids)} tokens exceeds max_prompt_tokens {rules.max_prompt_tokens}")
    return PlanRequest(request_id, goal.agent_id, goal.robot_type, prompt_ids, tuf, category,
                       token_budget(goal.max_new_tokens, rules.max_new_tokens, entry.quotas.max_new_tokens),
                       forced_ids=rules.encode(trace.plan) if trace else None, trace=trace.id if trace else None,
                       keep_if_infeasible=goal.keep_if_infeasible, overrun=_goal_overrun(goal))


def token_budget(asked: int, node_cap: int, quota: int) -> int:
    """A plan's max_new_tokens: what the goal asks (0: the node's default) within the node's cap and the
    agent's quota (0: none); 0 where that is the node's default."""
    cap = min(node_cap, quota) if quota else node_cap
    if asked <= 0:
        return cap if cap < node_cap else 0
    return min(asked, cap)


def _goal_overrun(goal: Goal) -> str:
    try:
        return overrun_name(goal.overrun_strategy)
    except FieldError as exc:
        raise RequestRejected(str(exc)) from None


def _goal_trace(goal: Goal, rules: GoalRules) -> Trace | None:
    if goal.trace_id < 0 or (goal.trace_id == 0 and rules.trace_required):
        raise RequestRejected(f"trace_id {goal.trace_id} invalid: the sim engine replays LRTrace plans (trace_id > 0)")
    if goal.trace_id == 0:
        return None
    if goal.trace_id not in rules.catalog.traces:
        raise RequestRejected(f"unknown trace_id {goal.trace_id}")
    trace = rules.catalog[goal.trace_id]
    if trace.robot != goal.robot_type:
        raise RequestRejected(f"trace {trace.id} is for robot {trace.robot!r}, not {goal.robot_type!r}")
    return trace


def _goal_tuf(goal: Goal, category: str, rules: GoalRules) -> TUF:
    try:
        ert = duration_seconds(goal.tuf_ert, "tuf_ert")
        if ert == goal.tuf_alpha == goal.tuf_beta == 0.0:
            return rules.default_tufs[category]
        tuf = TUF(ert, goal.tuf_alpha, goal.tuf_beta)
    except ValueError as exc:  # FieldError included
        raise RequestRejected(str(exc)) from exc
    if tuf.ert > MAX_ERT_S:
        raise RequestRejected(f"TUF ert {tuf.ert} s exceeds {MAX_ERT_S} s")
    if -tuf.alpha > MAX_TUF_SLOPE:
        raise RequestRejected(f"TUF alpha {tuf.alpha} is steeper than -{MAX_TUF_SLOPE}")
    if tuf.beta > MAX_TUF_BETA:
        raise RequestRejected(f"TUF beta {tuf.beta} exceeds {MAX_TUF_BETA}")
    return tuf
