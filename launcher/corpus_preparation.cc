#include "launcher/corpus_preparation.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <thread>
#include <utility>

#include "runtime/error.h"

namespace weft {

namespace {

namespace fs = std::filesystem;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}
bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A shard (or a shard's leftover temporary) of `name`, as TokenShardWriter names them.
bool is_shard_of(const std::string& file, const std::string& name) {
  return (starts_with(file, name + "_val_") || starts_with(file, name + "_train_")) &&
         (ends_with(file, ".bin") || ends_with(file, ".bin.tmp"));
}

// Makes `folder` ready for the shards of `name`; true when it had to create it.
bool prepare_output_folder(const std::string& folder, const std::string& name, bool overwrite) {
  std::error_code error;
  if (!fs::exists(folder, error)) {
    fs::create_directories(folder, error);
    WEFT_CHECK(!error, "cannot create the output folder '", folder, "': ", error.message());
    return true;
  }
  WEFT_CHECK(fs::is_directory(folder, error), "--out '", folder, "' exists and is not a folder");
  std::vector<std::string> entries;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder)) {
    entries.push_back(entry.path().filename().string());
  }
  if (entries.empty()) return false;
  WEFT_CHECK(overwrite, "the output folder '", folder, "' is not empty (it holds ", entries.size(),
             entries.size() == 1 ? " entry" : " entries", ", such as '", entries.front(),
             "'); choose a new --out folder, or pass --overwrite to replace the shards named '", name, "_*' in it");
  // Shards of an earlier, longer run would otherwise still match this run's glob.
  for (const std::string& entry : entries) {
    if (!is_shard_of(entry, name)) continue;
    fs::remove(fs::path(folder) / entry, error);
    WEFT_CHECK(!error, "--overwrite: cannot remove '", (fs::path(folder) / entry).string(),
               "': ", error.message());
  }
  return false;
}

// After a failed run: removes the shards of `name` it wrote (earlier ones were removed before it
// began, or there were none), and the folder when the run created it, so nothing half-done is left
// for a data.train glob to pick up.
void remove_failed_output(const std::string& folder, const std::string& name, bool created) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, error)) {
    if (is_shard_of(entry.path().filename().string(), name)) fs::remove(entry.path(), error);
  }
  if (created) fs::remove(folder, error);  // only when empty: a file someone put there stays
}

// Tokenizes texts[i] into tokens[i] for every i on `threads` threads; the first error is rethrown.
void tokenize_batch(const std::vector<std::string>& texts, std::vector<std::vector<int32_t>>& tokens,
                    const Tokenize& tokenize, int threads) {
  tokens.assign(texts.size(), {});
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  auto work = [&] {
    try {
      for (size_t index = next++; index < texts.size() && !failed; index = next++) {
        tokens[index] = tokenize(texts[index]);
      }
    } catch (...) {
      // Only the first failing thread stores its error; the others see `failed` and stop.
      if (!failed.exchange(true)) failure = std::current_exception();
    }
  };
  const int helpers = std::min<int>(threads, static_cast<int>(texts.size())) - 1;
  std::vector<std::thread> pool;
  for (int index = 0; index < helpers; ++index) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

// Reads, tokenizes and writes every document; fills the summary's counts and shards.
void write_shards(const PreparationOptions& options, const Tokenize& tokenize, int32_t end_of_text,
                  const std::function<void(const PreparationProgress&)>& on_progress, TextDocumentReader& reader,
                  TokenShardWriter& writer, PreparationSummary& summary) {
  PreparationProgress progress;
  progress.total_bytes = reader.total_bytes();
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> tokens;
  TextDocument document;
  const uint64_t batch_bytes = std::max<uint64_t>(1, options.batch_bytes_per_thread) * static_cast<uint64_t>(options.threads);
  bool more = true;
  while (more) {
    texts.clear();
    uint64_t bytes = 0;
    while (bytes < batch_bytes && (more = reader.next(document))) {
      bytes += document.text.size();
      texts.push_back(std::move(document.text));
    }
    tokenize_batch(texts, tokens, tokenize, options.threads);
    for (const std::vector<int32_t>& document_tokens : tokens) {
      writer.append(std::span<const int32_t>(&end_of_text, 1));
      writer.append(document_tokens);
    }
    progress.documents += texts.size();
    progress.tokens = writer.token_count();
    progress.bytes_read = reader.bytes_read();
    if (on_progress) on_progress(progress);
  }
  WEFT_CHECK(progress.documents > 0, "the corpus is empty: the ", options.inputs.size(),
             options.inputs.size() == 1 ? " input holds" : " inputs hold", " no document with text (",
             reader.skipped_documents(), " empty or white-space-only documents were skipped)");

  summary.shards = writer.finish();
  summary.bytes = reader.bytes_read();
  summary.documents = progress.documents;
  summary.skipped_documents = reader.skipped_documents();
  summary.tokens = writer.token_count();
  for (const TokenShardFile& shard : summary.shards) {
    (shard.validation ? summary.val_tokens : summary.train_tokens) += shard.tokens;
  }
}

}  // namespace

std::string default_shard_name(const std::string& input) {
  const std::string stem = fs::path(input).stem().string();
  return stem.empty() || stem == "." || stem == ".." ? "data" : stem;
}

PreparationSummary prepare_token_shards(const PreparationOptions& options, const Tokenize& tokenize,
                                        int32_t end_of_text,
                                        const std::function<void(const PreparationProgress&)>& on_progress) {
  const auto start = std::chrono::steady_clock::now();
  WEFT_CHECK(options.threads >= 1, "--threads must be at least 1, got ", options.threads);
  WEFT_CHECK(!options.output_folder.empty(), "give the output folder with --out DIR");
  TextDocumentReader reader(options.inputs, options.documents);

  PreparationSummary summary;
  summary.name = options.name.empty() ? default_shard_name(options.inputs.front()) : options.name;
  std::string folder = options.output_folder;
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  // Checked before the folder is touched, so that a bad name or size changes nothing on disk.
  TokenShardWriter writer({folder, summary.name, options.shard_tokens, options.val_tokens});
  const bool created = prepare_output_folder(folder, summary.name, options.overwrite);
  try {
    write_shards(options, tokenize, end_of_text, on_progress, reader, writer, summary);
  } catch (...) {
    remove_failed_output(folder, summary.name, created);
    throw;
  }
  summary.train_pattern = folder + "/" + summary.name + "_train_*.bin";
  summary.val_pattern = folder + "/" + summary.name + "_val_*.bin";
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace weft
