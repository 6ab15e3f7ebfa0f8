#!/usr/bin/env bash
# Everything timely_llm needs, in one venv: the package, vLLM on the CPU, ROS 2 Jazzy wheels
# with our interfaces built, djitellopy, and the test tools.
# Usage: scripts/setup_env.sh [VENV] [BUILD_DIR]   (defaults .venv and build/ros; idempotent)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo/.venv}"
build="${2:-$repo/build/ros}"

# Each step announces itself on a line starting with '==> ' (scripts/demo.sh shows only those).
echo "==> setup 1/3: torch and vLLM for the CPU into $venv (the first time downloads ~3.4 GB: several minutes)"
bash "$repo/scripts/install_vllm.sh" "$venv"
echo "==> setup 2/3: ROS 2 Jazzy wheels and the timely_llm interfaces (build in $build)"
bash "$repo/scripts/build_interfaces.sh" "$venv" "$build"
echo "==> setup 3/3: timely_llm with its robot and test extras"
"$venv/bin/python" -m pip install --disable-pip-version-check -q -e "$repo[test,robots]" ruff
