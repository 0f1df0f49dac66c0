#!/usr/bin/env bash
# Faults while a checkpoint is written, through weft-train (WEFT_FAULT, parallel/step/fault_injection.h):
# - SIGKILL at each phase of the save of step 4 (after tensors.bin, after state.json, after the
#   rename into place, after the new `latest` is written but before it replaces the old one):
#   `latest` still names a complete checkpoint, and resuming from it ends with the losses of a run
#   that was never interrupted, bit for bit;
# - a write that fails as on a full disk: with checkpoint.on_save_error: stop the run ends with an
#   error naming the disk and the last complete checkpoint, which is kept, with no leftovers; with
#   continue the run trains on and the later saves succeed.
#   usage: checkpoint_faults.sh WEFT_TRAIN WORK_DIR
set -euo pipefail
weft_train=$1 work=$2
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.layers=1 --set model.dim=32 --set model.heads=2 --set model.seq_len=32
        --set model.dropout=0.1 --set train.batch_size=8 --set train.steps=6 --set train.warmup_steps=2
        --set data.train="$work/text.txt" --set data.val_every=0 --set log.progress=plain --set checkpoint.every=1)
losses() { /usr/bin/python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "\"loss\"" in l))' "$1"; }

"$weft_train" "${common[@]}" --set checkpoint.dir="$work/straight" --set log.metrics_file="$work/straight.jsonl" >/dev/null
expected=$(losses "$work/straight.jsonl")

for phase in tensors state rename latest; do
  dir=$work/kill_$phase
  if WEFT_FAULT=kill:rank=0:step=4:phase=checkpoint_$phase "$weft_train" "${common[@]}" --set checkpoint.dir="$dir" \
      --set log.metrics_file="$dir.jsonl" >/dev/null 2>&1; then
    echo "FAIL: the run killed in the $phase phase exited 0"; exit 1
  fi
  [[ "$(cat "$dir/latest")" == step_00000003 ]] || { echo "FAIL ($phase): latest is $(cat "$dir/latest")"; exit 1; }
  "$weft_train" "${common[@]}" --set checkpoint.dir="$dir" --set checkpoint.resume=latest \
    --set log.metrics_file="$dir.jsonl" >/dev/null
  [[ "$(losses "$dir.jsonl")" == "$expected" ]] || { echo "FAIL ($phase): losses differ after resume"; exit 1; }
  echo "killed after the $phase phase of a save: latest kept step 3, the resumed losses are the uninterrupted ones"
done

dir=$work/full_stop
if output=$(WEFT_FAULT=fail_write:rank=0:step=4:phase=checkpoint_tensors "$weft_train" "${common[@]}" \
    --set checkpoint.dir="$dir" 2>&1); then
  echo "FAIL: a failed save with on_save_error: stop exited 0"; exit 1
fi
grep -q "cannot write the checkpoint of step 4: No space left on device" <<< "$output" || { echo "FAIL: $output"; exit 1; }
grep -q "the last complete checkpoint is $dir/step_00000003" <<< "$output" || { echo "FAIL: $output"; exit 1; }
[[ "$(cat "$dir/latest")" == step_00000003 && ! -e "$dir/step_00000004" ]] || { echo "FAIL: step 4 or latest"; exit 1; }
if ls -A "$dir" | grep -q '^\.'; then echo "FAIL: leftovers in $dir: $(ls -A "$dir")"; exit 1; fi
echo "a full disk with on_save_error: stop: a clear error, step 3 kept, no leftovers"

dir=$work/full_continue
output=$(WEFT_FAULT=fail_write:rank=0:step=4:phase=checkpoint_tensors "$weft_train" "${common[@]}" \
  --set checkpoint.dir="$dir" --set checkpoint.on_save_error=continue 2>&1)
grep -q "step 4  checkpoint not saved: .*No space left on device.*training goes on" <<< "$output" || { echo "FAIL: $output"; exit 1; }
[[ "$(cat "$dir/latest")" == step_00000006 && ! -e "$dir/step_00000004" ]] || { echo "FAIL: later saves"; exit 1; }
echo "a full disk with on_save_error: continue: training went on, steps 5 and 6 saved"
