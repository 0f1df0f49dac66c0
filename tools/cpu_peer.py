#!/usr/bin/env python3
"""PyTorch CPU training throughput: the peer for weft-train's CPU runs (issue #17), measured in the same call.

Reads a weft run config (YAML, typically the merged one `weft-train CONFIG --set ... --dump-config`
prints, so that every setting is the one weft runs) and trains the same GPT in PyTorch eager mode
on the CPU, f32:
  x = wte[ids] + wpe[:T]; per block x = x + proj(attn(ln1(x))); x = x + proj(gelu_tanh(fc(ln2(x))));
  logits = ln_f(x) wte^T (tied); cross-entropy
with the parameters named and shaped as weft's (tests/golden/model_golden.py's expected_shapes,
imported from there, so the count matches weft's by construction of the same design), weft's init
(normal(0, init_std) matrices, zero biases, unit norms), dropout where weft puts it (embedding sum,
attention output, MLP output), AdamW with weft's betas, eps and decay on 2-D and larger parameters
only, weft's warm-up and cosine schedule, and gradient clipping at train.grad_clip. Data: uniform
random token ids (throughput does not depend on them).

PyTorch at its best here: the causal mask is built once, AdamW runs with foreach (one C++ call per
step over all parameters; faster than the per-tensor loop on this CPU), gradients are set to None.
Torch 1.13 (Debian's) has neither torch.compile nor F.scaled_dot_product_attention, so attention is
matmul, masked softmax, matmul: what 1.13's eager mode offers.

For each thread count in --threads (torch.set_num_threads), runs --warmup steps, then times --steps
steps, and keeps the best. Prints (and with --out writes) one line:
    peer SHAPE TOKENS_PER_S THREADS STEP_MS PARAMETERS
where SHAPE is LAYERSxDIMxSEQ (e.g. 2x64x64); then, on stderr, each thread count's tokens/s.

Usage: /usr/bin/python3 tools/cpu_peer.py CONFIG.yaml [--steps 10] [--warmup 3] [--threads 1,2] [--out FILE]
Exits 2, saying why, on a config this peer does not model (it covers weft's GPT on the CPU in f32).
"""
import argparse
import math
import os
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    import yaml
except ImportError as error:
    sys.exit(f"cpu_peer.py: cannot import {error.name}; install Debian's python3-torch (tools/setup-deps) "
             "and run with /usr/bin/python3")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from model_golden import expected_shapes  # noqa: E402  (weft's parameter names and shapes for a GPT)

# weft's defaults (launcher/config_options.cc) for the keys this peer reads, used when the config
# file leaves them out; a `--dump-config` file holds every key.
MODEL_DEFAULTS = {"type": "gpt", "kv_heads": 0, "hidden_dim": 0, "mlp": "gelu_mlp", "norm": "layer_norm",
                  "positions": "learned", "norm_eps": 1e-5, "bias": True, "tie_embeddings": True,
                  "dropout": 0.0, "init_std": 0.02}
