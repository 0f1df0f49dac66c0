#!/usr/bin/env bash
# Runs one golden test: the weft program writes its forward/backward results to JSON, then the
# PyTorch script (Debian's python3-torch, CPU) recomputes them and compares.
#
# Usage: run_golden.sh WEFT_PROGRAM OUTPUT_DIR PYTHON_SCRIPT
# WEFT_GOLDEN_PYTHON overrides the interpreter (default /usr/bin/python3, the one python3-torch
# installs into; the python3 on PATH may be another one without torch).
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 WEFT_PROGRAM OUTPUT_DIR PYTHON_SCRIPT" >&2
  exit 2
fi
program=$1
output_dir=$2
script=$3
python=${WEFT_GOLDEN_PYTHON:-/usr/bin/python3}

# A missing torch is a failure, not a skip: a golden test that silently passes proves nothing.
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "golden test FAILED: $python cannot import torch." >&2
  echo "Install Debian's python3-torch (tools/setup-deps installs it), or point WEFT_GOLDEN_PYTHON" >&2
  echo "at an interpreter that has PyTorch." >&2
  exit 1
fi

mkdir -p "$output_dir"
json="$output_dir/$(basename "$program").json"
rm -f "$json"
"$program" "$json"
"$python" "$script" "$json"
