// TextDataset: raw text read as bytes, one token per byte (vocabulary 256).
//
// This is weft's default data: Debian's fortune files (/usr/share/games/fortunes, from the
// fortunes-min and fortune-mod packages that tools/setup-deps installs) train a small model with no
// tokenizer and no download. The source is a text file or a folder of them: the regular files
// directly in the folder, in sorted-name order, concatenated. Folders skip names ending in .dat and
// .u8, symbolic links and hidden files, because Debian's fortunes folder holds, beside each text
// file, a binary index (.dat) and a symlink to the same text (.u8) that would repeat it.
//
// Validation split: the last val_fraction of the bytes, unless a separate val path is given (then
// train uses all of its own bytes). The two splits share one buffer and never overlap.
//
// Errors (weft::Error) name the config key, the path and the sizes: a missing path, a folder with no
// text files, empty text, and text too short for one sequence of seq_len + 1 bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "launcher/dataset.h"

namespace weft {

class TextDataset : public Dataset {
 public:
  // Bytes [begin, end) of `text`, which other datasets (the other split) may share. `source` names
  // where the text came from, for describe().
  TextDataset(std::shared_ptr<const std::string> text, uint64_t begin, uint64_t end, std::string source,
              uint64_t seed);

  int64_t vocabulary() const override { return 256; }
  uint64_t token_count() const override { return end_ - begin_; }
  // "text 'path' (bytes [0, 2600000) of 2737000, vocabulary 256)".
  std::string describe() const override;

 protected:
  void read_tokens(uint64_t start, int64_t count, int64_t* destination) const override;

 private:
  std::shared_ptr<const std::string> text_;
  uint64_t begin_;
  uint64_t end_;
  std::string source_;
};

// The bytes of a file, or of a folder's text files as described above. `key` is the config key the
// path came from ("data.train"), for messages.
std::string read_text_source(const std::string& path, const std::string& key);

// The training and (optional) validation splits of one run.
struct TextDatasets {
  std::unique_ptr<TextDataset> train;
  std::unique_ptr<TextDataset> val;  // null when val_path is empty and val_fraction is 0
};

// Reads train_path (and val_path when not empty) and checks that each split holds at least
// sequence_length + 1 bytes. val_fraction is in [0, 1) and ignored when val_path is given.
TextDatasets open_text_datasets(const std::string& train_path, const std::string& val_path, double val_fraction,
                                int64_t sequence_length, uint64_t seed);

}  // namespace weft
