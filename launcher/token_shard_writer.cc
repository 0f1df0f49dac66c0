#include "launcher/token_shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "launcher/token_shard_dataset.h"
#include "runtime/error.h"

namespace weft {

namespace {

// Writes all of `size` bytes, retrying short writes and interruptions.
void write_all(int descriptor, const void* data, size_t size, const std::string& path) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::write(descriptor, bytes, size);
    if (written < 0 && errno == EINTR) continue;
    WEFT_CHECK(written > 0, "writing '", path, "' failed: ", std::strerror(errno),
               " (is the disk full?)");
    bytes += written;
    size -= static_cast<size_t>(written);
  }
}

// Renames are durable only once the folder that holds the entries is synced.
void sync_folder(const std::string& folder) {
  const int descriptor = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (descriptor < 0) return;
  ::fsync(descriptor);
  ::close(descriptor);
}

}  // namespace

TokenShardWriter::TokenShardWriter(TokenShardWriterOptions options) : options_(std::move(options)) {
  WEFT_CHECK(options_.shard_tokens >= 1, "--shard-tokens must be at least 1");
  WEFT_CHECK(options_.shard_tokens <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()),
             "--shard-tokens ", options_.shard_tokens, " is above ",
             std::numeric_limits<int32_t>::max(), ", the most one llm.c shard's int32 header can count");
  WEFT_CHECK(options_.val_tokens >= 1, "--val-tokens must be at least 1 (weft-train evaluates on it)");
  WEFT_CHECK(!options_.name.empty() && options_.name.find('/') == std::string::npos,
             "the shard name '", options_.name, "' must be non-empty and hold no '/'; set --name");
}

void TokenShardWriter::append(std::span<const int32_t> tokens) {
  WEFT_CHECK(!finished_, "TokenShardWriter::append after finish()");
  for (size_t index = 0; index < tokens.size(); ++index) {
    const int32_t token = tokens[index];
    WEFT_CHECK(token >= 0 && token <= std::numeric_limits<uint16_t>::max(), "token ", token,
               " (stream position ", token_count_ + index,
               ") does not fit the uint16 tokens of llm.c shards: the tokenizer's vocabulary must be at most 65536");
  }
  // One shard is at most shard_tokens long, so held_ is written out as it fills rather than growing.
  size_t next = 0;
  while (next < tokens.size()) {
    size_t take = tokens.size() - next;
    if (split_decided_) take = std::min<size_t>(take, options_.shard_tokens - held_.size());
    held_.insert(held_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(next),
                 tokens.begin() + static_cast<std::ptrdiff_t>(next + take));
    next += take;
    token_count_ += take;
    if (!split_decided_) {
      // With 10 * val_tokens seen, min(val_tokens, total / 10) is val_tokens whatever follows.
      if (held_.size() / 10 >= options_.val_tokens) split(options_.val_tokens);
    } else if (held_.size() == options_.shard_tokens) {
      write_shard(false, held_.data(), held_.size());
      held_.clear();
    }
  }
}

void TokenShardWriter::split(uint64_t val_count) {
  split_decided_ = true;
  uint64_t start = 0;
  while (start < val_count) {
    const uint64_t count = std::min(options_.shard_tokens, val_count - start);
    write_shard(true, held_.data() + start, count);
    start += count;
  }
  while (held_.size() - start >= options_.shard_tokens) {
    write_shard(false, held_.data() + start, options_.shard_tokens);
    start += options_.shard_tokens;
  }
  held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(start));
}

std::vector<TokenShardFile> TokenShardWriter::finish() {
  WEFT_CHECK(!finished_, "TokenShardWriter::finish called twice");
  finished_ = true;
  if (!split_decided_) {
    WEFT_CHECK(token_count_ >= 2, "the corpus gave ", token_count_,
               " tokens; it needs at least 2, one for the validation split and one for training");
    split(std::max<uint64_t>(1, std::min(options_.val_tokens, token_count_ / 10)));
  }
  if (!held_.empty()) write_shard(false, held_.data(), held_.size());
  held_.clear();
  held_.shrink_to_fit();
  sync_folder(options_.folder);
  return files_;
}

void TokenShardWriter::write_shard(bool validation, const uint16_t* tokens, uint64_t count) {
  char number[16];
  std::snprintf(number, sizeof(number), "%06lld", static_cast<long long>(next_index_));
  const std::string path = options_.folder + "/" + options_.name + (validation ? "_val_" : "_train_") + number + ".bin";
  const std::string temporary = path + ".tmp";

  int32_t header[256] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(count);
  const int descriptor = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  WEFT_CHECK(descriptor >= 0, "cannot create '", temporary, "': ", std::strerror(errno));
  bool closed = false;
  try {
    write_all(descriptor, header, sizeof(header), temporary);
    write_all(descriptor, tokens, count * sizeof(uint16_t), temporary);
    WEFT_CHECK(::fsync(descriptor) == 0, "cannot flush '", temporary, "' to disk: ", std::strerror(errno));
    closed = true;  // close releases the descriptor even when it fails
    WEFT_CHECK(::close(descriptor) == 0, "closing '", temporary, "' failed: ", std::strerror(errno));
  } catch (...) {
    if (!closed) ::close(descriptor);
    ::unlink(temporary.c_str());
    throw;
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    WEFT_FAIL("cannot rename '", temporary, "' to '", path, "': ", std::strerror(error));
  }
  files_.push_back({path, validation, count});
  ++next_index_;
}

}  // namespace weft
