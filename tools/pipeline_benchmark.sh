#!/usr/bin/env bash
# Pipeline schedules on the CPU: the same model (8 blocks, dim 128 by default) in one process and at
# pp = RANKS with M micro-batches under every schedule, in both comm modes, and a table of the mean
# per step after two warm-up steps: step time, tokens/s against the one-process run of the same call
# (the peer), and the measured pipeline bubble (mean over stages of each stage's idle share of the
# pipeline's span, as the papers count it) next to the schedule's bubble in theory.
#   usage: [CONFIG=run.yaml] [SEQUENCES=2] [MPIRUN_OPTIONS=...] [MODES="manual auto"]
#          tools/pipeline_benchmark.sh [WEFT_TRAIN] [RANKS] [MICRO_BATCHES] [weft-train arguments...]
# CONFIG runs its model instead (GPUs: tools/device/multi-gpu-pass), SEQUENCES is the sequences a
# micro-batch holds, MPIRUN_OPTIONS is added to mpirun's (e.g. "--bind-to none -x LD_LIBRARY_PATH"),
# and the trailing arguments to every weft-train run (e.g. --set data.train=...). MODES the comm
# modes to run: manual, auto, and direct (the auto mode with parallel.pp_transport direct: NCCL
# send/recv between the stages on GPUs, where the others go through host memory). The modes of one
# schedule run the same computations in the same order, so their losses must be the same bits: the
# table's last column says so, and a difference fails the run (exit status 1).
set -euo pipefail
weft_train=${1:-build/bin/weft-train}
ranks=${2:-4}
micro_batches=${3:-8}
shift $(( $# > 3 ? 3 : $# ))
steps=${STEPS:-8}
work=$(mktemp -d /tmp/weft-pipeline.XXXXXX)
mpirun=(mpirun --oversubscribe ${MPIRUN_OPTIONS:-})
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
if [[ -n ${CONFIG:-} ]]; then
  model=("$CONFIG")
else
  printf 'model:\n  type: gpt\n' > "$work/run.yaml"
  model=("$work/run.yaml" --set model.layers=${LAYERS:-8} --set model.dim=${DIM:-128} --set model.heads=4
         --set model.seq_len=64 --set model.vocab=256)
fi
common=("${model[@]}" --set train.batch_size=$((${SEQUENCES:-2} * micro_batches))
        --set train.micro_batches=$micro_batches --set train.steps=$steps --set train.warmup_steps=2
        --set data.val_every=0 --set log.progress=plain --set log.every=1000 "$@")
"$weft_train" "${common[@]}" --set log.metrics_file="$work/one.jsonl" >/dev/null
runs=(one)
for schedule in gpipe 1f1b interleaved zero_bubble; do
  chunks=1
  [[ $schedule == interleaved ]] && chunks=2
  for mode in ${MODES:-manual auto}; do
    name="${schedule}_${mode}"
    route=(--set comm.mode=$mode)
    [[ $mode == direct ]] && route=(--set comm.mode=auto --set parallel.pp_transport=direct)
    "${mpirun[@]}" -np "$ranks" "$weft_train" "${common[@]}" --set parallel.pp=$ranks \
      --set parallel.pp_schedule=$schedule --set parallel.pp_virtual=$chunks "${route[@]}" \
      --set log.metrics_file="$work/$name.jsonl" >/dev/null
    runs+=("$name")
  done
done
/usr/bin/python3 - "$work" "$ranks" "$micro_batches" "${runs[@]}" <<'PYTHON'
import json, sys
work, ranks, micro_batches, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def mean_of(run, key):
    rows = [json.loads(l) for l in open(f"{work}/{run}.jsonl") if '"loss"' in l][2:]
    return sum(r[key] for r in rows) / len(rows)
base = mean_of("one", "tokens_per_s")
def losses(run):
    return [json.loads(l)["loss"] for l in open(f"{work}/{run}.jsonl") if '"loss"' in l]
print(f"pp {ranks}, {micro_batches} micro-batches")
print(f"{'run':<26}{'step ms':>9}{'tokens/s':>10}{'vs pp 1':>9}{'bubble':>9}{'theory':>9}  losses")
differ = []
for run in runs:
    if run == "one":
        print(f"{'one process (pp 1)':<26}{mean_of(run, 'step_ms'):>9.1f}{mean_of(run, 'tokens_per_s'):>10.0f}{1.0:>9.2f}")
        continue
    schedule, mode = run.rsplit("_", 1)
    first = next(r for r in runs if r != "one" and r.rsplit("_", 1)[0] == schedule)
    same = "" if first == run else ("= " + first.rsplit("_", 1)[1] if losses(run) == losses(first) else "DIFFER")
    if same == "DIFFER":
        differ.append(f"{run} against {first}")
    print(f"{schedule + ', ' + mode:<26}{mean_of(run, 'step_ms'):>9.1f}{mean_of(run, 'tokens_per_s'):>10.0f}"
          f"{mean_of(run, 'tokens_per_s') / base:>9.2f}{mean_of(run, 'pipeline_bubble'):>9.3f}"
          f"{mean_of(run, 'pipeline_bubble_theory'):>9.3f}  {same}")
if differ:
    sys.exit("the losses differ bit for bit between modes of one schedule: " + "; ".join(differ))
PYTHON
