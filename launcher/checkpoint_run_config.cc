#include "launcher/checkpoint_run_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "launcher/config_loader.h"
#include "runtime/error.h"

namespace weft {

RunConfig checkpoint_run_config(const LoadedCheckpoint& checkpoint) {
  WEFT_CHECK(checkpoint.state.contains("config") && checkpoint.state.at("config").is_string(), "checkpoint ",
             checkpoint.path, " has no stored config in state.json; it was not written by weft-train");
  // The loader reads files (it names them in its messages), so the stored YAML goes through one.
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("weft-checkpoint-config-" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(file);
    out << checkpoint.state.at("config").get<std::string>();
  }
  try {
    RunConfig config = load_config({file.string()}, {"model.init_from="});
    std::filesystem::remove(file);
    return config;
  } catch (...) {
    std::filesystem::remove(file);
    throw;
  }
}

}  // namespace weft
