// Test hooks of the multi-tensor optimizer kernels (optimizer_kernels.cu). AdamW on Hopper may run
// adamw_bulk_kernel (the copy engine brings in its operands) where WEFT_ADAMW_BULK=1 and every
// parameter's arrays are aligned to 8 elements; elsewhere adamw_chunks_kernel runs. Both compute
// the same thing per element, so a test can only tell which ran by asking; these let one process
// check both kernels and see that the one it asked for was launched.
#pragma once

#include <cstdint>

namespace weft::cuda {

// Tests only: whether AdamW may take adamw_bulk_kernel from now on (at start, WEFT_ADAMW_BULK=1).
// Returns the previous setting.
bool set_adamw_bulk_for_testing(bool allowed);
// Tests only: how many times this process has launched adamw_bulk_kernel.
int64_t adamw_bulk_launches_for_testing();

}  // namespace weft::cuda
