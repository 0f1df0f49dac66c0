#!/opt/torch/.venv/bin/python
# Would AdamW hide under the next step's GEMMs? Times, on the GPU machine, a chain of cuBLAS products
# of one GPT-2 124M step's (or Llama 1B's) shapes on one stream, a fused AdamW over the model's
# parameter count in per-layer chunks, both one after the other, and both overlapped the way a
# deferred update would run (the chunks on a second stream, each layer's products waiting only for
# its chunk). Prints one line per model: what overlapping hid of the update's time.
#   source tools/device/env.sh; /opt/torch/.venv/bin/python tools/device/optimizer-overlap-probe.py
# PyTorch's kernels stand in for weft's (both are cuBLASLt products and one memory-bound multi-tensor
# AdamW pass); the question is the GPU's, not the library's. docs/performance.md has the answer.
import torch, time
torch.backends.cuda.matmul.allow_tf32 = True
dev = "cuda"
def shapes(name):
    if name == "llama":
        T, C, H, layers, params = 16384, 2048, 5504, 16, 870_000_000
        mats = [(C, 4096), (C, C), (C, 2 * H), (H, C)]
    else:
        T, C, layers, params = 16384, 768, 12, 124_000_000
        mats = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)]
    return T, layers, params, mats
for name in ["gpt2", "llama"]:
    T, layers, params, mats = shapes(name)
    xs = {k: torch.randn(T, k, device=dev, dtype=torch.bfloat16) for k, _ in mats}
    ws = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) for k, n in mats]
    chunk = params // layers
    ps = [torch.randn(chunk, device=dev) for _ in range(layers)]
    gs = [torch.randn(chunk, device=dev) for _ in range(layers)]
    ms = [torch.zeros(chunk, device=dev) for _ in range(layers)]
    vs = [torch.zeros(chunk, device=dev) for _ in range(layers)]
    steps = [torch.tensor(1.0, device=dev) for _ in range(layers)]
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    def gemm_layer(i):
        for (k, n), w in zip(mats, ws):
            torch.mm(xs[k], w)
            torch.mm(xs[k], w)  # forward + a second product ~ a backward's share
    def adam(i):
        torch._fused_adamw_([ps[i]], [gs[i]], [ms[i]], [vs[i]], [], [steps[i]], lr=1e-4, beta1=0.9, beta2=0.95,
                            weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)
    def run(mode):
        torch.cuda.synchronize(); t = time.perf_counter()
        for rep in range(5):
            if mode == "gemm":
                with torch.cuda.stream(a):
                    for i in range(layers): gemm_layer(i)
            elif mode == "adam":
                with torch.cuda.stream(a):
                    for i in range(layers): adam(i)
            elif mode == "serial":
                with torch.cuda.stream(a):
                    for i in range(layers): adam(i)
                    for i in range(layers): gemm_layer(i)
            else:  # overlapped: layer i's GEMMs wait for its chunk's update on stream b
                b.wait_stream(a)
                events = []
                with torch.cuda.stream(b):
                    for i in range(layers):
                        adam(i); e = torch.cuda.Event(); e.record(b); events.append(e)
                with torch.cuda.stream(a):
                    for i in range(layers):
                        a.wait_event(events[i]); gemm_layer(i)
                a.wait_stream(b)
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / 5 * 1000
    for mode in ["gemm", "adam", "serial", "overlap"]: run(mode)
    res = {m: [] for m in ["gemm", "adam", "serial", "overlap"]}
    for r in range(4):
        for m in res: res[m].append(run(m))
    med = {m: sorted(v)[len(v)//2] for m, v in res.items()}
    print(f"{name}: gemm {med['gemm']:.2f} ms adam {med['adam']:.2f} serial {med['serial']:.2f} overlapped {med['overlap']:.2f}"
          f" -> hidden {(med['serial']-med['overlap']):.2f} of {med['adam']:.2f} ms adam")
    del xs, ws, ps, gs, ms, vs
    torch.cuda.empty_cache()
