"""What the benchmark commands share: the inputs they load, progress lines, summaries."""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from timely_llm.core.features import Features
from timely_llm.errors import ConfigError

if TYPE_CHECKING:
    from timely_llm.traces import TraceCatalog
    from timely_llm_bench.workloads.generator import Workload

PROGRESS_PERIOD_S = 10.0


def _features(text: str) -> str:
    try:
        Features.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def workloads_help() -> str:
    """What ``--workload`` takes wherever it is given (``_load_inputs``), named from the two registries."""
    from timely_llm_bench.workloads.generator import BUILTIN
    from timely_llm_bench.workloads.peer import PEER_WORKLOADS

    return (f"{', '.join(BUILTIN)}, a peer workload ({', '.join(PEER_WORKLOADS)}: docs/peer-benchmark.md) "
            "or a workload JSON file")


def _add_only(p: argparse.ArgumentParser) -> None:
    """``--only CATEGORY...``, where a command replays a workload: ``_of_categories`` cuts it."""
    from timely_llm.traces import CATEGORIES

    p.add_argument("--only", nargs="+", default=None, choices=CATEGORIES, metavar="CATEGORY",
                   help=f"only the requests of these categories ({', '.join(CATEGORIES)}), at their own arrivals: "
                        "with --only urgent, what urgent robots get with nothing else to serve, the most any "
                        "policy can give them")


def _of_categories(workload: Workload, catalog: TraceCatalog, only: list[str] | None) -> Workload:
    """``workload`` cut to ``--only``'s categories (all of it without)."""
    if not only:
        return workload
    cut = workload.of_categories(only, catalog)
    if not cut.requests:
        raise ConfigError("--only", None, f"no request of {workload.name} is of {', '.join(only)}")
    return cut


def _load_inputs(args: argparse.Namespace):  # noqa: ANN202 - tuple of loaded inputs
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.traces import load_catalog
    from timely_llm_bench.workloads.generator import BUILTIN, generate, load_workload
    from timely_llm_bench.workloads.peer import PEER_WORKLOADS, generate_peer

    skills = load_skill_models(args.skill_models)
    catalog = load_catalog(robots=skills)  # prompts from the skill models this run uses
    for trace in catalog.traces.values():
        if trace.robot not in skills:
            raise ConfigError("lrtrace.yaml", f"trace {trace.id}.robot", f"no skill model for {trace.robot!r}")
    if args.workload in BUILTIN:
        workload = generate(BUILTIN[args.workload], catalog, skills, args.seed)
    elif args.workload in PEER_WORKLOADS:
        workload = generate_peer(PEER_WORKLOADS[args.workload], catalog, args.seed)
    elif Path(args.workload).is_file():
        workload = load_workload(args.workload, catalog)
    else:
        known = ", ".join([*BUILTIN, *PEER_WORKLOADS])
        raise ConfigError("--workload", args.workload, f"neither a built-in workload ({known}) nor a file")
    return skills, catalog, workload


def _read_json(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(path, None, f"cannot read JSON: {exc}") from exc


def _print_failures(records: list[dict]) -> None:
    for record in records:
        if record["status"] != "succeeded":
            print(f"    {record['id']} ({record['agent']}): {record['status']}: {record['reason']}")


@contextlib.contextmanager
def _progress(label: str, total: int, period_s: float = PROGRESS_PERIOD_S,
              waiting: Callable[[], str] | None = None) -> Iterator[Callable[[int], None]]:
    """A callback taking the number of requests done; a thread prints 'done / total' every ``period_s``, and with
    ``waiting`` (what the open requests wait for) that too."""
    done = [0]
    stop = threading.Event()
    began = time.monotonic()

    def report() -> None:
        while not stop.wait(period_s):
            open_ = waiting() if waiting is not None and done[0] < total else ""
            print(f"  {label}: {done[0]}/{total} requests done ({time.monotonic() - began:.0f} s)"
                  + (f"; waiting for {open_}" if open_ else ""), flush=True)

    def update(count: int) -> None:
        done[0] = count

    printer = threading.Thread(target=report, daemon=True)
    printer.start()
    try:
        yield update
    finally:
        stop.set()
        printer.join()


def _print_summary(result: dict) -> None:
    from timely_llm.core.kv_reuse import KvReuse
    from timely_llm_bench.evaluation.metrics import fmt_metric as fmt

    print(f"{result['policy']} on {result['workload']} ({result['hw']}, seed {result['seed']}):")
    for category, s in result["summary"].items():
        killed = f" killed={s['killed']}" if s.get("killed") else ""
        shed = (f" shed={s['shed']}{killed} utility with shed={fmt(s['mean_utility_with_shed'])}"
                if s.get("shed") or killed else "")
        print(f"  {category:7s} n={s['count']:4d} ok={s['succeeded']:4d} utility={fmt(s['mean_utility'])} "
              f"response={fmt(s['mean_response_time'])}s waiting={fmt(s['mean_waiting_time'])}s{shed}")
    if result.get("counters"):  # a ROS run (fleet, demo) has none: the node counts them
        print(f"  {KvReuse.of(result['counters']).describe()}")


BURSTY_MAX_BATCH = 8


