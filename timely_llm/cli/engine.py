"""``timely-llm`` commands on the embedded engine: profile, plan."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from timely_llm.cli.common import (
    DEFAULT_HW,
    _add_vllm_arg,
    _in_file,
    _model_dir,
    _out_file,
    _positive_int,
    _quiet_vllm_logging,
    _vllm_engine,
)
from timely_llm.errors import ConfigError
from timely_llm.models import DEFAULT_MODEL, MODEL_NAMES

if TYPE_CHECKING:
    from timely_llm.planning import GeneratedPlan

MIN_PROFILE_MODEL_LEN = 128


PLAN_AT_TOKEN_CAP = 3
"""``timely-llm plan``'s exit status for a plan the token cap cut: the model had not ended it."""
PLAN_EXIT_STATUS = (f"exit status: 0 the model ended the plan; 1 the plan failed (the reason is printed); 2 a usage "
                    f"error; {PLAN_AT_TOKEN_CAP} the plan was cut at its token cap (--max-new-tokens) before the "
                    "model ended it, so it may stop short of the task (stderr says so in one line)")


PROFILE_KV_GIB = 2.0
"""KV cache of the profiling engine: room for 32 generations of 1,024 tokens of SmolLM2."""


def _add_plan(p: argparse.ArgumentParser) -> None:
    from timely_llm.planning import DEFAULT_PLAN_TOKENS

    p.add_argument("--robot", required=True,
                   help="robot type: the robot of a skill model (a shipped one, or one in --skill-models)")
    p.add_argument("--task", help="the task, optionally after a scene: 'Scene: [cat], Task: ...' "
                                  "(required unless --show-prompt)")
    p.add_argument("--model", default=DEFAULT_MODEL, type=_model_dir,
                   help="smollm2 (default: SmolLM2-135M-Instruct), tiny (random test model) or a directory")
    p.add_argument("--max-new-tokens", type=_positive_int, default=DEFAULT_PLAN_TOKENS,
                   help=f"cap on the plan's tokens (default {DEFAULT_PLAN_TOKENS})")
    p.add_argument("--no-grammar", action="store_true", help="decode freely instead of in the robot's grammar")
    p.add_argument("--skill-models", nargs="*", default=None, type=_in_file,
                   help="skill-model YAML files (default: the shipped ones)")
    p.add_argument("--json", action="store_true", help="end with the plan as one line of JSON")
    p.add_argument("--show-prompt", action="store_true",
                   help="print the exact prompt the model gets (for --task, or the robot's fixed part alone) "
                        "and exit without loading a model")
    _add_vllm_arg(p)
    p.epilog = PLAN_EXIT_STATUS
    p.set_defaults(run=_plan)


def _plan(args: argparse.Namespace) -> int:
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.planning import generate_plan

    skills = load_skill_models(args.skill_models)
    if args.robot not in skills:
        raise ConfigError("--robot", None, f"unknown robot {args.robot!r} (known: {', '.join(sorted(skills))})")
    if args.show_prompt:
        print(skills[args.robot].prompt_text(args.task) if args.task else skills[args.robot].system_prompt, end="")
        return 0
    if args.task is None:
        raise ConfigError("--task", None, "required (unless --show-prompt)")
    if not args.task.strip():
        raise ConfigError("--task", None, "empty task")
    _quiet_vllm_logging()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    with _stdout_to_stderr():  # anything else vLLM and its libraries print
        engine = _vllm_engine(args.model, args.vllm_arg, announce=f"loading {args.model} on embedded vLLM (on a "
                                                                  "CPU it compiles for about half a minute first)")
        try:
            print("generating", file=sys.stderr, flush=True)
            plan = generate_plan(engine, skills[args.robot], args.task,
                                 constrained=not args.no_grammar, max_new_tokens=args.max_new_tokens,
                                 on_segment=lambda s: s.text and print(f"segment {s.index}: {s.text}", file=out))
        finally:
            engine.close()
    try:
        return _report(plan, args.json, out)
    finally:
        out.close()


def _report(plan: GeneratedPlan, as_json: bool, out: TextIO) -> int:
    """How the plan ended, on ``out`` (why it failed, its JSON line) and stderr (a cap that cut a plan); the exit
    status. A plan with no statement failed, whatever stopped it: the node aborts one, naming its token budget."""
    cut = plan.status == "succeeded" and plan.stopped_at_token_cap
    if cut:
        print(f"the plan stopped at its token cap ({plan.max_new_tokens} tokens; --max-new-tokens raises it): "
              f"the model had not ended it, so it may stop short of the task (exit status {PLAN_AT_TOKEN_CAP})",
              file=sys.stderr)
    if plan.reason:
        print(f"{plan.status}: {plan.reason}", file=out)
    if as_json:
        print(json.dumps(plan.to_json()), file=out)
    if plan.status != "succeeded":
        return 1
    return PLAN_AT_TOKEN_CAP if cut else 0


