#!/usr/bin/env python3
"""PyTorch GPT-2 training throughput: the peer for weft-train's GPU runs, measured in the same call.

Builds GPT-2 with the shape of a weft config (layers, width, heads, vocabulary, sequence; tied
embeddings, learned positions, GELU tanh MLP, pre-norm), trains it on random tokens in bf16 autocast
with F.scaled_dot_product_attention (causal) and fused AdamW, in eager mode and with torch.compile,
and prints one line per mode:
    mode tokens_per_s step_ms mfu peak_memory_mb
MFU counts 6 * parameters + 6 * layers * T * C FLOPs per token (as weft-train does) against 989
TFLOP/s, the H200's dense bf16 datasheet figure.

Usage: python tools/gpt2_peer.py [--layers 12 --dim 768 --heads 12 --vocab 50304 --seq 1024
                                   --batch 16 --steps 30 --modes eager,compile] [--out FILE]
Under torchrun (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel over NCCL, --batch
is per GPU, and tokens/s counts every rank's tokens (rank 0 prints).
"""
import argparse
import math
import time

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=-1)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.norm2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, dim, heads, vocab, seq):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids, targets):
        t = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.norm(x), self.tokens.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def measure(mode, args):
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = Gpt(args.layers, args.dim, args.heads, args.vocab, args.seq).cuda()
    parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    step_model = torch.compile(model) if mode == "compile" else model
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(5):  # warm-up (and compilation)
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    tokens = args.batch * args.seq * world
    flops = tokens * (6 * parameters + 6 * args.layers * args.seq * args.dim)
    return tokens / seconds, 1000 * seconds, flops / seconds / 989e12 / world, torch.cuda.max_memory_allocated() / 2**20


def main():
    parser = argparse.ArgumentParser()
    for name, default in [("layers", 12), ("dim", 768), ("heads", 12), ("vocab", 50304), ("seq", 1024),
                          ("batch", 16), ("steps", 30)]:
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--out")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    lines = []
    for mode in args.modes.split(","):
        tokens_per_s, step_ms, mfu, memory = measure(mode, args)
        name = f"pytorch-ddp-{mode}" if world > 1 else f"pytorch-{mode}"
        lines.append(f"{name} {tokens_per_s:.0f} {step_ms:.2f} {mfu:.4f} {memory:.0f}")
        if int(os.environ.get("RANK", "0")) == 0:
            print(lines[-1], flush=True)
    if world > 1:
        dist.destroy_process_group()
        if int(os.environ.get("RANK", "0")) != 0:
            return
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
