"""Golden test, PyTorch side: checks weft's composite forward/backward against torch.

Reads the JSON written by composite_golden (tests/golden/composite_golden.cc): the token ids, the
targets and, for each run (f64 and f32), every weight, the loss, the logits and the gradient of
every weight. Rebuilds the same computation with torch.nn.functional from those exact weights (not
re-drawn) and compares. The reference is always computed in float64: the f32 weights are exact in
f64, so the f32 run is measured against the true value rather than against torch's own f32 error.

Error per tensor = max |weft - ref| / max |ref|. Tolerances: f64 run 1e-10, f32 run 1e-4.
Exits 0 when everything passes, 1 on any failure (including a missing gradient or a shape
mismatch), 2 on bad usage.

Usage: /usr/bin/python3 composite_golden.py WEFT_OUTPUT.json
"""

import json
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as error:  # run_golden.sh checks first; this covers a direct run
    sys.exit(f"composite_golden.py: cannot import torch ({error}); install python3-torch "
             "(tools/setup-deps installs it) and run with /usr/bin/python3")

TOLERANCE = {"f64": 1e-10, "f32": 1e-4}


def tensor_from(entry, dtype):
    return torch.tensor(entry["values"], dtype=dtype).reshape(entry["shape"])


def reference(config, ids, targets, weights):
    """The composite in torch, float64. Returns (loss, logits, {name: grad})."""
    B, T, C, H, D = (config[k] for k in ("batch", "time", "channels", "heads", "head_dim"))
    eps = config["layer_norm_eps"]
    p = {name: tensor_from(entry, torch.float64).requires_grad_(True) for name, entry in weights.items()}

    x = F.embedding(ids, p["wte"]) + F.embedding(torch.arange(T), p["wpe"])  # [B, T, C]

    h = F.layer_norm(x, (C,), p["ln1_weight"], p["ln1_bias"], eps)
    qkv = F.linear(h, p["attn_qkv_weight"], p["attn_qkv_bias"])  # [B, T, 3C]
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))  # [B, H, T, D]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # [B, H, T, T]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    scores = scores.masked_fill(~causal, float("-inf"))
    attended = torch.softmax(scores, dim=-1) @ v  # [B, H, T, D]
    attended = attended.transpose(1, 2).contiguous().view(B, T, C)
    x = x + F.linear(attended, p["attn_proj_weight"], p["attn_proj_bias"])

    h = F.layer_norm(x, (C,), p["ln2_weight"], p["ln2_bias"], eps)
    h = F.gelu(F.linear(h, p["mlp_fc_weight"], p["mlp_fc_bias"]), approximate="tanh")
    x = x + F.linear(h, p["mlp_proj_weight"], p["mlp_proj_bias"])

    x = F.layer_norm(x, (C,), p["lnf_weight"], p["lnf_bias"], eps).view(B * T, C)
    logits = F.linear(x, p["wte"])  # [B*T, V], tied
    loss = F.cross_entropy(logits, targets, ignore_index=config["ignore_index"])
    loss.backward()
    return loss.detach(), logits.detach(), {name: t.grad for name, t in p.items()}


def compare(name, got_entry, ref, tolerance, rows):
    """Appends a table row; returns True when `got_entry` matches `ref`."""
    if got_entry is None:
        rows.append((name, "-", "-", "FAIL: weft wrote no gradient"))
        return False
    if ref is None:
        rows.append((name, "-", "-", "FAIL: torch computed no gradient"))
        return False
    if list(got_entry["shape"]) != list(ref.shape):
        rows.append((name, "-", "-", f"FAIL: shape {got_entry['shape']} != torch {list(ref.shape)}"))
        return False
    if any(value is None for value in got_entry["values"]):  # JSON null: weft produced NaN/inf
        rows.append((name, "-", "-", "FAIL: non-finite values from weft"))
        return False
    got = tensor_from(got_entry, torch.float64)
    abs_err = (got - ref).abs().max().item() if ref.numel() else 0.0
    scale = ref.abs().max().item() if ref.numel() else 0.0
    rel_err = abs_err / scale if scale > 0 else abs_err
    ok = math.isfinite(rel_err) and rel_err <= tolerance
    rows.append((name, f"{abs_err:.3e}", f"{rel_err:.3e}", "ok" if ok else f"FAIL (> {tolerance:g})"))
    return ok


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as file:
        document = json.load(file)
    config = document["config"]
    ids = tensor_from(document["ids"], torch.int64)
    targets = tensor_from(document["targets"], torch.int64)
    ignored = int((targets == config["ignore_index"]).sum())
    print(f"torch {torch.__version__}; B={config['batch']} T={config['time']} V={config['vocab']} "
          f"C={config['channels']} H={config['heads']}; {ignored} ignored target(s)")

    failures = 0
    runs_seen = set()
    for run in document["runs"]:
        dtype = run["dtype"]
        runs_seen.add(dtype)
        tolerance = TOLERANCE[dtype]
        loss, logits, grads = reference(config, ids, targets, run["weights"])

        rows = []
        ok = compare("loss", {"shape": [], "values": [run["loss"]]}, loss, tolerance, rows)
        ok &= compare("logits", run["logits"], logits, tolerance, rows)
        for name in grads:
            ok &= compare("grad " + name, run["grads"].get(name), grads[name], tolerance, rows)
        for name in sorted(set(run["grads"]) - set(grads)):
            rows.append(("grad " + name, "-", "-", "FAIL: not a parameter of the reference"))
            ok = False

        width = max(len(row[0]) for row in rows)
        print(f"\n== run {dtype} (tolerance: rel err <= {tolerance:g}; rel err = max abs err / max |ref|) ==")
        print(f"{'tensor':<{width}}  {'max abs err':>11}  {'rel err':>9}  status")
        for name, abs_err, rel_err, status in rows:
            print(f"{name:<{width}}  {abs_err:>11}  {rel_err:>9}  {status}")
        print(f"run {dtype}: loss weft {run['loss']!r} torch {loss.item()!r}: {'PASS' if ok else 'FAIL'}")
        failures += 0 if ok else 1

    for dtype in sorted(set(TOLERANCE) - runs_seen):
        print(f"FAIL: the JSON has no {dtype} run")
        failures += 1
    print("\ncomposite golden: " + ("PASS" if failures == 0 else f"FAIL ({failures} run(s) failed)"))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
