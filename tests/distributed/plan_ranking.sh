#!/usr/bin/env bash
# weft-plan's predictions against real runs: under mpirun -np 4 on the CPU, weft-plan calibrates
# (links and compute of the four ranks) and predicts every layout; weft-train then runs the six
# layouts of issue #15 (dp 4, tp 4, pp 4, dp 2 x tp 2, dp 2 x pp 2, tp 2 x pp 2; 4 micro-batches,
# 1F1B, no ZeRO, no sp) and their measured step times are compared with the predictions. Fails when
# two layouts whose measured times differ by more than MARGIN (default 30%) are ranked the other way
# round by the predictions; prints every prediction error.
# Four ranks on two cores, left to the scheduler, run in whatever regime the launch falls into
# (which ranks share a core, who waits for whom): the same layout measured up to 2-3x apart from one
# launch to the next (tp 4: 37 to 92 ms), which no prediction can follow. So every launch binds rank
# r to core r mod 2 (--map-by core --bind-to core:overload-allowed): neighbours in a tensor-parallel
# group always sit on different cores. A layout still measures 10-40% apart from one launch to the
# next (the regime of the launch, and a shared machine that is slower for minutes at a time), while
# the steps within a launch agree: a launch's figure is the median of its steps after the warm-up
# (a step that loses its core once moves a mean, not the median), and, as scheduling only ever adds
# time, a layout's figure is the fastest of its launches.
# Anything else on the two cores (a compiler beside the test) makes a launch that meets it up to 15
# times slower (tp 4: 600 ms against 40), and a calibration that meets it predicts that busy machine
# (tp 4 at 0.4-2.3 s, dp 4 well ahead of pp 4), not the quiet one that the fastest launches show. So
# each calibration and launch first waits until the cores were less than 10% busy over half a second
# (QUIET_S seconds of such checks and waits in all, default 40, after which the test takes the
# machine as it is: a load that stays does not go away by waiting).
# Where a comparison fails, weft-plan calibrates again and the verdict takes the quietest
# calibration so far, the one that predicts the six layouts fastest (the smallest product of their
# predictions; chosen without looking at the measurements); the layouts of the failing pairs (only
# those) are launched again, and all are judged on their fastest launch so far. A pair judged so
# fails only if no round launched both of them with a verdict that passes: where the two, launched
# side by side in one round, were in the predicted order or within the margin, the fastest launches'
# difference came from one launch that met a quieter (or busier) machine, not from the layouts
# (dp 4 once at 20.5 ms, then five launches at 27.6-30.0, beside pp 4's six at 26.7-28.8, in a CI
# run of 2026-12-07 whose two layouts were predicted 3-8% apart). Up to ATTEMPTS
# rounds (default 6), and none that would end, at the pace of the calibrations and launches so far
# and with the checks and waits still allowed, after BUDGET_S seconds from the start (default 150; a
# launch takes 2-3 s on a quiet machine, 3-9 s with a core taken), so that the test ends well within
# its 300 s.
# A ranking that is wrong by more than the margin fails in every calibration and every round:
# REVERSE_PREDICTIONS=1 gives each layout the prediction of its mirror in the predicted order (the
# fastest predicted takes the slowest's), and the test must then fail.
# Every weft-train launch reads the first calibration (comm.calibration_file) instead of measuring
# its own: a launch takes 2-3 s instead of 3-4 (with a core taken, 3-9 s instead of 11-23). The runs
# choose only the auto mode's gradient bucket size from it, and measure the same either way (six
# launches each: tp 4 35-38 ms, dp 2 x tp 2 30-33 ms).
#   usage: plan_ranking.sh WEFT_TRAIN WEFT_PLAN [CONFIG]
set -euo pipefail
weft_train=$1
weft_plan=$2
config=${3:-$(dirname "$0")/../../configs/tiny-cpu.yaml}
margin=${MARGIN:-0.30}
attempts=${ATTEMPTS:-6}
budget=${BUDGET_S:-150}
work=$(mktemp -d /tmp/weft-plan-ranking.XXXXXX)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe -np 4 --map-by core --bind-to core:overload-allowed)
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
model=(--set model.layers=4 --set model.dim=64 --set model.heads=4 --set model.seq_len=64 --set model.vocab=256
       --set train.batch_size=16 --set train.micro_batches=4 --set comm.mode=${MODE:-auto})
