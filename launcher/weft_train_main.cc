// weft-train: trains a model from YAML config files.
//
//   weft-train CONFIG.yaml [MORE.yaml...] [--set section.key=value]... [--dump-config] [--help]
//
// Errors in the configuration or the data are reported in one line that names the key, file and
// line where it can, and the program exits with status 2 (1 for a failure during training).
#include <cstdio>
#include <exception>

#include "launcher/command_line.h"
#include "launcher/config_loader.h"
#include "launcher/config_options.h"
#include "launcher/trainer.h"
#include "runtime/error.h"

int main(int argc, char** argv) {
  weft::CommandLine command_line;
  weft::RunConfig config;
  try {
    command_line = weft::parse_command_line(argc, argv);
    if (command_line.help) {
      std::printf("%s\n%s", weft::command_line_usage().c_str(), weft::config_help().c_str());
      return 0;
    }
    config = weft::load_config(command_line.files, command_line.overrides);
    if (command_line.dump_config) {
      std::printf("%s", weft::dump_config(config).c_str());
      return 0;
    }
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "weft-train: error: %s\n", error.what());
    return 2;
  }
  try {
    weft::Trainer trainer(config);
    trainer.run();
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "\nweft-train: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "\nweft-train: internal error: %s\n", error.what());
    return 1;
  }
  return 0;
}
