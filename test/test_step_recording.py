"""What the batch controller learns from: engine steps that decoded."""

from __future__ import annotations

from timely_llm.clock import VirtualClock
from timely_llm.core.features import Features
from timely_llm.core.tuf import NORMAL_TUF
from timely_llm.engines.base import StepOutput
from timely_llm.engines.hardware import HardwareProfile, load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.server import PlanRequest
from timely_llm.serving import ServerConfig, build_server
from timely_llm.traces import load_catalog

SKILLS = load_skill_models()
CATALOG = load_catalog()


class CompilingFirst(SimEngine):
    """The simulator, except that its first steps run nothing, as vLLM's while a grammar compiles."""

    waits = 3

    def step(self) -> StepOutput:
        if self.waits:
            self.waits -= 1
            return StepOutput(duration=0.0005)
        return super().step()


def test_engine_steps_that_decode_nothing_do_not_teach_the_batch_controller() -> None:
    # such a step timed as a decode step of the whole batch made the throughput curve's knee 1 on the CPU
    engine = CompilingFirst(load_profile("cpu-2core-smollm2-135m"))
    server = build_server(ServerConfig("timelyllm", 0.008, Features(ala=True)), engine, SKILLS, VirtualClock())
    trace = CATALOG[1]
    server.submit(PlanRequest("r", "a", trace.robot, engine.tokenizer.encode(trace.prompt), NORMAL_TUF,
                              forced_ids=engine.tokenizer.encode(trace.plan)))
    for _ in range(8):
        server.step()
    assert engine.waits == 0
    samples = list(server.batch.steps._samples)
    assert samples and min(d for _, d in samples) > 0.001


def test_the_last_step_time_is_the_engine_steps_own() -> None:
    """What the node's diagnostics report as the last step time: the step output's duration."""
    engine = RecordingSim(load_profile("rtx4090-llama3-8b"))
    server = build_server(ServerConfig("timelyllm", 0.008), engine, SKILLS, VirtualClock())
    assert server.last_step_s != server.last_step_s  # NaN before any step
    trace = CATALOG[1]
    server.submit(PlanRequest("r", "a", trace.robot, engine.tokenizer.encode(trace.prompt), NORMAL_TUF,
                              forced_ids=engine.tokenizer.encode(trace.plan)))
    for _ in range(3):
        assert server.step()
        assert server.last_step_s == engine.durations[-1] > 0


class RecordingSim(SimEngine):
    """The simulator, keeping each step's modelled duration."""

    def __init__(self, profile: HardwareProfile) -> None:
        super().__init__(profile)
        self.durations: list[float] = []

    def step(self) -> StepOutput:
        out = super().step()
        self.durations.append(out.duration)
        return out
