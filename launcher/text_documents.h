// TextDocumentReader: the documents of weft-prepare's input files, in input order, one at a time.
//
// Two formats, chosen per file by its extension (".jsonl" or ".json": JSON lines; anything else:
// plain text) unless a format is forced:
//   - plain text: the whole file is one document; or, with split_on_blank_lines, every run of
//     non-blank lines is one; or, with a separator_line, the text between lines equal to it is one
//     (separator_line "%" reads Debian's fortune files, one fortune per document). Lines keep their
//     newlines; separators and the blank lines between documents are dropped.
//   - JSON lines: every non-blank line is a JSON object and its text_field (a string) is one document.
//     A line that is not an object, lacks the field or holds a non-string there is a weft::Error
//     naming file:line.
// Documents that are empty or white space only are skipped (and counted): they hold nothing to learn.
//
// Invariants: the files are read in the order given, each from start to end, so the documents come
// in the same order on every run; bytes_read() never decreases and reaches total_bytes() at the end.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace weft {

enum class InputFormat { automatic, plain, jsonl };

// "auto" | "plain" | "jsonl"; throws weft::Error naming the choices for anything else.
InputFormat parse_input_format(const std::string& name);

struct TextDocumentOptions {
  InputFormat format = InputFormat::automatic;
  std::string text_field = "text";  // JSON lines: the field that holds the document
  bool split_on_blank_lines = false;  // plain text: a blank line (or white space only) ends a document
  std::string separator_line;        // plain text, when non-empty: a line equal to it ends a document
};

struct TextDocument {
  std::string text;
  std::string file;
  int64_t line = 0;  // 1-based line of the file where the document starts
};

class TextDocumentReader {
 public:
  // Checks that every file exists and is a regular file (or a link to one) and sums their sizes;
  // throws weft::Error naming the first that is not, or when no file is given, or when the plain
  // text options contradict each other.
  TextDocumentReader(std::vector<std::string> files, TextDocumentOptions options);

  // Reads the next document into `document`; returns false after the last one.
  bool next(TextDocument& document);

  uint64_t bytes_read() const { return bytes_done_ + bytes_in_file_; }
  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t skipped_documents() const { return skipped_documents_; }
  // The format `file` is read in under these options.
  InputFormat format_of(const std::string& file) const;

 private:
  bool open_next_file();
  void close_file();
  // One line of the open file, without its '\n'; false at its end.
  bool read_line(std::string& line);
  // Each reads the next candidate document of the open file (possibly blank); false at its end.
  bool next_whole_file(TextDocument& document);
  bool next_split(TextDocument& document);
  bool next_json_line(TextDocument& document);

  std::vector<std::string> files_;
  std::vector<uint64_t> sizes_;  // [files_.size()]
  TextDocumentOptions options_;
  uint64_t total_bytes_ = 0;
  uint64_t bytes_done_ = 0;      // bytes of the files already finished
  uint64_t bytes_in_file_ = 0;   // bytes read of the open file
  uint64_t skipped_documents_ = 0;

  size_t next_file_ = 0;         // index of the file to open after the open one
  bool file_open_ = false;
  std::ifstream stream_;
  InputFormat open_format_ = InputFormat::plain;
  int64_t line_number_ = 0;      // lines read of the open file
};

}  // namespace weft
