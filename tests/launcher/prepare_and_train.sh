#!/usr/bin/env bash
# weft-prepare turns three of Debian's fortune files into GPT-2 token shards: byte-identical with 1
# and 2 threads; llm.c headers; training shards cut at --shard-tokens; one end-of-text token (50256)
# before every fortune, the stream starting with one; JSON lines input; its errors. Then weft-train
# trains a tiny GPT-2-vocabulary model (configs/gpt2-tokens-cpu.yaml, made smaller) on the shards and
# its loss must fall from about ln(50257) = 10.8.
#   usage: prepare_and_train.sh WEFT_PREPARE WEFT_TRAIN CONFIG WORK_DIR
set -euo pipefail
weft_prepare=$1 weft_train=$2 config=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fortunes=/usr/share/games/fortunes
inputs=("$fortunes/computers" "$fortunes/linux" "$fortunes/science")
for input in "${inputs[@]}"; do
  [[ -f $input ]] || { echo "FAIL: $input is missing; tools/setup-deps installs Debian's fortunes"; exit 1; }
done

fail() { echo "FAIL: $*"; exit 1; }

prepare() {  # prepare OUT_DIR THREADS
  "$weft_prepare" --out "$1" --name fortunes --separator-line=% --shard-tokens 40000 --threads "$2" "${inputs[@]}" \
    > "$1.summary" 2> "$1.progress"
}
prepare "$work/one" 1
prepare "$work/two" 2
cat "$work/one.summary"
[[ ! -s $work/one.progress ]] || grep -q "weft-prepare: .* of .*tokens/s" "$work/one.progress" ||
  fail "unexpected output on stderr: $(cat "$work/one.progress")"
grep -q "train: $work/one/fortunes_train_\*.bin" "$work/one.summary" || fail "the summary does not name the train glob"
grep -q "val: $work/one/fortunes_val_\*.bin" "$work/one.summary" || fail "the summary does not name the val glob"
(cd "$work/one" && ls) > "$work/one.files"
(cd "$work/two" && ls) > "$work/two.files"
cmp -s "$work/one.files" "$work/two.files" || fail "1 and 2 threads wrote different files: $(paste "$work/one.files" "$work/two.files")"
while read -r name; do
  cmp "$work/one/$name" "$work/two/$name" || fail "$name differs between 1 and 2 threads"
done < "$work/one.files"

# The shards against the fortune files, read independently of weft: one document per fortune
# between lines of "%" (blank ones skipped), each starting with 50256.
/usr/bin/python3 - "$work/one" "$work/one.summary" "${inputs[@]}" <<'PYTHON'
import glob, os, re, struct, sys
folder, summary_path, inputs = sys.argv[1], sys.argv[2], sys.argv[3:]
def fail(message):
    sys.exit("FAIL: " + message)
def read_shard(path):
    data = open(path, "rb").read()
    header = struct.unpack("<256i", data[:1024])
    if header[0] != 20240520 or header[1] != 1:
        fail(f"{path}: header {header[:3]}, expected magic 20240520 and version 1")
    if len(data) != 1024 + 2 * header[2]:
        fail(f"{path}: {len(data)} bytes, but the header counts {header[2]} tokens")
    return list(struct.unpack(f"<{header[2]}H", data[1024:]))
val_paths = sorted(glob.glob(os.path.join(folder, "fortunes_val_*.bin")))
train_paths = sorted(glob.glob(os.path.join(folder, "fortunes_train_*.bin")))
names = [os.path.basename(path) for path in val_paths + train_paths]
expected_names = ["fortunes_val_000000.bin"] + [f"fortunes_train_{index:06d}.bin" for index in range(1, len(train_paths) + 1)]
if names != expected_names or len(train_paths) < 2:
    fail(f"shard files {names}, expected {expected_names} with at least 2 training shards")
if sorted(os.listdir(folder)) != sorted(names):
    fail(f"other files in the output folder: {sorted(os.listdir(folder))}")
val = read_shard(val_paths[0])
train = [read_shard(path) for path in train_paths]
for path, tokens in zip(train_paths[:-1], train[:-1]):
    if len(tokens) != 40000:
        fail(f"{path} holds {len(tokens)} tokens; every training shard but the last must hold --shard-tokens 40000")
if not 0 < len(train[-1]) <= 40000:
    fail(f"the last training shard holds {len(train[-1])} tokens")
