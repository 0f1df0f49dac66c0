// FaultInjection (fault_injection.h).
#include "parallel/step/fault_injection.h"

#include <signal.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "runtime/error.h"

namespace weft {

FaultInjection FaultInjection::parse(const std::string& value) {
  const char* form = "; expected WEFT_FAULT=raise|kill|hang:rank=R:step=S[:phase=forward|backward|optimizer]";
  FaultInjection fault;
  fault.text = value;
  const std::vector<std::string> parts = absl::StrSplit(value, ':');
  WEFT_CHECK(!parts.empty(), "WEFT_FAULT is empty", form);
  if (parts[0] == "raise") {
    fault.action = Action::kRaise;
  } else if (parts[0] == "kill") {
    fault.action = Action::kKill;
  } else if (parts[0] == "hang") {
    fault.action = Action::kHang;
  } else {
    WEFT_FAIL("WEFT_FAULT='", value, "': unknown action '", parts[0], "'", form);
  }
  bool has_rank = false, has_step = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::vector<std::string> pair = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    WEFT_CHECK(pair.size() == 2, "WEFT_FAULT='", value, "': '", parts[i], "' is not key=value", form);
    if (pair[0] == "rank") {
      WEFT_CHECK(absl::SimpleAtoi(pair[1], &fault.rank) && fault.rank >= 0, "WEFT_FAULT='", value, "': bad rank", form);
      has_rank = true;
    } else if (pair[0] == "step") {
      WEFT_CHECK(absl::SimpleAtoi(pair[1], &fault.step) && fault.step >= 1, "WEFT_FAULT='", value, "': bad step", form);
      has_step = true;
    } else if (pair[0] == "phase") {
      if (pair[1] == "forward") {
        fault.phase = Phase::kForward;
      } else if (pair[1] == "backward") {
        fault.phase = Phase::kBackward;
      } else if (pair[1] == "optimizer") {
        fault.phase = Phase::kOptimizer;
      } else {
        WEFT_FAIL("WEFT_FAULT='", value, "': unknown phase '", pair[1], "'", form);
      }
    } else {
      WEFT_FAIL("WEFT_FAULT='", value, "': unknown key '", pair[0], "'", form);
    }
  }
  WEFT_CHECK(has_rank && has_step, "WEFT_FAULT='", value, "' needs rank= and step=", form);
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
  }
}

}  // namespace weft
