#!/usr/bin/env bash
# Pipeline parallelism through weft-train: RANKS processes as dp x tp x pp train the same batches,
# from the same weights and dropout masks, as one process, in both comm modes, under one schedule.
# Every step's loss, the validation losses and the final weights (checkpoints are gathered in the
# global layout) agree with the one-process run to f32 tolerance: the pipeline computes each segment
# as one process does, but a tied embedding's gradient is the sum of the first stage's lookup part
# and the last stage's head part, where one process accumulates the two parts micro-batch by
# micro-batch (and tp and dp sum in their own orders). Manual against auto: the same work in the
# same order on every rank, so without tensor parallelism the losses are bitwise equal. With tp the
# two modes' tensor-parallel layers round differently in places (a Llama at these shapes differs
# in the gradient norm's last bits at tp 2 without any pipeline, too), so there they agree to
# tolerance. The auto mode runs a second time over parallel.pp_transport direct, which must match
# its host-route run bitwise. The start-up log names the cut and the
# schedule, and every step reports the bubble next to the schedule's theory and each stage's memory.
#   usage: pipeline_equivalence.sh WEFT_TRAIN COMPARE_CHECKPOINTS WORK_DIR DP TP PP SCHEDULE CHUNKS MODEL LAYERS ZERO [MPIRUN...]
#   WEFT_TEST_SETTINGS (environment): more weft-train arguments for every run (tools/device/shared-gpu-pass:
#   "--set train.device=cuda:0"); WEFT_TEST_PYTHON: the interpreter of the checks (default /usr/bin/python3)
set -euo pipefail
weft_train=$1 compare=$2 work=$3 dp=$4 tp=$5 pp=$6 schedule=$7 chunks=$8 model=$9 layers=${10} zero=${11}
shift 11
mpirun=("$@")
ranks=$((dp * tp * pp))
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.type="$model" --set model.layers="$layers" --set model.dim=32
        --set model.heads=4 --set model.seq_len=16 --set model.dropout=0.1 --set train.batch_size=8
        --set train.micro_batches=4 --set train.steps=6 --set train.warmup_steps=2 --set train.optimizer=sgd
        --set train.lr=0.5 --set train.grad_clip=1.0 --set data.train="$work/text.txt" --set data.val_every=3
        --set log.progress=plain)
[ "$model" = llama ] && common+=(--set model.kv_heads=2)
read -ra extra_settings <<< "${WEFT_TEST_SETTINGS:-}"
common+=("${extra_settings[@]}")

"$weft_train" "${common[@]}" --set checkpoint.dir="$work/single" --set log.metrics_file="$work/single.jsonl" >/dev/null
for mode in manual auto; do
  "${mpirun[@]}" -np "$ranks" "$weft_train" "${common[@]}" --set parallel.dp="$dp" --set parallel.tp="$tp" \
    --set parallel.pp="$pp" --set parallel.pp_schedule="$schedule" --set parallel.pp_virtual="$chunks" \
    --set parallel.zero="$zero" \
    --set comm.mode="$mode" --set checkpoint.dir="$work/$mode" --set log.metrics_file="$work/$mode.jsonl" \
    --set log.trace_file="$work/$mode.trace.json" > "$work/$mode.log"
done
# The auto mode again over parallel.pp_transport direct (the step's messages by a process group per
# direction, paired in order; MPI here, NCCL on GPUs): the same computations in the same order, so
# its losses and weights equal the host route's bit for bit. Every send waits for its receive, as
# NCCL's does (WEFT_MPI_SYNCHRONOUS_SENDS: these messages, 2-4 KB, would otherwise leave eagerly),
# so the plan is checked under NCCL's rendezvous.
WEFT_MPI_SYNCHRONOUS_SENDS=1 "${mpirun[@]}" -x WEFT_MPI_SYNCHRONOUS_SENDS -np "$ranks" "$weft_train" "${common[@]}" --set parallel.dp="$dp" --set parallel.tp="$tp" \
  --set parallel.pp="$pp" --set parallel.pp_schedule="$schedule" --set parallel.pp_virtual="$chunks" \
  --set parallel.zero="$zero" --set comm.mode=auto --set parallel.pp_transport=direct \
  --set checkpoint.dir="$work/direct" --set log.metrics_file="$work/direct.jsonl" > "$work/direct.log"
grep -q "pp $pp" "$work/manual.log" || { echo "FAIL: the start-up log does not report pp $pp"; exit 1; }
grep -q "pipeline schedule $schedule" "$work/auto.log" || { echo "FAIL: the start-up log does not name the schedule"; exit 1; }
grep -q "pipeline messages: parallel.pp_transport direct" "$work/direct.log" || { echo "FAIL: the start-up log does not name the direct route"; exit 1; }
grep -q "^stage 0" "$work/auto.log" || grep -q "stage 0" "$work/auto.log" || { echo "FAIL: the cut is not logged"; exit 1; }
grep -q "bubble" "$work/auto.log" || { echo "FAIL: the steps do not report the bubble"; exit 1; }
# With dp > 1 the auto mode chooses a bucket size per stage (each stage's dp group for its own
# gradients): the log names every stage's choice.
if [ "$dp" -gt 1 ] && [[ "${WEFT_TEST_SETTINGS:-}" != *comm.calibrate=off* ]]; then
  [ "$(grep -c "cost model, stage [0-9]*: bucket" "$work/auto.log")" -eq "$pp" ] ||
    { grep "cost model" "$work/auto.log"; echo "FAIL: the log does not name the bucket size of each of the $pp stages"; exit 1; }
fi
[ "$(grep -c '"pipeline bubble"' "$work/auto.trace.json")" -eq $((6 * ranks)) ] ||
  { echo "FAIL: the trace does not hold a bubble counter per step and rank"; exit 1; }

"${WEFT_TEST_PYTHON:-/usr/bin/python3}" - "$work" "$tp" "$pp" "$(dirname "$0")/../support" <<'PYTHON'
import sys
work, tp, pp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, sys.argv[4])
from training_metrics import read, expect_one_process_losses
for mode in ("manual", "auto"):
    steps, _ = read(work, mode)
    bubbles = [r["pipeline_bubble"] for r in steps]
    theory = steps[0]["pipeline_bubble_theory"]
    expect_one_process_losses(work, mode, "pipeline",
                              note=f"; bubble {sum(bubbles) / len(bubbles):.3f} (theory {theory:.3f})")
    if not all(0.0 <= b < 1.0 for b in bubbles) or not 0.0 < theory < 1.0:
        sys.exit(f"the {mode} mode's bubble figures are out of range: {bubbles}, theory {theory}")
    if not all(len(r["stage_memory_mb"]) == pp and min(r["stage_memory_mb"]) > 0 for r in steps):
        sys.exit(f"the {mode} mode's steps do not give the memory of each of the {pp} stages")
manual, _ = read(work, "manual")
auto, _ = read(work, "auto")
if tp == 1 and [r["loss"] for r in manual] != [r["loss"] for r in auto]:
    sys.exit("without tensor parallelism the manual and auto pipeline losses must be bitwise equal")
direct, _ = read(work, "direct")
if [r["loss"] for r in direct] != [r["loss"] for r in auto]:
    sys.exit("parallel.pp_transport direct must give the host route's losses bit for bit: "
             f"{[r['loss'] for r in direct]} against {[r['loss'] for r in auto]}")
PYTHON
for mode in manual auto; do "$compare" "$work/$mode" "$work/single" 1e-4; done
"$compare" "$work/direct" "$work/auto" 0
