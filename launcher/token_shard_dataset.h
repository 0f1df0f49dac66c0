// TokenShardDataset: pre-tokenized llm.c shards, so datasets people already prepared work as they are.
//
// Shard format (llm.c, dev/data/data_common.py): a header of 256 little-endian int32 — header[0] the
// magic 20240520, header[1] the version 1, header[2] the token count N — then N uint16 tokens. The
// file is exactly 1024 + 2 * N bytes. A source is one file or a glob(3) pattern; the matched shards
// are concatenated in sorted-name order into one token stream (a window may span two shards).
//
// Every shard is checked when it is opened, before any training: magic, version, size, and every
// token below the vocabulary. Each failure is a weft::Error naming the config key, the file and
// what is wrong (and, for a bad token, its position in the file). Shards are memory-mapped, so a
// many-gigabyte dataset costs page cache, not heap; the files must not change while a run reads them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "launcher/dataset.h"

namespace weft {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderBytes = 256 * 4;

// The opened, validated shards of one source, memory-mapped; shared by the splits that read them.
class TokenShardFiles {
 public:
  struct Shard {
    std::string path;
    const uint16_t* tokens = nullptr;  // [count] inside the mapping
    uint64_t count = 0;
    uint64_t first = 0;                // index of tokens[0] in the concatenated stream
    void* mapping = nullptr;
    uint64_t mapping_bytes = 0;
  };

  // Opens every file `pattern` matches (a path or a glob). `vocabulary` > 0: every token must be
  // below it; <= 0: the vocabulary becomes the largest token + 1. `key` names the config key
  // ("data.train") in messages.
  TokenShardFiles(const std::string& pattern, int64_t vocabulary, const std::string& key);
  ~TokenShardFiles();
  TokenShardFiles(const TokenShardFiles&) = delete;
  TokenShardFiles& operator=(const TokenShardFiles&) = delete;

  const std::string& pattern() const { return pattern_; }
  const std::vector<Shard>& shards() const { return shards_; }
  uint64_t token_count() const { return token_count_; }
  int64_t vocabulary() const { return vocabulary_; }
  // Writes tokens [start, start + count) of the concatenated stream as i64.
  void read(uint64_t start, int64_t count, int64_t* destination) const;

 private:
  std::string pattern_;
  std::vector<Shard> shards_;
  uint64_t token_count_ = 0;
  int64_t vocabulary_ = 0;
};

class TokenShardDataset : public Dataset {
 public:
  // All tokens of the shards `pattern` matches (see TokenShardFiles for `vocabulary` and `key`).
  TokenShardDataset(const std::string& pattern, int64_t vocabulary, uint64_t seed,
                    const std::string& key = "data.train");
  // Tokens [begin, end) of `files`, which other datasets (the other split) may share.
  TokenShardDataset(std::shared_ptr<const TokenShardFiles> files, uint64_t begin, uint64_t end, uint64_t seed);

  int64_t vocabulary() const override { return files_->vocabulary(); }
  uint64_t token_count() const override { return end_ - begin_; }
  // "token shards '/data/*_train_*.bin' (3 files, tokens [0, 300000000) of 300000000, vocabulary 50257)".
  std::string describe() const override;

 protected:
  void read_tokens(uint64_t start, int64_t count, int64_t* destination) const override;

 private:
  std::shared_ptr<const TokenShardFiles> files_;
  uint64_t begin_;
  uint64_t end_;
};

// The training and (optional) validation splits of one run, as open_text_datasets makes them:
// val_pattern's shards when given, otherwise the last val_fraction of the training tokens (0: none).
// Each split must hold at least sequence_length + 1 tokens.
struct TokenShardDatasets {
  std::unique_ptr<TokenShardDataset> train;
  std::unique_ptr<TokenShardDataset> val;
};
TokenShardDatasets open_token_shard_datasets(const std::string& train_pattern, const std::string& val_pattern,
                                             double val_fraction, int64_t vocabulary, int64_t sequence_length,
                                             uint64_t seed);

// Writes `tokens` as one llm.c shard (for tests and tools). Throws weft::Error when the file cannot
// be written or holds more tokens than the int32 header can count.
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace weft
