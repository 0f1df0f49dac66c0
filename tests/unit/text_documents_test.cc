// TextDocumentReader: plain text files (whole, split on blank lines, split on a separator line), JSON
// lines (the text field, file:line in every error), formats by extension, blank documents skipped,
// the byte progress, and missing inputs.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "launcher/text_documents.h"
#include "runtime/error.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

namespace fs = std::filesystem;

class TextDocumentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    folder_ = fs::temp_directory_path() / ("weft_text_documents_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(folder_);
    fs::create_directories(folder_);
  }
  void TearDown() override { fs::remove_all(folder_); }

  std::string write_file(const std::string& name, const std::string& text) const {
    const std::string path = (folder_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  fs::path folder_;
};

std::vector<TextDocument> read_all(TextDocumentReader& reader) {
  std::vector<TextDocument> documents;
  TextDocument document;
  while (reader.next(document)) documents.push_back(document);
  return documents;
}

std::vector<TextDocument> read_all(const std::vector<std::string>& files, const TextDocumentOptions& options = {}) {
  TextDocumentReader reader(files, options);
  return read_all(reader);
}

std::vector<std::string> texts(const std::vector<TextDocument>& documents) {
  std::vector<std::string> result;
  for (const TextDocument& document : documents) result.push_back(document.text);
  return result;
}

TEST_F(TextDocumentsTest, EachPlainFileIsOneDocumentInInputOrder) {
  const std::string first = write_file("b.txt", "second file's text\n\nwith a blank line");
  const std::string second = write_file("a.txt", "first\n");
  const std::string empty = write_file("empty.txt", "");
  const std::string blank = write_file("blank.txt", " \n\t\n");
  TextDocumentReader reader({first, empty, second, blank}, {});
  EXPECT_EQ(reader.total_bytes(), 37u + 0u + 6u + 4u);
  const std::vector<TextDocument> documents = read_all(reader);
  // The order given, not the names' order; the bytes as they are; blank files are skipped.
  EXPECT_EQ(texts(documents), (std::vector<std::string>{"second file's text\n\nwith a blank line", "first\n"}));
  EXPECT_EQ(documents[1].file, second);
  EXPECT_EQ(documents[1].line, 1);
  EXPECT_EQ(reader.skipped_documents(), 2u);
  EXPECT_EQ(reader.bytes_read(), reader.total_bytes());
}

TEST_F(TextDocumentsTest, PlainFilesSplitOnBlankLinesOrOnASeparatorLine) {
  const std::string paragraphs = write_file("paragraphs.txt", "\n\none\nstill one\n\n \n\ntwo\r\n\nthree");
  TextDocumentOptions blank_lines;
  blank_lines.split_on_blank_lines = true;
  const std::vector<TextDocument> split = read_all({paragraphs}, blank_lines);
  EXPECT_EQ(texts(split), (std::vector<std::string>{"one\nstill one\n", "two\r\n", "three\n"}));
  EXPECT_EQ(split[0].line, 3);
  EXPECT_EQ(split[1].line, 8);
  EXPECT_EQ(split[2].line, 10);

  // Debian's fortune files: one fortune per document between lines of "%"; blank lines stay inside.
  const std::string fortunes = write_file("fortunes", "A fortune.\n%\nTwo lines,\n\nand a blank one.\n%\r\n%\n\n%\nLast.\n%\n");
  TextDocumentOptions percent;
  percent.separator_line = "%";
  TextDocumentReader reader({fortunes}, percent);
  const std::vector<TextDocument> documents = read_all(reader);
  EXPECT_EQ(texts(documents), (std::vector<std::string>{"A fortune.\n", "Two lines,\n\nand a blank one.\n", "Last.\n"}));
  EXPECT_EQ(documents[2].line, 10);
  EXPECT_EQ(reader.skipped_documents(), 1u) << "the blank fortune between separators";
  EXPECT_EQ(reader.bytes_read(), reader.total_bytes());

  TextDocumentOptions both = percent;
  both.split_on_blank_lines = true;
  expect_contains(error_message([&] { TextDocumentReader({fortunes}, both); }),
                  {"--split-on-blank-lines", "--separator-line"});
}

TEST_F(TextDocumentsTest, JsonLinesGiveTheirTextFieldOneDocumentPerLine) {
  const std::string jsonl = write_file("corpus.jsonl",
                                       "{\"text\": \"caf\\u00e9\\nau lait\", \"id\": 1}\n"
                                       "\n"
                                       "{\"id\": 2, \"text\": \"second\"}\r\n"
                                       "{\"text\": \"  \"}\n"
                                       "{\"text\": \"last, no newline\"}");
  TextDocumentReader reader({jsonl}, {});
  EXPECT_EQ(reader.format_of(jsonl), InputFormat::jsonl);
  const std::vector<TextDocument> documents = read_all(reader);
  EXPECT_EQ(texts(documents), (std::vector<std::string>{"caf\xc3\xa9\nau lait", "second", "last, no newline"}));
  EXPECT_EQ(documents[1].line, 3);
  EXPECT_EQ(documents[2].line, 5);
  EXPECT_EQ(reader.skipped_documents(), 1u);
  EXPECT_EQ(reader.bytes_read(), reader.total_bytes());

  // Another field, a .json extension, and a forced format for a file named otherwise.
  const std::string json = write_file("corpus.json", "{\"content\": \"from content\"}\n");
  const std::string data = write_file("corpus.data", "{\"content\": \"forced\"}\n");
  TextDocumentOptions content;
  content.text_field = "content";
  EXPECT_EQ(texts(read_all({json}, content)), std::vector<std::string>{"from content"});
  EXPECT_EQ(texts(read_all({data}, content)), std::vector<std::string>{"{\"content\": \"forced\"}\n"});
  content.format = InputFormat::jsonl;
  EXPECT_EQ(texts(read_all({data}, content)), std::vector<std::string>{"forced"});
  content.format = InputFormat::plain;
  EXPECT_EQ(texts(read_all({json}, content)), std::vector<std::string>{"{\"content\": \"from content\"}\n"});
}

TEST_F(TextDocumentsTest, BadJsonLinesAreNamedByFileAndLine) {
  auto error_of = [&](const std::string& contents) {
    const std::string file = write_file("bad.jsonl", contents);
    return error_message([&] { read_all({file}); });
  };
  const std::string where = (folder_ / "bad.jsonl").string();
  expect_contains(error_of("{\"text\": \"fine\"}\n\n[\"a\", \"list\"]\n"),
                  {where + ":3:", "JSON array, not an object", "'text'"});
  expect_contains(error_of("{\"text\": \"fine\"}\n{\"body\": \"x\", \"id\": 3}\n"),
                  {where + ":2:", "no field 'text'", "its fields: body, id", "--text-field"});
  expect_contains(error_of("{\"text\": 42}\n"), {where + ":1:", "'text' is a number, not a string"});
  expect_contains(error_of("{\"text\": \"fine\"}\n{\"text\": \"cut off\n"), {where + ":2:", "not valid JSON"});
}

TEST_F(TextDocumentsTest, MissingInputsAndBadFormatsAreNamedErrors) {
  const std::string missing = (folder_ / "missing.txt").string();
  expect_contains(error_message([&] { TextDocumentReader({missing}, {}); }), {"no such input file", missing});
  expect_contains(error_message([&] { TextDocumentReader({folder_.string()}, {}); }), {"is a folder", "*.txt"});
  expect_contains(error_message([&] { TextDocumentReader({}, {}); }), {"no input files"});
  expect_contains(error_message([&] { parse_input_format("csv"); }), {"'csv'", "auto", "plain", "jsonl"});
  EXPECT_EQ(parse_input_format("plain"), InputFormat::plain);
}

}  // namespace
}  // namespace weft
