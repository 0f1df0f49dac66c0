"""The peer of tools/collective_benchmark: PyTorch's torch.distributed collectives, timed as weft's are.

One process per rank, with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), as tools/collective_benchmark.sh starts them (or under torchrun):
  python tools/collective_peer.py [--device cpu|cuda]
      [--dtype f32|bf16] [--min-bytes B] [--max-bytes B] [--factor F] [--iters N] [--warmup N]
      [--ops all_reduce,reduce_scatter,all_gather,send_recv] [--json FILE]

NCCL on GPUs (one per rank, by LOCAL_RANK), Gloo on the CPU. The same sizes, buffers, reductions
(max), the same slowest-rank host timing of --iters back-to-back calls after --warmup, and the same
algbw/busbw as collective_benchmark.cc; every result is checked the same way. An op the backend
does not offer (Gloo has no reduce_scatter) is reported as such, not timed.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    parser.add_argument("--min-bytes", type=int, default=1 << 10)
    parser.add_argument("--max-bytes", type=int, default=1 << 24)
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather,send_recv")
    parser.add_argument("--json", default="")
    return parser.parse_args()


def main():
    args = parse()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    size, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    element = torch.tensor([], dtype=dtype).element_size()

    def synchronize():
        if cuda:
            torch.cuda.synchronize()

    def check(tensor, begin, end, expected, what):
        values = tensor[begin:end].double().cpu()
        bad = (values != expected).nonzero()
        if len(bad):
            i = int(bad[0]) + begin
            raise SystemExit(f"collective_peer: {what}: element {i} is {float(tensor[i])}, expected {expected}")

    rows = []
    if rank == 0:
        print(f"PyTorch {torch.__version__} collectives over {size} ranks on {args.device} "
              f"({'NCCL' if cuda else 'Gloo'}), {args.dtype} (slowest rank, {args.iters} iterations after "
              f"{args.warmup} warm-up)")
        print(f"{'op':<15} {'bytes':>14} {'time us':>12} {'algbw GB/s':>12} {'busbw GB/s':>12}")
    for op in [o for o in args.ops.split(",") if o]:
        bytes_ = args.min_bytes
        while bytes_ <= args.max_bytes:
            count = max(bytes_ // element // size, 1) * size
            chunk = count // size
            what = f"{op} of {count * element} bytes"
            buffer = torch.full((count,), rank + 1.0, dtype=dtype, device=device)
            piece = torch.full((chunk,), rank + 1.0, dtype=dtype, device=device)
            received = torch.zeros(count, dtype=dtype, device=device)
            partner = rank + 1 if rank % 2 == 0 else rank - 1
            paired = op != "send_recv" or partner < size

            def issue():
                if op == "all_reduce":
                    dist.all_reduce(buffer, op=dist.ReduceOp.MAX)
                elif op == "reduce_scatter":
                    dist.reduce_scatter_tensor(piece, buffer, op=dist.ReduceOp.MAX)
                elif op == "all_gather":
                    if cuda:
                        dist.all_gather_into_tensor(buffer, piece)
                    else:  # Gloo gathers into a list of the ranks' chunks (views of the buffer)
                        dist.all_gather(list(buffer.split(chunk)), piece)
                else:
                    operations = [dist.P2POp(dist.isend, buffer, partner), dist.P2POp(dist.irecv, received, partner)]
                    for request in dist.batch_isend_irecv(operations):
                        request.wait()

            supported = True
            try:
                if paired:
                    for _ in range(max(1, args.warmup)):  # at least once: whether the backend has the op
                        issue()
                    synchronize()
            except Exception as error:  # the backend lacks the op (or the dtype); every rank raises alike
                supported = False
                reason = str(error).splitlines()[0]
            dist.barrier()
            if not supported:
                if rank == 0:
                    print(f"{op:<15} {count * element:>14} not offered by {'NCCL' if cuda else 'Gloo'}: {reason[:60]}")
                rows.append({"op": op, "bytes": count * element, "us": None, "algbw": None, "busbw": None})
                bytes_ *= args.factor
                continue
            start = time.perf_counter()
            if paired:
                for _ in range(args.iters):
                    issue()
                synchronize()
            seconds = (time.perf_counter() - start) / args.iters
            slowest = torch.tensor([seconds if paired else 0.0], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            seconds = float(slowest)

            if op == "all_reduce":
                check(buffer, 0, count, float(size), what)
            elif op == "reduce_scatter":
                check(piece, 0, chunk, float(size), what)
            elif op == "all_gather":
                for r in range(size):
                    check(buffer, r * chunk, (r + 1) * chunk, r + 1.0, what)
            elif paired:
                check(received, 0, count, partner + 1.0, what)

            algbw = count * element / seconds / 1e9
            factor = 2.0 * (size - 1) / size if op == "all_reduce" else 1.0 if op == "send_recv" else (size - 1) / size
            rows.append({"op": op, "bytes": count * element, "us": seconds * 1e6, "algbw": algbw,
                         "busbw": algbw * factor})
            if rank == 0:
                print(f"{op:<15} {count * element:>14} {seconds * 1e6:>12.1f} {algbw:>12.2f} {algbw * factor:>12.2f}",
                      flush=True)
            bytes_ *= args.factor
    if rank == 0 and args.json:
        with open(args.json, "w") as out:
            for row in rows:
                out.write(json.dumps(dict(row, ranks=size, side="pytorch")) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
