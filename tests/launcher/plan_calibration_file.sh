#!/usr/bin/env bash
# weft-plan keeps what it measured, as weft-train does: under mpirun with comm.calibration_file set
# it writes the figures there (and says so), and a later weft-plan given the same key, in one
# process, plans from that file (and says so) with the same predictions, row for row. With
# comm.calibrate: on it measures again rather than read.
#   usage: plan_calibration_file.sh WEFT_PLAN CONFIG WORK_DIR [MPIRUN]
set -euo pipefail
weft_plan=$1 config=$2 work=$3 mpirun=${4:-mpirun}
rm -rf "$work" && mkdir -p "$work"
mpirun_flags=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && mpirun_flags+=(--allow-run-as-root)
file=$work/calibration.json
"$mpirun" "${mpirun_flags[@]}" -np 2 "$weft_plan" "$config" --gpus 4 --set comm.calibration_file="$file" > "$work/measured.txt"
grep -F -q "cost model: written to $file" "$work/measured.txt" || { cat "$work/measured.txt"; echo "FAIL: no 'written to' line"; exit 1; }
[[ -s $file ]] || { echo "FAIL: $file was not written"; exit 1; }
"$weft_plan" "$config" --gpus 4 --set comm.calibration_file="$file" > "$work/read.txt"
grep -F -q "cost model: figures from $file" "$work/read.txt" || { cat "$work/read.txt"; echo "FAIL: the file was not read"; exit 1; }
grep -q "written to" "$work/read.txt" && { echo "FAIL: a plan read from the file wrote it again"; exit 1; }
# The table rows ("   1   dp tp pp ...") of both runs.
rows() { grep -E '^ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ ' "$1"; }
[[ -n $(rows "$work/measured.txt") ]] || { cat "$work/measured.txt"; echo "FAIL: no layout rows"; exit 1; }
diff <(rows "$work/measured.txt") <(rows "$work/read.txt") || { echo "FAIL: the plan from the file differs"; exit 1; }
"$weft_plan" "$config" --gpus 4 --set comm.calibration_file="$file" --set comm.calibrate=on > "$work/again.txt"
grep -F -q "cost model: written to $file" "$work/again.txt" || { cat "$work/again.txt"; echo "FAIL: calibrate on did not measure again"; exit 1; }
echo "weft-plan wrote $file under mpirun and planned the same $(rows "$work/read.txt" | wc -l) rows from it"
