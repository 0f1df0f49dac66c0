#!/usr/bin/env bash
# Checkpoints in the global layout across pipeline sizes: a run at pp 2 (1F1B) saves at step 3 of 6;
# the checkpoint resumes in one process (pp 1), at pp 4 (zero bubble) and at pp 2 in the other
# comm mode. Each resumed run's losses for steps 4-6 agree with the uninterrupted run's to f32
# tolerance (another cut sums the tied embedding's gradient in another order), and at the same
# mesh and schedule bit for bit. Dropout is on: each dropout stream resumes where the stage that
# runs its module left it (Strategy::random_state).
#   usage: pipeline_resume.sh WEFT_TRAIN WORK_DIR [MPIRUN...]
set -euo pipefail
weft_train=$1 work=$2
shift 2
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.layers=4 --set model.dim=32 --set model.heads=4 --set model.seq_len=16
        --set model.dropout=0.1 --set train.batch_size=8 --set train.micro_batches=4 --set train.steps=6 --set train.warmup_steps=2
        --set train.optimizer=adamw --set train.lr=0.01 --set data.train="$work/text.txt" --set data.val_every=0
        --set log.progress=plain)

"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set parallel.pp=2 --set checkpoint.dir="$work/straight" \
  --set checkpoint.every=3 --set log.metrics_file="$work/straight.jsonl" >/dev/null
resume=(--set checkpoint.resume="$work/straight/step_00000003")
"$weft_train" "${common[@]}" "${resume[@]}" --set checkpoint.dir="$work/pp1" --set log.metrics_file="$work/pp1.jsonl" >/dev/null
"${mpirun[@]}" -np 4 "$weft_train" "${common[@]}" "${resume[@]}" --set parallel.pp=4 \
  --set parallel.pp_schedule=zero_bubble --set checkpoint.dir="$work/pp4" --set log.metrics_file="$work/pp4.jsonl" >/dev/null
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" "${resume[@]}" --set parallel.pp=2 --set comm.mode=auto \
  --set checkpoint.dir="$work/same" --set log.metrics_file="$work/same.jsonl" >/dev/null

/usr/bin/python3 "$(dirname "$0")/../support/resumed_losses.py" "$work" pp1=1e-4 pp4=1e-4 same=0
