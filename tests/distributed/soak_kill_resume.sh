#!/usr/bin/env bash
# The soak test (ctest label soak, outside the default set; run it with `ctest -L soak`): a two-rank
# CPU run of STEPS steps (2000 by default) with a checkpoint every 50, killed (SIGKILL of a rank,
# WEFT_FAULT) at three random steps and resumed from `latest` each time, must end with the losses of
# every step and the final parameters bitwise equal to an uninterrupted run's.
#   usage: soak_kill_resume.sh WEFT_TRAIN COMPARE_CHECKPOINTS WORK_DIR [MPIRUN...]
set -euo pipefail
weft_train=$1 compare=$2 work=$3
shift 3
mpirun=("$@")
steps=${STEPS:-2000}
seed=${SOAK_SEED:-$RANDOM}
rm -rf "$work" && mkdir -p "$work"
for i in $(seq 1 2000); do echo "line $i of the soak text: the quick brown fox jumps over the lazy dog $((i % 13))."; done \
  > "$work/text.txt"
printf 'model:\n  type: gpt\n' > "$work/run.yaml"
common=("$work/run.yaml" --set model.layers=1 --set model.dim=32 --set model.heads=2 --set model.seq_len=32
        --set model.dropout=0.1 --set train.batch_size=8 --set train.steps="$steps" --set train.warmup_steps=20
        --set data.train="$work/text.txt" --set data.val_every=0 --set log.progress=plain --set log.every=500
        --set parallel.dp=2 --set parallel.zero=1 --set comm.mode=auto --set checkpoint.every=50)
start=$(date +%s)
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set checkpoint.dir="$work/straight" \
  --set log.metrics_file="$work/straight.jsonl" >/dev/null
straight_s=$(( $(date +%s) - start ))
# Three kill steps in (1, steps), increasing, from the printed seed.
mapfile -t kills < <(/usr/bin/python3 -c "import random; r = random.Random($seed); print(*sorted(r.sample(range(2, $steps), 3)), sep='\n')")
echo "seed $seed: killing rank 1 at steps ${kills[*]}"
start=$(date +%s)
resume=()
for kill in "${kills[@]}"; do
  if "${mpirun[@]}" -np 2 -x WEFT_FAULT="kill:rank=1:step=$kill:phase=backward" "$weft_train" "${common[@]}" \
      --set checkpoint.dir="$work/killed" --set log.metrics_file="$work/killed.jsonl" "${resume[@]}" >/dev/null 2>&1; then
    echo "FAIL: the run to be killed at step $kill exited 0"; exit 1
  fi
  echo "killed at step $kill; latest is $(cat "$work/killed/latest" 2>/dev/null || echo "none yet")"
  resume=(--set checkpoint.resume=latest)
done
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set checkpoint.dir="$work/killed" --set log.metrics_file="$work/killed.jsonl" \
  "${resume[@]}" >/dev/null
killed_s=$(( $(date +%s) - start ))
/usr/bin/python3 - "$work/straight.jsonl" "$work/killed.jsonl" "$steps" <<'PYTHON'
import json, sys
straight, killed = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
steps = int(sys.argv[3])
assert [r["step"] for r in killed] == list(range(1, steps + 1)), "the resumed runs do not cover every step once"
assert [r["loss"] for r in straight] == [r["loss"] for r in killed], "losses differ"
print(f"{steps} steps: every loss equal; last {killed[-1]['loss']!r}")
PYTHON
"$compare" "$work/killed" "$work/straight" 0
echo "uninterrupted run ${straight_s} s; killed three times and resumed ${killed_s} s"
