#!/usr/bin/env bash
# weft's collectives against PyTorch's in one call: tools/collective_benchmark (weft's process
# groups: MPI on the CPU, NCCL on GPUs) under mpirun, then tools/collective_peer.py (torch.distributed:
# Gloo on the CPU, NCCL on GPUs), one process per rank, on the same ranks, sizes and dtype, and
# one table: per op and size, each side's time and bus bandwidth (nccl-tests' definition) and
# weft / peer. Both sides check every result; either failing fails the script.
#   usage: [RANKS=2] [DEVICE=cpu|cuda] [DTYPE=f32] [MIN_BYTES=1024] [MAX_BYTES=16777216] [FACTOR=4]
#          [ITERS=20] [WARMUP=5] [OPS=all_reduce,reduce_scatter,all_gather,send_recv]
#          tools/collective_benchmark.sh [COLLECTIVE_BENCHMARK] [PYTHON]
# On the GPU machine (after `source tools/device/env.sh`), e.g. for the multi-GPU issue's NCCL
# figures: RANKS=2 DEVICE=cuda DTYPE=bf16 MAX_BYTES=$((2 << 30)) tools/collective_benchmark.sh
#   build-gpu/device-programs/collective_benchmark /opt/torch/.venv/bin/python
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
program=${1:-build/tools/collective_benchmark}
python=${2:-/usr/bin/python3}
ranks=${RANKS:-2}
work=$(mktemp -d /tmp/weft-collectives.XXXXXX)
flags=(--device "${DEVICE:-cpu}" --dtype "${DTYPE:-f32}" --min-bytes "${MIN_BYTES:-1024}"
       --max-bytes "${MAX_BYTES:-16777216}" --factor "${FACTOR:-4}" --iters "${ITERS:-20}" --warmup "${WARMUP:-5}"
       --ops "${OPS:-all_reduce,reduce_scatter,all_gather,send_recv}")
mpirun=(mpirun -np "$ranks" --bind-to none)
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
[[ $ranks -gt $(nproc) ]] && mpirun+=(--oversubscribe)
[[ -n ${LD_LIBRARY_PATH:-} ]] && mpirun+=(-x LD_LIBRARY_PATH)
[[ -n ${NCCL_NVLS_ENABLE:-} ]] && mpirun+=(-x NCCL_NVLS_ENABLE)
"${mpirun[@]}" "$program" "${flags[@]}" --json "$work/weft.jsonl"
echo
# The peer's ranks are started here with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT): Debian's torch 1.13 cannot start torch.distributed.run under its Python.
pids=()
for ((rank = 0; rank < ranks; ++rank)); do
  RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$ranks MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29517} \
    "$python" "$here/collective_peer.py" "${flags[@]}" --json "$work/peer.jsonl" &
  pids+=($!)
done
for pid in "${pids[@]}"; do
  wait "$pid" || { echo "collective_benchmark.sh: a peer rank failed" >&2; kill "${pids[@]}" 2>/dev/null; exit 1; }
done
echo
"$python" - "$work/weft.jsonl" "$work/peer.jsonl" <<'PYTHON'
import json, sys
weft = {(r["op"], r["bytes"]): r for r in map(json.loads, open(sys.argv[1]))}
peer = {(r["op"], r["bytes"]): r for r in map(json.loads, open(sys.argv[2]))}
print(f"{'op':<15} {'bytes':>12} {'weft us':>10} {'peer us':>10} {'weft busbw':>11} {'peer busbw':>11} {'weft/peer':>10}")
for key, row in weft.items():
    other = peer.get(key)
    if other is None or other["busbw"] is None:
        print(f"{key[0]:<15} {key[1]:>12} {row['us']:>10.1f} {'-':>10} {row['busbw']:>11.2f} {'-':>11} {'-':>10}")
        continue
    ratio = row["busbw"] / other["busbw"] if other["busbw"] > 0 else float("inf")
    print(f"{key[0]:<15} {key[1]:>12} {row['us']:>10.1f} {other['us']:>10.1f} {row['busbw']:>11.2f} "
          f"{other['busbw']:>11.2f} {ratio:>10.2f}")
PYTHON
