"""Closed-loop benchmark: the node's waiting queue against what a user would build otherwise.

Three ways to serve the closed-loop workload (``timely_llm_bench.workloads.closed_loop``) on one engine:

* ``waiting-queue``: the node; a segment ending in a blocking call waits, its KV kept (in place, or in the
  prefix cache), and resumes from the robot's value written into its context;
* ``resend``: ReAct-style, on the same node and policy: each step (the plan up to and including a blocking
  call) is a new request re-sending the whole context (prompt, the steps so far and the values seen), its
  prefix served by the engine's prefix cache where still there; the robot sends the next step, with its
  task's TUF as any new request, once it has the value;
* ``open-loop``: the node as it was, blocking skills served as any other (the plan goes on without the
  value; what it costs, not what the plan is worth).

Per task: the response (task arrival to its first action) and its utility; each step's response (the
robot's report of a value to the first action after it) and its utility under TUF_1 (the robot waits
idle from its report); the tokens prefilled per resume after a value (the engine's cache report).
"""

from __future__ import annotations

import functools
import random
import statistics
import zlib
from dataclasses import dataclass, field

from timely_llm.core.features import DEFAULT as DEFAULT_FEATURES
from timely_llm.core.policies import TIMELYLLM
from timely_llm.core.request import Outcome, Request, Status, executed_span
from timely_llm.core.tuf import TUF
from timely_llm.plan.segmenter import Segmenter
from timely_llm.plan.skills import SkillModel
from timely_llm.server import PlanRequest, Server
from timely_llm.serving import Driver, build_server
from timely_llm_bench.evaluation.harness import EngineSetup, SimulatedRobots, run_bench
from timely_llm_bench.workloads.closed_loop import ClosedLoopTasks
from timely_llm_bench.workloads.generator import Workload, WorkloadRequest

MODES = ("waiting-queue", "resend", "open-loop")


@dataclass
class TaskRecord:
    id: str
    category: str
    robot: str
    tuf: TUF
    succeeded: bool
    response: float | None = None
    step_responses: list[float] = field(default_factory=list)
    resume_prefills: list[int] = field(default_factory=list)
    completion: float | None = None

    @property
    def utility(self) -> float | None:
        return None if self.response is None else self.tuf(self.response)

    @property
    def step_utilities(self) -> list[float]:
        return [self.tuf.for_segment(1)(t) for t in self.step_responses]


def run_mode(mode: str, tasks: ClosedLoopTasks, workload: Workload, setup: EngineSetup, seed: int,
             policy: str = TIMELYLLM.name) -> list[TaskRecord]:
    """Serve ``workload`` one of the ``MODES`` ways; one record per task."""
    if mode == "resend":
        return _resend(tasks, workload, setup, seed, policy)
    robots = {n: r if mode == "waiting-queue" else r.served_open_loop() for n, r in tasks.robots.items()}
    result = run_bench(workload, policy, setup, robots, tasks.catalog, seed, values=tasks.values)
    return [_node_record(r, tasks) for r in result["requests"]]


def _node_record(record: dict, tasks: ClosedLoopTasks) -> TaskRecord:
    robot = tasks.robots[record["robot"]]
    task = TaskRecord(record["id"], record["category"], record["robot"], TUF(**record["tuf"]),
                      record["status"] == "succeeded")
    if not task.succeeded:
        return task
    segments = record["segments"]
    task.response, task.completion = record["response_time"], record["completion_time"]
    for waited, after in zip(segments, segments[1:], strict=False):
        if robot.blocking_call(waited["text"]) is not None:  # where the plan waits (or would have)
            task.step_responses.append(after["exec_start"] - waited["exec_end"])
            if waited.get("resume_prefill") is not None:
                task.resume_prefills.append(waited["resume_prefill"])
    return task


def plan_steps(plan: str, robot: SkillModel) -> list[str]:
    """``plan`` cut after each blocking call: what each request of a ReAct client asks for."""
    segmenter = Segmenter(robot)
    steps, current = [], ""
    for piece in [*segmenter.feed(plan), segmenter.flush()]:
        current += piece
        if robot.blocking_call(piece) is not None:
            steps.append(current)
            current = ""
    return [*steps, current] if current.strip() else steps


@dataclass
class _Task:
    request: WorkloadRequest
    steps: list[str]
    context: str
    outcomes: list[Outcome] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)


