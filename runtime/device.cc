#include "runtime/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/error.h"

namespace weft {

std::string Device::to_string() const {
  return is_cpu() ? std::string("cpu") : absl::StrCat("cuda:", index);
}

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  int index = -1;
  if (text.substr(0, 5) == "cuda:" && absl::SimpleAtoi(absl::string_view(text.data() + 5, text.size() - 5), &index) && index >= 0) {
    return cuda(index);
  }
  WEFT_FAIL("unknown device '", text, "': expected cpu, cuda or cuda:N");
}

}  // namespace weft
