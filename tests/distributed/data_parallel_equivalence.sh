#!/usr/bin/env bash
# Data parallelism through weft-train itself: N ranks with parallel.dp = N and parallel.zero = Z
# train the same global batches, with the same dropout masks, as one process, so the losses of every
# step and the final weights must agree to f32 reduction tolerance. SGD (with momentum) keeps rounding differences at rounding
# level; AdamW's first steps are sign-like (lr * g / |g|), so there a gradient element near zero whose
# sign differs in the last bit moves a weight by 2 lr, and runs drift apart by more than rounding.
#   usage: data_parallel_equivalence.sh WEFT_TRAIN COMPARE_CHECKPOINTS WORK_DIR RANKS ZERO [MPIRUN...]
#   WEFT_TEST_SETTINGS (environment): more weft-train arguments for every run (tools/device/shared-gpu-pass:
#   "--set train.device=cuda:0"); WEFT_TEST_PYTHON: the interpreter of the checks (default /usr/bin/python3)
set -euo pipefail
weft_train=$1 compare=$2 work=$3 ranks=$4 zero=$5
shift 5
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=(--set model.layers=2 --set model.dim=32 --set model.heads=2 --set model.seq_len=32 --set model.dropout=0.1
        --set train.batch_size=8 --set train.micro_batches=2 --set train.steps=6 --set train.warmup_steps=2
        --set train.optimizer=sgd --set train.lr=0.5 --set data.train="$work/text.txt" --set data.val_every=0 --set log.progress=plain)
config=$work/run.yaml
read -ra extra_settings <<< "${WEFT_TEST_SETTINGS:-}"
common+=("${extra_settings[@]}")

"$weft_train" "$config" "${common[@]}" --set checkpoint.dir="$work/single" --set log.metrics_file="$work/single.jsonl" >/dev/null
"${mpirun[@]}" -np "$ranks" "$weft_train" "$config" "${common[@]}" --set parallel.dp="$ranks" \
  --set parallel.zero="$zero" --set checkpoint.dir="$work/parallel" --set log.metrics_file="$work/parallel.jsonl" >/dev/null

"${WEFT_TEST_PYTHON:-/usr/bin/python3}" - "$work/single.jsonl" "$work/parallel.jsonl" <<'PYTHON'
import json, sys
single, parallel = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
assert len(single) == len(parallel) == 6, (len(single), len(parallel))
worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(single, parallel))
print("losses, one process :", " ".join(f"{r['loss']:.6f}" for r in single))
print("losses, data parallel:", " ".join(f"{r['loss']:.6f}" for r in parallel))
print(f"worst relative loss difference {worst:.3g}")
assert all(r["comm_ms"] > 0 for r in parallel), "data-parallel steps recorded no communication time"
if worst > 1e-4:
    sys.exit("the data-parallel losses differ from the single-process ones")
PYTHON
"$compare" "$work/parallel" "$work/single" 1e-4
