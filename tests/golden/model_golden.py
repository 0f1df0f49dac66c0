"""Golden test, PyTorch side: checks weft's GPT and Llama models against plain torch.

Reads the JSON written by model_golden (tests/golden/model_golden.cc): token ids, targets and, for
each model, its config, every weight, the loss and every gradient. Rebuilds each model here from
torch.nn.functional alone, with those exact weights, in float64, following the published designs
rather than weft's code:

  gpt:   x = wte[ids] + wpe[:T]; blocks x = x + attn(ln1(x)); x = x + mlp(ln2(x)) with
         mlp = proj(gelu_tanh(fc(x))); logits = ln_f(x) wte^T (tied)
  llama: x = wte[ids]; the same blocks with RMSNorm, SwiGLU (down(silu(gate(x)) * up(x))), no
         biases, RoPE on q and k (rotate-half, as Hugging Face's LlamaModel) and grouped-query
         attention (k/v heads repeated with repeat_interleave, as HF's repeat_kv); untied head

The fused qkv weight holds the H query heads, then the KV key heads, then the KV value heads, each
head D consecutive rows. The expected parameter names and shapes are checked too, so a renamed or
reshaped weight fails here. Error per tensor = max |weft - ref| / max |ref|, tolerance 1e-9.
Exits 0 when everything passes, 1 on any failure, 2 on bad usage.

Usage: /usr/bin/python3 model_golden.py WEFT_OUTPUT.json
"""

import json
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as error:  # run_golden.sh checks first; this covers a direct run
    sys.exit(f"model_golden.py: cannot import torch ({error}); install python3-torch "
             "(tools/setup-deps installs it) and run with /usr/bin/python3")

TOLERANCE = 1e-9


def tensor_from(entry, dtype=torch.float64):
    return torch.tensor(entry["values"], dtype=dtype).reshape(entry["shape"])


def swiglu_hidden(dim, hidden_dim):
    if hidden_dim > 0:
        return hidden_dim
    return (8 * dim // 3 + 63) // 64 * 64


def expected_shapes(kind, config):
    """name -> shape of every parameter the model must have, in weft's naming."""
    C, V, T, H = config["dim"], config["vocab"], config["seq_len"], config["heads"]
    KV = config["kv_heads"] or H
    D = C // H
    shapes = {"token_embedding.weight": [V, C]}
    if kind == "gpt":
        shapes["position_embedding.weight"] = [T, C]
    bias = kind == "gpt"
    for layer in range(config["layers"]):
        prefix = f"blocks.{layer}."
        linears = {"attention.qkv": [(H + 2 * KV) * D, C], "attention.proj": [C, C]}
        if kind == "gpt":
            hidden = config["hidden_dim"] or 4 * C
            linears.update({"mlp.fc": [hidden, C], "mlp.proj": [C, hidden]})
        else:
            hidden = swiglu_hidden(C, config["hidden_dim"])
            linears.update({"mlp.gate": [hidden, C], "mlp.up": [hidden, C], "mlp.down": [C, hidden]})
        for norm in ("norm1", "norm2"):
            shapes[prefix + norm + ".weight"] = [C]
            if bias:
                shapes[prefix + norm + ".bias"] = [C]
        for name, shape in linears.items():
            shapes[prefix + name + ".weight"] = shape
            if bias:
                shapes[prefix + name + ".bias"] = [shape[0]]
    shapes["final_norm.weight"] = [C]
    if bias:
        shapes["final_norm.bias"] = [C]
    if kind == "llama":
        shapes["head.weight"] = [V, C]
    return shapes


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(T, D, theta):
    inverse_frequency = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))  # [D/2]
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inverse_frequency)  # [T, D/2]
    angles = torch.cat((angles, angles), dim=-1)  # [T, D]
    return angles.cos(), angles.sin()


