#include "tests/support/error_expectations.h"

#include <exception>

#include "gtest/gtest.h"
#include "runtime/error.h"

namespace weft::testing {

std::string error_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  } catch (const std::exception& other) {
    ADD_FAILURE() << "threw a non-weft exception: " << other.what();
    return "";
  } catch (...) {
    ADD_FAILURE() << "threw something that is not a std::exception";
    return "";
  }
  ADD_FAILURE() << "expected a weft::Error, but nothing was thrown";
  return "";
}

void expect_contains(const std::string& message, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' missing from: " << message;
  }
}

}  // namespace weft::testing
