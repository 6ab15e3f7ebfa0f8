"""The node on the remote engine (``engine: remote``): free-text goals of a drone and an arm served by a real
``vllm serve`` to SUCCEEDED, segment by segment, each plan in its robot's grammar; and two servers, one killed
mid-run: only its goals end (aborted, naming it), none is lost, the node serves on with the other."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from remote_servers import API_KEY_ENV, MAX_NUM_SEQS

from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_models
from timely_llm_bench.robots.fleet import server_node

pytestmark = [pytest.mark.ros, pytest.mark.remote]

RESULT_TIMEOUT_S = 300.0
"""Grammars compile and prompts prefill on a loaded 2-core CPU server."""
MODELS = load_skill_models()
TASKS = {
    "tello": "Scene: [chair_1], Task: [A] Turn around, then fly up 50 cm and take a picture.",
    "arm": "Scene: [cup, sink], Task: Put the cup in the sink.",
}


def test_node_on_a_remote_server_serves_free_text_goals_segment_by_segment(session: tuple, robots: Callable,
                                                                            vllm_serve: object) -> None:
    params = {"remote.url": f"{vllm_serve.url}/v1", "remote.api_key_env": API_KEY_ENV,
              "remote.max_num_seqs": MAX_NUM_SEQS}
    with server_node(session[1], session[0], engine="remote", **params) as node:
        assert node.server.engine.max_batch == node.server.batch.max_batch == MAX_NUM_SEQS
        sent = {robot: robots(f"{robot}_free", robot).request(task) for robot, task in TASKS.items()}
        outcomes = {robot: outcome.wait(RESULT_TIMEOUT_S) for robot, outcome in sent.items()}

    for robot, outcome in outcomes.items():
        assert outcome.status == "succeeded", (robot, outcome.result.reason)
        assert outcome.result.num_segments >= 2, outcome.result.plan
        assert [s.index for s in outcome.segments] == list(range(outcome.result.num_segments))
        assert outcome.result_after_segments
        plan = "".join(s.text for s in outcome.segments)
        assert plan == MODELS[robot].without_observations(outcome.result.plan)  # the arm's scan answers shown
        assert plan_grammar(MODELS[robot]).accepts(plan), plan


@pytest.fixture
def doomed_serve(tmp_path: Path) -> Iterator[object]:
    """A second vllm serve, which the test kills mid-run."""
    from remote_servers import start_serve

    server = start_serve(tmp_path, "doomed")
    yield server
    server.close()


LONG_TASK = "Scene: [chair_1, table_2], Task: [A] Fly a square of 50 cm sides, turn around, then take a picture."


def test_two_servers_one_killed_mid_run_end_only_its_goals_and_the_node_serves_on(
        session: tuple, robots: Callable, vllm_serve: object, doomed_serve: object) -> None:
    params = {"remote.url": f"{vllm_serve.url}/v1,{doomed_serve.url}/v1", "remote.api_key_env": API_KEY_ENV,
              "remote.max_num_seqs": MAX_NUM_SEQS}
    with server_node(session[1], session[0], engine="remote", **params):
        sent = [robots(f"tello_{i}", "tello").request(LONG_TASK) for i in range(4)]
        deadline = time.monotonic() + RESULT_TIMEOUT_S
        while not all(o.segments or o.finished.done() for o in sent):  # each plan under way, on one server
            assert time.monotonic() < deadline, [o.status for o in sent]
            time.sleep(0.05)
        doomed_serve.kill()
        ended = [o.wait(RESULT_TIMEOUT_S) for o in sent]  # none lost
        after = robots("tello_after", "tello").request(TASKS["tello"]).wait(RESULT_TIMEOUT_S)

    statuses = sorted(o.status for o in ended)
    assert "succeeded" in statuses and "aborted" in statuses, [(o.status, o.result.reason) for o in ended]
    for outcome in ended:
        assert outcome.status in ("succeeded", "aborted"), outcome.result.reason
        if outcome.status == "aborted":
            assert doomed_serve.url in outcome.result.reason, outcome.result.reason
    assert after.status == "succeeded", after.result.reason  # the node serves on with the other server
