#!/usr/bin/env bash
# Runs PyTorch's SDPA peer (tools/attention_peer.py) and then weft's cuda_attention_benchmark with
# its numbers, on the GPU machine, so that both are measured in the same call.
# The benchmark times both of weft's implementations (flash kernels and cuDNN); WEFT_ATTENTION_VERBOSE=1
# prints the cuDNN engine chosen per shape.
# Usage: tools/cuda_attention_benchmark.sh [BUILD_DIR] [PYTHON] [extra benchmark args...]
#   BUILD_DIR defaults to build; PYTHON to /opt/torch/.venv/bin/python (python3 if that is absent).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
python="${2:-/opt/torch/.venv/bin/python}"
shift $(( $# > 2 ? 2 : $# ))
[[ -x "$python" ]] || python=python3
peer="$(mktemp /tmp/attention_peer.XXXXXX)"
peer_args=()
if PYTHONUNBUFFERED=1 "$python" "$here/attention_peer.py" --out "$peer"; then
  peer_args=(--peer "$peer")
else
  echo "attention_peer.py failed: weft numbers only" >&2
fi
"$build/tools/cuda_attention_benchmark" "${peer_args[@]}" "$@"
