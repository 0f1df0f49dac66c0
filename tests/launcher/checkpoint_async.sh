#!/usr/bin/env bash
# checkpoint.async through weft-train: background writes give the same checkpoints, bit for bit,
# as writes in line (one process and dp=2 with ZeRO 1, checkpoints every step), a resume from one of
# them is bit-exact, and a background write that fails stops the run (on_save_error: stop) or is
# reported while training goes on (continue).
#   usage: checkpoint_async.sh WEFT_TRAIN COMPARE_CHECKPOINTS WORK_DIR [MPIRUN...]
set -euo pipefail
weft_train=$1 compare=$2 work=$3
shift 3
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.layers=1 --set model.dim=32 --set model.heads=2 --set model.seq_len=32
        --set model.dropout=0.1 --set train.batch_size=8 --set train.steps=6 --set train.warmup_steps=2
        --set data.train="$work/text.txt" --set data.val_every=3 --set data.val_batches=1 --set log.progress=plain
        --set checkpoint.every=1)

"$weft_train" "${common[@]}" --set checkpoint.dir="$work/inline" >/dev/null
"$weft_train" "${common[@]}" --set checkpoint.dir="$work/async" --set checkpoint.async=true >/dev/null
for step in 3 6; do
  "$compare" "$work/async/step_0000000$step" "$work/inline/step_0000000$step" 0 >/dev/null
done
echo "one process: the background checkpoints of steps 3 and 6 equal the in-line ones bit for bit"
"$weft_train" "${common[@]}" --set checkpoint.dir="$work/async" --set checkpoint.async=true \
  --set checkpoint.resume="$work/async/step_00000003" --set checkpoint.keep=0 >/dev/null
"$compare" "$work/async" "$work/inline" 0 >/dev/null
echo "a resume from a background checkpoint ends bit for bit where the in-line run did"

"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set parallel.dp=2 --set parallel.zero=1 \
  --set checkpoint.dir="$work/dp_inline" >/dev/null
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set parallel.dp=2 --set parallel.zero=1 \
  --set checkpoint.dir="$work/dp_async" --set checkpoint.async=true >/dev/null
"$compare" "$work/dp_async" "$work/dp_inline" 0 >/dev/null
echo "dp=2, ZeRO 1: the background checkpoints equal the in-line ones"

if output=$(WEFT_FAULT=fail_write:rank=0:step=4:phase=checkpoint_tensors "$weft_train" "${common[@]}" \
    --set checkpoint.dir="$work/async_full" --set checkpoint.async=true 2>&1); then
  echo "FAIL: a failed background save with on_save_error: stop exited 0"; exit 1
fi
grep -q "cannot write the checkpoint of step 4: No space left on device" <<< "$output" || { echo "FAIL: $output"; exit 1; }
[[ "$(cat "$work/async_full/latest")" == step_00000003 ]] || { echo "FAIL: latest $(cat "$work/async_full/latest")"; exit 1; }
output=$(WEFT_FAULT=fail_write:rank=0:step=4:phase=checkpoint_tensors "$weft_train" "${common[@]}" \
  --set checkpoint.dir="$work/async_continue" --set checkpoint.async=true --set checkpoint.on_save_error=continue 2>&1)
grep -q "step 4  checkpoint not saved" <<< "$output" || { echo "FAIL: $output"; exit 1; }
[[ "$(cat "$work/async_continue/latest")" == step_00000006 ]] || { echo "FAIL: later background saves"; exit 1; }
echo "a failed background save stops the run (stop) or is reported while training goes on (continue)"
