#!/bin/bash
# expect_failure.sh SECONDS PATTERN [PATTERN...] -- COMMAND...
# Runs COMMAND and passes when it exits non-zero within SECONDS and its output (stdout and stderr)
# matches every PATTERN (grep -E). A pattern prefixed "once:" must match exactly one line.
limit=$1; shift
patterns=()
while [ "$1" != "--" ]; do patterns+=("$1"); shift; done
shift
output=$(mktemp)
start=$(date +%s%N)
"$@" > "$output" 2>&1
status=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
elapsed="$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))"
cat "$output"
echo "--- exit status $status after ${elapsed} s"
failed=0
if [ "$status" -eq 0 ]; then echo "FAIL: expected a non-zero exit status"; failed=1; fi
if [ "$elapsed_ms" -gt $((limit * 1000)) ]; then echo "FAIL: took ${elapsed} s, limit ${limit} s"; failed=1; fi
for pattern in "${patterns[@]}"; do
  if [[ "$pattern" == once:* ]]; then
    pattern=${pattern#once:}
    count=$(grep -cE -- "$pattern" "$output")
    if [ "$count" -ne 1 ]; then echo "FAIL: '$pattern' printed $count times, expected once"; failed=1; fi
  elif ! grep -qE -- "$pattern" "$output"; then
    echo "FAIL: output does not match '$pattern'"; failed=1
  fi
done
rm -f "$output"
exit $failed
