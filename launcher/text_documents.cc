#include "launcher/text_documents.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <utility>

#include "nlohmann/json.hpp"
#include "runtime/error.h"

namespace weft {

namespace {

namespace fs = std::filesystem;

bool is_blank(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](char character) {
    return character == ' ' || character == '\t' || character == '\r' || character == '\n' || character == '\f' ||
           character == '\v';
  });
}

// A line as written on Windows ends in "\r\n"; the '\r' is no part of a separator it may be.
std::string without_carriage_return(const std::string& line) {
  return !line.empty() && line.back() == '\r' ? line.substr(0, line.size() - 1) : line;
}

// "id, url, content" for a message that says which fields an object has instead.
std::string field_names(const nlohmann::json& object) {
  std::string names;
  size_t listed = 0;
  for (auto item = object.begin(); item != object.end(); ++item) {
    if (listed == 8) return names + ", ...";
    names += (listed++ == 0 ? "" : ", ") + item.key();
  }
  return names.empty() ? "none" : names;
}

}  // namespace

InputFormat parse_input_format(const std::string& name) {
  if (name == "auto") return InputFormat::automatic;
  if (name == "plain") return InputFormat::plain;
  if (name == "jsonl") return InputFormat::jsonl;
  WEFT_FAIL("unknown --format '", name,
            "'; expected auto (by extension: .jsonl and .json are JSON lines), plain or jsonl");
}

TextDocumentReader::TextDocumentReader(std::vector<std::string> files, TextDocumentOptions options)
    : files_(std::move(files)), options_(std::move(options)) {
  WEFT_CHECK(!files_.empty(), "no input files; give one or more text or JSON lines files");
  WEFT_CHECK(!(options_.split_on_blank_lines && !options_.separator_line.empty()),
             "--split-on-blank-lines and --separator-line both say where documents end; give one");
  WEFT_CHECK(!options_.text_field.empty(), "--text-field must name a field");
  for (const std::string& file : files_) {
    std::error_code error;
    const fs::file_status status = fs::status(file, error);
    WEFT_CHECK(fs::exists(status), "no such input file '", file, "'");
    WEFT_CHECK(!fs::is_directory(status), "the input '", file,
               "' is a folder; give the files in it, for example '", file, "'/*.txt");
    WEFT_CHECK(fs::is_regular_file(status), "the input '", file, "' is not a regular file");
    const uint64_t size = fs::file_size(file, error);
    WEFT_CHECK(!error, "cannot read the size of '", file, "': ", error.message());
    sizes_.push_back(size);
    total_bytes_ += size;
  }
}

InputFormat TextDocumentReader::format_of(const std::string& file) const {
  if (options_.format != InputFormat::automatic) return options_.format;
  const std::string extension = fs::path(file).extension().string();
  return extension == ".jsonl" || extension == ".json" ? InputFormat::jsonl : InputFormat::plain;
}

bool TextDocumentReader::next(TextDocument& document) {
  while (true) {
    if (!file_open_ && !open_next_file()) return false;
    bool found = false;
    if (open_format_ == InputFormat::jsonl) {
      found = next_json_line(document);
    } else if (options_.split_on_blank_lines || !options_.separator_line.empty()) {
      found = next_split(document);
    } else {
      found = next_whole_file(document);
    }
    if (!found) {
      close_file();
      continue;
    }
    if (is_blank(document.text)) {
      ++skipped_documents_;
      continue;
    }
    return true;
  }
}

bool TextDocumentReader::open_next_file() {
  if (next_file_ == files_.size()) return false;
  const std::string& file = files_[next_file_];
  stream_ = std::ifstream(file, std::ios::binary);
  WEFT_CHECK(stream_.is_open(), "cannot open the input '", file, "'");
  open_format_ = format_of(file);
  line_number_ = 0;
  bytes_in_file_ = 0;
  file_open_ = true;
  return true;
}

void TextDocumentReader::close_file() {
  WEFT_CHECK(!stream_.bad(), "reading '", files_[next_file_], "' failed");
  stream_.close();
  bytes_done_ += sizes_[next_file_];
  bytes_in_file_ = 0;
  file_open_ = false;
  ++next_file_;
}

bool TextDocumentReader::read_line(std::string& line) {
  if (!std::getline(stream_, line)) return false;
  ++line_number_;
  // The '\n' that getline consumed, unless the file ended without one; a file that grew while read
  // must not push the progress past its total.
  bytes_in_file_ = std::min(sizes_[next_file_], bytes_in_file_ + line.size() + 1);
  return true;
}

bool TextDocumentReader::next_whole_file(TextDocument& document) {
  if (line_number_ > 0) return false;  // the one document of this file was read
  std::ostringstream contents;
  contents << stream_.rdbuf();
  line_number_ = 1;
  document.text = std::move(contents).str();
  document.file = files_[next_file_];
  document.line = 1;
  // An empty file leaves the stream's failbit set by operator<<; it was read all the same.
  stream_.clear();
  bytes_in_file_ = std::min<uint64_t>(sizes_[next_file_], document.text.size());
  return true;
}

bool TextDocumentReader::next_split(TextDocument& document) {
  auto ends_document = [&](const std::string& line) {
    return options_.split_on_blank_lines ? is_blank(line)
                                         : without_carriage_return(line) == options_.separator_line;
  };
  document.text.clear();
  document.file = files_[next_file_];
  std::string line;
  bool started = false;
  while (read_line(line)) {
    if (ends_document(line)) {
      if (started) return true;
      continue;  // separators before the document's first line
    }
    if (!started) {
      started = true;
      document.line = line_number_;
    }
    document.text += line;
    document.text += '\n';
  }
  return started;
}

bool TextDocumentReader::next_json_line(TextDocument& document) {
  std::string line;
  while (read_line(line)) {
    if (is_blank(line)) continue;
    const std::string where = str(files_[next_file_], ":", line_number_);
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& error) {  // parse_error, or out_of_range for a number like 1e999
      WEFT_FAIL("", where, ": the line is not valid JSON (", error.what(),
                "); JSON lines input holds one object per line (use --format plain to read the file as text)");
    }
    WEFT_CHECK(object.is_object(), "", where, ": the line is a JSON ", object.type_name(),
               ", not an object; JSON lines input holds one object per line, its text in the field '",
               options_.text_field, "'");
    const auto field = object.find(options_.text_field);
    WEFT_CHECK(field != object.end(), "", where, ": the object has no field '", options_.text_field,
               "' (its fields: ", field_names(object), "); name the text's field with --text-field");
    WEFT_CHECK(field->is_string(), "", where, ": the field '", options_.text_field, "' is a ",
               field->type_name(), ", not a string");
    document.text = field->get<std::string>();
    document.file = files_[next_file_];
    document.line = line_number_;
    return true;
  }
  return false;
}

}  // namespace weft
