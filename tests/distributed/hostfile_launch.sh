#!/usr/bin/env bash
# A multi-node launch on one machine: mpirun with an Open MPI hostfile naming two hosts, localhost
# and 127.0.0.2 (another address of this machine's loopback), with plm_rsh_agent pointed at a
# stand-in for ssh that runs the command here. Open MPI starts its daemon on the second "host"
# through that agent and treats the two as separate nodes (each has its local rank 0, and ranks talk
# over TCP, not shared memory), as on a real cluster. weft-train at dp = RANKS, RANKS / 2 ranks per
# host, must give the losses of a plain `mpirun -np RANKS` run on one host.
# (Naming this machine twice, localhost plus its host name "vm" or its eth0 address, is refused by
# Open MPI 4.1: it resolves both to one node and stops with "A hostfile was provided that contains
# multiple definitions of the slot count for at least one node". 127.0.0.2 is not resolved to it.
# Two ranks per "host" (RANKS 4) crash here inside Open MPI 4.1.4 itself: a five-line C program that
# only calls MPI_Comm_split_type segfaults in mca_pml_ob1_recv_frag_callback_match over the TCP BTL,
# and hangs with --mca btl tcp,self; so ctest runs RANKS 2, one rank per host.)
#   usage: hostfile_launch.sh WEFT_TRAIN WORK_DIR RANKS MPIRUN...
set -euo pipefail
weft_train=$1 work=$2 ranks=$3
shift 3
mpirun=("$@")
source "$(dirname "$0")/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
per_host=$((ranks / 2))
printf 'localhost slots=%d\n127.0.0.2 slots=%d\n' "$per_host" "$per_host" > "$work/hostfile"
# ssh HOST COMMAND... -> COMMAND..., run here; every call is logged so the test can see it was used.
cat > "$work/local-agent.sh" <<EOF
#!/bin/bash
echo "\$*" >> "$work/agent.log"
while [[ \$1 == -* ]]; do shift; done
shift
exec /bin/sh -c "\$*"
EOF
chmod +x "$work/local-agent.sh"

common=("$work/run.yaml" --set model.layers=2 --set model.dim=32 --set model.heads=2 --set model.seq_len=32
        --set train.batch_size=8 --set train.steps=4 --set train.warmup_steps=1 --set data.train="$work/text.txt"
        --set data.val_every=2 --set data.val_batches=1 --set log.progress=plain --set parallel.dp="$ranks")
# Each rank writes where Open MPI placed it, then becomes weft-train.
placed=(/bin/sh -c 'echo "rank $OMPI_COMM_WORLD_RANK node $OMPI_COMM_WORLD_NODE_RANK local $OMPI_COMM_WORLD_LOCAL_RANK" >> "$0"; exec "$@"')
"${mpirun[@]}" -np "$ranks" "${placed[@]}" "$work/single-host.txt" "$weft_train" "${common[@]}" \
  --set log.metrics_file="$work/single-host.jsonl" > /dev/null
"${mpirun[@]}" -np "$ranks" --hostfile "$work/hostfile" --mca plm_rsh_agent "$work/local-agent.sh" \
  "${placed[@]}" "$work/two-hosts.txt" "$weft_train" "${common[@]}" --set log.metrics_file="$work/two-hosts.jsonl" > /dev/null

echo "agent calls:"; cut -c1-120 "$work/agent.log"
grep -q "^127.0.0.2 .*orted" "$work/agent.log" || { echo "Open MPI never used the agent to start 127.0.0.2's daemon"; exit 1; }
/usr/bin/python3 - "$work" "$ranks" <<'PYTHON'
import json, sys
work, ranks = sys.argv[1], int(sys.argv[2])
def local_ranks(name):
    lines = sorted(open(f"{work}/{name}.txt").read().split("\n")[:-1])
    return sorted(int(line.split()[-1]) for line in lines)
one, two = local_ranks("single-host"), local_ranks("two-hosts")
print("local ranks, one host:", one, " two hosts:", two)
assert one == list(range(ranks)), f"one host: local ranks {one}"
assert two == sorted(list(range(ranks // 2)) * 2), f"two hosts: local ranks {two}, expected two hosts of {ranks // 2}"
rows = {name: [json.loads(l) for l in open(f"{work}/{name}.jsonl")] for name in ("single-host", "two-hosts")}
assert len(rows["single-host"]) == len(rows["two-hosts"]) == 6, {k: len(v) for k, v in rows.items()}
for a, b in zip(rows["single-host"], rows["two-hosts"]):
    for key in ("loss", "val_loss", "grad_norm"):
        if key in a:
            assert a[key] == b[key], f"step {a['step']} {key}: one host {a[key]!r}, two hosts {b[key]!r}"
print("losses, one host and two hosts:", " ".join(repr(r.get("loss", r.get("val_loss"))) for r in rows["two-hosts"]))
PYTHON
