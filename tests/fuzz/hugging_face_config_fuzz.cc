// Fuzz target for the config.json reader (launcher/hugging_face_config.h): read_hugging_face_config,
// which turns a GPT-2 or Llama config.json into weft's model keys.
//
// Input: the text of one config.json. It is written beside a (dummy) model.safetensors in a scratch
// folder and read; a config that reads is then applied to a default run config as model.init_from
// does (apply_hugging_face_config), so each value it gives must either be taken by the model key's
// option or be refused with a weft::Error naming the field.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "launcher/hugging_face_config.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path folder = weft::fuzz::scratch_folder();
  const std::string path = (folder / "config.json").string();
  weft::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  std::vector<weft::HuggingFaceSetting> settings;
  try {
    settings = weft::read_hugging_face_config(path);
  } catch (const weft::Error&) {
    return 0;  // bad input, reported as it should be
  }
  for (const weft::HuggingFaceSetting& setting : settings) {
    if (setting.key.rfind("model.", 0) != 0 || setting.value.empty() || setting.field.empty()) {
      std::fprintf(stderr, "read_hugging_face_config gave the setting '%s' = '%s' (field '%s')\n", setting.key.c_str(),
                   setting.value.c_str(), setting.field.c_str());
      std::abort();
    }
  }

  const std::string weights = (folder / "model.safetensors").string();
  if (!std::filesystem::exists(weights)) weft::fuzz::write_file(weights, "");
  weft::RunConfig config;
  config.model.init_from = weights;
  try {
    weft::apply_hugging_face_config(
        config, [](const std::string&) { return std::string("default"); },
        [](const std::string&, const std::string&) {});
  } catch (const weft::Error&) {
    // a value weft refuses, reported as it should be
  }
  return 0;
}
