// Fault injection for tests: WEFT_FAULT makes one rank fail at a chosen point of a chosen step, so
// that the fault matrix (docs/reliability.md) is tested through weft-train itself.
//
//   WEFT_FAULT=<action>:rank=<world rank>:step=<step>[:phase=<phase>]
//     action  raise       throw a weft::Error (what a failing kernel or a bad value does)
//             kill        SIGKILL this process (a crashed host or an OOM kill)
//             hang        SIGSTOP this process (a stuck rank: alive, never arriving)
//             fail_write  throw the error a full disk gives (checkpoint phases)
//             nan         make that rank's loss of the step's first micro-batch NaN, and so its
//                         gradients (train.on_nan's case; the phase is not used: the rank must
//                         compute the loss, so on a pipeline it is a last stage's)
//     phase   where in the step: forward (the first forward node, the default), backward (the last
//             backward node), optimizer; or in the save of that step's checkpoint (rank 0):
//             checkpoint_tensors, checkpoint_state, checkpoint_rename, checkpoint_latest
//             (launcher/checkpoint.h's CheckpointPhase)
//
// Unset (the normal case) costs one branch per step. A malformed value is an error at start-up
// naming the variable and the expected form, on every rank alike.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace weft {

struct FaultInjection {
  enum class Action : uint8_t { kRaise, kKill, kHang, kFailWrite, kNan };
  enum class Phase : uint8_t {
    kForward, kBackward, kOptimizer,
    kCheckpointTensors, kCheckpointState, kCheckpointRename, kCheckpointLatest
  };
  Action action = Action::kRaise;
  int rank = 0;
  int64_t step = 0;
  Phase phase = Phase::kForward;
  std::string text;  // the variable's value, for the message

  // Parses `value` (WEFT_FAULT's form above); throws weft::Error naming what is wrong.
  static FaultInjection parse(const std::string& value);
  // The fault WEFT_FAULT asks for, if it is set.
  static std::optional<FaultInjection> from_environment();

  // Fails as asked when (rank, step, phase) is the chosen point; otherwise does nothing (and
  // nothing for `nan`, which poisons_loss answers).
  void at(int world_rank, int64_t current_step, Phase current_phase) const;
  // Whether this rank's loss of this step's first micro-batch is to be made NaN.
  bool poisons_loss(int world_rank, int64_t current_step) const {
    return action == Action::kNan && world_rank == rank && current_step == step;
  }
};

}  // namespace weft
