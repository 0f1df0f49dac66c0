#!/usr/bin/env bash
# The two comm modes on the CPU, side by side: weft-train under mpirun with parallel.dp = RANKS on a
# model big enough that communication shows (4 blocks, dim 256 by default), once per comm mode and
# bucket size, and a table of the mean per step after two warm-up steps: step time, communication,
# exposed communication (not hidden under compute) and tokens/s.
#   usage: tools/comm_modes_benchmark.sh [WEFT_TRAIN] [RANKS] [BUCKETS_MB...]
#   e.g.   tools/comm_modes_benchmark.sh build/bin/weft-train 2 25 4 1
set -euo pipefail
weft_train=${1:-build/bin/weft-train}
ranks=${2:-2}
shift $(( $# >= 2 ? 2 : $# ))
buckets=("$@")
[[ ${#buckets[@]} -gt 0 ]] || buckets=(25 4 1)
steps=${STEPS:-12}
work=$(mktemp -d /tmp/weft-comm-modes.XXXXXX)
mpirun=(mpirun --oversubscribe)
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
printf 'model:\n  type: gpt\n' > "$work/run.yaml"
common=("$work/run.yaml" --set model.layers=${LAYERS:-4} --set model.dim=${DIM:-256} --set model.heads=4
        --set model.seq_len=64 --set model.vocab=256 --set train.batch_size=$((8 * ranks)) --set train.steps=$steps
        --set train.warmup_steps=2 --set data.val_every=0 --set log.progress=plain --set log.every=1000
        --set parallel.dp=$ranks)
runs=()
for bucket in "${buckets[@]}"; do
  for mode in manual auto; do
    name="${mode}_${bucket}"
    "${mpirun[@]}" -np "$ranks" "$weft_train" "${common[@]}" --set comm.mode=$mode --set comm.bucket_mb=$bucket \
      --set log.metrics_file="$work/$name.jsonl" >/dev/null
    runs+=("$name")
  done
done
/usr/bin/python3 - "$work" "${runs[@]}" <<'PYTHON'
import json, sys
work, runs = sys.argv[1], sys.argv[2:]
print(f"{'mode':<8}{'bucket MB':>10}{'step ms':>10}{'comm ms':>10}{'exposed ms':>12}{'hidden':>8}{'tokens/s':>10}")
for run in runs:
    rows = [json.loads(l) for l in open(f"{work}/{run}.jsonl") if '"loss"' in l][2:]
    mean = lambda key: sum(r[key] for r in rows) / len(rows)
    comm, exposed = mean("comm_ms"), mean("exposed_comm_ms")
    mode, bucket = run.split("_")
    print(f"{mode:<8}{bucket:>10}{mean('step_ms'):>10.1f}{comm:>10.1f}{exposed:>12.1f}"
          f"{100 * (1 - exposed / comm) if comm else 0:>7.0f}%{mean('tokens_per_s'):>10.0f}")
PYTHON
rm -rf "$work"
