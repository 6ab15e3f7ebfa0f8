#!/usr/bin/env bash
# The main job: install what is needed (scripts/setup_env.sh), then run the node on the embedded
# default engine with a simulated fleet for a minute of WID1, and compare with --policy vllm.
# Extra arguments go to `timely-llm demo` (see `timely-llm demo --help`).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
build="$repo/build/ros"
mkdir -p "$repo/build"
bash "$repo/scripts/setup_env.sh" "$venv" "$build" > "$repo/build/setup.log" 2>&1 || {
  echo "setup failed, see build/setup.log" >&2; exit 1; }
# shellcheck source=/dev/null
. "$repo/scripts/ros_env.sh" "$venv" "$build"
cd "$repo"
exec "$venv/bin/timely-llm" demo "$@"
