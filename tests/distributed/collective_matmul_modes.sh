#!/usr/bin/env bash
# The auto mode's sequence-parallel linears through weft-train at tp 2 with sp: as a ring of chunks
# (comm.collective_matmul: ring) and as one collective beside one matmul (single) they train to the
# same losses (f32 rounding of another summation order), and auto says which the cost model chose.
#   usage: collective_matmul_modes.sh WEFT_TRAIN
set -euo pipefail
weft_train=$1
config=$(dirname "$0")/../../configs/tiny-cpu.yaml
work=$(mktemp -d /tmp/weft-collective-matmul.XXXXXX)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe -np 2)
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
for mode in ring single auto; do
  "${mpirun[@]}" "$weft_train" "$config" --set parallel.tp=2 --set parallel.sp=true --set comm.mode=auto \
    --set comm.collective_matmul=$mode --set train.steps=4 --set train.warmup_steps=0 --set data.val_every=0 \
    --set log.progress=plain --set log.metrics_file="$work/$mode.jsonl" > "$work/$mode.txt"
done
grep -q "collective matmuls: ring (comm.collective_matmul)" "$work/ring.txt"
grep -q "collective matmuls: one collective (comm.collective_matmul)" "$work/single.txt"
grep -qE "cost model: collective matmuls: (ring of 2 chunks|one collective): predicted" "$work/auto.txt" || { cat "$work/auto.txt"; exit 1; }
/usr/bin/python3 - "$work" <<'PYTHON'
import json, sys
work = sys.argv[1]
losses = {m: [json.loads(l)["loss"] for l in open(f"{work}/{m}.jsonl") if '"loss"' in l] for m in ("ring", "single", "auto")}
for mode in ("single", "auto"):
    assert len(losses[mode]) == 4
    for a, b in zip(losses["ring"], losses[mode]):
        assert abs(a - b) <= 1e-5 * abs(a), f"{mode} losses {losses[mode]} differ from the ring's {losses['ring']}"
print("collective matmuls: ring, single and auto train to the same losses", losses["ring"])
PYTHON
