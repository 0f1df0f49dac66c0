// hugging_face_logits: weft's logits for given token ids, from Hugging Face weights (the way
// model.init_from loads them) or from a weft checkpoint, as JSON for tests/interop's scripts.
//
//   hugging_face_logits init_from PATH IDS OUT.json [SEQ_LEN]   PATH as model.init_from takes it
//   hugging_face_logits checkpoint PATH IDS OUT.json            a step folder or a checkpoint dir
//
// IDS is a comma-separated list of token ids (one sequence). OUT.json: {"logits": [T][V]}.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/checkpoint.h"
#include "launcher/config_loader.h"
#include "launcher/hugging_face_export.h"
#include "launcher/pretrained_weights.h"
#include "layers/language_model.h"
#include "nlohmann/json.hpp"
#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s init_from|checkpoint PATH IDS OUT.json [SEQ_LEN]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1], path = argv[2];
  try {
    std::vector<int64_t> ids;
    std::stringstream list(argv[3]);
    for (std::string item; std::getline(list, item, ',');) ids.push_back(std::stoll(item));
    std::shared_ptr<weft::LanguageModel> model;
    if (mode == "init_from") {
      std::vector<std::string> overrides = {"model.init_from=" + path};
      if (argc > 5) overrides.push_back(std::string("model.seq_len=") + argv[5]);
      const weft::RunConfig config = weft::load_config({}, overrides);
      model = weft::build_model(config.model);
      for (const std::string& line : weft::load_pretrained_weights(*model, nullptr, path, config.model)) {
        std::fprintf(stderr, "%s\n", line.c_str());
      }
    } else if (mode == "checkpoint") {
      const weft::LoadedCheckpoint checkpoint = weft::load_checkpoint(path);
      model = weft::build_model(weft::checkpoint_run_config(checkpoint).model);
      model->load_state_dict(weft::checkpoint_model_parameters(checkpoint));
    } else {
      std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    model->eval();
    weft::autograd::NoGradGuard no_grad;
    const weft::Tensor input =
        weft::Tensor::from_vector(absl::Span<const int64_t>(ids), {1, static_cast<int64_t>(ids.size())}, weft::kInt64);
    const weft::Tensor logits = model->logits(input).to(weft::kFloat32).contiguous();  // [1, T, V]
    const std::vector<double> values = logits.to_vector();
    const int64_t time = logits.size(1), vocab = logits.size(2);
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t t = 0; t < time; ++t) {
      rows.push_back(std::vector<double>(values.begin() + t * vocab, values.begin() + (t + 1) * vocab));
    }
    std::ofstream(argv[4]) << nlohmann::json{{"logits", rows}}.dump();
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "hugging_face_logits: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
