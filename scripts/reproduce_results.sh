#!/usr/bin/env bash
# Regenerates README's results table: every policy on WID1 (low and high load), WID2 and WID3
# on the simulator with the RTX 4090 profile, seed 0. Results go to results/, plots to results/plots.
set -euo pipefail
py="${PYTHON:-python3}"
hw="${HW:-rtx4090-llama3-8b}"
mkdir -p results
files=()
for workload in WID1 WID1-high WID2 WID3; do
  for policy in vllm vllm-stream fcfs edf timelyllm isolated; do
    out="results/$workload-$policy.json"
    "$py" -m timely_llm.cli bench --engine sim --hw "$hw" --workload "$workload" --policy "$policy" \
      --seed 0 --out "$out" > /dev/null
    files+=("$out")
  done
done
"$py" -m timely_llm.cli table "${files[@]}"
"$py" -m timely_llm.cli plot "${files[@]}" --out results/plots > /dev/null || true
