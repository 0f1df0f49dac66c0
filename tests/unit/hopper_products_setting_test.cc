// Which of weft's own Hopper products run (runtime/cuda/hopper_products.h), on the host: the values
// WEFT_HOPPER_GEMM takes, the ones it refuses with a message naming the valid ones, the variable read
// once, and the tests' setting. The products themselves are CudaFused.OwnHopper* (a GPU of compute
// capability 9.0).
#ifdef WEFT_HAVE_CUDA

#include <cstdlib>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "runtime/cuda/hopper_products.h"

namespace weft::cuda {
namespace {

std::optional<unsigned> parse(const std::string& text, std::string* problem = nullptr) {
  return parse_hopper_products(text, problem);
}

TEST(HopperProductsSetting, NamesEveryProductOrNone) {
  EXPECT_EQ(parse(""), 0u);
  EXPECT_EQ(parse("0"), 0u);
  EXPECT_EQ(parse(" 0 "), 0u);
  EXPECT_EQ(parse("1"), kAllHopperProducts);
  EXPECT_EQ(parse("all"), kAllHopperProducts);
  EXPECT_EQ(kAllHopperProducts,
            unsigned{kHopperBiasGelu | kHopperGeluBackward | kHopperInputGradient | kHopperSwiglu |
                     kHopperSwigluBackward});
}

TEST(HopperProductsSetting, NamesProductsInAList) {
  EXPECT_EQ(parse("bias_gelu"), unsigned{kHopperBiasGelu});
  EXPECT_EQ(parse("gelu_backward"), unsigned{kHopperGeluBackward});
  EXPECT_EQ(parse("input_gradient"), unsigned{kHopperInputGradient});
  EXPECT_EQ(parse("bias_gelu,gelu_backward"), unsigned{kHopperBiasGelu | kHopperGeluBackward});
  EXPECT_EQ(parse("swiglu"), unsigned{kHopperSwiglu});
  EXPECT_EQ(parse("swiglu_backward"), unsigned{kHopperSwigluBackward});
  EXPECT_EQ(parse(" input_gradient , swiglu, gelu_backward , bias_gelu,swiglu_backward "), kAllHopperProducts);
  EXPECT_EQ(parse("bias_gelu,bias_gelu"), unsigned{kHopperBiasGelu});
}

TEST(HopperProductsSetting, RefusesOtherValuesNamingTheValidOnes) {
  for (const std::string text : {"gelu", "bias_gelu,dgelu", "bias_gelu,", "2", "1,bias_gelu", "yes", "ALL"}) {
    SCOPED_TRACE(text);
    std::string problem;
    EXPECT_EQ(parse(text, &problem), std::nullopt);
    EXPECT_NE(problem.find("is not a product"), std::string::npos) << problem;
    EXPECT_NE(problem.find("bias_gelu, gelu_backward, input_gradient, swiglu and swiglu_backward"), std::string::npos)
        << problem;
    EXPECT_NE(problem.find(text), std::string::npos) << "the message quotes the value: " << problem;
  }
  std::string problem;
  EXPECT_EQ(parse("bias_gelu,,gelu_backward", &problem), std::nullopt);
  EXPECT_NE(problem.find("an empty name"), std::string::npos) << problem;
  EXPECT_EQ(parse("dgelu", nullptr), std::nullopt) << "no message asked for: still refused";
}

// The variable is read at the first call and kept; a value it refuses runs none; the tests' setting
// replaces it.
TEST(HopperProductsSetting, ReadsTheVariableOnceAndTestsReplaceIt) {
  const char* before = std::getenv("WEFT_HOPPER_GEMM");
  const std::optional<std::string> saved = before != nullptr ? std::optional<std::string>(before) : std::nullopt;

  ::setenv("WEFT_HOPPER_GEMM", "gelu_backward", 1);
  forget_hopper_products_for_testing();
  EXPECT_EQ(hopper_products(), unsigned{kHopperGeluBackward});
  EXPECT_TRUE(hopper_product_enabled(kHopperGeluBackward));
  EXPECT_FALSE(hopper_product_enabled(kHopperBiasGelu));
  ::setenv("WEFT_HOPPER_GEMM", "1", 1);
  EXPECT_EQ(hopper_products(), unsigned{kHopperGeluBackward}) << "read once, at the first call";

  forget_hopper_products_for_testing();
  EXPECT_EQ(hopper_products(), kAllHopperProducts);

  ::setenv("WEFT_HOPPER_GEMM", "dgelu", 1);
  forget_hopper_products_for_testing();
  EXPECT_EQ(hopper_products(), 0u) << "a refused value runs cuBLASLt's products";

  ::unsetenv("WEFT_HOPPER_GEMM");
  forget_hopper_products_for_testing();
  EXPECT_EQ(hopper_products(), kAllHopperProducts) << "unset: every product";
  ::setenv("WEFT_HOPPER_GEMM", "", 1);
  forget_hopper_products_for_testing();
  EXPECT_EQ(hopper_products(), 0u) << "set and empty: none";
  ::setenv("WEFT_HOPPER_GEMM", "0", 1);
  forget_hopper_products_for_testing();
  EXPECT_EQ(hopper_products(), 0u);

  set_hopper_products(kHopperBiasGelu);
  EXPECT_TRUE(hopper_product_enabled(kHopperBiasGelu));
  EXPECT_FALSE(hopper_product_enabled(kHopperGeluBackward));
  set_hopper_products(~0u);
  EXPECT_EQ(hopper_products(), kAllHopperProducts) << "only products are kept";

  if (saved.has_value()) ::setenv("WEFT_HOPPER_GEMM", saved->c_str(), 1);
  forget_hopper_products_for_testing();
}

}  // namespace
}  // namespace weft::cuda

#endif  // WEFT_HAVE_CUDA
