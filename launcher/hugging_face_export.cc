// export_hugging_face and the checkpoint readers it uses (hugging_face_export.h).
#include "launcher/hugging_face_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "launcher/hugging_face_config.h"
#include "launcher/safetensors.h"
#include "runtime/error.h"

namespace weft {
namespace {

namespace fs = std::filesystem;

// `text` to `path` through a temporary file in the same folder, fsynced, then renamed.
void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = str(path, ".tmp-", ::getpid());
  const int descriptor = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  WEFT_CHECK(descriptor >= 0, "weft-export: cannot create '", temporary, "': ", std::strerror(errno));
  const bool written = ::write(descriptor, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       ::fsync(descriptor) == 0;
  const std::string reason = std::strerror(errno);
  ::close(descriptor);
  if (!written || ::rename(temporary.c_str(), path.c_str()) != 0) {
    ::unlink(temporary.c_str());
    WEFT_FAIL("weft-export: cannot write '", path, "': ", reason);
  }
}

}  // namespace

std::map<std::string, Tensor> checkpoint_model_parameters(const LoadedCheckpoint& checkpoint) {
  std::map<std::string, Tensor> parameters;
  for (const auto& [name, tensor] : checkpoint.tensors) {
    if (name.rfind("model.", 0) == 0) parameters[name.substr(6)] = tensor.to(kFloat32);
  }
  WEFT_CHECK(!parameters.empty(), "checkpoint ", checkpoint.path, " holds no model parameters");
  return parameters;
}

HuggingFaceExport export_hugging_face(const LoadedCheckpoint& checkpoint, const std::string& out_dir,
                                      HuggingFaceFormat format, DType dtype) {
  const ModelConfig model = checkpoint_run_config(checkpoint).model;
  // Both conversions before any file is written: an inexpressible model leaves OUT_DIR as it was.
  const nlohmann::ordered_json config_json = hugging_face_config_json(model, format, dtype);
  const std::map<std::string, Tensor> tensors =
      hugging_face_tensors_from_weft(checkpoint_model_parameters(checkpoint), model, format, dtype);
  std::error_code error;
  fs::create_directories(out_dir, error);
  WEFT_CHECK(fs::is_directory(out_dir), "weft-export: cannot create the folder '", out_dir, "'",
             error ? str(" (", error.message(), ")") : "");
  HuggingFaceExport out;
  out.weights_path = (fs::path(out_dir) / "model.safetensors").string();
  out.config_path = (fs::path(out_dir) / "config.json").string();
  write_safetensors(out.weights_path, tensors, {{"weft_checkpoint", checkpoint.path}});
  write_text_atomically(out.config_path, config_json.dump(2) + "\n");
  out.tensors = static_cast<int64_t>(tensors.size());
  for (const auto& [name, tensor] : tensors) out.parameters += tensor.numel();
  return out;
}

}  // namespace weft
