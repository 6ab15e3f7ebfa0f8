"""The node's Fast DDS profile: history payloads sized to their samples unless the operator configured Fast DDS."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from timely_llm.ros import dds_memory
from timely_llm.ros.dds_memory import OPERATOR_SETTINGS, PROFILE, size_history_to_samples

NS = {"dds": "http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles"}


def test_an_unconfigured_fast_dds_gets_the_nodes_profile() -> None:
    env = {"RMW_IMPLEMENTATION": "rmw_fastrtps_cpp"}
    assert size_history_to_samples(env)
    assert env["FASTRTPS_DEFAULT_PROFILES_FILE"] == str(PROFILE) and PROFILE.is_file()
    assert env["RMW_FASTRTPS_USE_QOS_FROM_XML"] == "1"
    assert size_history_to_samples({})  # Fast DDS is the default RMW


@pytest.mark.parametrize("setting", OPERATOR_SETTINGS)
def test_what_the_operator_set_is_left_as_it_is(setting: str) -> None:
    env = {setting: "theirs"}
    assert not size_history_to_samples(env)
    assert env == {setting: "theirs"}


def test_another_rmw_is_left_alone() -> None:
    env = {"RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}
    assert not size_history_to_samples(env)
    assert env == {"RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}


def test_without_the_profile_installed_fast_dds_keeps_its_defaults(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    monkeypatch.setattr(dds_memory, "PROFILE", tmp_path / "fastdds_node.xml")
    env: dict[str, str] = {}
    assert not dds_memory.size_history_to_samples(env)
    assert env == {}


def test_the_profile_sizes_readers_and_writers_to_their_samples_and_keeps_data_sharing_off() -> None:
    profiles = ET.parse(PROFILE).getroot().find("dds:profiles", NS)
    for kind in ("publisher", "subscriber"):  # DataWriter and DataReader profiles in Fast DDS 2.6 and 2.14
        default = [p for p in profiles.findall(f"dds:{kind}", NS) if p.get("is_default_profile") == "true"]
        assert len(default) == 1, kind
        assert default[0].findtext("dds:historyMemoryPolicy", namespaces=NS) == "DYNAMIC_REUSABLE"
        assert default[0].findtext("dds:qos/dds:data_sharing/dds:kind", namespaces=NS) == "OFF"


PING = """
import time, rclpy
from timely_llm.ros.dds_memory import size_history_to_samples
from timely_llm_interfaces.msg import SegmentDone
from timely_llm_interfaces.qos import DEEP_RELIABLE
assert size_history_to_samples()
rclpy.init()
node = rclpy.create_node("dds_memory_ping")
heard = []
node.create_subscription(SegmentDone, "segment_done", heard.append, DEEP_RELIABLE)
publisher = node.create_publisher(SegmentDone, "segment_done", DEEP_RELIABLE)
deadline = time.monotonic() + 20
while len(heard) < 3 and time.monotonic() < deadline:
    if publisher.get_subscription_count():
        publisher.publish(SegmentDone(agent_id="a" * 200, request_id="r", index=len(heard), result="x" * 1000))
    rclpy.spin_once(node, timeout_sec=0.1)
print(len(heard), heard[-1].result == "x" * 1000 if heard else None)
"""


def test_fast_dds_reads_the_profile_and_bounded_messages_still_flow(ros_domain: int) -> None:
    env = {k: v for k, v in os.environ.items() if k not in OPERATOR_SETTINGS}
    done = subprocess.run([sys.executable, "-c", PING], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "XMLPARSER" not in done.stderr and "Error" not in done.stderr, done.stderr
    assert done.stdout.split() == ["3", "True"]
