#!/usr/bin/env bash
# weft-train under an MPI that grants less than MPI_THREAD_MULTIPLE (WEFT_MPI_THREAD_LEVEL):
# serialized still runs the auto comm mode (weft serializes its MPI calls) with the losses of the
# multiple-level run bit for bit; funneled (only the main thread may call MPI) runs the manual mode
# and refuses the auto mode's communication threads with a message saying what to do, on every rank.
#   usage: thread_levels.sh WEFT_TRAIN WORK_DIR [MPIRUN...]
set -euo pipefail
weft_train=$1 work=$2
shift 2
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.layers=2 --set model.dim=32 --set model.heads=2 --set model.seq_len=32
        --set train.batch_size=8 --set train.steps=4 --set train.warmup_steps=1 --set data.train="$work/text.txt"
        --set data.val_every=0 --set log.progress=plain --set parallel.dp=2 --set comm.bucket_mb=0.01)
losses() { /usr/bin/python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "\"loss\"" in l))' "$1"; }
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set comm.mode=auto --set log.metrics_file="$work/multiple.jsonl" >/dev/null
"${mpirun[@]}" -np 2 -x WEFT_MPI_THREAD_LEVEL=serialized "$weft_train" "${common[@]}" --set comm.mode=auto \
  --set log.metrics_file="$work/serialized.jsonl" >/dev/null
[[ "$(losses "$work/serialized.jsonl")" == "$(losses "$work/multiple.jsonl")" ]] || { echo "FAIL: serialized losses differ"; exit 1; }
echo "serialized, auto: the losses of the multiple-level run"
"${mpirun[@]}" -np 2 -x WEFT_MPI_THREAD_LEVEL=funneled "$weft_train" "${common[@]}" --set comm.mode=manual \
  --set log.metrics_file="$work/funneled.jsonl" >/dev/null
[[ "$(losses "$work/funneled.jsonl")" == "$(losses "$work/multiple.jsonl")" ]] || { echo "FAIL: funneled losses differ"; exit 1; }
echo "funneled, manual: the same losses"
if output=$(timeout 60 "${mpirun[@]}" -np 2 -x WEFT_MPI_THREAD_LEVEL=funneled "$weft_train" "${common[@]}" \
    --set comm.mode=auto 2>&1); then
  echo "FAIL: funneled with the auto mode was accepted"; exit 1
fi
grep -q "below MPI_THREAD_SERIALIZED, so collectives cannot run from a thread other than main" <<< "$output" ||
  { echo "FAIL: $output"; exit 1; }
echo "funneled, auto: refused with the message"
