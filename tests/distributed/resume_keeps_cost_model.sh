#!/usr/bin/env bash
# A resumed auto-mode run chooses by the figures of the run it continues, not by a new measurement
# (launcher/cost_model_setup.h: a new measurement can tip a choice, and on a GPU another bucket
# layout sums the gradient norm's f32 squares in another order). The first run reads made-up figures
# (comm.calibration_file: collectives without latency, compute a thousand times slower than
# measured) under which the cost model picks 64 KB buckets, where figures measured here pick larger
# ones; it saves at step 2. Resumed from step 2 without the file, the run must say it took the
# checkpoint's figures, pick 64 KB again and end with the first run's weights bit for bit. The file
# the first run read is left as it was; a run resumed at another layout measures and says why; a
# damaged "cost_model" in state.json is refused with a message naming it.
#   usage: resume_keeps_cost_model.sh WEFT_TRAIN COMPARE_CHECKPOINTS WORK_DIR [MPIRUN...]
set -euo pipefail
weft_train=$1 compare=$2 work=$3
shift 3
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
fail() { echo "FAIL: $*"; exit 1; }
common=("$work/run.yaml" --set model.layers=4 --set model.dim=64 --set model.heads=2 --set model.seq_len=32
        --set train.batch_size=8 --set train.steps=4 --set train.warmup_steps=2 --set data.train="$work/text.txt"
        --set data.val_every=0 --set log.progress=plain --set parallel.dp=2 --set parallel.zero=2 --set comm.mode=auto)

# Measured figures, then the made-up ones derived from them.
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set train.steps=1 --set comm.calibrate=on \
  --set comm.calibration_file="$work/measured.json" > "$work/measured.log" 2>&1 ||
  { cat "$work/measured.log"; fail "the measuring run failed"; }
/usr/bin/python3 - "$work/measured.json" "$work/made_up.json" <<'PYTHON'
import json, sys
figures = json.load(open(sys.argv[1]))
for collective in figures["collectives"]:
    collective["latency_ms"] = 0.0
    collective["bytes_per_ms"] /= 100
for rate in ("matmul_flops_per_ms", "attention_flops_per_ms", "memory_bytes_per_ms"):
    figures["compute"][rate] /= 1000
figures["source"] = "made up by resume_keeps_cost_model.sh"
json.dump(figures, open(sys.argv[2], "w"))
PYTHON

cp "$work/made_up.json" "$work/made_up.copy.json"
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set comm.calibration_file="$work/made_up.json" \
  --set checkpoint.dir="$work/straight" --set checkpoint.every=2 > "$work/straight.log" 2>&1 ||
  { cat "$work/straight.log"; fail "the first run failed"; }
cmp -s "$work/made_up.json" "$work/made_up.copy.json" || fail "a calibration file that was read was written over"
grep -q "cost model: bucket 64 KB" "$work/straight.log" ||
  { grep "cost model" "$work/straight.log"; fail "the made-up figures did not choose 64 KB buckets"; }
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set checkpoint.dir="$work/resumed" \
  --set checkpoint.resume="$work/straight/step_00000002" > "$work/resumed.log" 2>&1 ||
  { cat "$work/resumed.log"; fail "the resumed run failed"; }
grep -q "cost model: the figures of the run being resumed (made up by resume_keeps_cost_model.sh), not measured again" \
  "$work/resumed.log" || { grep "cost model" "$work/resumed.log"; fail "the resumed run did not take the checkpoint's figures"; }
grep -q "cost model: bucket 64 KB" "$work/resumed.log" ||
  { grep "cost model" "$work/resumed.log"; fail "the resumed run chose another bucket size than the run it continues"; }
"$compare" "$work/resumed" "$work/straight" 0

# comm.calibrate: on still measures anew (what it says it does).
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set checkpoint.dir="$work/remeasured" --set comm.calibrate=on \
  --set checkpoint.resume="$work/straight/step_00000002" > "$work/remeasured.log" 2>&1 ||
  { cat "$work/remeasured.log"; fail "the resumed run with comm.calibrate: on failed"; }
grep -q "cost model: measured on 2 rank(s)" "$work/remeasured.log" ||
  { grep "cost model" "$work/remeasured.log"; fail "comm.calibrate: on did not measure on resume"; }

# Figures saved for another layout are not used: a run resumed at dp 1 measures, and says why.
"$weft_train" "${common[@]}" --set parallel.dp=1 --set parallel.zero=0 --set checkpoint.dir="$work/dp1" \
  --set checkpoint.resume="$work/straight/step_00000002" > "$work/dp1.log" 2>&1 ||
  { cat "$work/dp1.log"; fail "the run resumed at dp 1 failed"; }
grep -q "cost model: the resumed checkpoint's figures are not used (saved at dp 2 tp 1 pp 1, this run is at dp 1 tp 1 pp 1): measured anew" \
  "$work/dp1.log" || { grep "cost model" "$work/dp1.log"; fail "the run resumed at dp 1 did not say why it measured"; }

# A damaged cost_model is named.
cp -r "$work/straight/step_00000002" "$work/damaged"
/usr/bin/python3 - "$work/damaged/state.json" <<'PYTHON'
import json, sys
state = json.load(open(sys.argv[1]))
state["cost_model"]["compute"]["matmul_flops_per_ms"] = -1.0
json.dump(state, open(sys.argv[1], "w"))
PYTHON
bash "$(dirname "$0")/expect_failure.sh" 60 \
  "the resumed checkpoint's cost_model \(state.json\): 'matmul_flops_per_ms' = -1 must be positive" -- \
  "${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set checkpoint.dir="$work/from_damaged" \
  --set checkpoint.resume="$work/damaged" > "$work/damaged.log" || { cat "$work/damaged.log"; fail "the damaged figures were not named"; }
echo "resumed with the checkpoint's figures: 64 KB buckets again, the same weights bit for bit"
