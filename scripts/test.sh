#!/usr/bin/env bash
# The test command: installs what the tests need (scripts/setup_env.sh), then runs them all
# with real vLLM (CPU), real ROS 2 (rclpy + Fast DDS on loopback) and real djitellopy.
# Then the node as robots' computers run it: a Python 3.10 venv without vLLM or torch (build/py310), where the
# node tests marked no_vllm run on an rclpy stripped of what Humble's lacks (test/test_node_humble.py) and on the
# full one. Both parts run; the command fails if either does.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
build="$repo/build/ros"
py310_venv="$repo/build/py310/venv"
bash "$repo/scripts/setup_env.sh" "$venv" "$build"

# Python 3.10: python3.10 on PATH if it runs (a pyenv shim may not), else pyenv's.
python310() {
  local candidate
  for candidate in "$(command -v python3.10 || true)" "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.10*/bin/python3.10; do
    if [ -x "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  echo "scripts/test.sh: no Python 3.10 (python3.10 on PATH or pyenv's) for the node's 3.10 tests" >&2
  return 1
}
python_310="$(python310)"
echo "==> Python 3.10 venv without vLLM or torch ($python_310): $py310_venv"
TIMELY_LLM_VLLM_BUILD=none PYTHON="$python_310" bash "$repo/scripts/setup_env.sh" "$py310_venv" "$repo/build/py310/ros"

cd "$repo"
"$venv/bin/ruff" check timely_llm timely_llm_robot timely_llm_bench timely_llm_interfaces/python test
"$venv/bin/mypy"  # mypy.ini: the node's package, the robot package and the benchmark package
status=0
(. "$repo/scripts/ros_env.sh" "$venv" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" test) || status=$?
# The no_vllm tests live in modules that import without vLLM; the others' modules need it even to be collected.
mapfile -t no_vllm_modules < <(grep -l "no_vllm" test/test_*.py)
echo "==> the node tests that need no vLLM on Python 3.10: ${no_vllm_modules[*]}"
# Its remote-engine test serves from a vllm serve that this Python 3.11 venv's vLLM runs.
(. "$repo/scripts/ros_env.sh" "$py310_venv" && export TIMELY_LLM_VLLM_PYTHON="$venv/bin/python" &&
  "$py310_venv/bin/python" -m pytest -q -p no:cacheprovider -m no_vllm "${no_vllm_modules[@]}") || status=$?
exit "$status"
