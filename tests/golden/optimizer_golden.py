"""Golden test, PyTorch side: checks weft's AdamW, SGD and LR schedule against torch.

Reads the JSON written by optimizer_golden (tests/golden/optimizer_golden.cc): for each run, the
optimizer options, the parameter groups (names and weight decay), the initial parameters and, per
step, the learning rate, the gradient of every parameter and every parameter after the step.
Replays the run with torch.optim.AdamW / torch.optim.SGD in float64, from the same initial values,
setting p.grad to the same gradients and each group's lr to the same value before every step, and
compares the parameters after each step. The learning rates themselves are checked against an
independent implementation of the warmup + cosine schedule.

Error per tensor = max |weft - torch| / max |torch|; it must be <= 1e-12.
Exits 0 when everything passes, 1 on any failure, 2 on bad usage.

Usage: /usr/bin/python3 optimizer_golden.py WEFT_OUTPUT.json
"""

import json
import math
import sys

try:
    import torch
except ImportError as error:  # run_golden.sh checks first; this covers a direct run
    sys.exit(f"optimizer_golden.py: cannot import torch ({error}); install python3-torch "
             "(tools/setup-deps installs it) and run with /usr/bin/python3")

TOLERANCE = 1e-12


def tensor_from(entry):
    return torch.tensor(entry["values"], dtype=torch.float64).reshape(entry["shape"])


def scheduled_lr(schedule, step):
    """nanoGPT's warmup + cosine schedule, written independently of weft's."""
    peak, warmup, total = schedule["peak_lr"], schedule["warmup_steps"], schedule["total_steps"]
    min_lr = peak * schedule["min_lr_ratio"]
    if step < warmup:
        return peak * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - min_lr)


def relative_error(actual, expected):
    scale = expected.abs().max().item()
    difference = (actual - expected).abs().max().item()
    return difference / scale if scale > 0 else difference


def replay(run, schedule):
    """Replays one run in torch; returns a list of failure messages."""
    failures = []
    parameters = {name: tensor_from(entry).requires_grad_(True) for name, entry in run["initial"].items()}
    groups = [{"params": [parameters[name] for name in group["parameters"]],
               "weight_decay": group["weight_decay"]} for group in run["groups"]]
    options = run["options"]
    if run["optimizer"] == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=0.0, betas=(options["beta1"], options["beta2"]),
                                      eps=options["eps"])
    elif run["optimizer"] == "sgd":
        optimizer = torch.optim.SGD(groups, lr=0.0, momentum=options["momentum"],
                                    nesterov=options["nesterov"])
    else:
        return [f"unknown optimizer {run['optimizer']!r}"]

    for step, record in enumerate(run["steps"]):
        expected_lr = scheduled_lr(schedule, step)
        if abs(record["lr"] - expected_lr) > 1e-15 * max(1.0, abs(expected_lr)):
            failures.append(f"{run['optimizer']} step {step}: lr {record['lr']!r}, schedule says {expected_lr!r}")
        for group in optimizer.param_groups:
            group["lr"] = record["lr"]
        for name, parameter in parameters.items():
            parameter.grad = tensor_from(record["gradients"][name])
        optimizer.step()
        for name, parameter in parameters.items():
            weft_value = tensor_from(record["parameters_after"][name])
            if weft_value.shape != parameter.shape:
                failures.append(f"{run['optimizer']} step {step} {name}: shape {list(weft_value.shape)}, "
                                f"torch {list(parameter.shape)}")
                continue
            error = relative_error(weft_value, parameter.detach())
            status = "ok" if error <= TOLERANCE else "FAIL"
            print(f"{run['optimizer']:5s} step {step} {name:6s} lr {record['lr']:.6g}  rel err {error:.3e}  {status}")
            if error > TOLERANCE:
                failures.append(f"{run['optimizer']} step {step} {name}: relative error {error:.3e} > {TOLERANCE}")
    return failures


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as file:
        data = json.load(file)
    torch.set_default_dtype(torch.float64)
    failures = []
    runs = data["runs"]
    if {run["optimizer"] for run in runs} != {"adamw", "sgd"}:
        failures.append(f"expected an adamw and an sgd run, got {[run['optimizer'] for run in runs]}")
    for run in runs:
        failures += replay(run, data["schedule"])
    if failures:
        print("optimizer golden test FAILED:", file=sys.stderr)
        for failure in failures:
            print("  " + failure, file=sys.stderr)
        return 1
    print("optimizer golden test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
