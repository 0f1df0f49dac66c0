#!/usr/bin/env bash
# tools/cpu_peer.py (issue #17's PyTorch CPU peer) on the tiny default for 2 steps: its output line
# must parse (peer SHAPE TOKENS_PER_S THREADS STEP_MS PARAMETERS) with the config's shape, a
# positive speed and the thread count asked for, and its parameter count must equal the one
# weft-train prints at start-up for the same config. A config the peer does not model (Llama) must
# be refused with a message naming the key, not measured as something else.
#   usage: cpu_peer_runs.sh WEFT_TRAIN CONFIG LLAMA_CONFIG CPU_PEER WORK_DIR
set -euo pipefail
weft_train=$1 config=$2 llama_config=$3 peer=$4 work=$5
python=${WEFT_GOLDEN_PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "cpu_peer test FAILED: $python cannot import torch; install python3-torch (tools/setup-deps)" >&2
  exit 1
fi
mkdir -p "$work"
"$weft_train" "$config" --dump-config >"$work/tiny.yaml"
"$weft_train" "$config" --set train.steps=1 --set data.val_every=0 --set checkpoint.dir= \
  --set log.progress=plain >"$work/weft.log" 2>&1
weft_parameters=$(grep -m1 -o '[0-9]* parameters' "$work/weft.log" | cut -d' ' -f1)
[[ -n $weft_parameters ]] || { echo "FAIL: weft-train's log has no 'N parameters' line:"; cat "$work/weft.log"; exit 1; }

peer_line=$("$python" "$peer" "$work/tiny.yaml" --warmup 1 --steps 2 --threads 1)
echo "weft-train: $weft_parameters parameters; cpu_peer.py: $peer_line"
read -r tag shape tokens_per_s threads step_ms parameters extra <<<"$peer_line"
[[ $tag == peer && -z ${extra:-} ]] || { echo "FAIL: the peer's line is not 'peer SHAPE TOKENS_PER_S THREADS STEP_MS PARAMETERS'"; exit 1; }
[[ $shape == 2x64x64 ]] || { echo "FAIL: shape $shape, expected 2x64x64 (layers x dim x seq of $config)"; exit 1; }
[[ $tokens_per_s =~ ^[0-9]+$ && $tokens_per_s -gt 0 ]] || { echo "FAIL: tokens/s '$tokens_per_s' is not a positive count"; exit 1; }
[[ $threads == 1 ]] || { echo "FAIL: threads $threads, asked for 1"; exit 1; }
[[ $step_ms =~ ^[0-9]+\.[0-9]+$ ]] || { echo "FAIL: step ms '$step_ms' is not a number"; exit 1; }
[[ $parameters == "$weft_parameters" ]] ||
  { echo "FAIL: the peer has $parameters parameters, weft-train $weft_parameters: the models differ"; exit 1; }

"$weft_train" "$llama_config" --dump-config >"$work/llama.yaml"
if refusal=$("$python" "$peer" "$work/llama.yaml" --warmup 0 --steps 1 --threads 1 2>&1); then
  echo "FAIL: the peer measured a Llama config it does not model: $refusal"; exit 1
fi
[[ $refusal == *"model.type = llama is not modelled"* ]] ||
  { echo "FAIL: the refusal does not name model.type: $refusal"; exit 1; }
echo "ok: the peer's line parses, its parameters match weft's, and a Llama config is refused"
