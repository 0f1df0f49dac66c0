// Which of weft's own Hopper products the CUDA backend runs (runtime/cuda/hopper_products.h): the
// WEFT_HOPPER_GEMM setting, and the count of the products the own kernels have queued. Host code
// only, in every CUDA build, so that the setting's parsing is tested without a GPU.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/cuda/hopper_products.h"

namespace weft::cuda {
namespace {

constexpr unsigned kNotRead = ~0u;
std::atomic<unsigned> products_state{kNotRead};
std::atomic<int64_t> launches{0};

constexpr absl::string_view kValidValues =
    "0, 1, all, or a comma-separated list of bias_gelu, gelu_backward, input_gradient, swiglu and swiglu_backward";

}  // namespace

std::optional<unsigned> parse_hopper_products(std::string_view text, std::string* problem) {
  // absl::string_view: Debian's Abseil has its own, not std::string_view.
  const absl::string_view whole = absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
  if (whole.empty() || whole == "0") return 0u;
  if (whole == "1" || whole == "all") return kAllHopperProducts;
  unsigned products = 0;
  for (absl::string_view name : absl::StrSplit(whole, ',')) {
    name = absl::StripAsciiWhitespace(name);
    if (name == "bias_gelu") {
      products |= kHopperBiasGelu;
    } else if (name == "gelu_backward") {
      products |= kHopperGeluBackward;
    } else if (name == "input_gradient") {
      products |= kHopperInputGradient;
    } else if (name == "swiglu") {
      products |= kHopperSwiglu;
    } else if (name == "swiglu_backward") {
      products |= kHopperSwigluBackward;
    } else {
      if (problem != nullptr) {
        *problem = absl::StrCat(name.empty() ? std::string("an empty name") : absl::StrCat("\"", name, "\""), " in \"",
                                absl::string_view(text.data(), text.size()), "\" is not a product; valid values: ",
                                kValidValues);
      }
      return std::nullopt;
    }
  }
  return products;
}

unsigned hopper_products() {
  unsigned state = products_state.load(std::memory_order_relaxed);
  if (state == kNotRead) {
    const char* value = std::getenv("WEFT_HOPPER_GEMM");
    if (value == nullptr) {
      state = kDefaultHopperProducts;
    } else {
      std::string problem;
      const std::optional<unsigned> parsed = parse_hopper_products(value, &problem);
      if (!parsed.has_value()) {
        std::fprintf(stderr, "weft: WEFT_HOPPER_GEMM: %s; running cuBLASLt's products\n", problem.c_str());
      }
      state = parsed.value_or(0u);
    }
    products_state.store(state, std::memory_order_relaxed);
  }
  return state;
}

bool hopper_product_enabled(HopperProduct product) { return (hopper_products() & product) != 0; }

void set_hopper_products(unsigned products) {
  products_state.store(products & kAllHopperProducts, std::memory_order_relaxed);
}

void forget_hopper_products_for_testing() { products_state.store(kNotRead, std::memory_order_relaxed); }

int64_t hopper_gemm_launches() { return launches.load(std::memory_order_relaxed); }

void count_hopper_gemm_launch() { launches.fetch_add(1, std::memory_order_relaxed); }

}  // namespace weft::cuda
