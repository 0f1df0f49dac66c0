#!/usr/bin/env bash
# checkpoint.keep at the level of weft-train: with checkpoint.every=1 and checkpoint.keep=2 a run
# leaves the two newest step folders, `latest` naming the last, and every folder that is not a step
# folder untouched; a resumed run prunes the same way. Then one flipped byte inside a tensor of the
# latest checkpoint stops the next resume with a message that names the tensor, the step and the
# previous checkpoint.
#   usage: checkpoint_keep.sh WEFT_TRAIN WORK_DIR
set -euo pipefail
weft_train=$1 work=$2
rm -rf "$work" && mkdir -p "$work/checkpoints/notes"
for i in $(seq 1 200); do echo "the quick brown fox jumps over the lazy dog."; done > "$work/text.txt"
printf 'model:\n  type: gpt\n  layers: 1\n  dim: 32\n  heads: 2\n  seq_len: 32\n' > "$work/run.yaml"
train() {
  "$weft_train" "$work/run.yaml" --set data.train="$work/text.txt" --set train.warmup_steps=1 \
    --set data.val_every=0 --set log.progress=plain --set checkpoint.dir="$work/checkpoints" \
    --set checkpoint.every=1 --set checkpoint.keep=2 "$@"
}
expect_folder() {
  local got
  got=$(cd "$work/checkpoints" && ls -A | tr '\n' ' ')
  [[ $got == "$1" ]] || { echo "FAIL: expected the checkpoint folder to hold '$1', got '$got'"; exit 1; }
  [[ $(cat "$work/checkpoints/latest") == "$2" ]] || { echo "FAIL: latest should name $2"; exit 1; }
}

train --set train.steps=5 >/dev/null
expect_folder "latest notes step_00000004 step_00000005 " step_00000005
train --set train.steps=7 --set checkpoint.resume=latest >/dev/null
expect_folder "latest notes step_00000006 step_00000007 " step_00000007
echo "kept: $(cd "$work/checkpoints" && ls -A | tr '\n' ' ')"

# A flipped byte in the middle of tensors.bin lies inside some tensor's data (the weights are
# nearly all of the file).
file=$work/checkpoints/step_00000007/tensors.bin
middle=$(( $(stat -c %s "$file") / 2 ))
byte=$(od -An -tu1 -j "$middle" -N1 "$file" | tr -d ' ')
printf "$(printf '\\%03o' $(( byte ^ 16 )))" | dd of="$file" bs=1 seek="$middle" conv=notrunc status=none
if train --set train.steps=9 --set checkpoint.resume=latest > /dev/null 2> "$work/error.txt"; then
  echo "FAIL: a damaged checkpoint was loaded"; exit 1
fi
cat "$work/error.txt"
for part in "the tensor '" "of step 7 does not match its checksum" \
            "checkpoint.resume: $work/checkpoints/step_00000006"; do
  grep -qF -- "$part" "$work/error.txt" || { echo "FAIL: the error does not say: $part"; exit 1; }
done
