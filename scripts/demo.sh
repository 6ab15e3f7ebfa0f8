#!/usr/bin/env bash
# The main job: install what is needed (scripts/setup_env.sh), then run the node on the embedded
# default engine (loaded once) with a simulated fleet sending a burst of 14 drone tasks, 4 urgent, against a
# batch cap of 8, under timelyllm, vllm-stream and vllm; it ends with one verdict sentence per baseline.
# Third-party output (vLLM, progress bars, the node's ROS log) goes to build/demo.log.
# Extra arguments go to `timely-llm demo` (see `timely-llm demo --help`).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
build="$repo/build/ros"
mkdir -p "$repo/build"
log="$repo/build/setup.log"
began=$SECONDS
# Setup steps show as they start; everything else (pip, cmake) goes to the log.
if ! bash "$repo/scripts/setup_env.sh" "$venv" "$build" 2>&1 | tee "$log" | { grep --line-buffered '^==> ' || true; }
then
  echo "setup failed; the end of build/setup.log:" >&2; tail -n 20 "$log" >&2; exit 1
fi
echo "==> setup done in $((SECONDS - began)) s (log: build/setup.log)"
# shellcheck source=/dev/null
. "$repo/scripts/ros_env.sh" "$venv" "$build"
cd "$repo"
exec "$venv/bin/timely-llm" demo "$@"
