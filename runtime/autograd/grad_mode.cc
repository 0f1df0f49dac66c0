#include "runtime/autograd/grad_mode.h"

namespace weft::autograd {
namespace {
thread_local bool grad_mode = true;
}  // namespace

bool grad_mode_enabled() { return grad_mode; }
void set_grad_mode_enabled(bool enabled) { grad_mode = enabled; }

}  // namespace weft::autograd
