// safetensors reading and writing (launcher/safetensors.h): every dtype round-trips, every kind of
// damaged file is refused with a message naming the file and the tensor, a write is atomic; and
// the Hugging Face name map (launcher/hugging_face_names.h) round-trips and names what does not fit.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "launcher/hugging_face_names.h"
#include "launcher/safetensors.h"
#include "layers/language_model.h"
#include "runtime/error.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;
namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = fs::temp_directory_path() / ("weft-safetensors-" + std::to_string(std::random_device{}()));
    fs::create_directories(folder_);
  }
  void TearDown() override { fs::remove_all(folder_); }

  std::string path(const std::string& name) const { return (folder_ / name).string(); }

  // A file of an 8-byte length, `header` and `data` bytes, as a damaged writer might leave it.
  std::string raw_file(const std::string& name, const std::string& header, size_t data_bytes, uint64_t length) {
    std::ofstream out(path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << header << std::string(data_bytes, '\0');
    return path(name);
  }
  std::string raw_file(const std::string& name, const std::string& header, size_t data_bytes) {
    return raw_file(name, header, data_bytes, header.size());
  }

  fs::path folder_;
};

TEST_F(SafetensorsTest, EveryDtypeRoundTripsAndReadsAsF32) {
  const Tensor values = Tensor::from_vector(absl::Span<const double>(std::vector<double>{1.5, -2.25, 0.0, 3072.0, 7.0, -0.125}),
                                            {2, 3}, kFloat64);
  std::map<std::string, Tensor> tensors;
  for (const DType dtype : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
    tensors[std::string("w_") + std::string(dtype_name(dtype))] = values.to(dtype);
  }
  tensors["scalar"] = Tensor::full({}, 4.0);
  tensors["empty"] = Tensor::zeros({0, 5});
  write_safetensors(path("model.safetensors"), tensors);

  const SafetensorsFile file(path("model.safetensors"));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.entries().size(), tensors.size());
  EXPECT_EQ(file.entries().at("w_bf16").dtype, "BF16");
  EXPECT_EQ(file.entries().at("w_f16").dtype, "F16");
  EXPECT_EQ(file.entries().at("w_f64").dtype, "F64");
  for (const auto& [name, tensor] : tensors) {
    const Tensor read = file.read(name, tensor.dtype());
    EXPECT_EQ(read.dtype(), tensor.dtype()) << name;
    EXPECT_EQ(read.shape(), tensor.shape()) << name;
    EXPECT_EQ(read.to_vector(), tensor.to_vector()) << name;  // bit-exact in the stored dtype
    EXPECT_EQ(file.read(name).dtype(), kFloat32) << name;  // and converted when asked
  }
  // These values are exact in every dtype, so every conversion to f32 gives them back.
  EXPECT_EQ(file.read("w_bf16").to_vector(), values.to_vector());

  // The header: sorted names, 8-byte aligned data, offsets in name order.
  std::ifstream in(path("model.safetensors"), std::ios::binary);
  uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), 8);
  EXPECT_EQ((8 + length) % 8, 0u);
  std::string header(length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(length));
  EXPECT_LT(header.find("\"empty\""), header.find("\"scalar\""));
  EXPECT_LT(header.find("\"scalar\""), header.find("\"w_bf16\""));
}

TEST_F(SafetensorsTest, DamagedFilesAreRefusedNamingTheFileAndTheTensor) {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(SafetensorsFile(raw_file("good", good, 8)));

  std::ofstream(path("short")) << "abc";
  expect_contains(error_message([&] { SafetensorsFile file(path("short")); }),
                  {path("short"), "shorter than the 8-byte header length"});
  expect_contains(error_message([&] { SafetensorsFile file(raw_file("long", good, 8, 1u << 20)); }),
                  {path("long"), "header length 1048576 reaches beyond the end of the file"});
  expect_contains(error_message([&] { SafetensorsFile file(raw_file("json", "{\"a\": ", 0)); }),
                  {path("json"), "not valid JSON"});
  expect_contains(error_message([&] { SafetensorsFile file(raw_file("truncated", good, 4)); }),
                  {path("truncated"), "tensor 'a'", "reach beyond the data, which is 4 bytes"});
  const std::string sized = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  expect_contains(error_message([&] { SafetensorsFile file(raw_file("sized", sized, 8)); }),
                  {path("sized"), "tensor 'a'", "shape [3] of F32 is 12 bytes", "hold 8"});
  const std::string overlapping = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_contains(error_message([&] { SafetensorsFile file(raw_file("overlap", overlapping, 12)); }),
                  {path("overlap"), "tensor 'b'", "overlaps tensor 'a'"});
  const std::string unknown = R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})";
  expect_contains(error_message([&] { SafetensorsFile file(raw_file("dtype", unknown, 2)); }),
                  {path("dtype"), "tensor 'a'", "dtype 'F8_E4M3'", "weft reads F32, F16, BF16 and F64"});
  const std::string backwards = R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})";
  expect_contains(error_message([&] { SafetensorsFile file(raw_file("backwards", backwards, 8)); }),
                  {"tensor 'a'", "end before they begin"});
  const std::string missing = R"({"a":{"dtype":"F32","shape":[2]}})";
  expect_contains(error_message([&] { SafetensorsFile file(raw_file("missing", missing, 8)); }),
                  {"tensor 'a'", "no 'data_offsets'"});
  const std::string negative = R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})";
  expect_contains(error_message([&] { SafetensorsFile file(raw_file("negative", negative, 8)); }),
                  {"tensor 'a'", "must be a non-negative integer"});
  expect_contains(error_message([&] { SafetensorsFile file(path("absent")); }), {"cannot open", path("absent")});
  expect_contains(error_message([&] { SafetensorsFile(raw_file("good2", good, 8)).read("b"); }),
                  {"has no tensor 'b'"});
}

