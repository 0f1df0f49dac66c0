#include "launcher/token_shard_dataset.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include "runtime/error.h"

namespace weft {

namespace {

// The files a pattern names, in byte order of their names (glob(3) sorts by the locale's collation,
// which could differ between machines and so change the stream a seed visits).
std::vector<std::string> match_files(const std::string& pattern, const std::string& key) {
  const bool has_wildcard = pattern.find_first_of("*?[") != std::string::npos;
  struct stat status {};
  if (!has_wildcard) {
    WEFT_CHECK(::stat(pattern.c_str(), &status) == 0, key, ": no such file '", pattern,
               "'; give an llm.c token shard (.bin) or a glob pattern such as '/data/fineweb_train_*.bin'");
    // A folder of llm.c shards usually holds the train and the val shards side by side, so reading
    // all of it would train on the validation data.
    WEFT_CHECK(!S_ISDIR(status.st_mode), key, ": '", pattern,
               "' is a folder; give a glob pattern that matches only this split's shards, such as '", pattern,
               "/*_train_*.bin'");
    return {pattern};
  }
  glob_t matches{};
  const int result = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::string> files;
  if (result == 0) {
    for (size_t index = 0; index < matches.gl_pathc; ++index) {
      const std::string path = matches.gl_pathv[index];
      if (::stat(path.c_str(), &status) == 0 && S_ISDIR(status.st_mode)) continue;
      files.push_back(path);
    }
  }
  ::globfree(&matches);
  WEFT_CHECK(result == 0 || result == GLOB_NOMATCH, key, ": cannot expand the pattern '", pattern,
             "' (a folder on its path could not be read)");
  WEFT_CHECK(!files.empty(), key, ": no files match '", pattern, "'");
  std::sort(files.begin(), files.end());
  return files;
}

// Closes a file descriptor on every path out of a function, including a throw.
struct FileCloser {
  int descriptor;
  ~FileCloser() {
    if (descriptor >= 0) ::close(descriptor);
  }
};

}  // namespace

TokenShardFiles::TokenShardFiles(const std::string& pattern, int64_t vocabulary, const std::string& key)
    : pattern_(pattern) {
  try {
    uint16_t largest = 0;
    for (const std::string& path : match_files(pattern, key)) {
      const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      WEFT_CHECK(descriptor >= 0, key, ": cannot open '", path, "': ", std::strerror(errno));
      FileCloser closer{descriptor};
      struct stat status {};
      WEFT_CHECK(::fstat(descriptor, &status) == 0, key, ": cannot stat '", path, "': ", std::strerror(errno));
      const auto file_bytes = static_cast<uint64_t>(status.st_size);
      WEFT_CHECK(file_bytes >= static_cast<uint64_t>(kTokenShardHeaderBytes), key, ": '", path, "' is ",
                 file_bytes, " bytes, shorter than the ", kTokenShardHeaderBytes,
                 "-byte llm.c header: it is truncated or not a token shard");
      int32_t header[256];
      WEFT_CHECK(::pread(descriptor, header, sizeof(header), 0) == static_cast<ssize_t>(sizeof(header)), key,
                 ": cannot read the header of '", path, "': ", std::strerror(errno));
      WEFT_CHECK(header[0] == kTokenShardMagic, key, ": '", path, "' has magic ", header[0], ", not the llm.c ",
                 kTokenShardMagic, ": it is not an llm.c token shard (or is corrupt)");
      WEFT_CHECK(header[1] == kTokenShardVersion, key, ": '", path, "' is token shard version ", header[1],
                 "; weft reads version ", kTokenShardVersion, " (uint16 tokens)");
      WEFT_CHECK(header[2] >= 0, key, ": '", path, "' has a negative token count ", header[2],
                 " in its header: the file is corrupt");
      const auto count = static_cast<uint64_t>(header[2]);
      const uint64_t expected_bytes = kTokenShardHeaderBytes + 2 * count;
      WEFT_CHECK(file_bytes == expected_bytes, key, ": '", path, "' is ", file_bytes,
                 " bytes, but its header counts ", count, " tokens, which take 1024 + 2 * ", count, " = ",
                 expected_bytes, " bytes: the file is ", file_bytes < expected_bytes ? "truncated" : "corrupt",
                 " (or still being written)");

      Shard shard;
      shard.path = path;
      shard.count = count;
      shard.first = token_count_;
      shard.mapping_bytes = file_bytes;
      shard.mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, descriptor, 0);
      WEFT_CHECK(shard.mapping != MAP_FAILED, key, ": cannot map '", path, "': ", std::strerror(errno));
      shard.tokens = reinterpret_cast<const uint16_t*>(static_cast<const char*>(shard.mapping) +
                                                       kTokenShardHeaderBytes);
      shards_.push_back(shard);
      token_count_ += count;

      // Checked once here, because a token outside the embedding table would otherwise surface as an
      // out-of-range read deep inside a training step, far from its cause.
      for (uint64_t position = 0; position < count; ++position) {
        const uint16_t token = shard.tokens[position];
        largest = std::max(largest, token);
        WEFT_CHECK(vocabulary <= 0 || token < vocabulary, key, ": '", path, "' token ", position, " (of ", count,
                   ") is ", token, ", not below the vocabulary ", vocabulary,
                   " (model.vocab): the shards were made with another tokenizer, or model.vocab is too small");
      }
    }
    WEFT_CHECK(token_count_ > 0, key, ": the shards matching '", pattern, "' hold no tokens");
    vocabulary_ = vocabulary > 0 ? vocabulary : static_cast<int64_t>(largest) + 1;
  } catch (...) {
    // The destructor does not run for a constructor that throws; unmap what was mapped so far.
    for (const Shard& shard : shards_) ::munmap(shard.mapping, shard.mapping_bytes);
    shards_.clear();
    throw;
  }
}

