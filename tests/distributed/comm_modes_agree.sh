#!/usr/bin/env bash
# The two comm modes through weft-train under mpirun: N ranks at ZeRO stage Z train the same run in
# comm.mode manual and auto. They run the same collectives on the same gradient buckets, so every
# step's loss and the final checkpoint must agree bit for bit. The auto run's trace must hold every
# rank's timeline, and show a gradient bucket's collective starting before the step's last backward
# segment ends (overlap); the manual run's must show none starting before it.
#   usage: comm_modes_agree.sh WEFT_TRAIN COMPARE_CHECKPOINTS WORK_DIR RANKS ZERO [MPIRUN...]
set -euo pipefail
weft_train=$1 compare=$2 work=$3 ranks=$4 zero=$5
shift 5
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
# Four blocks and small buckets: several buckets become ready while backward still has blocks to do.
common=("$work/run.yaml" --set model.layers=4 --set model.dim=128 --set model.heads=2 --set model.seq_len=64
        --set model.dropout=0.1 --set train.batch_size=8 --set train.micro_batches=2 --set train.steps=4
        --set train.warmup_steps=2 --set data.train="$work/text.txt" --set data.val_every=2 --set data.val_batches=1
        --set log.progress=plain --set parallel.dp="$ranks" --set parallel.zero="$zero" --set comm.bucket_mb=0.01)
for mode in manual auto; do
  "${mpirun[@]}" -np "$ranks" "$weft_train" "${common[@]}" --set comm.mode=$mode --set checkpoint.dir="$work/$mode" \
    --set log.metrics_file="$work/$mode.jsonl" --set log.trace_file="$work/$mode.trace.json" >/dev/null
done
"$compare" "$work/auto" "$work/manual" 0

/usr/bin/python3 - "$work" "$ranks" <<'PYTHON'
import collections, json, sys
work, ranks = sys.argv[1], int(sys.argv[2])
manual, automatic = ([json.loads(l) for l in open(f"{work}/{m}.jsonl") if '"loss"' in l] for m in ("manual", "auto"))
assert len(manual) == len(automatic) == 4, (len(manual), len(automatic))
for a, b in zip(manual, automatic):
    assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], f"step {a['step']}: manual {a} auto {b}"
print("losses, both modes:", " ".join(repr(r["loss"]) for r in manual))

def steps(path):
    """Per rank, per step: {node name: (start, end)} from the Chrome trace (one event per node a step)."""
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    seen, out = collections.Counter(), collections.defaultdict(lambda: collections.defaultdict(dict))
    for e in events:
        step = seen[(e["pid"], e["name"])]
        seen[(e["pid"], e["name"])] += 1
        out[e["pid"]][step][e["name"]] = (e["ts"], e["ts"] + e["dur"])
    return out

for mode in ("manual", "auto"):
    timelines = steps(f"{work}/{mode}.trace.json")
    assert sorted(timelines) == list(range(ranks)), f"{mode}: trace has processes {sorted(timelines)}, expected {ranks} ranks"
    overlapped = 0
    for rank, per_step in timelines.items():
        assert len(per_step) == 4, f"{mode}: rank {rank} has {len(per_step)} steps in the trace"
        for step, nodes in per_step.items():
            last_backward_end = nodes["backward embedding mb1"][1]
            buckets = [times for name, times in nodes.items() if " bucket " in name and "all_gather" not in name]
            assert buckets, f"{mode}: no bucket collective in rank {rank} step {step}: {sorted(nodes)}"
            first_start = min(start for start, end in buckets)
            overlapped += first_start < last_backward_end
    print(f"{mode}: {overlapped} of {4 * ranks} rank-steps start a bucket before backward ends")
    if mode == "manual":
        assert overlapped == 0, "the manual mode started a bucket's collective before backward ended"
    else:
        # Every step's first bucket is issued after block 3's backward, three blocks before the end;
        # with more ranks than cores (CI runs 4 ranks on 2) a comm thread can still start late, so
        # ask for a quarter of the rank-steps, not every one. The manual mode gets none.
        assert overlapped * 4 >= 4 * ranks, "the auto mode did not overlap bucket collectives with backward"
PYTHON
