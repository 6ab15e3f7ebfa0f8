"""Run at the start of every Python process that has this directory on PYTHONPATH (tests' node processes):

- TIMELY_LLM_TEST_HUMBLE_RCLPY=1: rclpy lacks every name Humble's lacks (``humble_rclpy``);
- TIMELY_LLM_TEST_IMPORT_LOG=FILE: when the process exits, FILE gets one line per module of vllm and torch it imported
  (an empty file: none);
- TIMELY_LLM_TEST_VLLM_VERSION=X: timely_llm's vLLM version check reads X as the installed vLLM's version.
"""

import atexit
import os
import sys

WATCHED = ("vllm", "torch")


def _write_imports(path: str) -> None:
    with open(path, "w") as log:
        log.writelines(f"{name}\n" for name in sorted(sys.modules) if name.split(".")[0] in WATCHED)


if os.environ.get("TIMELY_LLM_TEST_IMPORT_LOG"):
    atexit.register(_write_imports, os.environ["TIMELY_LLM_TEST_IMPORT_LOG"])
if os.environ.get("TIMELY_LLM_TEST_HUMBLE_RCLPY") == "1":
    import humble_rclpy

    humble_rclpy.strip()
if os.environ.get("TIMELY_LLM_TEST_VLLM_VERSION"):
    import timely_llm.engines.vllm_version as vllm_version

    vllm_version.installed_version = lambda: os.environ["TIMELY_LLM_TEST_VLLM_VERSION"]
