#!/usr/bin/env bash
# Tensor parallelism on the CPU: the same model (4 blocks, dim 256 by default) in one process and at
# tp = RANKS, in both comm modes, with and without sequence parallelism, and a table of the mean per
# step after two warm-up steps: step time, tokens/s, and tokens/s against the one-process run of
# the same call (the peer: the one process uses every core through its BLAS threads, each tp rank
# its share of them).
#   usage: tools/tensor_parallel_benchmark.sh [WEFT_TRAIN] [RANKS]
set -euo pipefail
weft_train=${1:-build/bin/weft-train}
ranks=${2:-2}
steps=${STEPS:-10}
work=$(mktemp -d /tmp/weft-tensor-parallel.XXXXXX)
mpirun=(mpirun --oversubscribe)
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
printf 'model:\n  type: gpt\n' > "$work/run.yaml"
common=("$work/run.yaml" --set model.layers=${LAYERS:-4} --set model.dim=${DIM:-256} --set model.heads=4
        --set model.seq_len=128 --set model.vocab=256 --set train.batch_size=8 --set train.steps=$steps
        --set train.warmup_steps=2 --set data.val_every=0 --set log.progress=plain --set log.every=1000)
"$weft_train" "${common[@]}" --set log.metrics_file="$work/one.jsonl" >/dev/null
runs=(one)
for sp in false true; do
  for mode in manual auto; do
    name="${mode}_sp_${sp}"
    "${mpirun[@]}" -np "$ranks" "$weft_train" "${common[@]}" --set parallel.tp=$ranks --set parallel.sp=$sp \
      --set comm.mode=$mode --set log.metrics_file="$work/$name.jsonl" >/dev/null
    runs+=("$name")
  done
done
/usr/bin/python3 - "$work" "$ranks" "${runs[@]}" <<'PYTHON'
import json, sys
work, ranks, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
def mean_of(run, key):
    rows = [json.loads(l) for l in open(f"{work}/{run}.jsonl") if '"loss"' in l][2:]
    return sum(r[key] for r in rows) / len(rows)
base = mean_of("one", "tokens_per_s")
print(f"{'run':<22}{'step ms':>10}{'tokens/s':>10}{'vs tp 1':>9}")
for run in runs:
    label = "one process (tp 1)" if run == "one" else f"tp {ranks} " + run.replace("_sp_", ", sp ")
    print(f"{label:<22}{mean_of(run, 'step_ms'):>10.1f}{mean_of(run, 'tokens_per_s'):>10.0f}"
          f"{mean_of(run, 'tokens_per_s') / base:>9.2f}")
PYTHON
