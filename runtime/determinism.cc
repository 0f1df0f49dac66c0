// The deterministic-kernels setting (see determinism.h).
#include "runtime/determinism.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

namespace weft {
namespace {

// -1: not yet read from the environment.
std::atomic<int> g_deterministic{-1};

bool from_environment() {
  const char* value = std::getenv("WEFT_DETERMINISTIC");
  return value != nullptr && *value != '\0' && std::string_view(value) != "0";
}

}  // namespace

bool deterministic_kernels() {
  int value = g_deterministic.load(std::memory_order_relaxed);
  if (value < 0) {
    int expected = -1;
    g_deterministic.compare_exchange_strong(expected, from_environment() ? 1 : 0);
    value = g_deterministic.load(std::memory_order_relaxed);
  }
  return value == 1;
}

void set_deterministic_kernels(bool deterministic) {
  g_deterministic.store(deterministic ? 1 : 0, std::memory_order_relaxed);
}

}  // namespace weft