@contextlib.contextmanager
def _stdout_to_stderr():  # noqa: ANN202 - context manager
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="smollm2 (default: SmolLM2-135M-Instruct), tiny (random test model) or a directory; with "
                        "--url, the served model's name (default: the server's only one)")
    p.add_argument("--url", default=None,
                   help="profile a running vllm serve at this URL (http://host:port[/v1]) through its streams, for the "
                        "simulator of the remote path (needs neither vLLM nor torch here)")
    p.add_argument("--api-key-env", default="", help="with --url: the environment variable holding its bearer token")
    p.add_argument("--memory-from", default=None,
                   help=f"profile whose memory section is kept, but for its block size: the engine's (default "
                        f"{DEFAULT_HW}; with --url, the shipped fit of the served model where there is one, and the "
                        "server's KV blocks)")
    p.add_argument("--max-model-len", type=_positive_int, default=None,
                   help=f"vLLM max_model_len, at least {MIN_PROFILE_MODEL_LEN} (default: vllm.max_model_len of "
                        "config/timely_llm.yaml)")
    p.add_argument("--out", required=True, type=_out_file, help="hardware profile YAML file to write")
    _add_vllm_arg(p)
    p.set_defaults(run=_profile)


def _profile(args: argparse.Namespace) -> int:
    if args.url is not None:
        return _profile_server(args)
    from timely_llm.engines.hardware import load_profile, save_profile
    from timely_llm.engines.vllm_args import shipped_vllm_args

    try:
        model = _model_dir(args.model or DEFAULT_MODEL)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError("--model", None, str(exc)) from None
    given = dict(args.vllm_arg)
    max_model_len = args.max_model_len or given.get("max_model_len") or shipped_vllm_args().get("max_model_len")
    if not isinstance(max_model_len, int) or max_model_len < MIN_PROFILE_MODEL_LEN:
        raise ConfigError("--max-model-len", None, f"must be at least {MIN_PROFILE_MODEL_LEN}")
    memory = dict(load_profile(args.memory_from or DEFAULT_HW).memory)
    _quiet_vllm_logging()
    from timely_llm.engines.profile_fit import fit_profile, measure_steps

    length = {"max_model_len": ("--max-model-len", args.max_model_len)} if args.max_model_len else {}
    engine = _vllm_engine(model, args.vllm_arg, kv_cache_gib=PROFILE_KV_GIB, options=length)
    lengths = [n for n in (64, 128, 256, 512, 1024, 1536) if n < max_model_len - 8]
    contexts = tuple(n for n in (256, 1024) if n < max_model_len - 80)
    samples = measure_steps(engine, lengths, [1, 2, 4, 8, 16, 32], contexts=contexts)
    memory["block_tokens"] = float(engine.block_size)  # the prefix cache hits whole blocks of the engine's size
    engine.close()
    profile = fit_profile(samples, Path(args.out).stem, memory, max_model_len)
    if model in MODEL_NAMES:  # simulated with the model's token counts
        profile = dataclasses.replace(profile, tokenizer=model)
    save_profile(profile, args.out)
    for term, value in profile.step.items():
        print(f"{term:24s} {value:.3e}")
    return 0


def _profile_server(args: argparse.Namespace) -> int:
    """``profile --url``: the step terms and the http section of a server, measured through its streams."""
    if args.vllm_arg or args.max_model_len:
        raise ConfigError("--url", None, "the server's own settings apply: --vllm-arg and --max-model-len are not "
                                         "taken with it")
    from timely_llm.engines.hardware import FITTED_PROFILES, load_profile, save_profile
    from timely_llm.engines.profile_http import HttpProbe, fit_server_profile, measure_server

    probe = HttpProbe(args.url, args.model or "", args.api_key_env)
    memory = dict(load_profile(args.memory_from or FITTED_PROFILES.get(probe.served.model, DEFAULT_HW)).memory)
    print(f"profiling {probe.served.model} at {probe.server.url} (about a minute on a CPU)", file=sys.stderr)
    timings = measure_server(probe)
    profile = fit_server_profile(timings, Path(args.out).stem, memory)
    save_profile(profile, args.out)
    for term, value in (profile.step | (profile.http or {})).items():
        print(f"{term:24s} {value:.3e}")
    print("measured vs fitted step (ms): " + ", ".join(
        f"{1e3 * seconds:.1f}/{1e3 * profile.step_time(prefills, decodes, reread):.1f}"
        for prefills, decodes, reread, seconds in timings.samples))
    return 0
