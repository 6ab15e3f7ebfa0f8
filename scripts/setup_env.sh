#!/usr/bin/env bash
# Everything timely_llm needs, in one venv: the package, vLLM on the CPU, ROS 2 Jazzy wheels
# with our interfaces built, djitellopy, and the test tools.
# Usage: scripts/setup_env.sh [VENV] [BUILD_DIR]   (defaults .venv and build/ros; idempotent)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo/.venv}"
build="${2:-$repo/build/ros}"

bash "$repo/scripts/install_vllm.sh" "$venv"
bash "$repo/scripts/build_interfaces.sh" "$venv" "$build"
"$venv/bin/python" -m pip install --disable-pip-version-check -q -e "$repo[test,robots]" ruff
