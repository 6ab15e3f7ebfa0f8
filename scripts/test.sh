#!/usr/bin/env bash
# The test command: installs what the tests need (scripts/setup_env.sh), then runs them all
# with real vLLM (CPU), real ROS 2 (rclpy + Fast DDS on loopback) and real djitellopy.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
build="$repo/build/ros"
bash "$repo/scripts/setup_env.sh" "$venv" "$build"
# shellcheck source=/dev/null
. "$repo/scripts/ros_env.sh" "$venv"
cd "$repo"
"$venv/bin/ruff" check timely_llm test
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" test