def attention(x, p, prefix, config, kind):
    B, T, C = x.shape
    H = config["heads"]
    KV = config["kv_heads"] or H
    D = C // H
    qkv = F.linear(x, p[prefix + "qkv.weight"], p.get(prefix + "qkv.bias"))  # [B, T, (H + 2KV) D]
    q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
    q = q.view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
    k = k.view(B, T, KV, D).transpose(1, 2)  # [B, KV, T, D]
    v = v.view(B, T, KV, D).transpose(1, 2)
    if kind == "llama":
        cos, sin = rope_tables(T, D, config["rope_theta"])
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(H // KV, dim=1)  # [B, H, T, D]: query head h reads kv head h // (H / KV)
    v = v.repeat_interleave(H // KV, dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # [B, H, T, T]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    scores = scores.masked_fill(~causal, float("-inf"))
    attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    return F.linear(attended, p[prefix + "proj.weight"], p.get(prefix + "proj.bias"))


def reference(model, ids, targets, ignore_index):
    """The model in torch, float64. Returns (loss, {name: grad})."""
    config = model["config"]
    kind = config["type"]
    eps = config["norm_eps"]
    C = config["dim"]
    T = ids.shape[1]
    p = {name: tensor_from(entry).requires_grad_(True) for name, entry in model["weights"].items()}

    if kind == "gpt":
        def norm(x, prefix):
            return F.layer_norm(x, (C,), p[prefix + ".weight"], p[prefix + ".bias"], eps)

        def mlp(x, prefix):
            hidden = F.gelu(F.linear(x, p[prefix + "fc.weight"], p[prefix + "fc.bias"]), approximate="tanh")
            return F.linear(hidden, p[prefix + "proj.weight"], p[prefix + "proj.bias"])
    else:
        def norm(x, prefix):
            return rms_norm(x, p[prefix + ".weight"], eps)

        def mlp(x, prefix):
            hidden = F.silu(F.linear(x, p[prefix + "gate.weight"])) * F.linear(x, p[prefix + "up.weight"])
            return F.linear(hidden, p[prefix + "down.weight"])

    x = F.embedding(ids, p["token_embedding.weight"])  # [B, T, C]
    if kind == "gpt":
        x = x + p["position_embedding.weight"][:T]
    for layer in range(config["layers"]):
        prefix = f"blocks.{layer}."
        x = x + attention(norm(x, prefix + "norm1"), p, prefix + "attention.", config, kind)
        x = x + mlp(norm(x, prefix + "norm2"), prefix + "mlp.")
    x = norm(x, "final_norm")
    head = p["token_embedding.weight"] if kind == "gpt" else p["head.weight"]
    logits = F.linear(x, head)  # [B, T, V]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index)
    loss.backward()
    return loss.detach(), {name: t.grad for name, t in p.items()}


def relative(actual, expected):
    scale = expected.abs().max().item()
    return (actual - expected).abs().max().item() / max(scale, 1e-30)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as file:
        document = json.load(file)
    ids = tensor_from(document["ids"], torch.int64)
    targets = tensor_from(document["targets"], torch.int64)
    failures = 0
    for model in document["models"]:
        kind = model["config"]["type"]
        shapes = {name: entry["shape"] for name, entry in model["weights"].items()}
        expected = expected_shapes(kind, model["config"])
        if shapes != expected:
            failures += 1
            print(f"FAIL {kind}: parameters differ from the {kind} design")
            for name in sorted(set(shapes) | set(expected)):
                if shapes.get(name) != expected.get(name):
                    print(f"  {name}: weft {shapes.get(name)}, expected {expected.get(name)}")
            continue
        loss, grads = reference(model, ids, targets, document["ignore_index"])
        error = abs(model["loss"] - loss.item()) / abs(loss.item())
        ok = error <= TOLERANCE
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {kind} loss: weft {model['loss']:.15g} torch {loss.item():.15g} "
              f"rel err {error:.2e}")
        worst = 0.0
        for name, grad in grads.items():
            entry = model["grads"].get(name)
            if entry is None or grad is None:
                failures += 1
                print(f"FAIL {kind} {name}: gradient missing ({'weft' if entry is None else 'torch'})")
                continue
            error = relative(tensor_from(entry), grad)
            worst = max(worst, error)
            if not error <= TOLERANCE:
                failures += 1
                print(f"FAIL {kind} grad {name}: rel err {error:.2e}")
        print(f"     {kind}: {len(grads)} gradients, worst rel err {worst:.2e}")
    if failures:
        print(f"model_golden.py: {failures} failure(s)")
        return 1
    print("model_golden.py: all models match PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
