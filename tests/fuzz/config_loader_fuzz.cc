// Fuzz target for the config loader (launcher/config_loader.h): YAML files and --set values.
//
// Input: a YAML document, then, after a NUL byte, --set values separated by NUL bytes
// ("train:\n  lr: 0.1\n" NUL "train.steps=5" NUL "model.dim=64"). The document is written to a file
// and loaded with the values as overrides, as weft-train does. A config that loads must also
// survive --dump-config: its dump loads back to the same dump (checkpoints and `weft-train
// --dump-config` rely on that round trip).
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include "launcher/config_loader.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> parts = weft::fuzz::split_on_nul(data, size, size + 1);
  const std::string path = (weft::fuzz::scratch_folder() / "run.yaml").string();
  weft::fuzz::write_file(path, parts[0]);
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  weft::RunConfig config;
  try {
    config = weft::load_config({path}, overrides);
  } catch (const weft::Error&) {
    return 0;  // bad input, reported as it should be
  }
  const std::string dumped = weft::dump_config(config);
  const std::string dump_path = (weft::fuzz::scratch_folder() / "dumped.yaml").string();
  weft::fuzz::write_file(dump_path, dumped);
  std::string reloaded;
  try {
    reloaded = weft::dump_config(weft::load_config({dump_path}, {}));
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "a loaded config's dump does not load back: %s\n--- dump:\n%s\n", error.what(),
                 dumped.c_str());
    std::abort();
  }
  if (reloaded != dumped) {
    std::fprintf(stderr, "a loaded config's dump loads back differently\n--- dump:\n%s\n--- reloaded:\n%s\n",
                 dumped.c_str(), reloaded.c_str());
    std::abort();
  }
  return 0;
}
