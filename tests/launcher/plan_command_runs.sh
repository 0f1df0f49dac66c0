#!/usr/bin/env bash
# weft-plan's advice can be run as printed: for two CPU ranks it ends with "to run #1: mpirun -np 2
# .../weft-train CONFIG --set ...", and that command (under this machine's mpirun flags) trains
# with the layout of the table's first row; its --json gives each layout's settings, and the first
# interleaved pipeline's settings run with that schedule too. A setting weft-train did not take
# (a wrong key, a layout it refuses) fails the run, and a row the command does not match fails the
# comparison with weft-train's start-up line.
#   usage: plan_command_runs.sh WEFT_TRAIN WEFT_PLAN CONFIG WORK_DIR [MPIRUN]
set -euo pipefail
weft_train=$1 weft_plan=$2 config=$3 work=$4 mpirun=${5:-mpirun}
rm -rf "$work" && mkdir -p "$work"
mpirun_flags=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && mpirun_flags+=(--allow-run-as-root)
short=(--set train.steps=3 --set train.warmup_steps=0 --set data.val_every=0 --set log.progress=plain)

"$weft_plan" "$config" "${short[@]}" --gpus 2 --json "$work/plan.json" > "$work/plan.txt"
cat "$work/plan.txt"
# The table's first row: "   1   dp   tp   pp zero micro ..."
read -r _ dp tp pp zero micro _ < <(grep -E '^ +1 +[0-9]+ +[0-9]+ +[0-9]+ ' "$work/plan.txt")
command=$(sed -n 's/^to run #1: //p' "$work/plan.txt")
[[ -n $command ]] || { echo "FAIL: weft-plan printed no command to run its first layout"; exit 1; }
[[ $command == "mpirun -np 2 $weft_train "* ]] || { echo "FAIL: the command does not start the weft-train beside weft-plan under mpirun -np 2: $command"; exit 1; }
# The printed command, with this machine's mpirun and its flags in place of "mpirun".
eval "\"$mpirun\" ${mpirun_flags[*]} ${command#mpirun }" > "$work/first.txt" 2>&1 || {
  cat "$work/first.txt"; echo "FAIL: the printed command did not run"; exit 1; }
expected="parallel: 2 rank(s), dp $dp, tp $tp, pp $pp, zero $zero,"
grep -F -q "$expected" "$work/first.txt" || {
  grep "^parallel:" "$work/first.txt" || true; echo "FAIL: expected '$expected' (row 1, micro-batches $micro)"; exit 1; }
grep -E -q "^step +3/3" "$work/first.txt" || { cat "$work/first.txt"; echo "FAIL: the run did not reach step 3"; exit 1; }
echo "row 1 ran: $expected"

# The first interleaved pipeline in the JSON, run from its settings.
mapfile -t settings < <(/usr/bin/python3 -c '
import json, sys
layouts = json.load(open(sys.argv[1]))["layouts"]
chosen = next(l for l in layouts if l["fits"] and l["schedule"] == "interleaved")
for setting in chosen["settings"]:
    print(setting)
' "$work/plan.json")
arguments=()
for setting in "${settings[@]}"; do arguments+=(--set "$setting"); done
echo "interleaved: ${settings[*]}"
"$mpirun" "${mpirun_flags[@]}" -np 2 "$weft_train" "$config" "${short[@]}" "${arguments[@]}" > "$work/second.txt" 2>&1 || {
  cat "$work/second.txt"; echo "FAIL: the interleaved layout's settings did not run"; exit 1; }
grep -q "pipeline schedule interleaved: 2 stages x 2 chunks" "$work/second.txt" || {
  grep "pipeline schedule" "$work/second.txt" || true; echo "FAIL: the interleaved layout did not run interleaved"; exit 1; }
echo "PASS"