TRAIN_DEFAULTS = {"device": "cpu", "dtype": "f32", "micro_batches": 1, "optimizer": "adamw", "lr": 3e-4,
                  "min_lr_ratio": 0.1, "schedule": "cosine", "warmup_steps": 0, "weight_decay": 0.0,
                  "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0, "seed": 1, "recompute": "none"}
# What this peer models; anything else is refused rather than measured as something it is not.
SUPPORTED = {("model", "type"): "gpt", ("model", "mlp"): "gelu_mlp", ("model", "norm"): "layer_norm",
             ("model", "positions"): "learned", ("model", "bias"): True, ("model", "tie_embeddings"): True,
             ("train", "device"): "cpu", ("train", "dtype"): "f32", ("train", "micro_batches"): 1,
             ("train", "optimizer"): "adamw"}


def load_config(path):
    try:
        with open(path) as file:
            document = yaml.safe_load(file) or {}
    except (OSError, yaml.YAMLError) as error:
        sys.exit(f"cpu_peer.py: cannot read the config {path}: {error}")
    model = {**MODEL_DEFAULTS, **document.get("model", {})}
    train = {**TRAIN_DEFAULTS, **document.get("train", {})}
    for key in ("layers", "dim", "heads", "vocab", "seq_len"):
        if key not in model:
            sys.exit(f"cpu_peer.py: {path} has no model.{key}; pass a weft config (weft-train ... --dump-config)")
    if "batch_size" not in train:
        sys.exit(f"cpu_peer.py: {path} has no train.batch_size")
    # PyYAML reads YAML 1.1, where "1e-08" (no dot, as --dump-config writes it) is a string.
    for section, keys in ((model, ("norm_eps", "dropout", "init_std")),
                          (train, ("lr", "min_lr_ratio", "weight_decay", "beta1", "beta2", "eps", "grad_clip"))):
        for key in keys:
            try:
                section[key] = float(section[key])
            except (TypeError, ValueError):
                sys.exit(f"cpu_peer.py: {key} = {section[key]!r} in {path} is not a number")
    sections = {"model": model, "train": train}
    for (section, key), wanted in SUPPORTED.items():
        if sections[section][key] != wanted:
            sys.exit(f"cpu_peer.py: {section}.{key} = {sections[section][key]} is not modelled; this peer "
                     f"covers weft's GPT with {section}.{key} = {wanted}")
    if model["kv_heads"] not in (0, model["heads"]) or model["dim"] % model["heads"]:
        sys.exit(f"cpu_peer.py: model.heads = {model['heads']} must divide model.dim = {model['dim']}, "
                 "and the GPT has no grouped-query attention (model.kv_heads 0)")
    return model, train


def make_parameters(model):
    """{weft name: tensor}, f32, initialised as weft does."""
    golden_config = {key: model[key] for key in ("layers", "dim", "heads", "kv_heads", "vocab", "seq_len",
                                                 "hidden_dim")}
    parameters = {}
    for name, shape in expected_shapes("gpt", golden_config).items():
        if len(shape) >= 2:
            tensor = torch.randn(shape) * model["init_std"]
        elif "norm" in name and name.endswith(".weight"):
            tensor = torch.ones(shape)
        else:
            tensor = torch.zeros(shape)
        parameters[name] = tensor.requires_grad_(True)
    return parameters


def gpt_loss(p, ids, targets, model, causal, training=True):
    """The forward pass and loss, ids and targets [B, T]."""
    B, T = ids.shape
    C, H, eps, dropout = model["dim"], model["heads"], model["norm_eps"], model["dropout"]
    D = C // H

    def norm(x, name):
        return F.layer_norm(x, (C,), p[name + ".weight"], p[name + ".bias"], eps)

    def drop(x):
        return F.dropout(x, dropout, training) if dropout > 0 else x

    x = drop(F.embedding(ids, p["token_embedding.weight"]) + p["position_embedding.weight"][:T])  # [B, T, C]
    for layer in range(model["layers"]):
        prefix = f"blocks.{layer}."
        qkv = F.linear(norm(x, prefix + "norm1"), p[prefix + "attention.qkv.weight"],
                       p[prefix + "attention.qkv.bias"])  # [B, T, 3C]
        q, k, v = (part.view(B, T, H, D).transpose(1, 2) for part in qkv.split(C, dim=-1))  # [B, H, T, D]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # [B, H, T, T]
        weights = torch.softmax(scores.masked_fill(causal[:T, :T], float("-inf")), dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(B, T, C)  # [B, T, C]
        x = x + drop(F.linear(attended, p[prefix + "attention.proj.weight"], p[prefix + "attention.proj.bias"]))
        hidden = F.gelu(F.linear(norm(x, prefix + "norm2"), p[prefix + "mlp.fc.weight"], p[prefix + "mlp.fc.bias"]),
                        approximate="tanh")  # [B, T, 4C]
        x = x + drop(F.linear(hidden, p[prefix + "mlp.proj.weight"], p[prefix + "mlp.proj.bias"]))
    logits = F.linear(norm(x, "final_norm"), p["token_embedding.weight"])  # [B, T, V]
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def learning_rate(step, train, total_steps):
    """weft's schedule (optim/lr_schedule.h): linear warm-up, then cosine or linear decay to min_lr."""
    peak, warmup = train["lr"], min(train["warmup_steps"], total_steps)
    if step < warmup:
        return peak * (step + 1) / warmup
    if train["schedule"] == "constant" or total_steps == warmup:
        return peak
    progress = min(1.0, (step - warmup) / (total_steps - warmup))
    minimum = train["min_lr_ratio"] * peak
    if train["schedule"] == "linear":
        return peak - (peak - minimum) * progress
    return minimum + 0.5 * (peak - minimum) * (1 + math.cos(math.pi * progress))


def measure(model, train, threads, warmup, steps):
    """Tokens per second over `steps` timed steps after `warmup` steps, with `threads` threads."""
    torch.set_num_threads(threads)
    torch.manual_seed(train["seed"])
    p = make_parameters(model)
    decayed = [t for t in p.values() if t.dim() >= 2]  # weft: matrices and embeddings decay, 1-D does not
    plain = [t for t in p.values() if t.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": train["weight_decay"]},
                                   {"params": plain, "weight_decay": 0.0}],
                                  lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=train["eps"],
                                  foreach=True)
    B, T, V = train["batch_size"], model["seq_len"], model["vocab"]
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)  # True above the diagonal: masked
    total = warmup + steps
    windows = [torch.randint(0, V, (B, T + 1)) for _ in range(4)]  # [B, T + 1] each
    batches = [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]  # ids, targets [B, T]

    def step(index):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(index, train, total)
        ids, targets = batches[index % len(batches)]
        loss = gpt_loss(p, ids, targets, model, causal)
        loss.backward()
        if train["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(p.values(), train["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    for index in range(warmup):
        step(index)
    start = time.perf_counter()
    for index in range(warmup, total):
        loss = step(index)
    seconds = (time.perf_counter() - start) / steps
    if not math.isfinite(loss):
        sys.exit(f"cpu_peer.py: the loss is {loss} after {total} steps; the measurement is not a training run")
    return B * T / seconds, 1000 * seconds, sum(t.numel() for t in p.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0:
        sys.exit("cpu_peer.py: --steps must be at least 1 and --warmup at least 0")
    try:
        thread_counts = [int(count) for count in args.threads.split(",")]
    except ValueError:
        sys.exit(f"cpu_peer.py: --threads {args.threads!r} must be comma-separated counts, e.g. 1,2")
    model, train = load_config(args.config)
    best = None
    for threads in thread_counts:
        tokens_per_s, step_ms, parameters = measure(model, train, threads, args.warmup, args.steps)
        print(f"cpu_peer.py: {threads} thread(s): {tokens_per_s:.0f} tokens/s, {step_ms:.1f} ms/step",
              file=sys.stderr, flush=True)
        if best is None or tokens_per_s > best[0]:
            best = (tokens_per_s, threads, step_ms, parameters)
    shape = f"{model['layers']}x{model['dim']}x{model['seq_len']}"
    line = f"peer {shape} {best[0]:.0f} {best[1]} {best[2]:.2f} {best[3]}"
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as out:
            out.write(line + "\n")


if __name__ == "__main__":
    main()
