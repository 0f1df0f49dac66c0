// Grad mode: whether ops record autograd history on this thread.
//
// On by default. NoGradGuard turns it off for a scope (evaluation, optimizer updates, the forward
// of a custom op) and restores the previous state when it ends.
#pragma once

namespace weft::autograd {

bool grad_mode_enabled();
void set_grad_mode_enabled(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_mode_enabled()) { set_grad_mode_enabled(false); }
  ~NoGradGuard() { set_grad_mode_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace weft::autograd
