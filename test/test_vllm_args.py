"""vLLM engine arguments from users (node parameters vllm.<field>, --vllm-arg) and models by Hugging Face id.

vLLM's own checks run here (its EngineArgs fields and the configuration it creates from them) without
starting an engine; a Hub id is checked against a Hub that cannot be reached.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from timely_llm.engines.vllm_args import (
    EngineArgsError,
    check_fields,
    create_config,
    from_parameters,
    parse_assignment,
    parse_assignments,
    shipped_parameters,
    shipped_vllm_args,
)
from timely_llm.models import resolve_model

REPO = Path(__file__).resolve().parents[1]
HUB_ID = "some-org/some-model"
OFFLINE_BOUND_S = 30.0
CLOSED_PORT = "http://127.0.0.1:9"
"""The discard port on loopback: nothing listens, the connection is refused at once."""


def test_assignments_read_values_as_ros_reads_them() -> None:
    assert parse_assignment("max_num_seqs=8") == ("max_num_seqs", 8)
    assert parse_assignment("gpu_memory_utilization=0.8") == ("gpu_memory_utilization", 0.8)
    assert parse_assignment("enforce_eager=true") == ("enforce_eager", True)
    assert parse_assignment("dtype=float16") == ("dtype", "float16")
    assert parse_assignment('hf_overrides={"a": 1}') == ("hf_overrides", {"a": 1})
    assert parse_assignments(["max_num_seqs:=8", "quantization:=awq"], ":=") == {"max_num_seqs": 8,
                                                                              "quantization": "awq"}
    for bad in ("max_num_seqs", "=8"):
        with pytest.raises(EngineArgsError, match="KEY=VALUE"):
            parse_assignment(bad)
    with pytest.raises(EngineArgsError, match="dtype given twice"):
        parse_assignments(["dtype=half", "dtype=float"])


def test_a_json_object_in_a_ros_string_parameter_reaches_vllm_as_a_mapping() -> None:
    assert from_parameters({"compilation_config": '{"mode": 0}', "dtype": "half"}) == {
        "compilation_config": {"mode": 0}, "dtype": "half"}


@pytest.mark.needs_vllm
def test_unknown_forced_and_renamed_fields_are_refused_naming_the_field() -> None:
    with pytest.raises(EngineArgsError, match=r"^vllm\.no_such_field: vLLM has no engine argument") as unknown:
        check_fields({"dtype": "half", "no_such_field": 1})
    assert "\n" not in str(unknown.value)
    with pytest.raises(EngineArgsError, match=r"did you mean vllm\.max_num_seqs\?"):
        check_fields({"max_num_seq": 8})
    for field in ("enable_prefix_caching", "async_scheduling", "logits_processors"):
        with pytest.raises(EngineArgsError, match=rf"^vllm\.{field}: set by timely_llm's engine"):
            check_fields({field: True})
    with pytest.raises(EngineArgsError, match="through parameter kv_cache_gib"):
        check_fields({"kv_cache_memory_bytes": 1 << 30})
    with pytest.raises(EngineArgsError, match="through parameter model"):
        check_fields({"model": "x"})
    check_fields({"max_model_len": 1024, "dtype": "half", "tensor_parallel_size": 2, "quantization": "awq"})


@pytest.mark.needs_vllm
def test_max_num_seqs_is_refused_naming_the_batch_cap_setting() -> None:
    """vLLM's max_num_seqs follows the one batch cap, max_batch (plus slots for paused generations)."""
    with pytest.raises(EngineArgsError) as refused:
        check_fields({"max_num_seqs": 8})
    assert str(refused.value).startswith("vllm.max_num_seqs: set it through parameter max_batch (CLI: --max-batch)")
    assert "\n" not in str(refused.value)


@pytest.mark.needs_vllm
@pytest.mark.parametrize("given,named", [
    ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
    ({"dtype": "float17"}, "dtype"),
    ({"max_model_len": "long"}, "max_model_len"),
])
def test_a_value_vllm_refuses_is_one_line_with_vllms_reason(given: dict, named: str) -> None:
    from vllm import EngineArgs

    model, _ = resolve_model("tiny")
    with pytest.raises(EngineArgsError) as refused:
        create_config(EngineArgs(model=model, **given), given)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"vLLM refused the engine arguments (vllm.{named}=")
    assert message.count(named) >= 2, message  # what was given, and vLLM's own reason


@pytest.mark.needs_vllm
def test_the_shipped_defaults_are_the_params_files() -> None:
    import yaml

    section = yaml.safe_load((REPO / "config" / "timely_llm.yaml").read_text())
    (node,) = section.values()
    assert shipped_parameters() == node["ros__parameters"]
    assert shipped_vllm_args() == node["ros__parameters"]["vllm"]
    assert node["ros__parameters"]["engine"] == "vllm"
    check_fields(shipped_vllm_args())


