#!/usr/bin/env bash
# weft-compare under mpirun, as the README runs it, on a small GPT:
# - dp 2: the printed table has both modes; comparison.json has both modes with 4 steps each, every
#   rank's peak memory, and losses that are the same bits in both modes (data parallelism promises
#   it on the CPU: comm_modes_agree.sh) and the same bits as a plain weft-train run of the same
#   config in auto mode (the second trainer of weft-compare's process is not disturbed by the
#   first); both traces hold both ranks' events; timeline.svg draws both panels; both modes have
#   a predicted step time, from one calibration (the manual run's figures, given to the auto run).
# - tp 2 with sp: the losses agree to f32 tolerance (the auto mode's ring reduce-scatter adds in
#   another order), the auto mode's description names its tensor-parallel plan, and the
#   tensor-parallel block's line counts are printed as tools/tp_block_lines.py counts them.
# - pp 2 with parallel.pp_transport direct: the manual mode's run goes over the host route (direct
#   needs the auto mode) and says so; the auto mode's goes direct; the losses are the same bits.
# - a misspelt key: exit status 2 and one message naming the key, from rank 0 only.
#   usage: weft_compare.sh WEFT_COMPARE WEFT_TRAIN WORK_DIR [MPIRUN...]
set -euo pipefail
weft_compare=$1 weft_train=$2 work=$3
shift 3
mpirun=("$@")
[ ${#mpirun[@]} -gt 0 ] || mpirun=(mpirun --allow-run-as-root --oversubscribe)
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
common=("$work/run.yaml" --set model.layers=2 --set model.dim=32 --set model.heads=4 --set model.seq_len=32
        --set model.dropout=0.1 --set train.batch_size=8 --set train.micro_batches=2 --set train.warmup_steps=2
        --set data.train="$work/text.txt" --set comm.bucket_mb=0.01)

"${mpirun[@]}" -np 2 "$weft_compare" "${common[@]}" --set parallel.dp=2 --steps 4 --out "$work/dp" > "$work/dp.log"
"${mpirun[@]}" -np 2 "$weft_train" "${common[@]}" --set parallel.dp=2 --set train.steps=4 --set comm.mode=auto \
  --set data.val_every=0 --set log.progress=plain --set log.metrics_file="$work/train-auto.jsonl" > /dev/null
"${mpirun[@]}" -np 2 "$weft_compare" "${common[@]}" --set parallel.tp=2 --set parallel.sp=true --steps 4 \
  --out "$work/tp" > "$work/tp.log"
# comm.mode auto, so that the config is valid for weft-train too; weft-compare runs both modes.
"${mpirun[@]}" -np 2 "$weft_compare" "${common[@]}" --set parallel.pp=2 --set comm.mode=auto \
  --set parallel.pp_transport=direct --steps 4 --out "$work/pp" > "$work/pp.log"

status=0
"${mpirun[@]}" -np 2 "$weft_compare" "${common[@]}" --set train.lrr=0.1 --out "$work/bad" > "$work/bad.log" 2>&1 ||
  status=$?
cat "$work/bad.log"
[ "$status" -eq 2 ] || { echo "FAIL: a misspelt key gave exit status $status, expected 2"; exit 1; }
[ "$(grep -c "unknown key 'train.lrr'" "$work/bad.log")" -eq 1 ] ||
  { echo "FAIL: the misspelt key is not named exactly once"; exit 1; }
[ ! -e "$work/bad" ] || { echo "FAIL: a refused run created its out folder"; exit 1; }

/usr/bin/python3 - "$work" "$here/../../tools/tp_block_lines.py" <<'PYTHON'
import json, re, subprocess, sys
work, counter = sys.argv[1], sys.argv[2]

def check(condition, message):
    if not condition:
        sys.exit("FAIL: " + message)

def modes(case):
    log = open(f"{work}/{case}.log").read()
    report = json.load(open(f"{work}/{case}/comparison.json"))
    check(set(report["modes"]) == {"manual", "auto"}, f"{case}: comparison.json modes {sorted(report['modes'])}")
    for mode, run in report["modes"].items():
        check([s["step"] for s in run["steps"]] == [1, 2, 3, 4], f"{case} {mode}: steps {run['steps']}")
        check(run["losses"] == [s["loss"] for s in run["steps"]], f"{case} {mode}: losses and step rows differ")
        check(len(run["peak_memory_mb_per_rank"]) == 2 and min(run["peak_memory_mb_per_rank"]) > 0,
              f"{case} {mode}: peak memory per rank {run['peak_memory_mb_per_rank']}")
        check(len(run["exposed_comm_ms_per_rank"]) == 2, f"{case} {mode}: {run['exposed_comm_ms_per_rank']}")
        check(all(s["compute_ms"] > 0 for s in run["steps"]), f"{case} {mode}: a step without compute time")
        # Gradient buckets are the step graph's collectives; tensor-parallel ones are recorded inside
        # the segments that issue them: either way every step communicates.
        check(all(s["comm_ms"] > 0 for s in run["steps"]), f"{case} {mode}: a step without communication time")
        # The metrics file holds the same rows.
        rows = [json.loads(l) for l in open(f"{work}/{case}/metrics-{mode}.jsonl")]
        check([r["loss"] for r in rows] == run["losses"], f"{case} {mode}: metrics file and comparison.json differ")
        # Both ranks' events in the trace.
        events = json.load(open(f"{work}/{case}/trace-{mode}.json"))["traceEvents"]
        check({e["pid"] for e in events if e.get("ph") == "X"} == {0, 1}, f"{case} {mode}: trace ranks")
    # The table: a header row naming both modes, then the figures.
    check(re.search(r"^\s+manual\s+auto\s+auto / manual$", log, re.M), f"{case}: no table header in the output")
    for row in ("tokens/s", "step ms", "compute ms", "communication ms", "exposed communication ms", "overlap",
                "peak memory MB"):
        check(re.search(rf"^{re.escape(row)}.*\s[-\d.%]+\s+[-\d.%]+(\s|$)", log, re.M),
              f"{case}: no '{row}' row with both modes")
    check("means over steps 3-4; the first 2 are warm-up" in log, f"{case}: the warm-up note is missing")
    # timeline.svg: a panel per mode, each with event rectangles.
    svg = open(f"{work}/{case}/timeline.svg").read()
    panels = [svg.find("manual: step 4"), svg.find("auto: step 4")]
    check(-1 < panels[0] < panels[1], f"{case}: timeline.svg lacks the panel titles in order")
    for start, end in ((panels[0], panels[1]), (panels[1], len(svg))):
        check(re.search(r'<rect[^>]*class="event ', svg[start:end]), f"{case}: a timeline panel without events")
    return report, log

report, log = modes("dp")
manual, auto = report["modes"]["manual"]["losses"], report["modes"]["auto"]["losses"]
check(manual == auto, f"dp: the modes' losses differ: manual {manual}, auto {auto}")
check(report["losses"]["bitwise"] and "losses: bitwise equal over 4 steps" in log, "dp: no bitwise verdict")
train = [json.loads(l)["loss"] for l in open(f"{work}/train-auto.jsonl")]
check(train == auto, f"dp: weft-train's auto losses {train} differ from weft-compare's {auto}")
print("dp 2, both modes and weft-train:", " ".join(repr(x) for x in auto))
# One calibration, by the manual run (comm.calibrate auto measures for the auto mode, so weft-compare
# measures in the first run), and a prediction in each mode's steps and table column.
check(log.count("cost model: measured on 2 rank(s) of cpu") == 1, "dp: not exactly one calibration")
check("cost model: figures given (the manual run's: measured on 2 rank(s) of cpu" in log,
      "dp: the auto run did not take the manual run's figures")
for mode in ("manual", "auto"):
    check(all(s.get("predicted_step_ms", 0) > 0 for s in report["modes"][mode]["steps"]),
          f"dp {mode}: a step without a predicted time")
check(re.search(r"^  predicted by the cost model\s+[\d.]+\s+[\d.]+\s*$", log, re.M),
      "dp: the table does not predict both modes")

report, log = modes("tp")
manual, auto = report["modes"]["manual"]["losses"], report["modes"]["auto"]["losses"]
worst = max(abs(a - b) / abs(a) for a, b in zip(manual, auto))
check(worst < 1e-5, f"tp: the modes' losses differ by {worst}")
check(abs(report["losses"]["max_relative_difference"] - worst) <= 1e-6 * worst, "tp: another max difference")
check(any(l.startswith("tensor-parallel plan") for l in report["modes"]["auto"]["description"]),
      f"tp: the auto mode's description lacks its plan: {report['modes']['auto']['description']}")
counts = dict(re.findall(r"^(manual|auto):.*?(\d+)$", subprocess.run(
    [sys.executable, counter], capture_output=True, text=True, check=True).stdout, re.M))
expected = f"tensor-parallel block: manual {counts['manual']} lines, auto {counts['auto']} lines (tools/tp_block_lines.py)"
check(expected in log, f"tp: the line counts are not printed as '{expected}'")
check(report["tensor_parallel_block_lines"]["manual"] == int(counts["manual"]) > int(counts["auto"]) > 0,
      f"tp: comparison.json's line counts {report['tensor_parallel_block_lines']}")
print(f"tp 2 with sp: losses agree to {worst:.2g}; {expected}")

report, log = modes("pp")
manual, auto = report["modes"]["manual"]["losses"], report["modes"]["auto"]["losses"]
check(manual == auto, f"pp: the modes' losses differ: manual {manual}, auto {auto}")
check("the manual mode's pipeline messages go over parallel.pp_transport host" in log,
      "pp: the log does not say the manual mode went over the host route")
check(any("pipeline messages: parallel.pp_transport direct" in l for l in report["modes"]["auto"]["description"]) and
      any("pipeline messages: parallel.pp_transport host" in l for l in report["modes"]["manual"]["description"]),
      f"pp: the descriptions do not name each mode's route")
print("pp 2, manual over the host route, auto direct:", " ".join(repr(x) for x in auto))
PYTHON
