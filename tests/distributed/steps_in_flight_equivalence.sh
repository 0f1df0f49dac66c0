#!/usr/bin/env bash
# train.steps_in_flight through weft-train on the CPU: 2 (each step issued before the last one's
# loss is read) gives bitwise the losses, the validation losses, the checkpoints (the same steps,
# the same weights and optimizer state) and the final weights of 1, with evaluations and saves
# between steps, in one process or under mpirun with parallel.dp = RANKS in both comm modes. The
# start-up log says which was used. With train.on_nan: skip and a NaN loss injected on rank 0 at
# step 5 (WEFT_FAULT=nan), step 5 is skipped on every rank and 2 still gives bitwise 1's losses and
# checkpoints: step 6 is issued before step 5 is known to be skipped (5 is the one step here after
# which the run neither evaluates nor saves, which finish before the next issue), and its AdamW
# update must use the counts the skip leaves. 2 is refused on a pipeline, naming the keys.
#   usage: steps_in_flight_equivalence.sh WEFT_TRAIN COMPARE_CHECKPOINTS WORK_DIR RANKS [MPIRUN...]
set -euo pipefail
weft_train=$1 compare=$2 work=$3 ranks=$4
shift 4
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
launch=("$weft_train")
modes=(manual)
if ((ranks > 1)); then launch=("${mpirun[@]}" -np "$ranks" "$weft_train"); modes=(manual auto); fi
common=("$work/run.yaml" --set model.layers=2 --set model.dim=32 --set model.heads=2 --set model.seq_len=32
        --set model.dropout=0.1 --set train.batch_size=8 --set train.steps=7 --set train.warmup_steps=2
        --set data.train="$work/text.txt" --set data.val_every=3 --set checkpoint.every=2 --set checkpoint.keep=10
        --set log.progress=plain --set log.every=1 --set parallel.dp="$ranks")
fail() { echo "FAIL: $*"; exit 1; }

for mode in "${modes[@]}"; do
  for in_flight in 1 2; do
    name="${mode}_$in_flight"
    "${launch[@]}" "${common[@]}" --set comm.mode="$mode" --set train.steps_in_flight="$in_flight" \
      --set checkpoint.dir="$work/$name" --set log.metrics_file="$work/$name.jsonl" > "$work/$name.log" 2>&1 ||
      { cat "$work/$name.log"; fail "the run $name failed"; }
  done
  grep -q "steps in flight: 2 (train.steps_in_flight" "$work/${mode}_2.log" ||
    fail "the start-up log of the steps_in_flight 2 run does not say so"
  ! grep -q "steps in flight" "$work/${mode}_1.log" || fail "the steps_in_flight 1 run claims steps in flight"
  [ "$(ls "$work/${mode}_1")" = "$(ls "$work/${mode}_2")" ] ||
    fail "$mode: the checkpoint folders differ: $(ls "$work/${mode}_1") against $(ls "$work/${mode}_2")"
done

/usr/bin/python3 - "$work" "$(dirname "$0")/../support" "${modes[@]}" <<'PYTHON'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from training_metrics import read
for mode in sys.argv[3:]:
    one, one_val = read(work, f"{mode}_1")
    two, two_val = read(work, f"{mode}_2")
    assert len(one) == 7 and len(one_val) == 3, (len(one), len(one_val))
    print(f"{mode} steps_in_flight 2 losses:", " ".join(f"{r['loss']:.9f}" for r in two))
    if [r["step"] for r in two] != [r["step"] for r in one]:
        sys.exit(f"{mode}: the steps logged differ")
    if [r["loss"] for r in two] != [r["loss"] for r in one] or two_val != one_val:
        sys.exit(f"{mode}: train.steps_in_flight 2 changed the losses")
    if any(r["step_ms"] <= 0 for r in two):
        sys.exit(f"{mode}: a step time is not positive: {[r['step_ms'] for r in two]}")
PYTHON
for mode in "${modes[@]}"; do
  for step in "$work/${mode}_1"/step_*; do
    "$compare" "$step" "$work/${mode}_2/$(basename "$step")" 0
  done
done

# A skipped step (train.on_nan: skip, a NaN loss on rank 0 at step 5), one mode.
for in_flight in 1 2; do
  name="skip_$in_flight"
  WEFT_FAULT=nan:rank=0:step=5 "${launch[@]}" "${common[@]}" --set comm.mode="${modes[-1]}" --set train.on_nan=skip \
    --set train.steps_in_flight="$in_flight" --set checkpoint.dir="$work/$name" \
    --set log.metrics_file="$work/$name.jsonl" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "the run $name failed"; }
done
grep -q "steps in flight: 2 (train.steps_in_flight" "$work/skip_2.log" ||
  fail "the on_nan skip run with steps_in_flight 2 did not keep two steps in flight"
/usr/bin/python3 - "$work" "$(dirname "$0")/../support" <<'PYTHON'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from training_metrics import read
one, one_val = read(work, "skip_1")
two, two_val = read(work, "skip_2")
for name, rows in (("1", one), ("2", two)):
    skipped = [r["step"] for r in rows if r["skipped"]]
    if skipped != [5] or rows[4]["loss"] is not None:
        sys.exit(f"steps_in_flight {name}: skipped steps {skipped}, step 5's loss {rows[4]['loss']} (expected [5], null)")
print("skipped step 5, steps_in_flight 2 losses:", " ".join("null" if r["loss"] is None else f"{r['loss']:.9f}" for r in two))
if [r["loss"] for r in two] != [r["loss"] for r in one] or two_val != one_val:
    sys.exit("with a skipped step, train.steps_in_flight 2 changed the losses")
PYTHON
for step in "$work/skip_1"/step_*; do
  "$compare" "$step" "$work/skip_2/$(basename "$step")" 0
done
if output=$("$weft_train" "${common[@]}" --set parallel.dp=1 --set parallel.pp=2 --set train.micro_batches=2 \
            --set train.steps_in_flight=2 --set checkpoint.dir= 2>&1); then
  fail "train.steps_in_flight 2 on a pipeline was accepted"
fi
grep -q "train.steps_in_flight.*not offered on a pipeline (parallel.pp" <<< "$output" || fail "unexpected message: $output"
echo "train.steps_in_flight 2 matches 1 bitwise"
