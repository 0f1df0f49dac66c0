#include "launcher/text_dataset.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <utility>
#include <vector>

#include "runtime/error.h"

namespace weft {

namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void append_file(const fs::path& path, const std::string& key, std::string& text) {
  std::ifstream stream(path, std::ios::binary);
  WEFT_CHECK(stream, key, ": cannot read '", path.string(), "': ", std::strerror(errno));
  text.append(std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>());
  WEFT_CHECK(!stream.bad(), key, ": reading '", path.string(), "' failed: ", std::strerror(errno));
}

// Whether a folder entry is text to train on (see the header comment for why the others are not).
bool is_text_file(const fs::directory_entry& entry) {
  const std::string name = entry.path().filename().string();
  if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8")) return false;
  std::error_code error;
  if (entry.is_symlink(error)) return false;
  return entry.is_regular_file(error);
}

void check_long_enough(uint64_t bytes, int64_t sequence_length, const std::string& what, const std::string& hint) {
  WEFT_CHECK(bytes >= static_cast<uint64_t>(sequence_length) + 1, what, " holds ", bytes,
             " bytes, fewer than the seq_len + 1 = ", sequence_length + 1,
             " bytes that one training sequence needs; ", hint);
}

}  // namespace

TextDataset::TextDataset(std::shared_ptr<const std::string> text, uint64_t begin, uint64_t end, std::string source,
                         uint64_t seed)
    : Dataset(seed), text_(std::move(text)), begin_(begin), end_(end), source_(std::move(source)) {
  WEFT_CHECK(text_ != nullptr && begin_ <= end_ && end_ <= text_->size(), "TextDataset: bytes [", begin_, ", ",
             end_, ") are not inside the ", text_ ? text_->size() : 0, " bytes of '", source_, "'");
}

std::string TextDataset::describe() const {
  return str("text '", source_, "' (bytes [", begin_, ", ", end_, ") of ", text_->size(), ", vocabulary 256)");
}

void TextDataset::read_tokens(uint64_t start, int64_t count, int64_t* destination) const {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text_->data()) + begin_ + start;
  for (int64_t index = 0; index < count; ++index) destination[index] = bytes[index];
}

std::string read_text_source(const std::string& path, const std::string& key) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  WEFT_CHECK(fs::exists(status) || !error || error == std::errc::no_such_file_or_directory, key, ": cannot access '",
             path, "': ", error.message());
  WEFT_CHECK(fs::exists(status), key, ": no such file or folder '", path,
             "'; give a text file or a folder of text files (the default, /usr/share/games/fortunes, comes "
             "with Debian's fortunes-min and fortune-mod packages: run tools/setup-deps)");
  std::string text;
  if (fs::is_directory(status)) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& entry : fs::directory_iterator(path, error)) {
      if (is_text_file(entry)) files.push_back(entry.path());
    }
    WEFT_CHECK(!error, key, ": cannot list the folder '", path, "': ", error.message());
    WEFT_CHECK(!files.empty(), key, ": the folder '", path,
               "' holds no text files (names ending in .dat or .u8, symlinks and hidden files are skipped)");
    // Sorted so that the stream, and so the window order of a seed, is the same on every machine.
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) append_file(file, key, text);
  } else {
    append_file(path, key, text);
  }
  WEFT_CHECK(!text.empty(), key, ": '", path, "' is empty: there is no text to train on");
  return text;
}

TextDatasets open_text_datasets(const std::string& train_path, const std::string& val_path, double val_fraction,
                                int64_t sequence_length, uint64_t seed) {
  WEFT_CHECK(sequence_length > 0, "open_text_datasets: seq_len must be positive, got ", sequence_length);
  auto train_text = std::make_shared<const std::string>(read_text_source(train_path, "data.train"));
  TextDatasets datasets;
  if (!val_path.empty()) {
    check_long_enough(train_text->size(), sequence_length, str("data.train: '", train_path, "'"),
                      "give more text or a smaller model.seq_len");
    auto val_text = std::make_shared<const std::string>(read_text_source(val_path, "data.val"));
    check_long_enough(val_text->size(), sequence_length, str("data.val: '", val_path, "'"),
                      "give more text or a smaller model.seq_len");
    datasets.train = std::make_unique<TextDataset>(train_text, 0, train_text->size(), train_path, seed);
    datasets.val = std::make_unique<TextDataset>(val_text, 0, val_text->size(), val_path, seed);
    return datasets;
  }

  WEFT_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "data.val_fraction must be in [0, 1), got ", val_fraction);
  const uint64_t total = train_text->size();
  const auto val_bytes = static_cast<uint64_t>(static_cast<double>(total) * val_fraction);
  const uint64_t train_bytes = total - val_bytes;
  check_long_enough(train_bytes, sequence_length,
                    str("data.train: '", train_path, "' (", total, " bytes, less the last ", val_bytes,
                        " for validation)"),
                    "give more text, a smaller model.seq_len or a smaller data.val_fraction");
  datasets.train = std::make_unique<TextDataset>(train_text, 0, train_bytes, train_path, seed);
  if (val_fraction > 0.0) {
    check_long_enough(val_bytes, sequence_length,
                      str("the validation split (the last ", val_fraction, " of the ", total, " bytes of '",
                          train_path, "')"),
                      "raise data.val_fraction, give data.val, or set data.val_fraction to 0 for no validation");
    datasets.val = std::make_unique<TextDataset>(train_text, train_bytes, total, train_path, seed);
  }
  return datasets;
}

}  // namespace weft
