#!/usr/bin/env bash
# Resharding on load: a run at dp 2 x tp 2 (4 ranks) saves at step 3 of 6; the checkpoint (full
# tensors) resumes at tp 1 in one process and at tp 4 on 4 ranks, and at dp 2 x tp 2 in the other
# comm mode; each resumed run's losses for steps 4-6 agree with the uninterrupted run's to f32
# reduction tolerance (another tp sums partial products in another order), and at the same mesh
# bit for bit.
#   usage: tensor_parallel_resume.sh WEFT_TRAIN WORK_DIR ZERO [MPIRUN...]
set -euo pipefail
weft_train=$1 work=$2 zero=$3
shift 3
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.layers=2 --set model.dim=32 --set model.heads=4 --set model.seq_len=32
        --set train.batch_size=8 --set train.steps=6 --set train.warmup_steps=2 --set train.optimizer=sgd
        --set train.lr=0.5 --set data.train="$work/text.txt" --set data.val_every=0 --set log.progress=plain)

"${mpirun[@]}" -np 4 "$weft_train" "${common[@]}" --set parallel.dp=2 --set parallel.tp=2 --set parallel.zero="$zero" \
  --set checkpoint.dir="$work/straight" --set checkpoint.every=3 --set log.metrics_file="$work/straight.jsonl" >/dev/null
resume=(--set checkpoint.resume="$work/straight/step_00000003")
"$weft_train" "${common[@]}" "${resume[@]}" --set checkpoint.dir="$work/tp1" --set log.metrics_file="$work/tp1.jsonl" >/dev/null
"${mpirun[@]}" -np 4 "$weft_train" "${common[@]}" "${resume[@]}" --set parallel.tp=4 --set parallel.zero=0 \
  --set checkpoint.dir="$work/tp4" --set log.metrics_file="$work/tp4.jsonl" >/dev/null
"${mpirun[@]}" -np 4 "$weft_train" "${common[@]}" "${resume[@]}" --set parallel.dp=2 --set parallel.tp=2 \
  --set parallel.zero="$zero" --set checkpoint.dir="$work/same" --set log.metrics_file="$work/same.jsonl" >/dev/null

/usr/bin/python3 "$(dirname "$0")/../support/resumed_losses.py" "$work" tp1=1e-4 tp4=1e-4 same=0
