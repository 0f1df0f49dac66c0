# Reading weft-train's metrics files (log.metrics_file) in the distributed test scripts, and the
# check they share: every step's loss and every validation loss of a parallel run agree with the
# one-process run's to a relative tolerance.
#   sys.path.insert(0, "<tests/support>"); import training_metrics
import json
import sys


def read(work, name):
    """The step rows and the validation losses of WORK/NAME.jsonl."""
    rows = [json.loads(line) for line in open(f"{work}/{name}.jsonl")]
    steps = [r for r in rows if "loss" in r and "val_loss" not in r]
    return steps, [r["val_loss"] for r in rows if "val_loss" in r]


def expect_one_process_losses(work, mode, what, tolerance=1e-4, steps_expected=6, note=""):
    """WORK/MODE.jsonl against WORK/single.jsonl; prints both, exits naming WHAT when they differ.
    Returns MODE's step rows."""
    single, single_val = read(work, "single")
    steps, val = read(work, mode)
    assert len(steps) == len(single) == steps_expected, (mode, len(steps), len(single))
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(single, steps))
    worst_val = max(abs(a - b) / abs(a) for a, b in zip(single_val, val))
    print(f"{mode:6s} losses:", " ".join(f"{r['loss']:.6f}" for r in steps), "(one process:",
          " ".join(f"{r['loss']:.6f}" for r in single) + f"), worst {worst:.3g}, validation {worst_val:.3g}" + note)
    if worst > tolerance or worst_val > tolerance or len(val) != len(single_val):
        sys.exit(f"the {mode} mode's {what} losses differ from the one-process ones")
    return steps
