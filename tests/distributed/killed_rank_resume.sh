#!/usr/bin/env bash
# A rank killed mid-step loses only the steps since the last checkpoint: 2 ranks save every step,
# rank 1 is SIGKILLed in the backward of step 4 (WEFT_FAULT), mpirun ends the job; resuming from
# `latest` (step 3) to the end gives the losses and weights of a run that was never interrupted,
# bit for bit.
#   usage: killed_rank_resume.sh WEFT_TRAIN COMPARE_CHECKPOINTS WORK_DIR [MPIRUN...]
set -euo pipefail
weft_train=$1 compare=$2 work=$3
shift 3
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.layers=1 --set model.dim=32 --set model.heads=2 --set model.seq_len=32
        --set model.dropout=0.1 --set train.batch_size=8 --set train.steps=6 --set train.warmup_steps=2
        --set data.train="$work/text.txt" --set data.val_every=0 --set log.progress=plain --set parallel.dp=2)

"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set checkpoint.dir="$work/straight" \
  --set log.metrics_file="$work/straight.jsonl" >/dev/null
if "${mpirun[@]}" -np 2 -x WEFT_FAULT=kill:rank=1:step=4:phase=backward "$weft_train" "${common[@]}" \
    --set checkpoint.dir="$work/killed" --set checkpoint.every=1 --set log.metrics_file="$work/killed.jsonl" \
    >"$work/killed.log" 2>&1; then
  echo "FAIL: the run with a killed rank exited 0"; exit 1
fi
[[ "$(cat "$work/killed/latest")" == step_00000003 ]] || { echo "FAIL: latest is $(cat "$work/killed/latest")"; exit 1; }
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set checkpoint.dir="$work/killed" --set checkpoint.resume=latest \
  --set log.metrics_file="$work/killed.jsonl" >/dev/null
/usr/bin/python3 - "$work/straight.jsonl" "$work/killed.jsonl" <<'PYTHON'
import json, sys
straight, resumed = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
assert [r["step"] for r in resumed] == list(range(1, 7)), [r["step"] for r in resumed]
assert [r["loss"] for r in straight] == [r["loss"] for r in resumed], (straight, resumed)
print("losses after the kill and resume:", " ".join(repr(r["loss"]) for r in resumed))
PYTHON
"$compare" "$work/killed" "$work/straight" 0
