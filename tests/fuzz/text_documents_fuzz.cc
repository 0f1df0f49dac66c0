// Fuzz target for weft-prepare's document reader (launcher/text_documents.h): TextDocumentReader
// over JSON lines and plain text files.
//
// Input: one options byte, then the file's bytes. The options byte's bits choose:
//   bits 0-1  --format: 0 auto, 1 plain, 2 jsonl, 3 auto
//   bit 2     the file's extension: 0 ".txt", 1 ".jsonl" (what auto goes by)
//   bit 3     split_on_blank_lines
//   bit 4     separator_line "%" (with bit 3 too: contradicting options, an error)
//   bit 5     text_field "content" instead of "text"
//   bit 6     the file is given twice (as two files), so the reader moves from one file to the next
//   bit 7     text_field "" (an error)
// Every document is read, and what the header promises is checked: documents come file by file in
// order with rising line numbers, none is blank, bytes_read() never decreases nor passes
// total_bytes() and reaches it at the end, and a reader at its end stays there.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "launcher/text_documents.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "TextDocumentReader: %s\n", what);
  std::abort();
}

bool is_blank(const std::string& text) {
  return text.find_first_not_of(" \t\r\n\f\v") == std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t choice = size > 0 ? data[0] : 0;
  const std::string_view contents = size > 0 ? std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1)
                                             : std::string_view();
  weft::TextDocumentOptions options;
  options.format = (choice & 3) == 1 ? weft::InputFormat::plain
                   : (choice & 3) == 2 ? weft::InputFormat::jsonl
                                       : weft::InputFormat::automatic;
  options.split_on_blank_lines = (choice & 8) != 0;
  if ((choice & 16) != 0) options.separator_line = "%";
  options.text_field = (choice & 128) != 0 ? "" : (choice & 32) != 0 ? "content" : "text";
  const std::string extension = (choice & 4) != 0 ? ".jsonl" : ".txt";
  std::vector<std::string> files = {(weft::fuzz::scratch_folder() / ("input" + extension)).string()};
  if ((choice & 64) != 0) files.push_back((weft::fuzz::scratch_folder() / ("again" + extension)).string());
  for (const std::string& file : files) weft::fuzz::write_file(file, contents);

  try {
    weft::TextDocumentReader reader(files, options);
    if (reader.total_bytes() != files.size() * contents.size()) fail("total_bytes() is not the files' size");
    size_t file_index = 0;
    int64_t last_line = 0;
    uint64_t last_bytes = 0;
    weft::TextDocument document;
    while (reader.next(document)) {
      while (file_index < files.size() && document.file != files[file_index]) {
        ++file_index;
        last_line = 0;
      }
      if (file_index == files.size()) fail("a document names no file, or the files came out of order");
      if (document.line <= last_line) fail("a document's line is not after the previous document's");
      last_line = document.line;
      if (is_blank(document.text)) fail("a blank document was returned");
      if (reader.bytes_read() < last_bytes || reader.bytes_read() > reader.total_bytes()) {
        fail("bytes_read() went back or past total_bytes()");
      }
      last_bytes = reader.bytes_read();
    }
    if (reader.bytes_read() != reader.total_bytes()) fail("bytes_read() did not reach total_bytes() at the end");
    if (reader.next(document)) fail("a reader at its end returned another document");
  } catch (const weft::Error&) {
    // bad input, reported as it should be
  }
  return 0;
}
