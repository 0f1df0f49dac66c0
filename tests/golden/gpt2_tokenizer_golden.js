// The oracle side of the GPT-2 tokenizer test (run_gpt2_tokenizer_golden.sh): encodes the same
// corpus with tiktoken's gpt2 encoding (encode_ordinary: "<|endoftext|>" in the text is ordinary
// text, as in weft) and compares with the ids gpt2_tokenizer_golden wrote. Prints each line that
// differs, with both encodings, and exits 1 when any does.
//   node gpt2_tokenizer_golden.js TIKTOKEN_DIR CORPUS WEFT_JSON
'use strict';
const fs = require('fs');

const [tiktokenDirectory, corpusPath, weftPath] = process.argv.slice(2);
const encoding = require(tiktokenDirectory).get_encoding('gpt2');
const raw = fs.readFileSync(corpusPath);
const corpus = raw.toString('utf8');
if (!Buffer.from(corpus, 'utf8').equals(raw)) {
  console.error(`${corpusPath} is not valid UTF-8; tiktoken (JavaScript strings) could not see its bytes`);
  process.exit(1);
}
const weft = JSON.parse(fs.readFileSync(weftPath, 'utf8'));
const lines = corpus.split('\n');
const failures = [];
const compare = (name, text, weftIds) => {
  const expected = Array.from(encoding.encode_ordinary(text));
  if (JSON.stringify(expected) !== JSON.stringify(weftIds)) {
    failures.push(`${name} ${JSON.stringify(text).slice(0, 200)}\n  tiktoken: ${JSON.stringify(expected)}\n` +
                  `  weft:     ${JSON.stringify(weftIds)}`);
  }
  return expected.length;
};
if (weft.lines.length !== lines.length) {
  console.error(`weft encoded ${weft.lines.length} lines, the corpus has ${lines.length}`);
  process.exit(1);
}
let tokens = 0;
lines.forEach((line, index) => { tokens += compare(`line ${index + 1}`, line, weft.lines[index]); });
const wholeTokens = compare('the whole file', corpus, weft.whole);
encoding.free();
if (failures.length > 0) {
  console.error(failures.slice(0, 20).join('\n'));
  console.error(`FAILED: ${failures.length} of ${lines.length + 1} encodings differ from tiktoken's`);
  process.exit(1);
}
console.log(`all ${lines.length} lines (${tokens} tokens) and the whole file (${wholeTokens} tokens) ` +
            `encode to tiktoken's gpt2 ids`);
