#!/usr/bin/env bash
# Activation recomputation through weft-train: train.recompute selective and full give bitwise the
# losses (every step's and every validation loss) and the final weights of none, on one mesh, in
# both comm modes, with dropout on (the masks are replayed in backward). Recomputation changes what
# is kept and when it is computed, never the values or the order of any reduction, so the runs are
# compared exactly. RANKS 1 runs one process without mpirun (comm.mode manual only: the modes differ
# only across processes).
#   usage: recompute_equivalence.sh WEFT_TRAIN COMPARE_CHECKPOINTS WORK_DIR RANKS DP TP PP SP SCHEDULE MODEL [MPIRUN...]
#   MODEL: gpt (learned positions, layer norm, GELU, tied) or llama (rope, RMSNorm, SwiGLU, GQA, untied)
set -euo pipefail
weft_train=$1 compare=$2 work=$3 ranks=$4 dp=$5 tp=$6 pp=$7 sp=$8 schedule=$9 model=${10}
shift 10
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.type="$model" --set model.layers=4 --set model.dim=32 --set model.heads=4
        --set model.seq_len=32 --set model.dropout=0.1 --set train.batch_size=8 --set train.micro_batches=4
        --set train.steps=5 --set train.warmup_steps=2 --set train.lr=0.01 --set data.train="$work/text.txt"
        --set data.val_every=3 --set log.progress=plain
        --set parallel.dp="$dp" --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.sp="$sp"
        --set parallel.pp_schedule="$schedule")
[ "$model" = llama ] && common+=(--set model.kv_heads=2)
modes=(manual auto)
[ "$ranks" = 1 ] && modes=(manual) && mpirun=()
[ "$ranks" != 1 ] && mpirun+=(-np "$ranks")

for mode in "${modes[@]}"; do
  for recompute in none selective full; do
    name="${mode}_${recompute}"
    "${mpirun[@]}" "$weft_train" "${common[@]}" --set comm.mode="$mode" --set train.recompute="$recompute" \
      --set checkpoint.dir="$work/$name" --set log.metrics_file="$work/$name.jsonl" > "$work/$name.log"
  done
  grep -q "activation recomputation: full" "$work/${mode}_full.log" ||
    { echo "FAIL: the start-up log of the full run does not report the recomputation"; exit 1; }
done

/usr/bin/python3 - "$work" "$(dirname "$0")/../support" "${modes[@]}" <<'PYTHON'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from training_metrics import read
for mode in sys.argv[3:]:
    none, none_val = read(work, f"{mode}_none")
    assert len(none) == 5 and len(none_val) >= 1, (len(none), len(none_val))
    for recompute in ("selective", "full"):
        steps, val = read(work, f"{mode}_{recompute}")
        print(f"{mode} {recompute:9s} losses:", " ".join(f"{r['loss']:.9f}" for r in steps), "(none:",
              " ".join(f"{r['loss']:.9f}" for r in none) + ")")
        if [r["loss"] for r in steps] != [r["loss"] for r in none] or val != none_val:
            sys.exit(f"comm.mode {mode}: train.recompute {recompute} changed the losses")
PYTHON
for mode in "${modes[@]}"; do
  for recompute in selective full; do "$compare" "$work/${mode}_$recompute" "$work/${mode}_none" 0; done
done
echo "recompute selective and full match none bitwise"
