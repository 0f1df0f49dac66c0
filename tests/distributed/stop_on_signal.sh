#!/usr/bin/env bash
# Stopping a run with a signal (launcher/stop_signal.h), through weft-train on the CPU, in one process
# (RANKS 1) or under mpirun with parallel.dp = RANKS / (TP * PP), parallel.tp = TP, parallel.pp = PP.
#   resume          SIGTERM to the last rank only, after a few steps: every rank exits 0 at the same
#                   step, rank 0 says where it stopped and how to resume, and a checkpoint of that
#                   step is latest; resuming it with checkpoint.resume=latest to the end gives the
#                   losses of an uninterrupted run, bit for bit.
#   second-signal   SIGTERM, then SIGINT while the step is still running: the process ends at once,
#                   killed by SIGINT, without the checkpoint the first signal asked for.
#   every-minutes   checkpoint.every_minutes far below a step's time: a checkpoint at every step.
#   usage: stop_on_signal.sh MODE WEFT_TRAIN WORK_DIR RANKS [MPIRUN...]
#   STEPS_IN_FLIGHT (environment): train.steps_in_flight for every run (default: the key's default)
#   TP, PP (environment): parallel.tp and parallel.pp (default 1; PP micro-batches a step): the vote
#                     must reach every rank of every group, not only the dp group's (a tp rank that
#                     saved alone left its peer in a collective)
set -euo pipefail
mode=$1 weft_train=$2 work=$3 ranks=$4
shift 4
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
launch=("$weft_train")
if ((ranks > 1)); then launch=("${mpirun[@]}" -np "$ranks" "$weft_train"); fi
common=("$work/run.yaml" --set model.layers=1 --set model.dim=32 --set model.heads=2 --set model.seq_len=32
        --set model.dropout=0.1 --set train.batch_size=8 --set train.warmup_steps=2 --set data.train="$work/text.txt"
        --set data.val_every=0 --set log.progress=plain --set log.every=50 --set parallel.dp="$((ranks / ${TP:-1} / ${PP:-1}))"
        --set parallel.tp="${TP:-1}" --set parallel.pp="${PP:-1}" --set train.micro_batches="${PP:-1}"
        --set train.steps_in_flight="${STEPS_IN_FLIGHT:-0}")

fail() { echo "FAIL: $*"; exit 1; }

# Waits (up to 30 s) until the metrics file shows step $2 of the run whose launcher is $1; on
# failure shows the end of the run's log $4.
wait_for_step() {
  local launcher=$1 step=$2 metrics=$3 log=$4
  for _ in $(seq 1 600); do
    grep -q "\"step\":$step," "$metrics" 2>/dev/null && return 0
    kill -0 "$launcher" 2>/dev/null || { tail -20 "$log"; fail "the run ended before step $step"; }
    sleep 0.05
  done
  tail -20 "$log"
  fail "no step $step in $metrics after 30 s"
}

# The process id of world rank $2 of the run whose launcher is $1: the launcher itself in one
# process, otherwise the child of mpirun whose environment says that rank. Looked for again for up
# to 2 s: once, in a CI run with other tests beside it, a single look found no such child while
# the run went on.
rank_pid() {
  local launcher=$1 rank=$2
  if ((ranks == 1)); then echo "$launcher"; return; fi
  for _ in $(seq 1 40); do
    for child in $(pgrep -P "$launcher"); do
      if tr '\0' '\n' < "/proc/$child/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then
        echo "$child"; return
      fi
    done
    sleep 0.05
  done
  fail "no process of rank $rank under mpirun (pid $launcher; children: $(pgrep -P "$launcher" | tr '\n' ' '))"
}

