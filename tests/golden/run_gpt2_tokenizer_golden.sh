#!/usr/bin/env bash
# The GPT-2 tokenizer's oracle test: weft's Gpt2Tokenizer (gpt2_tokenizer_golden) and tiktoken's
# gpt2 encoding (gpt2_tokenizer_golden.js, under node) encode every line of the corpus and the whole
# file; their ids must be equal.
#   usage: run_gpt2_tokenizer_golden.sh WEFT_PROGRAM CORPUS OUTPUT_DIR
set -euo pipefail
if [[ $# -ne 3 ]]; then
  echo "usage: $0 WEFT_PROGRAM CORPUS OUTPUT_DIR" >&2
  exit 2
fi
program=$1 corpus=$2 output_dir=$3
here=$(cd "$(dirname "$0")" && pwd)

# A missing oracle is a failure, not a skip: a test that silently passes proves nothing.
node=${WEFT_NODE:-$(command -v node || true)}
npm_root=$(npm root -g 2>/dev/null || true)
if [[ -z $node || -z $npm_root || ! -f $npm_root/tiktoken/package.json ]]; then
  echo "GPT-2 tokenizer oracle test FAILED: node or the npm package tiktoken is missing" >&2
  echo "(looked for ${npm_root:-npm root -g}/tiktoken). Run tools/setup-deps, which installs both." >&2
  exit 1
fi

mkdir -p "$output_dir"
json="$output_dir/gpt2_tokenizer_golden.json"
rm -f "$json"
"$program" "$corpus" "$json"
"$node" "$here/gpt2_tokenizer_golden.js" "$npm_root/tiktoken" "$corpus" "$json"