def _resend(tasks: ClosedLoopTasks, workload: Workload, setup: EngineSetup, seed: int,
            policy: str) -> list[TaskRecord]:
    engine, clock = setup.new_engine(), setup.new_clock()
    driver = Driver(clock)
    robots = SimulatedRobots(dict(tasks.robots), workload.network_latency, seed, driver.at)
    catalog, tokenizer = tasks.catalog, engine.tokenizer
    live: dict[str, _Task] = {}

    def submit(task: _Task, server: Server) -> None:
        trace, k = catalog[task.request.trace], len(task.outcomes)
        prompt_ids = tokenizer.encode(task.context)
        task.prompt_tokens.append(len(prompt_ids))
        step_id = f"{task.request.id}.{k}"
        live[step_id] = task
        server.submit(PlanRequest(step_id, task.request.agent, trace.robot, prompt_ids, task.request.tuf,
                                  trace.category, forced_ids=tokenizer.encode(task.steps[k]), trace=trace.id,
                                  arrival=clock.now()))

    def on_finish(request: Request) -> None:
        task = live.pop(request.id)
        task.outcomes.append(Outcome.of(request))
        k = len(task.outcomes)
        if request.status is Status.SUCCEEDED and k < len(task.steps):
            task.context += task.steps[k - 1] + _observation(tasks, task, k - 1, seed)
            driver.at(clock.now(), lambda server: submit(task, server))

    config = setup.server_config(policy, workload.network_latency, None, DEFAULT_FEATURES)
    server = build_server(config, engine, dict(tasks.robots), clock, on_segment=robots.on_segment,
                          on_finish=on_finish)
    for robot in sorted({catalog[r.trace].robot for r in workload.requests}):
        server.warm_prefix(tokenizer.encode(catalog.prompt_text(robot, "")))
    all_tasks = _resend_tasks(tasks, workload, clock.now())
    for task in all_tasks:
        driver.at(task.request.arrival, functools.partial(submit, task))
    driver.run(server)
    return [_resend_record(t, tasks) for t in all_tasks]


def _resend_tasks(tasks: ClosedLoopTasks, workload: Workload, origin: float) -> list[_Task]:
    """Each request of ``workload`` as a ReAct client's task: its plan cut into steps, arriving from ``origin``."""
    made = []
    for r in workload.requests:
        trace = tasks.catalog[r.trace]
        made.append(_Task(WorkloadRequest(r.id, origin + r.arrival, r.agent, r.trace, r.tuf),
                          plan_steps(trace.plan, tasks.robots[trace.robot]),
                          tasks.catalog.prompt_text(trace.robot, trace.prompt)))
    return made


def _observation(tasks: ClosedLoopTasks, task: _Task, step: int, seed: int) -> str:
    """What the robot saw at the end of ``step``, as the node would write it: drawn per seed from the task's
    values."""
    robot = tasks.robots[tasks.catalog[task.request.trace].robot]
    call = robot.blocking_call(task.steps[step])
    assert call is not None, "a step that a next one follows ends in a blocking call (plan_steps)"
    rng = random.Random(zlib.crc32(f"{seed}/{task.request.id}/{step}".encode()))
    return robot.observation.text(call.name, rng.choice(tasks.values[task.request.trace][call.name]))


def _resend_record(task: _Task, tasks: ClosedLoopTasks) -> TaskRecord:
    trace = tasks.catalog[task.request.trace]
    done = len(task.outcomes) == len(task.steps) and all(o.status is Status.SUCCEEDED for o in task.outcomes)
    record = TaskRecord(task.request.id, trace.category, trace.robot, task.request.tuf, done)
    if not done:
        return record
    first, last = task.outcomes[0], task.outcomes[-1]
    record.response = executed_span(first.segments[0])[0] - task.request.arrival
    record.completion = executed_span(last.segments[-1])[1] - task.request.arrival
    for before, after, prompt in zip(task.outcomes, task.outcomes[1:], task.prompt_tokens[1:], strict=False):
        record.step_responses.append(executed_span(after.segments[0])[0] - executed_span(before.segments[-1])[1])
        record.resume_prefills.append(prompt - (after.segments[0].cached_tokens or 0))
    return record


def summarize_tasks(records: list[TaskRecord]) -> dict[str, dict]:
    """Per category and overall: tasks, succeeded, mean utility, mean step utility, mean and p95 step
    response, mean prefill per resume, mean completion."""
    groups: dict[str, list[TaskRecord]] = {"all": records}
    for r in records:
        groups.setdefault(r.category, []).append(r)
    return {name: _summary(rs) for name, rs in sorted(groups.items())}


def _summary(records: list[TaskRecord]) -> dict:
    done = [r for r in records if r.succeeded]
    steps = [t for r in done for t in r.step_responses]
    prefills = [p for r in done for p in r.resume_prefills]
    return {
        "tasks": len(records), "succeeded": len(done),
        "utility": _mean([r.utility for r in done]), "response": _mean([r.response for r in done]),
        "step_utility": _mean([u for r in done for u in r.step_utilities]),
        "step_response": _mean(steps), "step_response_p95": _p95(steps),
        "prefill_per_resume": _mean(prefills), "completion": _mean([r.completion for r in done]),
    }


def _mean(values: list) -> float | None:
    return statistics.fmean(values) if values else None


def _p95(values: list[float]) -> float | None:
    return sorted(values)[int(0.95 * (len(values) - 1))] if values else None
