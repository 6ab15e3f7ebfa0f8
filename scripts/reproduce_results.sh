#!/usr/bin/env bash
# Regenerates the results tables of docs/simulator.md:
# every policy on WID1 (low and high load), WID2 and WID3
# on the simulator with the RTX 4090 profile, seed 0, with vLLM's default batch cap (256) and with
# the artifact's max_num_seqs=8 (CAPS="none 8"). Results go to results/, plots to results/plots-cap*.
set -euo pipefail
py="${PYTHON:-python3}"
hw="${HW:-rtx4090-llama3-8b}"
mkdir -p results
for cap in ${CAPS:-none 8}; do
  files=()
  cap_args=()
  if [ "$cap" != none ]; then cap_args=(--max-batch "$cap"); fi
  for workload in WID1 WID1-high WID2 WID3; do
    for policy in vllm vllm-stream vllm-priority fcfs edf timelyllm isolated; do
      out="results/$workload-$policy-cap$cap.json"
      "$py" -m timely_llm.cli bench --engine sim --hw "$hw" --workload "$workload" --policy "$policy" \
        --seed 0 "${cap_args[@]}" --out "$out" > /dev/null
      files+=("$out")
    done
  done
  echo "batch cap $cap:"
  "$py" -m timely_llm.cli table "${files[@]}"
  "$py" -m timely_llm.cli plot "${files[@]}" --out "results/plots-cap$cap" > /dev/null || true
done
