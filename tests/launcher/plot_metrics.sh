#!/usr/bin/env bash
# tools/plot-metrics on real weft-train metrics: two short runs (two learning rates, one with
# validation) and a third file that repeats steps as a resumed run's may. The PNG must be a PNG of
# the requested size, and --summary must report, per run and panel, the points and last values that
# the files hold (the last record of a repeated step; no validation points for the run without
# them). A file that is not metrics JSON-lines must stop it with status 2 and say which line.
#   usage: plot_metrics.sh WEFT_TRAIN PLOT_METRICS WORK_DIR
set -euo pipefail
weft_train=$1 plot=$2 work=$3
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.layers=1 --set model.dim=32 --set model.heads=2 --set model.seq_len=32
        --set train.batch_size=4 --set train.steps=6 --set train.warmup_steps=2 --set data.train="$work/text.txt"
        --set data.val_batches=1 --set log.progress=plain)
"$weft_train" "${common[@]}" --set train.lr=1e-3 --set data.val_every=2 --set log.metrics_file="$work/slow.jsonl" >/dev/null
"$weft_train" "${common[@]}" --set train.lr=3e-3 --set data.val_every=0 --set log.metrics_file="$work/fast.jsonl" >/dev/null
# A resumed run's file as an older weft may leave it: steps 4-6, then steps 4-6 again with other losses.
/usr/bin/python3 - "$work" <<'PYTHON'
import json, sys
work = sys.argv[1]
rows = [json.loads(l) for l in open(f"{work}/fast.jsonl")]
with open(f"{work}/resumed.jsonl", "w") as out:
    for row in rows + [dict(r, loss=r["loss"] + 100) for r in rows if r["step"] >= 4]:
        out.write(json.dumps(row) + "\n")
PYTHON

"$plot" "$work/slow.jsonl" "$work/fast.jsonl" "$work/resumed.jsonl" --label slow --label fast --label resumed \
  -o "$work/curves.png" --width 1200 --height 700 --summary > "$work/summary.txt"
cat "$work/summary.txt"
/usr/bin/python3 - "$work" <<'PYTHON'
import json, struct, sys
work = sys.argv[1]
png = open(f"{work}/curves.png", "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n", "curves.png is not a PNG"
assert png[12:16] == b"IHDR", "curves.png has no IHDR chunk first"
width, height = struct.unpack(">II", png[16:24])
assert (width, height) == (1200, 700), f"curves.png is {width}x{height}, expected 1200x700"

summary = {}
for line in open(f"{work}/summary.txt"):
    if "\t" not in line:
        continue
    label, field, points, last = line.rstrip("\n").split("\t")
    summary[(label, field)] = (int(points.split()[0]), last)

def expect(label, field, records):
    """The summary's count and last value for LABEL/FIELD against the last record of each step."""
    by_step = {}
    for r in records:
        if r.get(field) is not None:
            by_step[r["step"]] = r[field]
    points, last = summary[(label, field)]
    want_last = f"last step {max(by_step)} value {float(by_step[max(by_step)])!r}" if by_step else "empty"
    assert (points, last) == (len(by_step), want_last), f"{label} {field}: read {points} points, {last}; " \
        f"the file holds {len(by_step)}, {want_last}"

for label, name in (("slow", "slow"), ("fast", "fast"), ("resumed", "resumed")):
    rows = [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
    steps = [r for r in rows if "loss" in r]
    validations = [r for r in rows if "val_loss" in r]
    for field in ("loss", "lr", "tokens_per_s", "exposed_comm_ms"):
        expect(label, field, steps)
    expect(label, "val_loss", validations)
assert summary[("slow", "loss")][0] == 6 and summary[("slow", "val_loss")][0] == 3, summary
assert summary[("fast", "val_loss")] == (0, "empty"), "the run without validation has validation points"
assert summary[("resumed", "loss")][0] == 6, "a repeated step was counted twice"
fast_last = [json.loads(l) for l in open(f"{work}/fast.jsonl")][-1]["loss"]
assert summary[("resumed", "loss")][1] == f"last step 6 value {fast_last + 100!r}", "the first record of a repeated step was kept"
print("plot-metrics: PNG 1200x700, every run's series as in its file")
PYTHON

# Not metrics: a checkpoint manifest-like JSON object spread over lines, and a text file.
printf '{\n  "format": "weft"\n}\n' > "$work/not-metrics.json"
if "$plot" "$work/slow.jsonl" "$work/not-metrics.json" -o "$work/bad.png" 2> "$work/error.txt"; then
  echo "plot-metrics accepted a file that is not metrics JSON-lines"; exit 1
else
  status=$?
fi
cat "$work/error.txt"
[[ $status -eq 2 ]] || { echo "exit status $status, expected 2"; exit 1; }
grep -q "not-metrics.json:1: not a JSON line" "$work/error.txt"
[[ ! -e "$work/bad.png" ]] || { echo "a PNG was written despite the error"; exit 1; }
echo '{"step": 1, "tokens": 5}' > "$work/other.jsonl"
! "$plot" "$work/other.jsonl" -o "$work/bad.png" 2> "$work/error.txt"
grep -q "other.jsonl:1: a record with neither \"loss\" nor \"val_loss\"" "$work/error.txt"
echo "plot-metrics: files that are not metrics are refused, naming the line"
