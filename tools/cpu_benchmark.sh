#!/usr/bin/env bash
# CPU training throughput, weft against PyTorch (issue #17): for three GPT shapes, weft-train
# (configs/tiny-cpu.yaml with --set overrides) and its PyTorch peer (tools/cpu_peer.py, eager, at
# its best thread count of 1 and 2) on the same config, measured in the same call, printed as one
# table with the machine's CPU model and core count. The peer reads the config weft itself merges
# (weft-train --dump-config with the same overrides), so shapes, optimizer, clipping, schedule and
# dropout match by construction. Both skip their first steps (warm-up) and count tokens over the
# rest; the large shape measures only a few steps so that the whole run takes about 2-3 minutes
# on 2 cores. Run it on an otherwise idle machine: a concurrent build halves either side.
#   usage: tools/cpu_benchmark.sh [WEFT_TRAIN]     (default build/bin/weft-train)
#   PYTHON (default /usr/bin/python3, Debian's, with torch) runs the peer; SHAPES=tiny,medium,laptop
#   picks the rows; SCALE=N multiplies every row's step counts for a steadier measurement.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
weft_train=${1:-build/bin/weft-train}
python=${PYTHON:-/usr/bin/python3}
config="$here/../configs/tiny-cpu.yaml"
scale=${SCALE:-1}
if [[ ! -x "$weft_train" ]]; then
  echo "cpu_benchmark.sh: no weft-train at '$weft_train'; build it (tools/build) or pass its path" >&2
  exit 2
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "cpu_benchmark.sh: $python cannot import torch; install python3-torch (tools/setup-deps) or set PYTHON" >&2
  exit 2
fi
work=$(mktemp -d /tmp/weft-cpu-benchmark.XXXXXX)
trap 'rm -rf "$work"' EXIT

# name | --set overrides on configs/tiny-cpu.yaml | warm-up steps | timed steps. Heads keep the head
# dim at 16 for the tiny default (its config) and 64 for the others.
shapes=(
  "tiny||5|30"
  "medium|model.layers=4 model.dim=256 model.seq_len=128|2|5"
  "laptop|model.layers=6 model.dim=384 model.heads=6 model.seq_len=256|1|2"
)
wanted=",${SHAPES:-tiny,medium,laptop},"

cores=$(nproc)
cpu_model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "CPU: ${cpu_model:-unknown} ($cores cores usable here); torch $("$python" -c 'import torch; print(torch.__version__)'), eager"

: >"$work/rows.txt"
for row in "${shapes[@]}"; do
  IFS='|' read -r name overrides warmup steps <<<"$row"
  [[ $wanted == *",$name,"* ]] || continue
  warmup=$((warmup * scale)) steps=$((steps * scale))
  sets=(--set train.steps=$((warmup + steps)) --set train.warmup_steps=$((warmup + steps)) --set data.val_every=0)
  for override in $overrides; do sets+=(--set "$override"); done
  "$weft_train" "$config" "${sets[@]}" --dump-config >"$work/$name.yaml"

  echo "[$name] weft-train: $warmup warm-up + $steps timed steps" >&2
  "$weft_train" "$config" "${sets[@]}" --set checkpoint.dir= --set log.every=1 \
    --set log.metrics_file="$work/$name.jsonl" --set log.progress=plain >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log" >&2; echo "cpu_benchmark.sh: weft-train failed on $name" >&2; exit 1; }
  echo "[$name] cpu_peer.py: $warmup warm-up + $steps timed steps at 1 and 2 threads" >&2
  "$python" "$here/cpu_peer.py" "$work/$name.yaml" --warmup "$warmup" --steps "$steps" --threads 1,2 \
    --out "$work/peer-$name.txt" >/dev/null
  echo "$name $warmup $work/$name.yaml $work/$name.jsonl $work/$name.log $work/peer-$name.txt" >>"$work/rows.txt"
done

"$python" - "$work/rows.txt" <<'PYTHON'
import json, re, sys
import yaml
print(f"\n{'shape (layers x dim x seq, batch)':<36}{'weft tok/s':>12}{'peer tok/s':>12}{'(threads)':>10}{'weft/peer':>11}")
thread_notes = set()
for line in open(sys.argv[1]):
    name, warmup, config, metrics, log, peer = line.split()
    document = yaml.safe_load(open(config))
    model, train = document["model"], document["train"]
    rows = [json.loads(l) for l in open(metrics) if '"tokens_per_s"' in l][int(warmup):]  # skip warm-up steps
    tokens = train["batch_size"] * model["seq_len"]
    weft = tokens * len(rows) / (sum(r["step_ms"] for r in rows) / 1000)
    _, shape, peer_tps, threads, _, _ = open(peer).read().split()
    parameters = re.search(r"(\d+) parameters", open(log).read())
    label = f"{name} {shape}, {train['batch_size']}" + (f" ({int(parameters.group(1)) / 1e6:.2f}M)" if parameters else "")
    print(f"{label:<36}{weft:>12.0f}{float(peer_tps):>12.0f}{'(' + threads + ')':>10}{weft / float(peer_tps):>11.2f}")
    thread_notes.update(l.strip() for l in open(log) if re.search(r"thread", l, re.IGNORECASE))
print("weft threads: " + ("; ".join(sorted(thread_notes)) if thread_notes else
      "its log does not say (one rank: OpenBLAS's default, OPENBLAS_NUM_THREADS or one per core)"))
PYTHON