def _plan_with_hub_model(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    environ |= {"HF_HOME": str(tmp_path / "hf"), **env}
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "timely_llm.cli", "plan", "--robot", "tello", "--task", "fly up",
                          "--model", HUB_ID], env=environ, capture_output=True, text=True, timeout=120)
    return out, time.monotonic() - began


@contextlib.contextmanager
def _silent_endpoint() -> Iterator[str]:
    """An HTTP endpoint on loopback that takes connections (the kernel completes them) but never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("env", [{"HF_ENDPOINT": CLOSED_PORT}, {"HF_ENDPOINT": "silent"}, {}, {"HF_HUB_OFFLINE": "1"}],
                         ids=["refused", "unanswered", "this_machines_network", "hf_hub_offline"])
def test_a_hub_model_that_cannot_be_downloaded_fails_in_seconds_with_one_line(tmp_path: Path, env: dict) -> None:
    with _silent_endpoint() as silent:
        out, took = _plan_with_hub_model(tmp_path, **{k: silent if v == "silent" else v for k, v in env.items()})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"timely-llm plan: error: --model: model {HUB_ID!r}")
    assert "local directory" in lines[0] and "Hugging Face cache" in lines[0]
    assert took < OFFLINE_BOUND_S, took


def test_a_cached_hub_model_needs_no_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    snapshot = tmp_path / "models--some-org--some-model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--some-org--some-model" / "refs").mkdir()
    (tmp_path / "models--some-org--some-model" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "ENDPOINT", CLOSED_PORT)
    assert resolve_model(HUB_ID) == (HUB_ID, None)
    with pytest.raises(ValueError, match="Hugging Face model id"):
        resolve_model("no-such-directory")


PLAN = ["plan", "--robot", "tello", "--task", "fly up"]
VLLM_BENCH = ["bench", "--engine", "vllm", "--workload", "WID1", "--policy", "vllm"]


@pytest.mark.needs_vllm
@pytest.mark.parametrize("argv,needles", [
    ([*PLAN, "--vllm-arg", "no_such_field=1"], ["timely-llm plan: error: --vllm-arg: no_such_field: vLLM has no"]),
    ([*PLAN, "--vllm-arg", "max_num_seqs"], ["--vllm-arg", "KEY=VALUE"]),
    ([*PLAN, "--vllm-arg", "dtype=half", "--vllm-arg", "dtype=float"], ["--vllm-arg: dtype given twice"]),
    ([*PLAN, "--vllm-arg", "async_scheduling=true"], ["--vllm-arg: async_scheduling: set by timely_llm's engine"]),
    ([*VLLM_BENCH, "--vllm-arg", "seed=3", "--out", "{tmp}/r.json"], ["--vllm-arg: seed is set by --seed"]),
    ([*VLLM_BENCH, "--max-batch", "4", "--vllm-arg", "max_num_seqs=8", "--out", "{tmp}/r.json"],
     ["--vllm-arg: max_num_seqs: set it through parameter max_batch (CLI: --max-batch)"]),
    ([*VLLM_BENCH, "--vllm-arg", "max_num_seqs=8", "--out", "{tmp}/r.json"],
     ["--vllm-arg: max_num_seqs: set it through parameter max_batch (CLI: --max-batch)"]),
    (["fidelity", "--vllm-arg", "max_num_seqs=8"],
     ["timely-llm fidelity: error: --vllm-arg: max_num_seqs: set it through parameter max_batch"]),
    (["demo", "--engine", "vllm", "--vllm-arg", "max_num_seqs=8"],
     ["timely-llm demo: error: --vllm-arg: max_num_seqs: set it through parameter max_batch"]),
    (["bench", "--workload", "WID1", "--policy", "vllm", "--vllm-arg", "dtype=half", "--out", "{tmp}/r.json"],
     ["--vllm-arg: applies to --engine vllm only"]),
])
def test_bad_vllm_args_on_the_command_line_fail_on_one_line_before_any_engine(
        argv: list[str], needles: list[str], tmp_path: Path, capfd: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from timely_llm.cli import main

    monkeypatch.setitem(sys.modules, "timely_llm.engines.vllm_engine", None)  # importing it raises ImportError
    try:
        code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    except SystemExit as exc:
        code = exc.code
    lines = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    for needle in needles:
        assert needle in lines[0], (needle, lines)
    assert not (tmp_path / "r.json").exists()
