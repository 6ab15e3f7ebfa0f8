#!/usr/bin/env bash
# The GPU check: run where an NVIDIA GPU is present, in a venv with vLLM's CUDA build (scripts/setup_env.sh
# picks it there). The CPU suite (scripts/test.sh) never collects test_gpu/.
#   1. test_gpu/ (marker gpu): CUDA vLLM start, SmolLM2 plans in bfloat16 and float16, segmented = straight token
#      for token, resumes from the prefix cache, KV offloading; tensor parallel (marker multi_gpu) with 2+ GPUs.
#   2. The benchmark, printing: step time (timely-llm profile's fit), resume cost (segment_overhead), and the
#      urgent response under timelyllm vs vllm-stream on the first BENCH_SECONDS of WID1 (timely-llm bench).
# Usage: scripts/test_gpu.sh [VENV]    (default .venv; results under build/gpu/)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo/.venv}"
out="$repo/build/gpu"
dtype="${GPU_DTYPE:-bfloat16}"
seconds="${BENCH_SECONDS:-60}"
# shellcheck source=/dev/null
. "$repo/scripts/ros_env.sh" "$venv"
cd "$repo"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"

gpus="$(nvidia-smi -L | grep -c '^GPU' || true)"
echo "==> GPU check on $gpus GPU(s): $(nvidia-smi -L | head -1)"
"$venv/bin/python" -c 'import vllm, torch; assert torch.version.cuda, "torch is a CPU build"; print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.version.cuda)'
marker="gpu"
[ "$gpus" -gt 1 ] || marker="gpu and not multi_gpu"
echo "==> tests: pytest -m '$marker' test_gpu"
"$venv/bin/python" -m pytest -q -p no:cacheprovider -m "$marker" test_gpu

echo "==> step time: timely-llm profile, SmolLM2 in $dtype"
"$venv/bin/timely-llm" profile --model smollm2 --vllm-arg "dtype=$dtype" --out "$out/gpu-smollm2.yaml"

echo "==> resume cost: segment_overhead (tiny model, 1000-token prompt; then SmolLM2 generating a plan)"
"$venv/bin/python" -m timely_llm_bench.evaluation.segment_overhead --prompt-tokens 1000
"$venv/bin/python" -m timely_llm_bench.evaluation.segment_overhead --model smollm2 \
  --task "Scene: [], Task: [A] Could you find the cat? If so, go to it."

echo "==> urgent response: timelyllm vs vllm-stream, the first $seconds s of WID1 on SmolLM2 in $dtype"
"$venv/bin/timely-llm" workload --workload WID1 --out "$out/wid1.json"
"$venv/bin/python" - "$out/wid1.json" "$out/wid1-cut.json" "$seconds" <<'EOF'
import json, sys
workload = json.load(open(sys.argv[1]))
workload["requests"] = [r for r in workload["requests"] if r["arrival"] < float(sys.argv[3])]
json.dump(workload, open(sys.argv[2], "w"))
print(len(workload["requests"]), "requests")
EOF
for policy in timelyllm vllm-stream; do
  "$venv/bin/timely-llm" bench --engine vllm --model smollm2 --vllm-arg "dtype=$dtype" \
    --estimator-profile "$out/gpu-smollm2.yaml" --workload "$out/wid1-cut.json" --policy "$policy" \
    --out "$out/$policy.json"
done
"$venv/bin/timely-llm" table "$out/timelyllm.json" "$out/vllm-stream.json"
