#!/usr/bin/env bash
# GPT-2 124M training throughput on one GPU: weft-train (configs/gpt2-124m.yaml on random token
# shards) next to PyTorch eager and torch.compile (tools/gpt2_peer.py), measured in the same call,
# printed as one table with ratios. Runs on the GPU machine after `source tools/device/env.sh`.
# With RANKS=2 (two GPUs): weft-train under mpirun with parallel.dp = 2 (16 sequences per GPU)
# next to PyTorch DDP under torchrun, and weft's communication time and exposed part per step.
#   usage: [RANKS=N] tools/gpt2_benchmark.sh [WEFT_TRAIN] [PYTHON] [STEPS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/device/gpu-clocks"
weft_train=${1:-build/bin/weft-train}
python=${2:-/opt/torch/.venv/bin/python}
steps=${3:-30}
[[ -x "$python" ]] || python=python3
ranks=${RANKS:-1}
work=$(mktemp -d /tmp/weft-gpt2.XXXXXX)

# Random tokens in llm.c's shard format (enough for the run; the throughput does not depend on them).
"$here/device/random-token-shard" "$work/train.bin" $((16 * 1024 * 64 + 1)) 50257

launcher=()
peer_launcher=("$python")
if [[ $ranks -gt 1 ]]; then
  launcher=(mpirun -np "$ranks" --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)
  peer_launcher=("$python" -m torch.distributed.run --nproc_per_node "$ranks")
fi
gpu_clocks_start "$work/peer.clocks"
"${peer_launcher[@]}" "$here/gpt2_peer.py" --steps "$steps" --out "$work/peer.txt" ${PEER_MODES:+--modes "$PEER_MODES"} ||
  echo "gpt2_peer.py failed" >&2
peer_clocks=$(gpu_clocks_summary "$work/peer.clocks")

gpu_clocks_start "$work/weft.clocks"
"${launcher[@]}" "$weft_train" "$here/../configs/gpt2-124m.yaml" --set data.train="$work/train.bin" --set data.val= \
  --set data.val_fraction=0 --set data.val_every=0 --set train.steps=$((steps + 5)) --set train.warmup_steps=5 \
  --set train.batch_size=$((16 * ranks)) --set parallel.dp="$ranks" \
  --set checkpoint.dir= --set log.every=5 --set log.metrics_file="$work/weft.jsonl" --set log.progress=plain
weft_clocks=$(gpu_clocks_summary "$work/weft.clocks")

"$python" - "$work/weft.jsonl" "$work/peer.txt" "$here" <<'PYTHON'
import json, sys
sys.path.insert(0, sys.argv[3])
from weft_metrics import summary
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l][5:]  # skip warm-up steps
n = len(rows)
weft = summary(sys.argv[1], 5)  # wall time over the steps after the warm-up, as the peers measure
peers = {}
try:
    for line in open(sys.argv[2]):
        name, tps, ms, mfu, mem = line.split()
        peers[name] = (float(tps), float(ms), float(mfu), float(mem))
except FileNotFoundError:
    pass
print(f"\n{'run':<18}{'tokens/s':>12}{'step ms':>10}{'MFU':>8}{'peak MB':>10}{'weft/peer':>11}")
print(f"{'weft':<18}{weft[0]:>12.0f}{weft[1]:>10.1f}{100*weft[2]:>7.1f}%{weft[3]:>10.0f}{'':>11}")
comm = sum(r["comm_ms"] for r in rows) / n
if comm > 0:
    exposed = sum(r["exposed_comm_ms"] for r in rows) / n
    print(f"weft communication per step: {comm:.1f} ms, exposed {exposed:.1f} ms")
for name, (tps, ms, mfu, mem) in peers.items():
    print(f"{name:<18}{tps:>12.0f}{ms:>10.1f}{100*mfu:>7.1f}%{mem:>10.0f}{weft[0]/tps:>11.2f}")
PYTHON
# The GPU clock each side ran at: a power-capped run is slower for that reason alone.
echo "clocks: weft $weft_clocks; peer $peer_clocks"
