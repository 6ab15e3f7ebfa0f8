"""How often generated plans are executable, with and without the robot's grammar.

    python -m timely_llm_bench.evaluation.plan_validity [--model smollm2] [--max-new-tokens 48]

For the LRTrace task texts and this project's own (``plan_tasks.yaml``: 35 drone, 15 arm)
it generates every plan three times on embedded vLLM, greedy: freely, in the grammar
straight through, and in the grammar segmented (suspended after every segment, resumed
from the token ids). Each run submits all tasks at once, so vLLM batches them. It prints
per task set how many plans parse in the robot's grammar, how many name only known
skills, and how many segmented plans equal the straight ones token for token.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from timely_llm.core.request import Request
from timely_llm.core.tuf import TUF
from timely_llm.engines.base import Engine
from timely_llm.errors import read_mapping
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.plan.skills import SkillModel
from timely_llm.planning import generate_together, task_prompt
from timely_llm.server import PlanRequest
from timely_llm.traces import TraceCatalog, load_catalog

TASKS_PATH = Path(__file__).with_name("plan_tasks.yaml")
_ids = itertools.count()


@dataclass(frozen=True)
class Task:
    set: str
    robot: str
    text: str


def load_tasks(catalog: TraceCatalog, path: Path = TASKS_PATH) -> list[Task]:
    own = read_mapping(path)
    tasks = [Task("lrtrace", t.robot, t.prompt) for t in catalog.traces.values()]
    return tasks + [Task(f"own-{robot}", robot, text) for robot, texts in own.items() for text in texts]


def generate_all(engine: Engine, robots: dict[str, SkillModel], catalog: TraceCatalog, tasks: list[Task], *,
                 segmented: bool, constrained: bool, max_new_tokens: int) -> list[Request]:
    """Every task's plan, all submitted at once; robots execute segments instantly."""
    plans = [PlanRequest(f"v{next(_ids)}", f"agent{i}", t.robot,
                         engine.tokenizer.encode(task_prompt(catalog, t.robot, t.text)), TUF(1.0, -2.0, 1.0),
                         max_new_tokens=max_new_tokens, constrained=constrained)
             for i, t in enumerate(tasks)]
    return generate_together(engine, robots, plans, segmented=segmented)


def executable(model: SkillModel, text: str) -> bool:
    """The plan names only known skills and parses in the robot's grammar."""
    grammar = plan_grammar(model)
    known = all(c.name in model.skills for c in model.find_calls(text))
    return known and grammar is not None and grammar.accepts(text)


def only_known_skills(model: SkillModel, text: str) -> bool:
    """Every call-shaped name in the plan (``name(``) is one of the robot's skills."""
    names = re.findall(r"(?<![\w'])([A-Za-z_]\w*)\(", re.sub(r"'[^']*'", "''", text))
    return bool(model.find_calls(text)) and all(n in model.skills for n in names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks (a quick look)")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the table readable on stdout
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

    from timely_llm.engines.vllm_engine import VllmEngine

    robots = load_skill_models()
    catalog = load_catalog()
    tasks = load_tasks(catalog)[: args.limit]
    engine = VllmEngine(args.model, max_model_len=2048, kv_cache_gib=1.0)
    runs = {}
    for name, segmented, constrained in (("free", False, False), ("grammar", False, True),
                                         ("segmented", True, True)):
        began = time.perf_counter()
        runs[name] = generate_all(engine, robots, catalog, tasks, segmented=segmented, constrained=constrained,
                                  max_new_tokens=args.max_new_tokens)
        print(f"{name}: {len(tasks)} plans in {time.perf_counter() - began:.0f} s", flush=True)
    engine.close()
    print(f"\nplans of {args.model}, greedy, at most {args.max_new_tokens} tokens")
    print("| tasks | n | free: grammatical | free: known skills only | grammar: grammatical | "
          "grammar: known skills only | segmented = straight |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for task_set in dict.fromkeys(t.set for t in tasks):
        rows = [i for i, t in enumerate(tasks) if t.set == task_set]

        def count(run: str, check, rows: list[int] = rows) -> str:  # noqa: ANN001 - predicate
            hits = sum(check(robots[tasks[i].robot], _text(runs[run][i])) for i in rows)
            return f"{hits}/{len(rows)}"

        same = sum(runs["segmented"][i].output_ids == runs["grammar"][i].output_ids for i in rows)
        print(f"| {task_set} | {len(rows)} | {count('free', executable)} | {count('free', only_known_skills)} | "
              f"{count('grammar', executable)} | {count('grammar', only_known_skills)} | {same}/{len(rows)} |")
    for i, task in enumerate(tasks):
        print(f"{task.set:9s} {task.text[:60]!r:64s} -> {_text(runs['grammar'][i])}")
    return 0


def _text(request: Request) -> str:
    return "".join(s.text for s in request.segments)


if __name__ == "__main__":
    raise SystemExit(main())