TEST_F(SafetensorsTest, WritesAreAtomic) {
  const std::string target = path("model.safetensors");
  write_safetensors(target, {{"a", Tensor::ones({4})}});
  write_safetensors(target, {{"b", Tensor::zeros({2})}});  // replaces the file whole
  EXPECT_FALSE(SafetensorsFile(target).contains("a"));
  EXPECT_TRUE(SafetensorsFile(target).contains("b"));
  // A write that cannot complete (the target is a folder: the final rename fails) leaves nothing
  // behind: no temporary file, the folder as it was.
  fs::create_directories(path("occupied/inside"));
  expect_contains(error_message([&] { write_safetensors(path("occupied"), {{"a", Tensor::ones({4})}}); }),
                  {"cannot rename", path("occupied")});
  // An undefined tensor is refused before anything is written.
  expect_contains(error_message([&] { write_safetensors(path("other.safetensors"), {{"a", Tensor()}}); }),
                  {"the tensor 'a' is undefined"});
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder_)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"model.safetensors", "occupied"}));
}

// The name map both ways: weft -> Hugging Face -> weft gives every parameter back, bit for bit,
// for a GPT-2 (Conv1D transposes) and a grouped-query Llama (q, k, v rows stacked).
TEST_F(SafetensorsTest, HuggingFaceNamesRoundTripAndMismatchesAreNamed) {
  for (const std::string type : {"gpt", "llama"}) {
    ModelConfig config;
    config.type = type;
    config.dim = 32;
    config.heads = 4;
    config.vocab = 40;
    config.seq_len = 8;
    if (type == "llama") {
      config.kv_heads = 2;
      config.norm = "rms_norm";
      config.mlp = "swiglu_mlp";
      config.positions = "rope";
      config.bias = false;
      config.tie_embeddings = false;
    }
    const std::shared_ptr<LanguageModel> model = build_model(config);
    std::map<std::string, Tensor> parameters;
    for (const NamedParameter& parameter : model->named_parameters()) parameters[parameter.name] = parameter.tensor;
    const HuggingFaceFormat format = hugging_face_format_of(config);
    const std::map<std::string, Tensor> tensors = hugging_face_tensors_from_weft(parameters, config, format);
    if (type == "gpt") {
      EXPECT_EQ(tensors.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{32, 96}));
      EXPECT_EQ(tensors.at("transformer.h.0.attn.c_attn.weight").to_vector()[1],
                parameters.at("blocks.0.attention.qkv.weight").to_vector()[32]);  // [0][1] = qkv[1][0]
      EXPECT_EQ(tensors.count("lm_head.weight"), 0u);  // tied
    } else {
      EXPECT_EQ(tensors.at("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{16, 32}));
      EXPECT_EQ(tensors.count("lm_head.weight"), 1u);
    }
    HuggingFaceTensorSource source;
    for (const auto& [name, tensor] : tensors) source.shapes[name] = tensor.shape();
    source.read = [&](const std::string& name) { return tensors.at(name); };
    source.description = "test tensors";
    const std::map<std::string, Tensor> back = weft_parameters_from_hugging_face(source, config, format);
    ASSERT_EQ(back.size(), parameters.size());
    for (const auto& [name, tensor] : parameters) EXPECT_EQ(back.at(name).to_vector(), tensor.to_vector()) << name;

    // A missing tensor, an unexpected one and a wrong shape, all named in one message.
    const std::string first = type == "gpt" ? "transformer.ln_f.weight" : "model.norm.weight";
    const std::string second = type == "gpt" ? "transformer.wte.weight" : "model.embed_tokens.weight";
    HuggingFaceTensorSource damaged = source;
    damaged.shapes.erase(first);
    damaged.shapes["extra.weight"] = {3};
    damaged.shapes[second] = {41, 32};
    expect_contains(error_message([&] { weft_parameters_from_hugging_face(damaged, config, format); }),
                    {"3 problem(s)", "missing tensor '" + first + "' (expected shape [32]",
                     "unexpected tensor 'extra.weight' (shape [3])",
                     "tensor '" + second + "' has shape [41, 32], expected [40, 32]"});
  }
  ModelConfig rope_gpt;
  rope_gpt.positions = "rope";
  expect_contains(error_message([&] { check_expressible(rope_gpt, HuggingFaceFormat::kGpt2); }),
                  {"hf-gpt2 cannot express model.positions = rope"});
}

}  // namespace
}  // namespace weft
