// weft-export: writes a weft checkpoint as a Hugging Face model folder (model.safetensors and
// config.json) that transformers' from_pretrained reads.
//
//   weft-export CHECKPOINT OUT_DIR --format hf-gpt2|hf-llama [--dtype f32|bf16|f16]
//
// CHECKPOINT is a step folder (checkpoints/step_00000200) or a checkpoint dir (its `latest` is
// used). hf-gpt2 takes a model with learned positions, layer norms, the GELU MLP and biases
// (GPT2LMHeadModel); hf-llama one with rope, RMS norms, the SwiGLU MLP and no biases
// (LlamaForCausalLM). Anything else is an error naming the setting. Exits 1 on an error, 2 on a
// bad command line.
#include <cstdio>
#include <exception>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "launcher/checkpoint.h"
#include "launcher/hugging_face_export.h"
#include "runtime/error.h"

ABSL_FLAG(std::string, format, "", "hf-gpt2 (GPT2LMHeadModel) or hf-llama (LlamaForCausalLM)");
ABSL_FLAG(std::string, dtype, "f32", "dtype of the written weights: f32, bf16 or f16");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a weft checkpoint as a Hugging Face model folder.\n  weft-export CHECKPOINT OUT_DIR "
      "--format hf-gpt2|hf-llama [--dtype f32|bf16|f16]");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() != 3 || absl::GetFlag(FLAGS_format).empty()) {
    std::fprintf(stderr, "weft-export: expected a checkpoint path, an output folder and --format\n%s\n",
                 absl::ProgramUsageMessage().data());
    return 2;
  }
  try {
    const weft::HuggingFaceFormat format = weft::parse_hugging_face_format(absl::GetFlag(FLAGS_format));
    const weft::DType dtype = weft::parse_dtype(absl::GetFlag(FLAGS_dtype));
    const weft::LoadedCheckpoint checkpoint = weft::load_checkpoint(positional[1]);
    const weft::HuggingFaceExport out = weft::export_hugging_face(checkpoint, positional[2], format, dtype);
    std::printf("weft-export: %s (step %lld) -> %s (%lld tensors, %lld parameters, %s) and %s\n",
                checkpoint.path.c_str(), static_cast<long long>(checkpoint.step), out.weights_path.c_str(),
                static_cast<long long>(out.tensors), static_cast<long long>(out.parameters),
                absl::GetFlag(FLAGS_dtype).c_str(), out.config_path.c_str());
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "weft-export: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "weft-export: internal error: %s\n", error.what());
    return 1;
  }
  return 0;
}