stream = val + [token for tokens in train for token in tokens]
if len(val) != len(stream) // 10:
    fail(f"val holds {len(val)} of {len(stream)} tokens; a corpus under 10 * --val-tokens gives val a tenth")
documents = 0
for path in inputs:
    text = open(path, "rb").read().decode("utf-8", "replace")
    documents += sum(1 for piece in re.split(r"^%\r?$", text, flags=re.M) if piece.strip())
end_of_text = [index for index, token in enumerate(stream) if token == 50256]
if stream[0] != 50256:
    fail(f"the stream starts with {stream[0]}, not the end-of-text token 50256")
if len(end_of_text) != documents:
    fail(f"{len(end_of_text)} end-of-text tokens for the {documents} fortunes")
if any(later - earlier < 2 for earlier, later in zip(end_of_text, end_of_text[1:])):
    fail("a document holds no token")
if max(stream) > 50256:
    fail(f"token {max(stream)} is outside GPT-2's vocabulary")
summary = open(summary_path).read()
if f"{documents:,} documents, {len(stream):,} tokens" not in summary:
    fail(f"the summary does not report {documents:,} documents and {len(stream):,} tokens:\n{summary}")
print(f"{documents} fortunes, {len(stream)} tokens: val {len(val)}, train {[len(tokens) for tokens in train]}")
PYTHON

# JSON lines: one document per line's "text"; a bad line is named by file:line; a full output
# folder and a missing input are refused.
printf '{"text": "Hello world"}\n{"text": "A second document."}\n' > "$work/corpus.jsonl"
"$weft_prepare" --out "$work/jsonl" "$work/corpus.jsonl" > /dev/null 2>&1 || fail "the JSON lines file was refused"
/usr/bin/python3 - "$work/jsonl" <<'PYTHON'
import glob, struct, sys
tokens = []
for path in sorted(glob.glob(sys.argv[1] + "/corpus_val_*.bin")) + sorted(glob.glob(sys.argv[1] + "/corpus_train_*.bin")):
    data = open(path, "rb").read()
    tokens += struct.unpack(f"<{(len(data) - 1024) // 2}H", data[1024:])
# GPT-2's "Hello world" is [15496, 995].
if tokens.count(50256) != 2 or tokens[:3] != [50256, 15496, 995]:
    sys.exit(f"FAIL: JSON lines shards hold {tokens}")
PYTHON
expect_error() {  # expect_error MESSAGE_REGEX ARGS...
  local pattern=$1; shift
  if "$weft_prepare" "$@" > "$work/error.txt" 2>&1; then fail "weft-prepare $* succeeded"; fi
  grep -Eq "$pattern" "$work/error.txt" || fail "weft-prepare $*: expected /$pattern/, got: $(cat "$work/error.txt")"
}
printf '{"text": "fine"}\n["not", "an object"]\n' > "$work/bad.jsonl"
expect_error "bad\\.jsonl:2: the line is a JSON array, not an object" --out "$work/bad" "$work/bad.jsonl"
expect_error "is not empty .*--overwrite" --out "$work/one" --separator-line=% "${inputs[0]}"
expect_error "no such input file '$work/missing.txt'" --out "$work/missing" "$work/missing.txt"
"$weft_prepare" --out "$work/one" --name fortunes --overwrite --separator-line=% --shard-tokens 40000 "${inputs[@]}" \
  > /dev/null 2>&1 || fail "--overwrite was refused"

# Training on the shards with the ready config, made small: the loss must fall.
metrics=$work/metrics.jsonl
"$weft_train" "$config" --set data.train="$work/one/fortunes_train_*.bin" --set data.val="$work/one/fortunes_val_*.bin" \
  --set model.dim=32 --set train.batch_size=4 --set train.steps=12 --set train.warmup_steps=2 --set train.lr=1e-2 \
  --set data.val_every=12 --set data.val_batches=2 --set checkpoint.every=0 --set checkpoint.dir="$work/checkpoints" \
  --set log.every=4 --set log.progress=plain --set log.metrics_file="$metrics"
/usr/bin/python3 - "$metrics" <<'PYTHON'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
losses = [record["loss"] for record in records if "loss" in record]
first, last = losses[0], sum(losses[-3:]) / 3
print(f"first loss {first:.3f}, mean of the last 3 steps {last:.3f}")
if not (first > 10.0 and last < first - 1.0):
    sys.exit(f"FAIL: the loss did not fall: first {first:.3f} (want > 10.0, about ln(50257) = 10.8), "
             f"last {last:.3f} (want < first - 1.0)")
PYTHON
