#!/usr/bin/env bash
# Hugging Face weights in and out of weft, against tests/interop/hugging_face_interop.py's plain
# PyTorch GPT-2 and Llama (Hugging Face's names and semantics, random weights).
#
#   usage: hugging_face_interop.sh MODE BIN_DIR LOGITS_PROGRAM WORK_DIR [MPIRUN...]
#   MODE gpt2 | llama   weft's logits from the files (model.init_from's loading) match PyTorch's;
#                       so do a sharded set's (an index and two files); weft-train runs 3 steps
#                       from them (model.seq_len below the file's positions), weft-export writes
#                       the checkpoint, and PyTorch's logits of the export match
#                       weft's of the checkpoint. The Llama file is BF16 (read, converted to f32).
#   MODE tp             model.init_from under mpirun -np 2 with parallel.tp 2, both comm modes,
#                       starts from the one-process run's first loss (GPT-2 and Llama)
#   MODE errors         a missing path, an unsupported config.json field, a shape that does not fit,
#                       and a model key that contradicts config.json are refused, each named
set -euo pipefail
mode=$1 bin=$2 logits=$3 work=$4
shift 4
mpirun=("$@")
here=$(dirname "$0")
python=${WEFT_GOLDEN_PYTHON:-/usr/bin/python3}
script="$here/hugging_face_interop.py"
source "$here/../support/training_work_dir.sh"
prepare_training_work_dir "$work"
printf 'train:\n  steps: 3\n' > "$work/run.yaml"  # no model keys: config.json sets them
train=("$bin/weft-train" "$work/run.yaml" --set data.train="$work/text.txt" --set train.batch_size=4
       --set train.warmup_steps=0 --set train.lr=0.01 --set data.val_every=0 --set log.progress=plain)

write() {  # KIND DIR [--dtype D]
  mkdir -p "$2"
  "$python" "$script" write "$@"
}

case "$mode" in
  gpt2 | llama)
    kind=$mode
    dtype=F32; [ "$kind" = llama ] && dtype=BF16
    write "$kind" "$work/hf" --dtype "$dtype"
    "$logits" init_from "$work/hf" "$("$python" "$script" ids "$kind" 20)" "$work/init.json" 2> "$work/init.log"
    cat "$work/init.log"
    grep -q "model.init_from: .* parameters from .* tensors of $work/hf/model.safetensors ($dtype" "$work/init.log" ||
      { echo "FAIL: no start-up line naming the file, the count and the dtype"; exit 1; }
    "$python" "$script" check "$work/hf" "$work/init.json"
    # The same weights as a sharded set (model.safetensors.index.json and two files).
    write "$kind" "$work/sharded" --dtype "$dtype" --shards 2
    "$logits" init_from "$work/sharded" "$("$python" "$script" ids "$kind" 20)" "$work/sharded.json" 2> "$work/sharded.log"
    grep -q "model.safetensors.index.json (2 files)" "$work/sharded.log" || { cat "$work/sharded.log"; exit 1; }
    "$python" "$script" check "$work/hf" "$work/sharded.json"
    # A shorter context: GPT-2's position table is cut to its first 16 rows, and says so.
    "$logits" init_from "$work/hf" "$("$python" "$script" ids "$kind" 12)" "$work/short.json" 16 2> "$work/short.log"
    "$python" "$script" check "$work/hf" "$work/short.json"
    if [ "$kind" = gpt2 ]; then
      grep -q "transformer.wpe.weight has 32 positions; the first model.seq_len = 16 are used" "$work/short.log" ||
        { echo "FAIL: the truncated position table is not reported"; cat "$work/short.log"; exit 1; }
    fi
    "${train[@]}" --set model.init_from="$work/hf" --set model.seq_len=16 --set checkpoint.dir="$work/checkpoints" \
      --set log.metrics_file="$work/metrics.jsonl" > "$work/train.log"
    grep -q "model.init_from: " "$work/train.log" || { echo "FAIL: weft-train did not log what it loaded"; exit 1; }
    "$bin/weft-export" "$work/checkpoints" "$work/export" --format "hf-$kind"
    "$logits" checkpoint "$work/checkpoints" "$("$python" "$script" ids "$kind" 12)" "$work/trained.json"
    "$python" "$script" check "$work/export" "$work/trained.json" --export --differs-from "$work/hf"
    # The export goes back in: model.init_from on weft-export's folder gives the checkpoint's logits.
    "$logits" init_from "$work/export" "$("$python" "$script" ids "$kind" 12)" "$work/reloaded.json" 2> /dev/null
    "$python" "$script" check "$work/export" "$work/reloaded.json"
    # The other format cannot express this model.
    other=hf-llama; [ "$kind" = llama ] && other=hf-gpt2
    if "$bin/weft-export" "$work/checkpoints" "$work/wrong" --format "$other" 2> "$work/wrong.log"; then
      echo "FAIL: weft-export wrote a $kind model as $other"; exit 1
    fi
    grep -q "$other cannot express model.positions" "$work/wrong.log" || { cat "$work/wrong.log"; exit 1; }
    [ ! -e "$work/wrong/model.safetensors" ] || { echo "FAIL: a refused export left files"; exit 1; }
    ;;
  tp)
    for kind in gpt2 llama; do
      write "$kind" "$work/$kind"
      common=("${train[@]}" --set model.init_from="$work/$kind" --set train.steps=1 --set train.optimizer=sgd)
      "${common[@]}" --set log.metrics_file="$work/$kind-single.jsonl" > /dev/null
      for comm in manual auto; do
        "${mpirun[@]}" -np 2 "${common[@]}" --set parallel.tp=2 --set comm.mode="$comm" \
          --set log.metrics_file="$work/$kind-$comm.jsonl" > "$work/$kind-$comm.log"
      done
      # Another seed draws other weights; model.init_from replaces them all, so the loss is the same.
      "${common[@]}" --set model.seed=99 --set log.metrics_file="$work/$kind-seed.jsonl" > /dev/null
    done
    "$python" - "$work" <<'PYTHON'