case $mode in
resume)
  steps=300
  "${launch[@]}" "${common[@]}" --set train.steps=$steps --set checkpoint.dir="$work/straight" \
    --set log.metrics_file="$work/straight.jsonl" > "$work/straight.log" 2>&1 ||
    { tail -20 "$work/straight.log"; fail "the uninterrupted run failed"; }

  "${launch[@]}" "${common[@]}" --set train.steps=$steps --set checkpoint.dir="$work/stopped" \
    --set log.metrics_file="$work/stopped.jsonl" > "$work/stopped.log" 2>&1 &
  launcher=$!
  wait_for_step "$launcher" 3 "$work/stopped.jsonl" "$work/stopped.log"
  # (A failure inside $(...) only ends the subshell: say it, with the run's log, out here.)
  target=$(rank_pid "$launcher" $((ranks - 1))) || { cat "$work/stopped.log"; fail "${target#FAIL: }"; }
  kill -TERM "$target"
  status=0
  wait "$launcher" || status=$?
  cat "$work/stopped.log"
  ((status == 0)) || fail "the stopped run exited with status $status"
  line=$(grep "stopped at step" "$work/stopped.log") || fail "no 'stopped at step' line"
  stop_step=$(sed -E 's/.*stopped at step ([0-9]+) .*/\1/' <<< "$line")
  ((stop_step >= 3 && stop_step < steps)) || fail "stopped at step $stop_step, not between 3 and $steps"
  grep -q -- "--set checkpoint.resume=latest" <<< "$line" || fail "the line does not say how to resume"
  [[ $(grep -c "stopped at step" "$work/stopped.log") == 1 ]] || fail "more than one 'stopped' line"
  [[ $(cat "$work/stopped/latest") == $(printf 'step_%08d' "$stop_step") ]] ||
    fail "latest is $(cat "$work/stopped/latest"), not the stop step $stop_step"

  "${launch[@]}" "${common[@]}" --set train.steps=$steps --set checkpoint.dir="$work/stopped" \
    --set log.metrics_file="$work/stopped.jsonl" --set checkpoint.resume=latest > "$work/resumed.log" 2>&1 ||
    { tail -20 "$work/resumed.log"; fail "the resumed run failed"; }
  grep -q "resumed from .* at step $stop_step" "$work/resumed.log" || fail "the run did not resume at step $stop_step"
  /usr/bin/python3 - "$work/straight.jsonl" "$work/stopped.jsonl" "$stop_step" <<'PYTHON'
import json, sys
straight, stopped = ([(r["step"], r["loss"]) for r in map(json.loads, open(p))] for p in sys.argv[1:3])
print(f"stopped at step {sys.argv[3]}; {len(stopped)} steps after resuming, {len(straight)} straight")
if stopped != straight:
    bad = next(i for i, (a, b) in enumerate(zip(stopped, straight)) if a != b) if len(stopped) == len(straight) else -1
    sys.exit(f"the stopped and resumed losses differ from the uninterrupted run's (first at index {bad})")
PYTHON
  ;;

second-signal)
  # A model whose step takes about a second, so that the second signal comes during the step.
  "${launch[@]}" "${common[@]}" --set model.layers=4 --set model.dim=256 --set model.heads=4 --set model.seq_len=128 \
    --set train.batch_size=16 --set train.steps=20 --set checkpoint.dir="$work/checkpoints" \
    --set log.metrics_file="$work/metrics.jsonl" > "$work/run.log" 2>&1 &
  launcher=$!
  wait_for_step "$launcher" 1 "$work/metrics.jsonl" "$work/run.log"
  target=$(rank_pid "$launcher" $((ranks - 1))) || { cat "$work/run.log"; fail "${target#FAIL: }"; }
  kill -TERM "$target"
  sleep 0.3  # the first signal is handled (standard signals do not queue: a second one sent at once could merge)
  kill -INT "$target"
  status=0
  wait "$launcher" || status=$?
  cat "$work/run.log"
  ((status != 0)) || fail "the run exited 0 after a second signal"
  if ((ranks == 1)); then ((status == 130)) || fail "exit status $status, not 130 (killed by SIGINT)"; fi
  ! grep -q "stopped at step" "$work/run.log" || fail "the run stopped cleanly instead of at once"
  [[ ! -e "$work/checkpoints/latest" ]] || fail "a checkpoint was written after the second signal"
  echo "ended at once with status $status"
  ;;

every-minutes)
  steps=12
  # 1e-5 minutes is 0.6 ms, less than one step: every step's boundary finds a save due.
  "${launch[@]}" "${common[@]}" --set train.steps=$steps --set checkpoint.dir="$work/checkpoints" \
    --set checkpoint.every_minutes=1e-5 > "$work/run.log" 2>&1 || { tail -20 "$work/run.log"; fail "the run failed"; }
  saved=$(find "$work/checkpoints" -maxdepth 1 -name 'step_*' | wc -l)
  echo "$saved checkpoints in $steps steps"
  ((saved >= steps - 1)) || fail "only $saved checkpoints in $steps steps with checkpoint.every_minutes=1e-5"
  [[ $(grep -c "checkpoint saved to .*step_00000012" "$work/run.log") == 1 ]] || fail "the last step was not saved once"
  ;;

*) fail "unknown mode '$mode'" ;;
esac
