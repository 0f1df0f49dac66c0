#!/usr/bin/env bash
# A GPT-2-tokenized model end to end: a tiny llm.c token shard (GPT-2 ids from tiktoken), a few
# weft-train steps at model.vocab 50257, then weft-generate. The sample must start with the prompt,
# repeat for the same seed, and be exactly the text that its ids (--tokenizer ids, same seed)
# decode to under tiktoken; --top_p samples too, and out-of-range options are named.
#   usage: generate_gpt2_from_checkpoint.sh WEFT_TRAIN WEFT_GENERATE WORK_DIR
set -euo pipefail
weft_train=$1 weft_generate=$2 work=$3
rm -rf "$work" && mkdir -p "$work"

# tiktoken is the independent oracle here; missing, the test fails (it never skips).
npm_root=$(npm root -g 2>/dev/null || true)
if ! command -v node >/dev/null || [[ ! -f $npm_root/tiktoken/package.json ]]; then
  echo "FAIL: node or the npm package tiktoken is missing; run tools/setup-deps"; exit 1
fi
tiktoken="$npm_root/tiktoken"

# The shard (launcher/token_shard_dataset.h): 256 int32 header (magic, version, count), uint16 ids.
node -e '
  const [tiktoken, path] = process.argv.slice(1);
  const encoding = require(tiktoken).get_encoding("gpt2");
  const ids = [];
  for (let i = 0; i < 300; ++i) {
    ids.push(...encoding.encode_ordinary("the quick brown fox jumps over the lazy dog. "));
    if (i % 50 == 49) ids.push(50256);
  }
  const header = new Int32Array(256);
  header.set([20240520, 1, ids.length]);
  require("fs").writeFileSync(path, Buffer.concat([Buffer.from(header.buffer), Buffer.from(Uint16Array.from(ids).buffer)]));
' "$tiktoken" "$work/train.bin"
printf 'model:\n  type: gpt\n  layers: 1\n  dim: 32\n  heads: 2\n  seq_len: 32\n  vocab: 50257\ndata:\n  format: tokens\n' \
  > "$work/run.yaml"
"$weft_train" "$work/run.yaml" --set data.train="$work/train.bin" --set train.steps=20 --set train.warmup_steps=2 \
  --set train.lr=0.01 --set data.val_every=0 --set log.progress=plain --set checkpoint.dir="$work/checkpoints" >/dev/null

generate() { "$weft_generate" "$work/checkpoints" --tokens 24 --seed 3 "$@"; }
generate --prompt "the quick" > "$work/first.txt"
generate --prompt "the quick" > "$work/second.txt"
echo "sample: $(cat "$work/first.txt")"
[[ $(head -c 9 "$work/first.txt") == "the quick" ]] || { echo "FAIL: the sample does not start with the prompt"; exit 1; }
cmp -s "$work/first.txt" "$work/second.txt" || { echo "FAIL: the same seed gave different samples"; exit 1; }
# "the quick" is GPT-2's ids 1169 2068: the same draws through --tokenizer ids give the sample's ids.
generate --tokenizer ids --prompt "1169 2068" > "$work/ids.txt"
echo "ids: $(cat "$work/ids.txt")"
node -e '
  const [tiktoken, textPath, idsPath] = process.argv.slice(1);
  const fs = require("fs");
  const encoding = require(tiktoken).get_encoding("gpt2");
  const ids = fs.readFileSync(idsPath, "utf8").trim().split(/\s+/).map(Number);
  if (ids.length !== 24) { console.log(`FAIL: expected 24 sampled ids, got ${ids.length}`); process.exit(1); }
  if (ids.some((id) => !(id >= 0 && id < 50257))) { console.log(`FAIL: an id outside GPT-2: ${ids}`); process.exit(1); }
  const expected = Buffer.concat([Buffer.from(encoding.decode(Uint32Array.from([1169, 2068, ...ids]))), Buffer.from("\n")]);
  if (!expected.equals(fs.readFileSync(textPath))) {
    console.log(`FAIL: the sample is not the text of its ids under tiktoken: ${JSON.stringify(expected.toString())}`);
    process.exit(1);
  }
' "$tiktoken" "$work/first.txt" "$work/ids.txt"

# Nucleus sampling: reproducible, and a tiny p keeps only the likeliest token (temperature aside).
generate --prompt "the quick" --top_p 0.9 > "$work/top_p.txt"
generate --prompt "the quick" --top_p 0.9 | cmp -s - "$work/top_p.txt" || { echo "FAIL: top_p sample not reproducible"; exit 1; }
generate --prompt "the quick" --top_p 1e-9 --seed 1 > "$work/greedy_1.txt"
generate --prompt "the quick" --top_p 1e-9 --seed 2 | cmp -s - "$work/greedy_1.txt" ||
  { echo "FAIL: top_p 1e-9 should keep one token, so the seed should not matter"; exit 1; }
for bad in 0 1.5 -0.1; do
  if generate --prompt "the quick" --top_p="$bad" 2>"$work/error.txt"; then
    echo "FAIL: --top_p $bad was accepted"; exit 1
  fi
  grep -q "top_p must be in (0, 1\].*, got $bad\$" "$work/error.txt" || { echo "FAIL: --top_p $bad:"; cat "$work/error.txt"; exit 1; }
done
# The tokenizer folder named by the environment, missing: the message says how to get the files.
if WEFT_GPT2_TOKENIZER_DIR="$work/no-tokenizer" generate --prompt x 2>"$work/error.txt"; then
  echo "FAIL: a missing tokenizer folder was accepted"; exit 1
fi
grep -q "no-tokenizer' does not exist; run tools/setup-deps" "$work/error.txt" || { cat "$work/error.txt"; exit 1; }
echo "PASS"
