// Errors that reach users.
//
// weft reports user mistakes (a shape, dtype or device mismatch, a bad argument) by throwing
// weft::Error, never by abort() or a crash, so that a program or a test can catch it and a
// distributed run can shut every rank down cleanly. The message names the op and the operands.
// WEFT_CHECK(condition, parts...) builds the message only when it fails, from any parts that
// stream to std::ostream (Debian 12's Abseil has its own string_view type, which absl::StrCat does
// not take from std::string_view, so messages are streamed instead).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace weft {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// str(parts...): concatenates the streamed form of every part.
template <class... Parts>
std::string str(const Parts&... parts) {
  std::ostringstream stream;
  (stream << ... << parts);
  return stream.str();
}

}  // namespace weft

#define WEFT_CHECK(condition, ...)                               \
  do {                                                           \
    if (!(condition)) [[unlikely]] {                             \
      throw ::weft::Error(::weft::str(__VA_ARGS__));          \
    }                                                            \
  } while (0)

#define WEFT_FAIL(...) throw ::weft::Error(::weft::str(__VA_ARGS__))
