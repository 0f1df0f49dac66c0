#!/usr/bin/env python3
"""PyTorch SDPA causal attention timings: the peer numbers for tools/cuda_attention_benchmark.

Runs on the GPU machine with PyTorch's Python (there: /opt/torch/.venv/bin/python, also `python3`).
For each shape it times torch.nn.functional.scaled_dot_product_attention(is_causal=True) in bf16
with the cuDNN and the flash backends: the forward alone and forward + backward, with CUDA events
(warm-up, then the median of --iters runs). TFLOP/s count causal FLOPs as half of the full T x T
products: forward 4*B*H*T*T*D / 2; backward 2.5x the forward, so forward + backward = 3.5x.

Writes one line per (backend, shape) to --out (and prints the same table):
    backend B H T D fwd_ms fwd_tflops fwdbwd_ms fwdbwd_tflops
A backend that cannot run a shape is written with "nan" numbers.

Usage: python tools/attention_peer.py --out peer.txt [--iters 20] [--shapes 16,12,1024,64 ...]
"""
import argparse
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DEFAULT_SHAPES = [(16, 12, 1024, 64), (8, 16, 1024, 128), (4, 16, 4096, 128)]
BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]


def causal_fwd_flops(b, h, t, d):
    return 4.0 * b * h * t * t * d / 2.0


def median_ms(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def measure(backend, shape, iters):
    b, h, t, d = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, g = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    with sdpa_kernel([backend]):
        def forward():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def forward_backward():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(g)
            q.grad = k.grad = v.grad = None

        fwd = median_ms(forward, iters)
        fwdbwd = median_ms(forward_backward, iters)
    flops = causal_fwd_flops(b, h, t, d)
    return fwd, flops / fwd / 1e9, fwdbwd, 3.5 * flops / fwdbwd / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="file for the numbers (read by cuda_attention_benchmark --peer)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--shapes", nargs="*", default=None, help="B,H,T,D ...")
    args = parser.parse_args()
    shapes = DEFAULT_SHAPES if not args.shapes else [tuple(int(x) for x in s.split(",")) for s in args.shapes]
    if not torch.cuda.is_available():
        sys.exit("attention_peer.py: no CUDA device visible to PyTorch")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    lines = ["# backend B H T D fwd_ms fwd_tflops fwdbwd_ms fwdbwd_tflops"]
    print(f"{'backend':8s} {'B':>3s} {'H':>3s} {'T':>5s} {'D':>4s} {'fwd ms':>8s} {'fwd TF/s':>9s} "
          f"{'f+b ms':>8s} {'f+b TF/s':>9s}")
    for shape in shapes:
        for name, backend in BACKENDS:
            try:
                fwd_ms, fwd_tf, fb_ms, fb_tf = measure(backend, shape, args.iters)
            except Exception as error:  # a backend may not support a shape
                print(f"{name}: {shape} failed: {str(error).splitlines()[0] if str(error) else error!r}")
                fwd_ms = fwd_tf = fb_ms = fb_tf = math.nan
            b, h, t, d = shape
            lines.append(f"{name} {b} {h} {t} {d} {fwd_ms:.4f} {fwd_tf:.2f} {fb_ms:.4f} {fb_tf:.2f}")
            print(f"{name:8s} {b:3d} {h:3d} {t:5d} {d:4d} {fwd_ms:8.3f} {fwd_tf:9.1f} {fb_ms:8.3f} {fb_tf:9.1f}")
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