TokenShardFiles::~TokenShardFiles() {
  for (const Shard& shard : shards_) ::munmap(shard.mapping, shard.mapping_bytes);
}

void TokenShardFiles::read(uint64_t start, int64_t count, int64_t* destination) const {
  // The last shard whose first token is <= start holds it.
  auto shard = std::upper_bound(shards_.begin(), shards_.end(), start,
                                [](uint64_t index, const Shard& candidate) { return index < candidate.first; });
  --shard;
  int64_t written = 0;
  while (written < count) {
    // Shards with no tokens hold nothing to copy; skip past them.
    while (start >= shard->first + shard->count) ++shard;
    const uint64_t inside = start - shard->first;
    const int64_t take = std::min<int64_t>(count - written, static_cast<int64_t>(shard->count - inside));
    for (int64_t index = 0; index < take; ++index) destination[written + index] = shard->tokens[inside + index];
    written += take;
    start += static_cast<uint64_t>(take);
  }
}

TokenShardDataset::TokenShardDataset(const std::string& pattern, int64_t vocabulary, uint64_t seed,
                                     const std::string& key)
    : TokenShardDataset(std::make_shared<const TokenShardFiles>(pattern, vocabulary, key), 0, 0, seed) {
  end_ = files_->token_count();
}

TokenShardDataset::TokenShardDataset(std::shared_ptr<const TokenShardFiles> files, uint64_t begin, uint64_t end,
                                     uint64_t seed)
    : Dataset(seed), files_(std::move(files)), begin_(begin), end_(end) {
  WEFT_CHECK(files_ != nullptr && begin_ <= end_ && end_ <= files_->token_count(), "TokenShardDataset: tokens [",
             begin_, ", ", end_, ") are not inside the ", files_ ? files_->token_count() : 0, " tokens of '",
             files_ ? files_->pattern() : "", "'");
}

std::string TokenShardDataset::describe() const {
  const size_t shards = files_->shards().size();
  return str("token shards '", files_->pattern(), "' (", shards, shards == 1 ? " file" : " files", ", tokens [",
             begin_, ", ", end_, ") of ", files_->token_count(), ", vocabulary ", files_->vocabulary(), ")");
}

void TokenShardDataset::read_tokens(uint64_t start, int64_t count, int64_t* destination) const {
  files_->read(begin_ + start, count, destination);
}

TokenShardDatasets open_token_shard_datasets(const std::string& train_pattern, const std::string& val_pattern,
                                             double val_fraction, int64_t vocabulary, int64_t sequence_length,
                                             uint64_t seed) {
  WEFT_CHECK(sequence_length > 0, "open_token_shard_datasets: seq_len must be positive, got ", sequence_length);
  const auto needed = static_cast<uint64_t>(sequence_length) + 1;
  auto check_long_enough = [&](uint64_t tokens, const std::string& what) {
    WEFT_CHECK(tokens >= needed, what, " holds ", tokens, " tokens, fewer than the seq_len + 1 = ", needed,
               " that one training sequence needs");
  };
  auto train_files = std::make_shared<const TokenShardFiles>(train_pattern, vocabulary, "data.train");
  TokenShardDatasets datasets;
  if (!val_pattern.empty()) {
    // The validation shards must fit the same model, so they are checked against the same vocabulary.
    auto val_files = std::make_shared<const TokenShardFiles>(val_pattern, train_files->vocabulary(), "data.val");
    check_long_enough(train_files->token_count(), str("data.train: '", train_pattern, "'"));
    check_long_enough(val_files->token_count(), str("data.val: '", val_pattern, "'"));
    datasets.train = std::make_unique<TokenShardDataset>(train_files, 0, train_files->token_count(), seed);
    datasets.val = std::make_unique<TokenShardDataset>(val_files, 0, val_files->token_count(), seed);
    return datasets;
  }
  WEFT_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "data.val_fraction must be in [0, 1), got ", val_fraction);
  const uint64_t total = train_files->token_count();
  const auto val_tokens = static_cast<uint64_t>(static_cast<double>(total) * val_fraction);
  check_long_enough(total - val_tokens, str("data.train: '", train_pattern, "' (", total,
                                            " tokens, less the last ", val_tokens, " for validation)"));
  datasets.train = std::make_unique<TokenShardDataset>(train_files, 0, total - val_tokens, seed);
  if (val_fraction > 0.0) {
    check_long_enough(val_tokens, str("the validation split (the last ", val_fraction, " of the ", total,
                                      " tokens of '", train_pattern, "')"));
    datasets.val = std::make_unique<TokenShardDataset>(train_files, total - val_tokens, total, seed);
  }
  return datasets;
}

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  WEFT_CHECK(tokens.size() <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()), "write_token_shard: ",
             tokens.size(), " tokens do not fit the int32 count of one shard; split them over several files");
  int32_t header[256] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  WEFT_CHECK(stream, "write_token_shard: cannot create '", path, "': ", std::strerror(errno));
  stream.write(reinterpret_cast<const char*>(header), sizeof(header));
  stream.write(reinterpret_cast<const char*>(tokens.data()),
               static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  stream.close();
  WEFT_CHECK(stream, "write_token_shard: writing '", path, "' failed: ", std::strerror(errno));
}

}  // namespace weft
