#!/usr/bin/env bash
# The custom layer under tensor parallelism: squared_relu_tp.yaml on 2 ranks against
# squared_relu.yaml in one process, 6 steps: the losses agree to f32 reduction tolerance, so the
# plan in the YAML split the layer correctly.
#   usage: compare_tensor_parallel.sh CUSTOM_TRAIN SOURCE_DIR WORK_DIR MPIRUN...
set -euo pipefail
train=$1 source=$2 work=$3
shift 3
rm -rf "$work" && mkdir -p "$work"
steps=(--set train.steps=6 --set log.progress=plain)
"$train" "$source/squared_relu.yaml" "${steps[@]}" --set log.metrics_file="$work/one.jsonl" >/dev/null
"$@" -np 2 "$train" "$source/squared_relu_tp.yaml" "${steps[@]}" --set log.metrics_file="$work/tp.jsonl" >/dev/null
/usr/bin/python3 - "$work/one.jsonl" "$work/tp.jsonl" <<'PYTHON'
import json, sys
one, tp = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
worst = max(abs(a - b) / abs(a) for a, b in zip(one, tp))
print("one process:", one, "\ntp 2       :", tp, f"\nworst relative difference {worst:.3g}")
sys.exit(0 if len(one) == len(tp) == 6 and worst < 1e-4 else "the tensor-parallel custom layer does not match one process")
PYTHON
