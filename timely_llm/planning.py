"""One plan for one task, generated through the server loop (the ``plan`` command, tests, benchmarks).

The robot's prompt is its fixed part, built from its skill-model file (skills, guidance, worked
examples), followed by the task, which may start with a scene (``Scene: [...], Task: ...``).
Generation runs in the robot's plan grammar unless asked not to; segmented, each segment
suspends the generation and the next resumes it from the token ids, as under the
``timelyllm`` policy; unsegmented, it runs straight through (policy ``vllm``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from timely_llm.clock import VirtualClock
from timely_llm.core.policies import TIMELYLLM, VLLM
from timely_llm.core.request import Request, Segment
from timely_llm.core.tuf import TUF
from timely_llm.engines.base import Engine
from timely_llm.plan.skills import SkillModel
from timely_llm.server import PlanRequest
from timely_llm.serving import Driver, ServerConfig, build_server
from timely_llm.traces import TraceCatalog

DEFAULT_PLAN_TOKENS = 64
_ids = itertools.count()


@dataclass
class GeneratedPlan:
    robot: str
    task: str
    status: str
    reason: str
    output_ids: list[int]
    segments: list[Segment]
    """Segments with text (the server may end a plan with an empty one: 'nothing more')."""
    max_new_tokens: int

    @property
    def stopped_at_token_cap(self) -> bool:
        """Generation ended because the plan used up its tokens, not because the model ended it."""
        return len(self.output_ids) >= self.max_new_tokens

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)

    def to_json(self) -> dict:
        return {
            "robot": self.robot, "task": self.task, "plan": self.text,
            "segments": [
                {"index": s.index, "text": s.text, "skills": [{"name": c.name, "args": list(c.args)} for c in s.calls]}
                for s in self.segments
            ],
        }


def task_prompt(catalog: TraceCatalog, robot: str, task: str) -> str:
    """The text a request of a catalog robot for ``task`` is generated from (its skill model's prompt)."""
    return catalog.prompt_text(robot, task)


def generate_plan(engine: Engine, robot: SkillModel, task: str, *,
                  segmented: bool = True, constrained: bool = True, max_new_tokens: int = DEFAULT_PLAN_TOKENS,
                  on_segment: Callable[[Segment], object] | None = None) -> GeneratedPlan:
    """Generate one plan on ``engine``; ``on_segment`` sees each segment the moment it is cut.

    The robot is taken to execute each segment instantly, so only generation is timed.
    """
    prompt_ids = engine.tokenizer.encode(robot.prompt_text(task))
    plan = PlanRequest(f"plan-{next(_ids)}", "cli", robot.robot, prompt_ids, TUF(1.0, -2.0, 1.0),
                       max_new_tokens=max_new_tokens, constrained=constrained)
    (request,) = generate_together(engine, {robot.robot: robot}, [plan], segmented=segmented, on_segment=on_segment)
    return GeneratedPlan(robot.robot, task, request.status.value, request.reason, list(request.output_ids),
                         [s for s in request.segments if s.text], max_new_tokens)


def generate_together(engine: Engine, robots: dict[str, SkillModel], plans: list[PlanRequest], *, segmented: bool,
                      on_segment: Callable[[Segment], object] | None = None) -> list[Request]:
    """``plans`` submitted at once and generated to their end, segmented (policy ``timelyllm``) or straight
    through (``vllm``); the robots execute each segment the moment it is cut (``on_segment`` sees it then). No
    robot is there to report a value, so blocking skills are served as any other: the plan as the model writes it."""
    robots = {name: robot.served_open_loop() for name, robot in robots.items()}
    clock = VirtualClock()
    driver = Driver(clock)

    def dispatched(request: Request, segment: Segment) -> None:
        if on_segment is not None:
            on_segment(segment)
        driver.executed_at_once(request, segment)

    config = ServerConfig(TIMELYLLM.name if segmented else VLLM.name, network_latency=0.0)
    server = build_server(config, engine, robots, clock, on_segment=dispatched)
    requests = [server.submit(plan) for plan in plans]
    driver.run(server)
    return requests
