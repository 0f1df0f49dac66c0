// MatmulTuningCache (matmul_tuning_cache.h).
#include "runtime/cuda/matmul_tuning_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace weft::cuda {
namespace {

constexpr char kMagic[] = "weft-matmul-tuning";
constexpr char kFormat[] = "1";
constexpr size_t kFields = 3 + 24 + 8;  // magic, format, signature; the key; the algorithm

template <typename Integer>
bool parse(std::string_view text, Integer& value, int base) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value, base);
  return error == std::errc() && stop == end;
}

// One line of the file as a choice; false for a line that is not one (see the header).
bool parse_line(const std::string& line, std::string& signature, MatmulTuningCache::Key& key,
                MatmulTuningCache::Algorithm& algorithm) {
  const std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
  bool parsed = fields.size() == kFields && fields[0] == kMagic && fields[1] == kFormat;
  for (size_t i = 0; parsed && i < key.size(); ++i) parsed = parse(fields[3 + i], key[i], 10);
  for (size_t i = 0; parsed && i < algorithm.size(); ++i) parsed = parse(fields[27 + i], algorithm[i], 16);
  if (parsed) signature = fields[2];
  return parsed;
}

}  // namespace

MatmulTuningCache::MatmulTuningCache(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  const int descriptor = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) return;  // not there yet: the first choice creates it
  read_new_lines(descriptor);
  ::close(descriptor);
}

void MatmulTuningCache::read_new_lines(int descriptor) {
  const off_t end = ::lseek(descriptor, 0, SEEK_END);
  if (end < 0) return;
  if (end < read_offset_) {  // the file was replaced or cut: read it again from its start
    read_offset_ = 0;
    in_file_.clear();
  }
  std::string text(static_cast<size_t>(end - read_offset_), '\0');
  size_t have = 0;
  while (have < text.size()) {
    const ssize_t got = ::pread(descriptor, text.data() + have, text.size() - have, read_offset_ + have);
    if (got <= 0) break;
    have += static_cast<size_t>(got);
  }
  // Whole lines only: a line still being written (or cut short by a killed process) is read once
  // its newline is there, or with the line after it (and then skipped as broken).
  const size_t whole = text.rfind('\n', have == 0 ? 0 : have - 1);
  if (have == 0 || whole == std::string::npos) return;
  for (std::string_view rest(text.data(), whole + 1); !rest.empty();) {
    const size_t newline = rest.find('\n');
    const std::string line(rest.substr(0, newline));
    rest.remove_prefix(newline + 1);
    if (line.find_first_not_of(' ') == std::string::npos) continue;
    std::string signature;
    Key key = {};
    Algorithm algorithm = {};
    if (!parse_line(line, signature, key, algorithm)) {
      ++skipped_lines_;
      continue;
    }
    choices_.emplace(std::make_pair(signature, key), algorithm);  // the first line wins
    in_file_.insert(std::make_pair(signature, key));
  }
  read_offset_ += static_cast<off_t>(whole + 1);
}

std::string MatmulTuningCache::path_from_environment() {
  if (const char* named = std::getenv("WEFT_MATMUL_TUNING_CACHE"); named != nullptr) {
    return std::string_view(named) == "off" ? std::string() : std::string(named);
  }
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache != nullptr && cache[0] != '\0') {
    return absl::StrCat(cache, "/weft/matmul-tuning.txt");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    return absl::StrCat(home, "/.cache/weft/matmul-tuning.txt");
  }
  return std::string();
}

std::optional<MatmulTuningCache::Algorithm> MatmulTuningCache::find(const std::string& signature,
                                                                    const Key& key) const {
  const auto found = choices_.find(std::make_pair(signature, key));
  if (found == choices_.end()) return std::nullopt;
  return found->second;
}

void MatmulTuningCache::add(const std::string& signature, const Key& key, const Algorithm& algorithm) {
  if (path_.empty()) {
    choices_.emplace(std::make_pair(signature, key), algorithm);
    return;
  }
  std::string line = absl::StrCat(kMagic, " ", kFormat, " ", signature, " ", absl::StrJoin(key, " "));
  for (uint64_t word : algorithm) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%llx", static_cast<unsigned long long>(word));
    absl::StrAppend(&line, " ", hex);
  }
  line += '\n';
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ignored);
  const int descriptor = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (descriptor < 0) {
    choices_.emplace(std::make_pair(signature, key), algorithm);
    warn_once(absl::StrCat("cannot open ", path_, " (", std::strerror(errno), ")"));
    return;
  }
  // Under the lock, the lines other processes appended since this one last read are read first: a
  // rank that tuned the same product meanwhile has its line there, and that choice is taken
  // instead of writing a second line for it (the ranks of a host tune the same products at once).
  // A file system without locks still gets whole lines (one write with O_APPEND), duplicates
  // possible, as before.
  const bool locked = ::flock(descriptor, LOCK_EX) == 0;
  read_new_lines(descriptor);
  // Bytes past the last whole line, under the lock, are a line cut short (a process killed in its
  // write): end it, so that it stays one broken line and this one is read whole.
  if (locked && ::lseek(descriptor, 0, SEEK_END) > read_offset_) line = "\n" + line;
  choices_.emplace(std::make_pair(signature, key), algorithm);  // no-op where the file has it
  if (!in_file_.count(std::make_pair(signature, key))) {
    const ssize_t written = ::write(descriptor, line.data(), line.size());
    if (written != static_cast<ssize_t>(line.size())) {
      warn_once(absl::StrCat("cannot write ", path_, " (", written < 0 ? std::strerror(errno) : "short write", ")"));
    } else {
      in_file_.insert(std::make_pair(signature, key));
      // Unlocked, another process may have appended before this line: read from where this one
      // was, next time, rather than past lines never seen.
      if (locked) read_offset_ = ::lseek(descriptor, 0, SEEK_END);
    }
  }
  ::close(descriptor);  // and the lock with it
}

void MatmulTuningCache::warn_once(const std::string& message) {
  if (warned_) return;
  warned_ = true;
  std::fprintf(stderr,
               "weft: the matmul tuning cache %s; tuned choices are kept for this process only "
               "(WEFT_MATMUL_TUNING_CACHE names another file, or off)\n",
               message.c_str());
}

}  // namespace weft::cuda
