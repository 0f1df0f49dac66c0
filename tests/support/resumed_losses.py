# Checks that runs resumed from a step-3 checkpoint continue the uninterrupted run: each resumed
# run's metrics file (WORK/NAME.jsonl) holds steps 4-6, whose losses agree with WORK/straight.jsonl's
# to the relative tolerance given with its name.
#   usage: /usr/bin/python3 resumed_losses.py WORK NAME=TOLERANCE [NAME=TOLERANCE ...]
import json
import sys

work = sys.argv[1]


def losses(name):
    rows = map(json.loads, open(f"{work}/{name}.jsonl"))
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "val_loss" not in r}


straight = losses("straight")
for argument in sys.argv[2:]:
    name, tolerance = argument.split("=")
    resumed = losses(name)
    assert sorted(resumed) == [4, 5, 6], (name, sorted(resumed))
    worst = max(abs(resumed[s] - straight[s]) / abs(straight[s]) for s in resumed)
    print(f"resumed at {name}: worst relative loss difference over steps 4-6: {worst:.3g}")
    if worst > float(tolerance):
        sys.exit(f"the run resumed at {name} does not continue the saved one")
