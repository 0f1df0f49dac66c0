// prepare_token_shards: weft-prepare's pipeline, text files -> documents -> tokens -> llm.c shards.
//
// Documents (launcher/text_documents.h) are read in input order in batches of about a megabyte per
// thread; a pool of `threads` tokenizes a batch's documents at once, and the writer
// (launcher/token_shard_writer.h) appends their tokens in input order, each document preceded by the
// end-of-text token, as llm.c's data scripts write them. The shards are therefore byte-identical
// for any thread count.
//
// The output folder is created when missing. An existing folder must be empty, unless `overwrite`:
// then the shards of this name (NAME_val_*.bin, NAME_train_*.bin and leftover .tmp files) are
// removed first and any other file is left alone. A run that fails (a bad JSON line, a tokenizer
// error, an empty corpus) removes the shards it wrote, and the folder when it created it, so that
// no data.train glob picks up half a corpus.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/text_documents.h"
#include "launcher/token_shard_writer.h"

namespace weft {

struct PreparationOptions {
  std::vector<std::string> inputs;
  TextDocumentOptions documents;
  std::string output_folder;
  std::string name;                     // empty: default_shard_name(inputs[0])
  uint64_t shard_tokens = 100'000'000;
  uint64_t val_tokens = 1'000'000;
  int threads = 1;                      // >= 1
  bool overwrite = false;
  // Text read per thread before a batch is tokenized: large enough that starting the threads costs
  // nothing beside tokenizing it, small enough that the progress moves every second or so.
  uint64_t batch_bytes_per_thread = 1 << 20;
};

// A document's token ids; called from several threads at once, so it must be thread-safe.
using Tokenize = std::function<std::vector<int32_t>(std::string_view text)>;

struct PreparationProgress {
  uint64_t bytes_read = 0;
  uint64_t total_bytes = 0;
  uint64_t documents = 0;
  uint64_t tokens = 0;
};

struct PreparationSummary {
  std::string name;
  uint64_t bytes = 0;              // input bytes read
  uint64_t documents = 0;          // documents written
  uint64_t skipped_documents = 0;  // empty or white-space-only documents left out
  uint64_t tokens = 0;             // tokens written, end-of-text tokens included
  uint64_t val_tokens = 0;
  uint64_t train_tokens = 0;
  std::vector<TokenShardFile> shards;
  std::string train_pattern;       // the glob for data.train: FOLDER/NAME_train_*.bin
  std::string val_pattern;         // the glob for data.val
  double seconds = 0.0;
};

// The default shard name for a first input: its file name without the last extension
// ("data/tiny.txt" -> "tiny").
std::string default_shard_name(const std::string& input);

// Runs the pipeline. `on_progress` is called after every batch from the calling thread (it may be
// empty). Throws weft::Error for bad input (launcher/text_documents.h), an output folder that is not
// empty without `overwrite`, or a corpus with no document.
PreparationSummary prepare_token_shards(const PreparationOptions& options, const Tokenize& tokenize,
                                        int32_t end_of_text,
                                        const std::function<void(const PreparationProgress&)>& on_progress);

}  // namespace weft
