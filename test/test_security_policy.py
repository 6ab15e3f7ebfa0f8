"""``timely-llm security-policy``: the SROS2 policies it writes are valid against sros2's policy schema (the
Fast DDS in these wheels is built without DDS Security, so no test here can enforce them: docs/node.md,
"Security") and grant each robot its own topics only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
import xmlschema

from timely_llm.ros.security_policy import write_policies

SCHEMA = Path(__file__).parent / "data" / "sros2_policy.xsd"


def rules(path: Path) -> dict[tuple[str, str], set[str]]:
    """(element, rule) -> names, e.g. ("topics", "publish") -> {"/task_requests", ...}."""
    found: dict[tuple[str, str], set[str]] = {}
    for group in ElementTree.parse(path).getroot().iter():
        for rule, value in group.attrib.items():
            if value == "ALLOW":
                found.setdefault((group.tag, rule), set()).update(item.text for item in group)
    return found


def test_every_policy_is_valid_against_the_sros2_schema(tmp_path: Path) -> None:
    schema = xmlschema.XMLSchema(SCHEMA)  # its import of the XML namespace resolves to xmlschema's own copy
    written = write_policies(["d1", "d2", "arm_3"], tmp_path, namespace="/fleet_a")
    assert sorted(p.name for p in written) == ["arm_3.policy.xml", "d1.policy.xml", "d2.policy.xml",
                                               "timely_llm_server.policy.xml"]
    for path in written:
        schema.validate(path)
    broken = tmp_path / "broken.policy.xml"
    broken.write_text(written[0].read_text().replace('publish="ALLOW"', 'publish="MAYBE"'))
    assert not schema.is_valid(broken)  # the schema does check what the policies say


def test_a_robot_may_publish_only_on_its_own_topics_and_task_requests(tmp_path: Path) -> None:
    write_policies(["d1", "d2"], tmp_path)
    d1 = rules(tmp_path / "d1.policy.xml")
    assert d1[("topics", "publish")] == {"/task_requests", "/d1/task_requests", "/d1/segment_done", "/d1/cancel",
                                         "/rosout", "/parameter_events"}
    assert d1[("topics", "subscribe")] == {"/d1/segments", "/d1/plan_result", "/parameter_events", "/clock"}
    assert d1[("actions", "call")] == {"/request_plan"}
    assert not any("d2" in name for names in d1.values() for name in names)
    server = rules(tmp_path / "timely_llm_server.policy.xml")
    # every robot's topics through wildcards: the node's policy names no robot
    assert {"/task_requests", "/*/task_requests", "/*/segment_done", "/*/cancel"} <= server[("topics", "subscribe")]
    assert {"/*/segments", "/*/plan_result", "/status"} <= server[("topics", "publish")]
    assert not any("d1" in name or "d2" in name for names in server.values() for name in names)
    assert server[("actions", "execute")] == {"/request_plan"}
    assert ElementTree.parse(tmp_path / "d2.policy.xml").find(".//enclave").get("path") == "/timely_llm/d2"


def test_the_command_writes_the_files_and_refuses_an_agent_id_that_cannot_name_topics(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "timely_llm.cli", "security-policy", "--out", str(tmp_path), "--agents"]
    done = subprocess.run([*command, "d1", "d2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path / f) for f in ("d1.policy.xml", "d2.policy.xml",
                                                               "timely_llm_server.policy.xml")]
    refused = subprocess.run([*command, "d1", "drone-2"], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "'drone-2' is not a ROS name token" in refused.stderr


@pytest.mark.parametrize("agents", [["d1", "d1"], ["a/b"]])
def test_bad_agent_lists_are_refused(tmp_path: Path, agents: list[str]) -> None:
    with pytest.raises(ValueError):
        write_policies(agents, tmp_path)
    assert not list(tmp_path.iterdir())


FLEET = """
robots:
  - {id: drone_01, types: [tello], class: urgent}
  - {id: arm_01, types: arm}
  - {id: "scout_*", types: "*", class: background}
"""


def test_a_fleet_files_policies_grant_each_robot_its_own_request_topic_and_not_the_shared_names(
        tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    out = tmp_path / "policies"
    command = [sys.executable, "-m", "timely_llm.cli", "security-policy", "--fleet", str(fleet), "--out", str(out)]
    done = subprocess.run([*command, "--agents", "scout_7"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(Path(p).name for p in done.stdout.split()) == [
        "arm_01.policy.xml", "drone_01.policy.xml", "scout_7.policy.xml", "timely_llm_server.policy.xml"]
    schema = xmlschema.XMLSchema(SCHEMA)
    for path in out.iterdir():
        schema.validate(path)
    drone = rules(out / "drone_01.policy.xml")
    assert drone[("topics", "publish")] == {"/drone_01/task_requests", "/drone_01/segment_done", "/drone_01/cancel",
                                            "/rosout", "/parameter_events"}
    assert ("actions", "call") not in drone  # the action lets a client name any agent id
    refused = subprocess.run([*command, "--agents", "intruder"], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "'intruder' is not in the fleet file" in refused.stderr


def test_adding_a_robot_to_the_fleet_changes_that_robots_policy_only(tmp_path: Path) -> None:
    from timely_llm.ros.fleet_file import load_fleet
    from timely_llm.ros.security_policy import fleet_agents

    before, after = tmp_path / "before.yaml", tmp_path / "after.yaml"
    robots = [f"  - {{id: drone_{i:02d}, types: [tello], class: urgent}}" for i in range(20)]
    before.write_text("robots:\n" + "\n".join(robots) + "\n")
    after.write_text("robots:\n" + "\n".join([*robots, "  - {id: drone_20, types: [tello]}"]) + "\n")
    for name, fleet in (("a", before), ("b", after)):
        write_policies(fleet_agents(load_fleet(str(fleet)), []), tmp_path / name, shared=False)
    old, new = ({p.name: p.read_bytes() for p in (tmp_path / n).iterdir()} for n in ("a", "b"))
    assert set(new) - set(old) == {"drone_20.policy.xml"}
    assert all(new[name] == content for name, content in old.items())  # the node's policy included