quiet_s=${QUIET_S:-40} waited=0
busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
quiet() {  # until the cores were less than 10% busy over half a second, QUIET_S seconds in all
  local start=$SECONDS before after
  while ((waited + SECONDS - start < quiet_s)); do
    before=($(busy)); sleep 0.5; after=($(busy))
    ((10 * (after[0] - before[0]) < after[1] - before[1])) && break
    sleep 1
  done
  waited=$((waited + SECONDS - start))
}
plans=0 plan_s=0
plan() {  # a calibration of its own (the file does not exist yet) and every layout's prediction, plan_N.json
  local start=$SECONDS before=$waited
  quiet
  plans=$((plans + 1))
  "${mpirun[@]}" "$weft_plan" "$config" "${model[@]}" --set comm.calibration_file="$work/calibration_$plans.json" \
    --gpus 4 --json "$work/plan_$plans.json" > "$work/plan_$plans.txt"
  plan_s=$((plan_s + SECONDS - start - (waited - before)))
}
launches=0 launch_s=0
measuring_round=1
measure() {  # one launch of each layout given ("dp tp pp"), its metrics in run_DP_TP_PP_N_rROUND.jsonl
  local start=$SECONDS before=$waited
  for layout in "$@"; do
    read -r dp tp pp <<<"$layout"
    launches=$((launches + 1))
    quiet
    "${mpirun[@]}" "$weft_train" "$config" "${model[@]}" --set comm.calibration_file="$work/calibration_1.json" \
      --set parallel.dp=$dp --set parallel.tp=$tp --set parallel.pp=$pp \
      --set train.steps=${STEPS:-10} --set train.warmup_steps=0 --set data.val_every=0 --set log.progress=plain \
      --set log.every=1000 --set log.metrics_file="$work/run_${dp}_${tp}_${pp}_${launches}_r$measuring_round.jsonl" \
      > "$work/run_${dp}_${tp}_${pp}.txt"
  done
  launch_s=$((launch_s + SECONDS - start - (waited - before)))
}
# Judges every calibration and launch so far; exits 1 on a failing pair and writes the layouts of
# the failing pairs to $work/again.
judge() {
/usr/bin/python3 - "$work" "$margin" "$1" "$plans" "${REVERSE_PREDICTIONS:-0}" "${layouts[@]}" <<'PYTHON'
import glob, itertools, json, math, re, statistics, sys
work, margin, round, plans, reverse = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
layouts = [tuple(map(int, l.split())) for l in sys.argv[6:]]
def predictions_of(n):
    plan = json.load(open(f"{work}/plan_{n}.json"))["layouts"]
    predictions = {}
    for dp, tp, pp in layouts:
        predicted = [l for l in plan if (l["dp"], l["tp"], l["pp"]) == (dp, tp, pp) and l["zero"] == 0
                     and l["micro_batches"] == 4 and not l["sp"] and l["pp_virtual"] == 1
                     and (pp == 1 or l["schedule"] == "1f1b")]
        assert len(predicted) == 1, f"weft-plan listed {len(predicted)} entries for dp {dp} tp {tp} pp {pp}"
        predictions[(dp, tp, pp)] = predicted[0]["step_ms"]
    return predictions
every = {n: predictions_of(n) for n in range(1, plans + 1)}
quietest = min(every, key=lambda n: sum(math.log(p) for p in every[n].values()))
predictions = every[quietest]
if reverse:  # the check of the check: a ranking known to be wrong
    order = sorted(layouts, key=lambda l: predictions[l])
    predictions = dict(zip(order, sorted(predictions.values(), reverse=True)))
rows = []
by_round = {}  # (dp, tp, pp) -> {round: that round's launch}
for dp, tp, pp in layouts:
    launches = []
    for path in glob.glob(f"{work}/run_{dp}_{tp}_{pp}_*_r*.jsonl"):
        launch, launch_round = map(int, re.search(r"_(\d+)_r(\d+)\.jsonl$", path).groups())
        steps = [json.loads(l)["step_ms"] for l in open(path) if '"loss"' in l]
        # after the warm-up (first steps allocate and connect)
        launches.append((launch, launch_round, statistics.median(steps[3:])))
    launches.sort()
    figures = [figure for _, _, figure in launches]
    by_round[(dp, tp, pp)] = {launch_round: figure for _, launch_round, figure in launches}
    rows.append((f"dp{dp} tp{tp} pp{pp}", predictions[(dp, tp, pp)], min(figures), figures, f"{dp} {tp} {pp}"))
def layout_of(row):
    return tuple(map(int, row[4].split()))
def passes(a, b, measured_a, measured_b):  # in the predicted order, or within the margin
    return ((a[1] - b[1]) * (measured_a - measured_b) > 0
            or max(measured_a, measured_b) <= (1 + margin) * min(measured_a, measured_b))
def side_by_side(a, b):  # the first round that launched both, and whose two launches pass
    rounds_a, rounds_b = by_round[layout_of(a)], by_round[layout_of(b)]
    return next((r for r in sorted(rounds_a) if r in rounds_b and passes(a, b, rounds_a[r], rounds_b[r])), None)
print(f"round {round}: the fastest launch of each layout so far (a launch: the median of its steps after the "
      f"warm-up); predictions of calibration {quietest} of {plans}" + (" (the quietest)" if plans > 1 else ""))
print(f"{'layout':<14}{'predicted ms':>14}{'measured ms':>13}{'error':>9}   launches (ms)")
for name, predicted, measured, figures, _ in sorted(rows, key=lambda r: r[2]):
    print(f"{name:<14}{predicted:>14.1f}{measured:>13.1f}{100 * (predicted - measured) / measured:>8.0f}%   "
          + ", ".join(f"{m:.1f}" for m in figures))
if plans > 1:
    print("every calibration's predictions (ms): " + "; ".join(
        f"{n}: " + " ".join(f"{every[n][l]:.1f}" for l in layouts) for n in every) + f"  ({', '.join(r[0] for r in rows)})")
concordant = discordant = 0
failures, again = [], []
for a, b in itertools.combinations(rows, 2):
    same = (a[1] - b[1]) * (a[2] - b[2]) > 0
    concordant += same
    discordant += not same
    if not passes(a, b, a[2], b[2]):
        passed_round = side_by_side(a, b)
        if passed_round is not None:
            rounds_a, rounds_b = by_round[layout_of(a)], by_round[layout_of(b)]
            print(f"  {a[0]} against {b[0]}: their fastest launches are in the other order, more than "
                  f"{100 * margin:.0f}% apart, but in round {passed_round}, launched side by side, they "
                  f"measured {rounds_a[passed_round]:.1f} and {rounds_b[passed_round]:.1f} ms")
            continue
        failures.append(f"{a[0]} ({a[2]:.1f} ms measured, {a[1]:.1f} predicted) against {b[0]} "
                        f"({b[2]:.1f} measured, {b[1]:.1f} predicted)")
        again += [r[4] for r in (a, b) if r[4] not in again]
print(f"pairs in the measured order: {concordant} of {concordant + discordant} "
      f"(Kendall tau {(concordant - discordant) / (concordant + discordant):.2f})")
open(f"{work}/again", "w").write("".join(f"{l}\n" for l in again))
if failures:
    print("ranked the other way round although the measured times differ by more than "
          f"{100 * margin:.0f}%:\n  " + "\n  ".join(failures))
    sys.exit(1)
PYTHON
}
layouts=("4 1 1" "1 4 1" "1 1 4" "2 2 1" "2 1 2" "1 2 2")
plan
measure "${layouts[@]}"
for ((round = 1; ; round++)); do
  if judge "$round"; then
    echo "passed in round $round ($SECONDS s, $waited s of them checking or waiting for quiet cores)"
    exit 0
  fi
  mapfile -t again < "$work/again"
  # Another round only where it would end within the budget, at the pace so far, even if it waited
  # for the cores as long as it still may.
  left=$((quiet_s > waited ? quiet_s - waited : 0))
  if ((round >= attempts || SECONDS + left + plan_s / plans + ${#again[@]} * launch_s / launches > budget)); then
    echo "failed in each of $round round(s) ($SECONDS s, $waited s of them checking or waiting for quiet cores)"
    exit 1
  fi
  echo "calibrating again, and measuring again (dp tp pp): $(paste -sd';' "$work/again")"
  plan
  measuring_round=$((round + 1))
  measure "${again[@]}"
done
