// MatmulTuningCache (matmul_tuning_cache.h).
#include "runtime/cuda/matmul_tuning_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
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

}  // namespace

MatmulTuningCache::MatmulTuningCache(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  std::ifstream file(path_);
  if (!file) return;  // not there yet: the first choice creates it
  std::string line;
  while (std::getline(file, line)) {
    const std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.empty()) continue;
    bool parsed = fields.size() == kFields && fields[0] == kMagic && fields[1] == kFormat;
    Key key = {};
    Algorithm algorithm = {};
    for (size_t i = 0; parsed && i < key.size(); ++i) parsed = parse(fields[3 + i], key[i], 10);
    for (size_t i = 0; parsed && i < algorithm.size(); ++i) parsed = parse(fields[27 + i], algorithm[i], 16);
    if (!parsed) {
      ++skipped_lines_;
      continue;
    }
    choices_.emplace(std::make_pair(fields[2], key), algorithm);  // the first line wins
  }
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
  choices_.emplace(std::make_pair(signature, key), algorithm);
  if (path_.empty()) return;
  std::string line = absl::StrCat(kMagic, " ", kFormat, " ", signature, " ", absl::StrJoin(key, " "));
  for (uint64_t word : algorithm) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%llx", static_cast<unsigned long long>(word));
    absl::StrAppend(&line, " ", hex);
  }
  line += '\n';
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ignored);
  const int descriptor = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (descriptor < 0) {
    warn_once(absl::StrCat("cannot open ", path_, " (", std::strerror(errno), ")"));
    return;
  }
  // One write: with O_APPEND each process's line lands whole at the end.
  const ssize_t written = ::write(descriptor, line.data(), line.size());
  if (written != static_cast<ssize_t>(line.size())) {
    warn_once(absl::StrCat("cannot write ", path_, " (", written < 0 ? std::strerror(errno) : "short write", ")"));
  }
  ::close(descriptor);
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
