// Expectations about errors for tests: the message of the weft::Error an action throws, and
// checks that a message names what it should (the op, the operands, the key, the file line).
#pragma once

#include <functional>
#include <initializer_list>
#include <string>

namespace weft::testing {

// The message of the weft::Error `action` throws. Adds a test failure (and returns "") when it
// throws nothing, or throws anything else — a user error must always be a weft::Error.
std::string error_message(const std::function<void()>& action);

// Adds a test failure for each part that `message` does not contain.
void expect_contains(const std::string& message, std::initializer_list<std::string> parts);

}  // namespace weft::testing