import json, sys
work = sys.argv[1]
first = lambda name: json.loads(open(f"{work}/{name}.jsonl").readline())["loss"]
for kind in ("gpt2", "llama"):
    single = first(f"{kind}-single")
    for other in ("manual", "auto", "seed"):
        loss = first(f"{kind}-{other}")
        print(f"{kind}: first loss one process {single!r}, {other} {loss!r}")
        if abs(loss - single) > 1e-5 * abs(single):
            sys.exit(f"FAIL: {kind} {other} starts at {loss}, one process at {single}")
PYTHON
    ;;
  errors)
    write gpt2 "$work/hf"
    expect() {  # PATTERN ARGS...: weft-train must fail with a message matching PATTERN
      local pattern=$1; shift
      if "${train[@]}" "$@" > "$work/out.log" 2>&1; then echo "FAIL: weft-train accepted $*"; exit 1; fi
      grep -qE "$pattern" "$work/out.log" || { echo "FAIL: expected /$pattern/ for $*, got:"; cat "$work/out.log"; exit 1; }
      echo "refused as expected: $(grep -E "$pattern" "$work/out.log" | head -1)"
    }
    expect "model.init_from: '$work/missing' does not exist" --set model.init_from="$work/missing"
    mkdir -p "$work/empty"
    expect "holds neither model.safetensors nor model.safetensors.index.json" --set model.init_from="$work/empty"
    mkdir -p "$work/scaled" && cp "$work/hf/model.safetensors" "$work/scaled/"
    "$python" -c "import json,sys; c=json.load(open(sys.argv[1])); c['activation_function']='relu'; json.dump(c, open(sys.argv[2],'w'))" \
      "$work/hf/config.json" "$work/scaled/config.json"
    expect "config.json: field 'activation_function' = \"relu\" is not supported" --set model.init_from="$work/scaled"
    mkdir -p "$work/wide" && cp "$work/hf/model.safetensors" "$work/wide/"
    "$python" -c "import json,sys; c=json.load(open(sys.argv[1])); c['vocab_size']=301; json.dump(c, open(sys.argv[2],'w'))" \
      "$work/hf/config.json" "$work/wide/config.json"
    expect "tensor 'transformer.wte.weight' has shape \[300, 64\], expected \[301, 64\]" --set model.init_from="$work/wide"
    expect "model.dim = 32 \(--set model.dim=32\) differs from model.dim = 64 that model.init_from's .*config.json gives \(field 'n_embd'\).*remove model.dim" \
      --set model.init_from="$work/hf" --set model.dim=32
    # Without config.json the model keys must describe the weights: the defaults do not.
    mkdir -p "$work/bare" && cp "$work/hf/model.safetensors" "$work/bare/"
    expect "missing tensor 'transformer.h.2.ln_1.weight'|has shape" --set model.init_from="$work/bare/model.safetensors" \
      --set model.layers=3 --set model.dim=64 --set model.vocab=300 --set model.seq_len=32
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
echo "PASS: hugging_face_interop $mode"
