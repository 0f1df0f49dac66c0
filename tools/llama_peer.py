#!/usr/bin/env python3
"""PyTorch Llama training throughput: the peer for weft-train's Llama runs, measured in the same call.

Builds a Llama-style model with the shape of a weft config (layers, width, heads, key/value heads,
MLP width, vocabulary, sequence): RMSNorm before attention and MLP, rotary positions on q and k
(rotate-half, as weft's layers/rope.h and Hugging Face's LlamaModel), grouped-query attention through
F.scaled_dot_product_attention (causal; enable_gqa where this torch has it, else k and v repeated),
a SwiGLU MLP (down(silu(gate(x)) * up(x))), no biases and an untied output head. It trains on random
tokens in bf16 autocast with AdamW (fused on CUDA) and gradient clipping, in eager mode and with
torch.compile, and prints one line per mode, as tools/gpt2_peer.py does:
    mode tokens_per_s step_ms mfu peak_memory_mb
MFU counts 6 * parameters + 6 * layers * T * C FLOPs per token (as weft-train does) against 989
TFLOP/s, the H200's dense bf16 datasheet figure. The parameter count goes to stderr, to check that
both sides built the same model.

Usage: python tools/llama_peer.py [--layers 16 --dim 2048 --heads 16 --kv-heads 8 --hidden 0
                                    --vocab 32000 --seq 2048 --batch 8 --steps 30
                                    --modes eager,compile] [--out FILE] [--device cuda]
--hidden 0 takes weft's default, 8C/3 rounded up to a multiple of 64. --device cpu (eager only, a
tiny shape) checks the script where there is no GPU; there autocast is off and AdamW is not fused.
"""
import argparse
import inspect
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F



def sdpa_has_gqa():
    """Whether F.scaled_dot_product_attention takes enable_gqa (torch >= 2.5): query head h then
    reads kv head h // (H / KV) without a copy."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return False
    try:
        q, kv = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8)
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return True
    except TypeError:
        return False


SDPA_HAS_GQA = sdpa_has_gqa()


def causal_attention(q, k, v, gqa):
    """softmax(mask(q k^T / sqrt(D))) v; q [B, H, T, D], k and v [B, KV, T, D]."""
    if gqa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch < 2.0 (Debian's 1.13, for the CPU check only): the same product written out.
    t = q.shape[2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


def swiglu_hidden(dim, hidden):
    return hidden if hidden > 0 else (8 * dim // 3 + 63) // 64 * 64


class RmsNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if hasattr(F, "rms_norm"):  # torch >= 2.4
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        normalized = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normalized.type_as(x) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1 = RmsNorm(dim)
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm2 = RmsNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        d = self.head_dim
        q, k, v = self.qkv(self.norm1(x)).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = q.view(b, t, self.heads, d).transpose(1, 2)      # [B, H, T, D]
        k = k.view(b, t, self.kv_heads, d).transpose(1, 2)   # [B, KV, T, D]
        v = v.view(b, t, self.kv_heads, d).transpose(1, 2)   # [B, KV, T, D]
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)          # [T, D], as the activations (HF does the same)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = causal_attention(q, k, v, SDPA_HAS_GQA and self.kv_heads != self.heads)  # [B, H, T, D]
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, layers, dim, heads, kv_heads, hidden, vocab, seq, theta):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RmsNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        d = dim // heads
        inverse_frequency = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = torch.outer(torch.arange(seq, dtype=torch.float64), inverse_frequency)  # [T, D/2]
        angles = torch.cat((angles, angles), dim=-1)                                       # [T, D]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, ids, targets):
        t = ids.shape[1]
        x = self.tokens(ids)
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def measure(mode, args):
    torch.manual_seed(0)
    device = args.device
    on_gpu = device == "cuda"
    hidden = swiglu_hidden(args.dim, args.hidden)
    model = Llama(args.layers, args.dim, args.heads, args.kv_heads, hidden, args.vocab, args.seq, args.rope_theta)
    model = model.to(device)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"llama_peer: {parameters} parameters (hidden {hidden}), sdpa gqa {'native' if SDPA_HAS_GQA else 'expanded'}",
          file=sys.stderr)
    fused = {"fused": True} if on_gpu else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **fused)
    step_model = torch.compile(model) if mode == "compile" else model
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)

    def step():
        if on_gpu:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step_model(ids, targets)
        else:
            loss = step_model(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):  # warm-up (and compilation)
        step()
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if on_gpu:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    if not torch.isfinite(loss):
        raise RuntimeError(f"llama_peer: loss is {loss.item()} in mode {mode}")
    tokens = args.batch * args.seq
    flops = tokens * (6 * parameters + 6 * args.layers * args.seq * args.dim)
    memory = torch.cuda.max_memory_allocated() / 2**20 if on_gpu else 0.0
    return tokens / seconds, 1000 * seconds, flops / seconds / 989e12, memory


def main():
    parser = argparse.ArgumentParser()
    for name, default in [("layers", 16), ("dim", 2048), ("heads", 16), ("kv-heads", 8), ("hidden", 0),
                          ("vocab", 32000), ("seq", 2048), ("batch", 8), ("steps", 30), ("warmup", 5)]:
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--rope-theta", type=float, default=10000.0)
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.dim % args.heads or args.heads % args.kv_heads or (args.dim // args.heads) % 2:
        parser.error("--heads must divide --dim with an even head dim, and --kv-heads must divide --heads")
    lines = []
    for mode in args.modes.split(","):
        tokens_per_s, step_ms, mfu, memory = measure(mode, args)
        lines.append(f"pytorch-{mode} {tokens_per_s:.0f} {step_ms:.2f} {mfu:.4f} {memory:.0f}")
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
