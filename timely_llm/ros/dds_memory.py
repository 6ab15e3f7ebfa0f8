"""The node's DDS memory: history payloads sized to what they hold, where the operator has not configured Fast DDS.

rmw_fastrtps gives every reader and writer PREALLOCATED_WITH_REALLOC history memory, whose payloads are allocated at
the type's largest serialized size when the type is bounded. The node's interfaces bound every string, so each
robot's ``segment_done`` reader held payloads of SegmentDone's 2.6 KB bound: 270 MiB of RSS at 500 robots with a
goal in flight, 114 MiB with payloads sized to each sample (``timely-llm load-bench``, docs/node.md).
``fastdds_node.xml`` keeps rmw_fastrtps's other settings (data sharing off, the built-in endpoints' memory). Its
writers publish in Fast DDS's default mode, synchronous: Jazzy's rmw_fastrtps default, where Humble's is asynchronous.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

PROFILE = Path(__file__).with_name("fastdds_node.xml")
FAST_DDS_RMWS = ("rmw_fastrtps_cpp", "rmw_fastrtps_dynamic_cpp")
OPERATOR_SETTINGS = ("FASTRTPS_DEFAULT_PROFILES_FILE", "FASTDDS_DEFAULT_PROFILES_FILE",
                     "RMW_FASTRTPS_USE_QOS_FROM_XML", "RMW_FASTRTPS_PUBLICATION_MODE")
"""Any of these set: the operator configures Fast DDS, and the node leaves it as they said."""


def size_history_to_samples(env: MutableMapping[str, str] = os.environ) -> bool:
    """Point Fast DDS at the node's profile (before ``rclpy.init``); False where another RMW runs, the operator
    configured Fast DDS themselves or the profile is not installed."""
    if not PROFILE.is_file():
        return False
    if env.get("RMW_IMPLEMENTATION", FAST_DDS_RMWS[0]) not in FAST_DDS_RMWS:
        return False
    if any(name in env for name in OPERATOR_SETTINGS):
        return False
    env["FASTRTPS_DEFAULT_PROFILES_FILE"] = str(PROFILE)
    env["RMW_FASTRTPS_USE_QOS_FROM_XML"] = "1"
    return True
