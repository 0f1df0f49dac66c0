#!/usr/bin/env bash
# Llama training throughput on one GPU: weft-train (configs/llama-1b.yaml on random token shards)
# next to PyTorch eager and torch.compile (tools/llama_peer.py) with the same shape, measured in the
# same call, printed as one table with ratios (tokens/s, step time, MFU, peak memory), as
# tools/gpt2_benchmark.sh does for GPT-2. Runs on the GPU machine after `source tools/device/env.sh`.
#   usage: tools/llama_benchmark.sh [WEFT_TRAIN] [PYTHON] [STEPS]
# The shape is the config's unless overridden: LAYERS, DIM, HEADS, KV_HEADS, VOCAB, SEQ, BATCH
# (both sides get the same values); PEER_MODES (default eager,compile); RECOMPUTE sets
# train.recompute for weft; ROUNDS alternates the two sides (below). MFU counts 6 * parameters + 6 * layers * T * C FLOPs per token on both
# sides, against 989 TFLOP/s.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/device/gpu-clocks"
weft_train=${1:-build/bin/weft-train}
python=${2:-/opt/torch/.venv/bin/python}
steps=${3:-30}
[[ -x "$python" ]] || python=python3
layers=${LAYERS:-16} dim=${DIM:-2048} heads=${HEADS:-16} kv_heads=${KV_HEADS:-8}
vocab=${VOCAB:-32000} seq=${SEQ:-2048} batch=${BATCH:-8}
work=$(mktemp -d /tmp/weft-llama.XXXXXX)

# Random tokens in llm.c's shard format, enough for every step (throughput does not depend on them).
"$here/device/random-token-shard" "$work/train.bin" $(((steps + 10) * batch * seq + 1)) "$vocab"

# ROUNDS (default 1) alternates the two sides that many times (peer, weft, peer, weft, ...): on a
# power-capped GPU whichever runs second meets a warmer chip, so one pair of runs can tilt the ratio
# by a few percent; each round's ratio is printed, then their mean.
rounds=${ROUNDS:-1}
clock_lines=()
for round in $(seq 1 "$rounds"); do
  gpu_clocks_start "$work/peer.$round.clocks"
  "$python" "$here/llama_peer.py" --layers "$layers" --dim "$dim" --heads "$heads" --kv-heads "$kv_heads" \
    --vocab "$vocab" --seq "$seq" --batch "$batch" --steps "$steps" --out "$work/peer.$round.txt" \
    ${PEER_MODES:+--modes "$PEER_MODES"} || echo "llama_peer.py failed" >&2
  peer_clocks=$(gpu_clocks_summary "$work/peer.$round.clocks")

  gpu_clocks_start "$work/weft.$round.clocks"
  "$weft_train" "$here/../configs/llama-1b.yaml" --set data.train="$work/train.bin" --set data.val= \
    --set data.val_fraction=0 --set data.val_every=0 --set train.steps=$((steps + 5)) --set train.warmup_steps=5 \
    --set model.layers="$layers" --set model.dim="$dim" --set model.heads="$heads" --set model.kv_heads="$kv_heads" \
    --set model.vocab="$vocab" --set model.seq_len="$seq" --set train.batch_size="$batch" \
    ${RECOMPUTE:+--set train.recompute="$RECOMPUTE"} \
    --set checkpoint.dir= --set log.every=5 --set log.metrics_file="$work/weft.$round.jsonl" --set log.progress=plain
  weft_clocks=$(gpu_clocks_summary "$work/weft.$round.clocks")
  clock_lines+=("clocks, round $round: weft $weft_clocks; peer $peer_clocks")
done

"$python" - "$work" "$rounds" "$here" <<'PYTHON'
import json, sys
work, rounds = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from weft_metrics import summary
ratios = {}
for round in range(1, rounds + 1):
    weft = summary(f"{work}/weft.{round}.jsonl", 5)  # wall time after the warm-up, as the peers measure
    peers = {}
    try:
        for line in open(f"{work}/peer.{round}.txt"):
            name, tps, ms, mfu, mem = line.split()
            peers[name] = (float(tps), float(ms), float(mfu), float(mem))
    except FileNotFoundError:
        pass
    title = f" (round {round} of {rounds})" if rounds > 1 else ""
    print(f"\n{'run' + title:<18}{'tokens/s':>12}{'step ms':>10}{'MFU':>8}{'peak MB':>10}{'weft/peer':>11}{'mem/peer':>10}")
    print(f"{'weft':<18}{weft[0]:>12.0f}{weft[1]:>10.1f}{100*weft[2]:>7.1f}%{weft[3]:>10.0f}")
    for name, (tps, ms, mfu, mem) in peers.items():
        memory_ratio = f"{weft[3]/mem:>10.2f}" if mem > 0 else f"{'':>10}"
        print(f"{name:<18}{tps:>12.0f}{ms:>10.1f}{100*mfu:>7.1f}%{mem:>10.0f}{weft[0]/tps:>11.2f}{memory_ratio}")
        ratios.setdefault(name, []).append(weft[0] / tps)
if rounds > 1:
    for name, values in ratios.items():
        print(f"weft / {name}, mean of {len(values)} rounds: {sum(values) / len(values):.3f}")
PYTHON
# The GPU clock each side ran at: a power-capped run is slower for that reason alone.
printf '%s\n' "${clock_lines[@]}"
