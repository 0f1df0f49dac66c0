// custom-train: weft-train with the squared-ReLU MLP compiled in.
//
//   custom-train CONFIG.yaml [MORE.yaml...] [--set section.key=value]... [--dump-config] [--help]
//                [--expect-loss-drop=D]
//
// The same program as weft's own weft-train (launcher/weft_train_main.cc): load_config, then
// Trainer. The only difference is what is linked in: squared_relu_mlp.cc registers
// "squared_relu_mlp" during static initialization, so `model.mlp: squared_relu_mlp` resolves like a
// built-in. At the end it prints the first and the final training loss; with --expect-loss-drop=D
// it exits with status 3 unless final <= first - D (how the example's test checks that it learns).
// Exit status: 2 for a config error, 1 for a failure during training.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/command_line.h"
#include "launcher/config_loader.h"
#include "launcher/trainer.h"
#include "parallel/comm/fault_handler.h"
#include "parallel/comm/mpi_environment.h"
#include "runtime/error.h"

namespace {

constexpr const char* kLossDropFlag = "--expect-loss-drop";

// Takes --expect-loss-drop=D (or "--expect-loss-drop D") out of argv; the rest is weft-train's.
std::optional<double> take_loss_drop_flag(std::vector<const char*>& arguments) {
  std::optional<double> drop;
  const std::string flag = kLossDropFlag;
  for (size_t i = 1; i < arguments.size(); ++i) {
    const std::string argument = arguments[i];
    std::string value;
    size_t taken = 1;
    if (argument == "--") break;
    if (argument.rfind(flag + "=", 0) == 0) {
      value = argument.substr(flag.size() + 1);
    } else if (argument == flag) {
      WEFT_CHECK(i + 1 < arguments.size(), flag, " needs a value: ", flag, "=D");
      value = arguments[i + 1];
      taken = 2;
    } else {
      continue;
    }
    char* end = nullptr;
    drop = std::strtod(value.c_str(), &end);
    WEFT_CHECK(!value.empty() && *end == '\0', flag, ": expected a number, got '", value, "'");
    arguments.erase(arguments.begin() + static_cast<std::ptrdiff_t>(i),
                    arguments.begin() + static_cast<std::ptrdiff_t>(i + taken));
    --i;
  }
  return drop;
}

}  // namespace

int main(int argc, char** argv) {
  weft::MpiEnvironment mpi(&argc, &argv);  // under mpirun every rank runs this; alone, a world of one
  std::vector<const char*> arguments(argv, argv + argc);
  std::optional<double> expected_drop;
  weft::RunConfig config;
  try {
    expected_drop = take_loss_drop_flag(arguments);
    std::optional<weft::RunConfig> loaded = weft::config_from_command_line(
        weft::parse_command_line(static_cast<int>(arguments.size()), arguments.data()),
        std::string("  ") + kLossDropFlag + "=D  exit 3 unless the final loss is at least D below the first\n");
    if (!loaded) return 0;  // --help or --dump-config
    config = std::move(*loaded);
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "custom-train: error: %s\n", error.what());
    return 2;
  }

  weft::TrainResult result;
  try {
    weft::Trainer trainer(config);
    result = trainer.run();
  } catch (const weft::Error& error) {
    weft::abort_all_if_distributed(std::string("custom-train: error: ") + error.what());
    std::fprintf(stderr, "\ncustom-train: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    weft::abort_all_if_distributed(std::string("custom-train: internal error: ") + error.what());
    std::fprintf(stderr, "\ncustom-train: internal error: %s\n", error.what());
    return 1;
  }
  if (result.losses.empty() || mpi.world_rank() != 0) return 0;  // nothing ran, or another rank reports

  const double first = result.losses.front();
  const double last = result.losses.back();
  std::printf("custom-train: first loss %.4f (step %lld), final loss %.4f (step %lld)\n", first,
              static_cast<long long>(result.first_step), last, static_cast<long long>(result.last_step));
  if (expected_drop && !(last <= first - *expected_drop)) {
    std::fprintf(stderr, "custom-train: the loss fell by %.4f, less than the expected %.4f\n", first - last,
                 *expected_drop);
    return 3;
  }
  return 0;
}
