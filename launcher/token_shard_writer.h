// TokenShardWriter: writes one token stream as llm.c shards (the format TokenShardFiles reads:
// launcher/token_shard_dataset.h), the first tokens as the validation split, the rest as training.
//
// Layout, as llm.c's dev/data scripts write it: every shard holds shard_tokens tokens but the last of
// its split; shards are numbered in one sequence over both splits, validation first:
//   NAME_val_000000.bin, NAME_train_000001.bin, NAME_train_000002.bin, ...
// A document may span two shards (llm.c's scripts split them the same way).
//
// The validation split is the first min(val_tokens, total / 10) tokens, at least one, so a small
// corpus still gets both splits with most of it for training. Deciding that needs the total or
// 10 * val_tokens tokens, whichever comes first: until then the writer holds the tokens in memory
// (20 MB at weft-prepare's default val_tokens of 1,000,000) and writes nothing.
//
// Invariants: a shard is written to NAME_..._NNNNNN.bin.tmp, flushed to disk, then renamed, so a file
// named *.bin is always whole; a failed write throws weft::Error and leaves neither file behind.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace weft {

struct TokenShardWriterOptions {
  std::string folder;                    // must exist
  std::string name;                      // shard file prefix, e.g. "fortunes"
  uint64_t shard_tokens = 100'000'000;   // tokens per shard; at most 2^31 - 1 (the header's int32)
  uint64_t val_tokens = 1'000'000;       // the validation split's size on a large corpus (>= 1)
};

// One written shard.
struct TokenShardFile {
  std::string path;
  bool validation = false;
  uint64_t tokens = 0;
};

class TokenShardWriter {
 public:
  // Throws weft::Error for a zero shard_tokens or val_tokens, a shard_tokens above the int32 count,
  // or a name holding '/'.
  explicit TokenShardWriter(TokenShardWriterOptions options);
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // Appends tokens to the stream (each in [0, 65535], the uint16 of the format; weft::Error
  // otherwise) and writes every shard that becomes full.
  void append(std::span<const int32_t> tokens);
  // Writes the tokens still held and returns every shard written, in order. The stream must hold
  // at least 2 tokens (one for each split). The writer takes no tokens after this.
  std::vector<TokenShardFile> finish();

  uint64_t token_count() const { return token_count_; }

 private:
  // Decides the validation size (the stream's first val_count tokens) and writes the full shards held.
  void split(uint64_t val_count);
  void write_shard(bool validation, const uint16_t* tokens, uint64_t count);

  TokenShardWriterOptions options_;
  std::vector<uint16_t> held_;  // [tokens not yet written], at the end of the stream
  uint64_t token_count_ = 0;    // tokens appended so far
  bool split_decided_ = false;  // once true, held_ holds training tokens only, fewer than shard_tokens
  bool finished_ = false;
  int64_t next_index_ = 0;      // the next shard's number
  std::vector<TokenShardFile> files_;
};

}  // namespace weft
