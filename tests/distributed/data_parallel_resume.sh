#!/usr/bin/env bash
# Checkpoints of a data-parallel run: 2 ranks with ZeRO stage Z train 6 steps straight, saving at
# step 3; a second run resumes from that step-3 checkpoint at the same dp and must end with the same
# weights bit for bit. Resuming at another dp is refused with a message naming both settings.
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

if message=$("$weft_train" "${common[@]}" --set parallel.dp=1 --set checkpoint.resume="$work/straight" 2>&1); then
  echo "FAIL: resuming a dp=2 checkpoint with dp=1 was accepted"; exit 1
fi
echo "$message" | tail -1
echo "$message" | grep -q "saved with parallel.dp = 2" || { echo "FAIL: the refusal does not name the saved dp"; exit 1; }
