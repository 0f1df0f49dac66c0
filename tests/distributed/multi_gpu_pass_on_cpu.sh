#!/usr/bin/env bash
# tools/device/multi-gpu-pass with DEVICE=cpu: every section must run (exit 0) and print its table,
# the killed-and-resumed run must give the uninterrupted losses bit for bit, the pipeline
# section's direct route the manual mode's losses, the tp section's comparison the same losses in
# both modes without sp, and the plan section a row for each of the three layouts of two ranks.
#   usage: multi_gpu_pass_on_cpu.sh WEFT_TRAIN COLLECTIVE_BENCHMARK
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
output=$(DEVICE=cpu RANKS=2 STEPS=6 MASTER_PORT=29533 bash "$here/../../tools/device/multi-gpu-pass" "$1" /usr/bin/python3 "$2" 2>&1)
status=$?
echo "$output"
[[ $status -eq 0 ]] || { echo "FAIL: multi-gpu-pass exited $status"; exit 1; }
for expected in "^dp_auto_zero2 " "^pp 2, 16 micro-batches" "^zero_bubble, auto " "^zero_bubble, direct .* = manual$" "^send_recv +[0-9]+ +[0-9.]+ +[0-9.]+ " \
    "the message names rank 1: yes" "losses after the kill and resume equal bit for bit" \
    "^-- sp true" "^losses: bitwise equal over 6 steps" "^exposed communication ms +[0-9.]+ +[0-9.]+" \
    "^dp2_tp1_pp1 +[0-9.]+ +[0-9.]+" "^dp1_tp2_pp1 +[0-9.]+ +[0-9.]+" "^dp1_tp1_pp2 +[0-9.]+ +[0-9.]+" \
    "^pairs in the measured order: [0-9]+ of 3"; do
  grep -qE "$expected" <<<"$output" || { echo "FAIL: no line matching '$expected'"; exit 1; }
done
echo "multi-gpu-pass ran every section on the CPU"
