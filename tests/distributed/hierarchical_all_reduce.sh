#!/usr/bin/env bash
# The two-level dp all-reduce across "hosts" on one machine (WEFT_RANKS_PER_HOST=2: ranks 0-1 and
# 2-3 are two hosts), through weft-train at dp 4:
#  - comm.dp_all_reduce hierarchical trains to the flat run's losses (f32 rounding of another sum order);
#  - auto takes the path the cost model predicts faster: hierarchical with a calibration file whose
#    across-hosts links are slow, flat with one whose host links are the slow ones — and says so;
#    comm.mode manual keeps flat with the same file (hand-written code fixes its path);
#  - hierarchical where it cannot apply (every rank on one host) stops with a message naming the key.
#   usage: hierarchical_all_reduce.sh WEFT_TRAIN
set -euo pipefail
weft_train=$1
config=$(dirname "$0")/../../configs/tiny-cpu.yaml
work=$(mktemp -d /tmp/weft-hierarchical.XXXXXX)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe -np 4 -x WEFT_RANKS_PER_HOST)
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
export WEFT_RANKS_PER_HOST=2
common=("$config" --set parallel.dp=4 --set comm.mode=auto --set model.layers=2 --set train.steps=4 --set train.warmup_steps=0
        --set data.val_every=0 --set log.progress=plain --set log.every=1)
for mode in flat hierarchical; do
  "${mpirun[@]}" "$weft_train" "${common[@]}" --set comm.dp_all_reduce=$mode --set log.metrics_file="$work/$mode.jsonl" \
    > "$work/$mode.txt"
done
grep -q "dp all-reduce: hierarchical (comm.dp_all_reduce), 2 ranks per host on 2 hosts" "$work/hierarchical.txt"
/usr/bin/python3 - "$work" <<'PYTHON'
import json, sys
work = sys.argv[1]
losses = {m: [json.loads(l)["loss"] for l in open(f"{work}/{m}.jsonl") if '"loss"' in l] for m in ("flat", "hierarchical")}
assert len(losses["flat"]) == 4 and len(losses["hierarchical"]) == 4, losses
for a, b in zip(losses["flat"], losses["hierarchical"]):
    assert abs(a - b) <= 1e-5 * abs(a), f"hierarchical losses {losses['hierarchical']} differ from flat {losses['flat']}"
print("hierarchical all-reduce: the flat run's losses", losses["hierarchical"])
PYTHON

# Calibration files: links across hosts 100x slower than within one, or 100x faster.
for case in slow fast; do
  /usr/bin/python3 - "$work/$case.json" "$case" <<'PYTHON'
import json, sys
path, case = sys.argv[1], sys.argv[2]
collectives = []
for kind in ("all_reduce", "reduce_scatter", "all_gather", "send_recv"):
    for link in ("same_host", "across_hosts"):
        slow = (link == "across_hosts") == (case == "slow")
        collectives.append({"kind": kind, "link": link, "latency_ms": 0.01, "bytes_per_ms": 1e4 if slow else 1e6,
                            "measured_ranks": 4, "measured": True})
json.dump({"format": "weft-calibration", "version": 1, "device": "cpu", "dtype": "f32", "source": f"test ({case})",
           "ranks_per_host": 2, "collectives": collectives,
           "compute": {"matmul_flops_per_ms": 1e7, "attention_flops_per_ms": 1e7, "memory_bytes_per_ms": 1e6}},
          open(path, "w"))
PYTHON
  "${mpirun[@]}" "$weft_train" "${common[@]}" --set comm.calibration_file="$work/$case.json" --set train.steps=2 > "$work/auto_$case.txt"
done
grep -q "cost model: dp all-reduce hierarchical" "$work/auto_slow.txt" || { cat "$work/auto_slow.txt"; exit 1; }
grep -q "cost model: dp all-reduce flat" "$work/auto_fast.txt" || { cat "$work/auto_fast.txt"; exit 1; }
grep -q "cost model: figures from $work/slow.json" "$work/auto_slow.txt"
# The manual mode keeps the flat path that hand-written code fixes, even with the model at hand.
"${mpirun[@]}" "$weft_train" "${common[@]}" --set comm.mode=manual --set comm.calibration_file="$work/slow.json" \
  --set train.steps=2 > "$work/manual_slow.txt"
grep -q "dp all-reduce: flat (comm.mode manual fixes the path in advance" "$work/manual_slow.txt" ||
  { cat "$work/manual_slow.txt"; exit 1; }

# Forced where it cannot apply: one host.
unset WEFT_RANKS_PER_HOST
if mpirun --oversubscribe -np 4 $([[ $(id -u) -eq 0 ]] && echo --allow-run-as-root) "$weft_train" "${common[@]}" \
     --set comm.dp_all_reduce=hierarchical > "$work/refused.txt" 2>&1; then
  echo "hierarchical on one host was not refused"; exit 1
fi
grep -q "comm.dp_all_reduce: hierarchical needs a dp group spanning hosts" "$work/refused.txt" || { cat "$work/refused.txt"; exit 1; }
echo "hierarchical all-reduce: chosen by the cost model, refused where it cannot apply"
