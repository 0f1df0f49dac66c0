#!/usr/bin/env bash
# Checkpoints of a data-parallel run: 2 ranks with ZeRO stage Z train 6 steps straight, saving at
# step 3; a second run resumes from that step-3 checkpoint at the same dp and must end with the same
# weights bit for bit. The same checkpoint resumed at dp 1 without ZeRO (checkpoints hold every
# tensor in the parameters' own layout) continues with the same losses to f32 reduction tolerance.
# MODE is the comm mode (auto: ZeRO's gathers of the last update wait for the next step, so the
# save must complete them first).
#   usage: data_parallel_resume.sh WEFT_TRAIN COMPARE_CHECKPOINTS WORK_DIR ZERO MODE [MPIRUN...]
set -euo pipefail
weft_train=$1 compare=$2 work=$3 zero=$4 mode=$5
shift 5
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.layers=1 --set model.dim=32 --set model.heads=2 --set model.seq_len=32
        --set model.dropout=0.1 --set train.batch_size=8 --set train.steps=6 --set train.warmup_steps=2
        --set data.train="$work/text.txt" --set data.val_every=0 --set log.progress=plain
        --set parallel.dp=2 --set parallel.zero="$zero" --set comm.mode="$mode")

"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set checkpoint.dir="$work/straight" --set checkpoint.every=3 >/dev/null
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set checkpoint.dir="$work/resumed" \
  --set checkpoint.resume="$work/straight/step_00000003" >/dev/null
"$compare" "$work/resumed" "$work/straight" 0

"$weft_train" "${common[@]}" --set parallel.dp=1 --set parallel.zero=0 --set checkpoint.dir="$work/dp1" \
  --set checkpoint.resume="$work/straight/step_00000003" --set log.metrics_file="$work/dp1.jsonl" >/dev/null
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set checkpoint.dir="$work/straight_log" \
  --set log.metrics_file="$work/straight.jsonl" >/dev/null
/usr/bin/python3 - "$work/straight.jsonl" "$work/dp1.jsonl" <<'PYTHON'
import json, sys
straight, resumed = ({r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r and "val_loss" not in r}
                     for p in sys.argv[1:3])
assert sorted(resumed) == [4, 5, 6], sorted(resumed)
worst = max(abs(resumed[s] - straight[s]) / abs(straight[s]) for s in resumed)
print(f"resumed at dp 1: worst relative loss difference over steps 4-6: {worst:.3g}")
if worst > 1e-4:
    sys.exit("the run resumed at dp 1 does not continue the dp 2 one")
PYTHON
