"""The benchmark commands and the demo, added to the ``timely-llm`` command (entry point ``timely_llm.commands``)."""

from __future__ import annotations

import argparse

from timely_llm_bench.cli.engine import _add_fidelity, _add_peer_bench
from timely_llm_bench.cli.ros import _add_abuse_bench, _add_demo, _add_fleet, _add_load_bench, _add_traffic_bench
from timely_llm_bench.cli.simulator import (
    _add_ablation,
    _add_bench,
    _add_closed_loop,
    _add_estimate_error,
    _add_loop_cost,
    _add_plot,
    _add_sched,
    _add_sweep,
    _add_table,
    _add_workload,
)


def register(sub: argparse._SubParsersAction) -> dict[str, str]:
    """Add the benchmark commands to ``timely-llm``'s subparsers; returns the bench's own policies (name: help)."""
    from timely_llm_bench.evaluation.harness import BENCH_POLICY_HELP

    _add_bench(sub.add_parser("bench", help="run a workload under one policy and write the records"))
    _add_plot(sub.add_parser("plot", help="Figure 5/6-style plots from bench results; load-map plots from sweeps"))
    _add_sweep(sub.add_parser("sweep", help="load map: policies x hardware x batch caps x agents, one JSON"))
    _add_ablation(sub.add_parser("ablation", help="scheduler parts each alone, all and none, on chosen points"))
    _add_workload(sub.add_parser("workload", help="write a generated workload to JSON"))
    _add_closed_loop(sub.add_parser("closed-loop-bench", help="closed-loop plans (blocking skills): the waiting "
                                    "queue vs a new request per step (ReAct re-send) vs open-loop, on the simulator"))
    _add_sched(sub.add_parser("sched-overhead", help="time per scheduling decision vs queue length"))
    _add_loop_cost(sub.add_parser("loop-cost", help="the server loop's own CPU per step, per token and per resume, "
                                                     "the engine left out"))
    _add_estimate_error(sub.add_parser("estimate-error", help="error of predicted segment generation times G(s) "
                                                              "on the simulator: TimeBill vs the constant"))
    _add_fleet(sub.add_parser("fleet", help="replay a workload through ROS 2 robot clients against a running node"))
    _add_demo(sub.add_parser("demo", help="node + fleet in-process, timelyllm against vllm-stream and vllm, "
                                           "with the machine's load during each"))
    _add_load_bench(sub.add_parser("load-bench", help="the node under 100s of robots: goals in flight, accept "
                                                       "latency, CPU, RSS; RSS after 1,000 vs 10,000 goals"))
    _add_abuse_bench(sub.add_parser("abuse-bench", help="honest robots' response times beside request floods, "
                                                       "impostor ids, urgency claims, with and without a fleet file"))
    _add_traffic_bench(sub.add_parser("traffic-bench", help="what each robot process receives on the action vs "
                                                             "the topic interface, for N robot processes"))
    _add_table(sub.add_parser("table", help="markdown table of bench or sweep results"))
    _add_peer_bench(sub.add_parser("peer-bench", help="vllm serve with streaming robots vs the node's policies, "
                                                      "same model, prompts, grammar and arrivals: one table"))
    _add_fidelity(sub.add_parser("fidelity", help="one workload on the simulator and on embedded vLLM, side by "
                                                  "side per policy: does the simulator predict the engine?"))
    return BENCH_POLICY_HELP
