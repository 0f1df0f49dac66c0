// FaultInjection (fault_injection.h).
#include "parallel/step/fault_injection.h"

#include <signal.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "runtime/error.h"

namespace weft {

namespace {

constexpr const char* kForm =
    "; expected WEFT_FAULT=raise|kill|hang|fail_write|nan:rank=R:step=S[:phase=forward|backward|optimizer|"
    "checkpoint_tensors|checkpoint_state|checkpoint_rename|checkpoint_latest]";

// The entry of `choices` named `name`; an error naming `what` and the value otherwise.
template <class Value>
Value choose(const std::vector<std::pair<std::string, Value>>& choices, const std::string& name, const char* what,
             const std::string& value) {
  for (const auto& [choice, result] : choices) {
    if (choice == name) return result;
  }
  WEFT_FAIL("WEFT_FAULT='", value, "': unknown ", what, " '", name, "'", kForm);
}

}  // namespace

FaultInjection FaultInjection::parse(const std::string& value) {
  FaultInjection fault;
  fault.text = value;
  const std::vector<std::string> parts = absl::StrSplit(value, ':');
  fault.action = choose<Action>(
      {{"raise", Action::kRaise},
       {"kill", Action::kKill},
       {"hang", Action::kHang},
       {"fail_write", Action::kFailWrite},
       {"nan", Action::kNan}},
      parts[0], "action", value);
  bool has_rank = false, has_step = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::vector<std::string> pair = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    WEFT_CHECK(pair.size() == 2, "WEFT_FAULT='", value, "': '", parts[i], "' is not key=value", kForm);
    if (pair[0] == "rank") {
      WEFT_CHECK(absl::SimpleAtoi(pair[1], &fault.rank) && fault.rank >= 0, "WEFT_FAULT='", value, "': bad rank", kForm);
      has_rank = true;
    } else if (pair[0] == "step") {
      WEFT_CHECK(absl::SimpleAtoi(pair[1], &fault.step) && fault.step >= 1, "WEFT_FAULT='", value, "': bad step", kForm);
      has_step = true;
    } else if (pair[0] == "phase") {
      fault.phase = choose<Phase>({{"forward", Phase::kForward},
                                   {"backward", Phase::kBackward},
                                   {"optimizer", Phase::kOptimizer},
                                   {"checkpoint_tensors", Phase::kCheckpointTensors},
                                   {"checkpoint_state", Phase::kCheckpointState},
                                   {"checkpoint_rename", Phase::kCheckpointRename},
                                   {"checkpoint_latest", Phase::kCheckpointLatest}},
                                  pair[1], "phase", value);
    } else {
      WEFT_FAIL("WEFT_FAULT='", value, "': unknown key '", pair[0], "'", kForm);
    }
  }
  WEFT_CHECK(has_rank && has_step, "WEFT_FAULT='", value, "' needs rank= and step=", kForm);
  return fault;
}

std::optional<FaultInjection> FaultInjection::from_environment() {
  const char* value = std::getenv("WEFT_FAULT");
  if (value == nullptr || *value == '\0') return std::nullopt;
  return parse(value);
}

void FaultInjection::at(int world_rank, int64_t current_step, Phase current_phase) const {
  if (world_rank != rank || current_step != step || current_phase != phase) return;
  switch (action) {
    case Action::kRaise:
      WEFT_FAIL("injected fault (WEFT_FAULT=", text, ") at step ", step);
    case Action::kKill:
      ::raise(SIGKILL);
      break;
    case Action::kHang:
      ::raise(SIGSTOP);
      break;
    case Action::kFailWrite:
      WEFT_FAIL("cannot write the checkpoint of step ", step, ": No space left on device (injected: WEFT_FAULT=", text,
                ")");
    case Action::kNan:
      break;  // poisons_loss: the step builder multiplies the loss's input by NaN
  }
}

}  // namespace weft
