// Run configs: the option table's defaults and help, layering of YAML files and --set overrides,
// every class of config error with what its message must carry (file, 1-based line, key, nearest
// key, allowed values), the --dump-config round trip, and weft-train's command line.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "gtest/gtest.h"
#include "tests/support/error_expectations.h"
#include "launcher/command_line.h"
#include "launcher/config_loader.h"
#include "launcher/config_options.h"
#include "runtime/error.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

// A fresh folder per test, so the files can have the plain names ("run.yaml") that messages show.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    folder_ = std::filesystem::path(::testing::TempDir()) /
              ("weft_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(folder_);
  }
  void TearDown() override { std::filesystem::remove_all(folder_); }

  std::string write(const std::string& name, const std::string& contents) {
    const std::string path = (folder_ / name).string();
    std::ofstream(path) << contents;
    return path;
  }

  std::filesystem::path folder_;
};

// Equal in every declared key (the dump prints every key with a text that parses back exactly).
void expect_same_config(const RunConfig& a, const RunConfig& b) {
  EXPECT_EQ(dump_config(a), dump_config(b));
  EXPECT_EQ(a.model.options, b.model.options);
}

TEST_F(ConfigTest, NoFilesGiveTheStructDefaults) {
  const RunConfig config = load_config({}, {});
  expect_same_config(config, RunConfig{});
  EXPECT_EQ(config.train.lr, 3e-3);
  EXPECT_EQ(config.model.dim, 64);
  EXPECT_EQ(config.data.train, "/usr/share/games/fortunes");
  EXPECT_NO_THROW(validate_config(RunConfig{}));
  // An empty file and empty sections change nothing.
  expect_same_config(load_config({write("empty.yaml", ""), write("sections.yaml", "train:\nmodel:\n")}, {}),
                     RunConfig{});
}

TEST_F(ConfigTest, TableDeclaresEveryKeyOnceWithHelpAndAValidDefault) {
  std::set<std::string> keys;
  for (const ConfigOption& option : config_options()) {
    EXPECT_TRUE(keys.insert(option.key).second) << "declared twice: " << option.key;
    EXPECT_FALSE(option.help.empty()) << option.key;
    EXPECT_EQ(find_config_option(option.key), &option);
    if (option.type == OptionType::string_map) continue;
    RunConfig config;
    EXPECT_EQ(option.assign(config, option.format(RunConfig{})), "") << option.key;
  }
  EXPECT_EQ(keys.size(), 77u);  // every field of RunConfig; update with run_config.h
  EXPECT_EQ(find_config_option("train.lrr"), nullptr);
  EXPECT_EQ(find_config_option("train.lr")->type, OptionType::floating);
  EXPECT_EQ(find_config_option("model.options")->type, OptionType::string_map);
  EXPECT_EQ(find_config_option("parallel.pp_layers")->type, OptionType::integer_list);
}

TEST_F(ConfigTest, LaterFilesOverrideEarlierOnesKeyByKey) {
  const std::string base = write("base.yaml",
                                 "model:\n  dim: 128\n  heads: 8\n  options:\n    alpha: 1\n    beta: two\n"
                                 "train:\n  lr: 0.01\n  steps: 500\n  device: cuda:1\n  seed: 18446744073709551615\n");
  const std::string over = write("over.yaml",
                                 "train:\n  lr: 1e-4\n  schedule: linear\nmodel:\n  options:\n    beta: 3\n"
                                 "  bias: no\n");
  const RunConfig config = load_config({base, over}, {});
  EXPECT_EQ(config.model.dim, 128);
  EXPECT_EQ(config.model.heads, 8);
  EXPECT_EQ(config.model.bias, false);
  EXPECT_EQ(config.train.lr, 1e-4);
  EXPECT_EQ(config.train.steps, 500);
  EXPECT_EQ(config.train.schedule, "linear");
  EXPECT_EQ(config.train.device, "cuda:1");
  EXPECT_EQ(config.train.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(config.model.options, (std::map<std::string, std::string>{{"alpha", "1"}, {"beta", "3"}}));
  // The other order: base wins.
  EXPECT_EQ(load_config({over, base}, {}).train.lr, 0.01);
}

TEST_F(ConfigTest, SetOverridesComeAfterTheFilesInOrder) {
  const std::string file = write("run.yaml", "train:\n  lr: 0.01\n  steps: 500\n");
  const RunConfig config = load_config(
      {file}, {"train.lr=0.5", "train.lr = 0.25", "data.val=", "model.options.rank=16",
               "log.metrics_file=out/metrics.jsonl", "model.tie_embeddings=false", "train.steps=+20",
               "train.deterministic=on"});
  EXPECT_EQ(config.train.lr, 0.25);
  EXPECT_EQ(config.train.steps, 20);
  EXPECT_EQ(config.data.val, "");
  EXPECT_EQ(config.model.options.at("rank"), "16");
  EXPECT_EQ(config.log.metrics_file, "out/metrics.jsonl");
  EXPECT_FALSE(config.model.tie_embeddings);
  EXPECT_TRUE(config.train.deterministic);
  expect_contains(error_message([] { load_config({}, {"train.deterministic=sometimes"}); }),
                  {"train.deterministic: expected true or false, got 'sometimes'"});
}

TEST_F(ConfigTest, UnknownKeyNamesFileLineAndNearestKey) {
  const std::string file = write("run.yaml",
                                 "# a run\n"
                                 "model:\n"
                                 "  dim: 64\n"
                                 "train:\n"
                                 "  steps: 10\n"
                                 "\n"
                                 "  lrr: 0.1\n");
  EXPECT_EQ(error_message([&] { load_config({file}, {}); }),
            file + ":7: unknown key 'train.lrr'; did you mean 'train.lr'?");
  // The right name under the wrong section.
  const std::string misplaced = write("misplaced.yaml", "train:\n  vocab: 50304\n");
  expect_contains(error_message([&] { load_config({misplaced}, {}); }),
                  {"misplaced.yaml:2", "unknown key 'train.vocab'", "did you mean 'model.vocab'?"});
  // Nothing close: list the section's keys.
  const std::string far = write("far.yaml", "comm:\n  overlap_everything: true\n");
  expect_contains(error_message([&] { load_config({far}, {}); }),
                  {"far.yaml:2", "unknown key 'comm.overlap_everything'", "the keys of 'comm' are: mode"});
}

TEST_F(ConfigTest, UnknownSectionNamesFileLineAndNearestSection) {
  const std::string typo = write("run.yaml", "model:\n  dim: 64\ntrian:\n  lr: 0.1\n");
  EXPECT_EQ(error_message([&] { load_config({typo}, {}); }),
            typo + ":3: unknown section 'trian'; did you mean 'train'?");
  const std::string flat = write("flat.yaml", "\nlr: 0.1\n");
  expect_contains(error_message([&] { load_config({flat}, {}); }),
                  {"flat.yaml:2", "unknown section 'lr'", "did you mean 'train.lr'?"});
  const std::string dotted = write("dotted.yaml", "train.lr: 0.1\n");
  expect_contains(error_message([&] { load_config({dotted}, {}); }),
                  {"dotted.yaml:1", "unknown section 'train.lr'", "'train:' and under it 'lr: ...'"});
  const std::string nothing_close = write("other.yaml", "optimizer_settings:\n  x: 1\n");
  expect_contains(error_message([&] { load_config({nothing_close}, {}); }),
                  {"other.yaml:1", "the sections are model, train, data, parallel, comm, checkpoint, log"});
}

TEST_F(ConfigTest, WrongTypeNamesKeyValueAndFileLine) {
  const std::string file = write("run.yaml", "train:\n  lr: 0.1\n\n\n  steps: ten\n");
  EXPECT_EQ(error_message([&] { load_config({file}, {}); }),
            "train.steps: expected an integer, got 'ten' (" + file + ":5)");
  expect_contains(error_message([&] { load_config({write("a.yaml", "train:\n  steps: 1.5\n")}, {}); }),
                  {"train.steps: expected an integer, got '1.5'", "a.yaml:2"});
  expect_contains(error_message([&] { load_config({write("b.yaml", "train:\n  lr: fast\n")}, {}); }),
                  {"train.lr: expected a number, got 'fast'", "b.yaml:2"});
  expect_contains(error_message([&] { load_config({write("c.yaml", "model:\n  bias: maybe\n")}, {}); }),
                  {"model.bias: expected true or false, got 'maybe'", "c.yaml:2"});
  expect_contains(error_message([&] { load_config({write("d.yaml", "model:\n  dim: [1, 2]\n")}, {}); }),
                  {"model.dim: expected an integer, got a list", "d.yaml:2"});
  expect_contains(error_message([&] { load_config({write("e.yaml", "model:\n  dim:\n")}, {}); }),
                  {"model.dim: expected an integer, got nothing", "e.yaml:2"});
  expect_contains(error_message([&] { load_config({write("f.yaml", "train:\n  seed: -1\n")}, {}); }),
                  {"train.seed: expected a non-negative integer, got '-1'", "f.yaml:2"});
  expect_contains(error_message([&] { load_config({write("g.yaml", "model:\n  options: [a]\n")}, {}); }),
                  {"model.options: expected a map of NAME: VALUE, got a list", "g.yaml:2"});
  expect_contains(error_message([&] { load_config({write("h.yaml", "train: 3\n")}, {}); }),
                  {"h.yaml:1", "section 'train' must be a map of keys", "got '3'"});
  expect_contains(error_message([&] { load_config({write("i.yaml", "- train\n")}, {}); }),
                  {"i.yaml:1", "expected a map of sections", "got a list"});
}

TEST_F(ConfigTest, ValuesOutOfRangeOrNotAllowedSayWhatIsAllowed) {
  expect_contains(error_message([&] { load_config({write("run.yaml", "train:\n  lr: -0.1\n")}, {}); }),
                  {"train.lr: must be > 0, got -0.1", "run.yaml:2"});
  expect_contains(error_message([&] { load_config({write("a.yaml", "train:\n  schedule: cosin\n")}, {}); }),
                  {"train.schedule: must be one of cosine|linear|constant, got 'cosin'", "a.yaml:2"});
  expect_contains(error_message([&] { load_config({write("b.yaml", "train:\n  device: gpu\n")}, {}); }),
                  {"train.device: must be one of cpu|cuda|cuda:N, got 'gpu'", "b.yaml:2"});
  expect_contains(error_message([] { load_config({}, {"train.device=cuda:x"}); }),
                  {"train.device: must be one of cpu|cuda|cuda:N, got 'cuda:x'"});
  expect_contains(error_message([] { load_config({}, {"train.dtype=fp16"}); }), {"one of f32|bf16"});
  expect_contains(error_message([] { load_config({}, {"train.optimizer=adam"}); }), {"one of adamw|sgd"});
  expect_contains(error_message([] { load_config({}, {"data.format=json"}); }), {"one of text|tokens"});
  expect_contains(error_message([] { load_config({}, {"comm.mode=magic"}); }), {"one of manual|auto"});
  expect_contains(error_message([] { load_config({}, {"log.progress=fancy"}); }), {"one of auto|bar|plain"});
  expect_contains(error_message([] { load_config({}, {"train.on_nan=ignore"}); }), {"one of stop|skip"});
  expect_contains(error_message([] { load_config({}, {"train.recompute=some"}); }),
                  {"train.recompute: must be one of none|selective|full, got 'some'"});
  expect_contains(error_message([] { load_config({}, {"parallel.zero=3"}); }),
                  {"parallel.zero: must be one of 0|1|2, got '3'"});
  expect_contains(error_message([] { load_config({}, {"data.val_fraction=0.6"}); }),
                  {"data.val_fraction: must be in [0, 0.5], got 0.6", "(--set data.val_fraction=0.6)"});
  expect_contains(error_message([] { load_config({}, {"model.dropout=1"}); }), {"must be in [0, 1), got 1.0"});
  expect_contains(error_message([] { load_config({}, {"model.layers=0"}); }), {"model.layers: must be >= 1, got 0"});
  expect_contains(error_message([] { load_config({}, {"data.train="}); }), {"data.train: must not be empty"});
  EXPECT_EQ(load_config({}, {"train.device=cuda:3"}).train.device, "cuda:3");
  EXPECT_EQ(load_config({}, {"data.val_fraction=0.5"}).data.val_fraction, 0.5);
}

TEST_F(ConfigTest, YamlSyntaxErrorNamesFileAndLine) {
  const std::string file = write("run.yaml", "train:\n  lr: 0.1\n  steps: [1, 2\n\n");
  expect_contains(error_message([&] { load_config({file}, {}); }), {file + ":", "YAML syntax error"});
  const std::string brace = write("brace.yaml", "model:\n  dim: 64\n  heads: {\n");
  const std::string message = error_message([&] { load_config({brace}, {}); });
  expect_contains(message, {"brace.yaml:", "YAML syntax error"});
  EXPECT_EQ(message.find("brace.yaml:0"), std::string::npos) << "lines are 1-based: " << message;
  const std::string tabs = write("tabs.yaml", "model:\n\tdim: 3\n");
  expect_contains(error_message([&] { load_config({tabs}, {}); }),
                  {tabs + ":2:", "YAML syntax error", "tab: YAML indents with spaces only"});
}

TEST_F(ConfigTest, MissingFileIsNamed) {
  const std::string missing = (folder_ / "nope.yaml").string();
  expect_contains(error_message([&] { load_config({missing}, {}); }),
                  {"cannot read config file '" + missing + "'", "No such file"});
}

TEST_F(ConfigTest, DuplicateKeyNamesBothLines) {
  const std::string file = write("run.yaml", "train:\n  lr: 0.1\n  steps: 3\n  lr: 0.2\n");
  expect_contains(error_message([&] { load_config({file}, {}); }),
                  {file + ":4: duplicate key 'train.lr'", "first set at " + file + ":2"});
}

TEST_F(ConfigTest, SetErrorsNameTheOverride) {
  expect_contains(error_message([] { load_config({}, {"train.lr"}); }), {"--set 'train.lr': expected key=value"});
  expect_contains(error_message([] { load_config({}, {"=3"}); }), {"expected key=value"});
  EXPECT_EQ(error_message([] { load_config({}, {"train.lrr=0.1"}); }),
            "--set train.lrr=0.1: unknown key 'train.lrr'; did you mean 'train.lr'?");
  expect_contains(error_message([] { load_config({}, {"trian.lr=0.1"}); }),
                  {"unknown key 'trian.lr'", "did you mean 'train.lr'?"});
  expect_contains(error_message([] { load_config({}, {"modle.dim=3"}); }),
                  {"unknown key 'modle.dim'", "did you mean 'model.dim'?"});
  EXPECT_EQ(error_message([] { load_config({}, {"lr=0.1"}); }),
            "--set lr=0.1: unknown key 'lr'; did you mean 'train.lr'?");
  expect_contains(error_message([] { load_config({}, {"optimizer_settings.x=1"}); }),
                  {"unknown key 'optimizer_settings.x'", "the sections are model, train"});
  EXPECT_EQ(error_message([] { load_config({}, {"trian.foo=1"}); }),
            "--set trian.foo=1: unknown key 'trian.foo'; did you mean section 'train'?");
  EXPECT_EQ(error_message([] { load_config({}, {"train.steps=ten"}); }),
            "train.steps: expected an integer, got 'ten' (--set train.steps=ten)");
  expect_contains(error_message([] { load_config({}, {"model.options=x"}); }),
                  {"model.options is a map", "--set model.options.NAME=VALUE"});
}

TEST_F(ConfigTest, CrossFieldErrorsNameBothKeysValuesAndOrigins) {
  const std::string file = write("run.yaml", "model:\n  dim: 65\n");
  expect_contains(error_message([&] { load_config({file}, {}); }),
                  {"model.dim = 65 (" + file + ":2)", "model.heads = 4 (default)", "not a multiple"});
  expect_contains(error_message([] { load_config({}, {"model.kv_heads=3"}); }),
                  {"model.heads = 4 (default)", "model.kv_heads = 3 (--set model.kv_heads=3)"});
  EXPECT_NO_THROW(load_config({}, {"model.kv_heads=2"}));
  expect_contains(error_message([] { load_config({}, {"train.micro_batches=3"}); }),
                  {"train.batch_size = 8 (default)", "train.micro_batches = 3"});
  expect_contains(error_message([] { load_config({}, {"parallel.dp=2", "parallel.pp=2"}); }),
                  {"train.micro_batches = 1 (default) is fewer than parallel.pp = 2 (--set parallel.pp=2)",
                   "at least one micro-batch per stage"});
  expect_contains(error_message([] { load_config({}, {"parallel.sp=true"}); }),
                  {"parallel.sp = true (--set parallel.sp=true)", "parallel.tp = 1", "parallel.sp: false"});
  expect_contains(error_message([] { load_config({}, {"parallel.tp=2", "parallel.tp_plan.blocks.*.mlp.fc=column"}); }),
                  {"parallel.tp_plan", "comm.mode: auto"});
  EXPECT_NO_THROW(load_config({}, {"parallel.dp=4"}));
  expect_contains(error_message([] { load_config({}, {"parallel.dp=3"}); }),
                  {"train.batch_size = 8 (default)", "parallel.dp = 3 (--set parallel.dp=3)", "split evenly"});
  // A warm-up longer than the run is cut by the trainer (with a warning), not refused.
  EXPECT_NO_THROW(load_config({}, {"train.warmup_steps=300"}));
  expect_contains(error_message([] { load_config({}, {"checkpoint.resume=latest"}); }),
                  {"checkpoint.resume = latest", "needs checkpoint.dir"});
  expect_contains(error_message([] { load_config({}, {"checkpoint.every_minutes=30"}); }),
                  {"checkpoint.every_minutes = 30.0", "needs checkpoint.dir"});
  expect_contains(error_message([] { load_config({}, {"checkpoint.every_minutes=-1"}); }),
                  {"checkpoint.every_minutes"});
  // The GPT-2 tokenizer needs its 50257 ids in the vocabulary, and token shards.
  expect_contains(error_message([] { load_config({}, {"data.format=tokens", "data.tokenizer=gpt2"}); }),
                  {"data.tokenizer = gpt2 (--set data.tokenizer=gpt2)", "model.vocab = 256 (default)",
                   "model.vocab: 50257"});
  expect_contains(error_message([] { load_config({}, {"data.tokenizer=gpt2", "model.vocab=50257"}); }),
                  {"data.tokenizer = gpt2", "data.format = text (default)", "trains on bytes"});
  expect_contains(error_message([] { load_config({}, {"data.tokenizer=bpe"}); }),
                  {"data.tokenizer", "one of auto|bytes|gpt2|ids"});
  EXPECT_NO_THROW(load_config({}, {"data.format=tokens", "data.tokenizer=gpt2", "model.vocab=50304"}));
  // The origin is where the key was set last.
  const std::string heads = write("heads.yaml", "model:\n  heads: 5\n");
  expect_contains(error_message([&] { load_config({heads}, {"model.dim=96"}); }),
                  {"model.dim = 96 (--set model.dim=96)", "model.heads = 5 (" + heads + ":2)"});
}

TEST_F(ConfigTest, ValidateConfigChecksConfigsBuiltInCode) {
  RunConfig config;
  config.train.schedule = "step";
  expect_contains(error_message([&] { validate_config(config); }), {"train.schedule: must be one of"});
  config = RunConfig{};
  config.model.dim = 66;
  expect_contains(error_message([&] { validate_config(config); }), {"model.dim = 66 is not a multiple of model.heads = 4"});
}

TEST_F(ConfigTest, LlamaTypeFillsItsFixedSettingsAndRefusesOthers) {
  const RunConfig config = load_config({}, {"model.type=llama"});
  EXPECT_EQ(config.model.norm, "rms_norm");
  EXPECT_EQ(config.model.mlp, "swiglu_mlp");
  EXPECT_EQ(config.model.positions, "rope");
  EXPECT_FALSE(config.model.bias);
  EXPECT_FALSE(config.model.tie_embeddings);
  expect_contains(error_message([] { load_config({}, {"model.type=llama", "model.mlp=gelu_mlp"}); }),
                  {"model.mlp = gelu_mlp (--set model.mlp=gelu_mlp)", "llama always uses swiglu_mlp"});
  EXPECT_NO_THROW(load_config({}, {"model.type=llama", "model.mlp=swiglu_mlp"}));
}

TEST_F(ConfigTest, DumpConfigRoundTrips) {
  RunConfig config;
  config.model.type = "llama";
  config.model.layers = 12;
  config.model.dim = 768;
  config.model.heads = 12;
  config.model.kv_heads = 4;
  config.model.positions = "rope";  // the llama type's fixed settings, as load_config fills them in
  config.model.norm = "rms_norm";
  config.model.mlp = "swiglu_mlp";
  config.model.tie_embeddings = false;
  config.model.rope_theta = 500000.0;
  config.model.norm_eps = 1e-6;
  config.model.bias = false;
  config.model.dropout = 0.1 + 0.2;  // not a short decimal: must still come back bit for bit
  config.model.seed = std::numeric_limits<uint64_t>::max();
  config.model.options = {{"rank", "16"}, {"note", "a: b # not a comment"}, {"empty", ""}, {"tilde", "~"}};
  config.train.device = "cpu";
  config.train.dtype = "bf16";
  config.train.batch_size = 12;
  config.train.micro_batches = 3;
  config.train.lr = 6e-4;
  config.train.eps = 1e-12;
  config.train.schedule = "constant";
  config.train.on_nan = "skip";
  config.data.train = "data/shard_*.bin";
  config.data.val = "null";
  config.data.format = "tokens";
  config.data.val_fraction = 0.0;
  config.parallel.zero = 2;
  config.parallel.pp = 3;
  config.parallel.pp_schedule = "interleaved";
  config.parallel.pp_virtual = 2;
  config.parallel.pp_layers = {0, 2, 3, 3, 3, 1};
  config.parallel.pp_transport = "direct";
  config.comm.mode = "auto";
  config.checkpoint.dir = " runs/with spaces ";
  config.checkpoint.resume = "latest";
  config.log.metrics_file = "metrics.jsonl";
  config.log.progress = "plain";
  ASSERT_NO_THROW(validate_config(config));

  const std::string dumped = dump_config(config);
  for (const ConfigOption& option : config_options()) {
    EXPECT_NE(dumped.find(std::string(option.name()) + ":"), std::string::npos) << option.key;
  }
  const RunConfig loaded = load_config({write("dumped.yaml", dumped)}, {});
  expect_same_config(loaded, config);
  EXPECT_EQ(loaded.model.dropout, config.model.dropout);
  EXPECT_EQ(loaded.data.val, "null");
  EXPECT_EQ(loaded.checkpoint.dir, " runs/with spaces ");
  EXPECT_EQ(loaded.model.options.at("tilde"), "~");
  EXPECT_NE(dumped.find("  pp_layers: [0, 2, 3, 3, 3, 1]\n"), std::string::npos) << dumped;
  EXPECT_EQ(loaded.parallel.pp_layers, (std::vector<int64_t>{0, 2, 3, 3, 3, 1}));
  // The defaults round-trip too, empty strings and the empty map included.
  expect_same_config(load_config({write("defaults.yaml", dump_config(RunConfig{}))}, {}), RunConfig{});
}

TEST_F(ConfigTest, DumpConfigPrintsSectionsInFixedOrder) {
  const std::string dumped = dump_config(RunConfig{});
  size_t previous = 0;
  for (const std::string& section : config_sections()) {
    const size_t at = dumped.find("\n" + section + ":");
    ASSERT_NE(at, std::string::npos) << section;
    EXPECT_GT(at, previous) << section;
    previous = at;
  }
  expect_contains(dumped, {"  lr: 0.003\n", "  device: cpu\n", "  val: \"\"\n", "  options: {}\n", "  pp_layers: []\n",
                           "  pp_schedule: 1f1b\n", "  pp_virtual: 1\n"});
}

TEST_F(ConfigTest, HelpListsEveryKeyWithTypeDefaultLimitsAndHelp) {
  const std::string help = config_help();
  for (const ConfigOption& option : config_options()) {
    EXPECT_NE(help.find("  " + option.key + " "), std::string::npos) << option.key;
    EXPECT_NE(help.find(option.help), std::string::npos) << option.key;
  }
  for (const std::string& section : config_sections()) {
    EXPECT_NE(help.find(section + ":\n"), std::string::npos) << section;
  }
  expect_contains(help, {"(float, default 0.003; > 0)  peak learning rate",
                         "(string, default cosine; one of cosine|linear|constant)",
                         "(int, default 0; one of 0|1|2)", "(string, default \"\")", "(map, default {})",
                         "(bool, default true)", "(float, default 0.05; in [0, 0.5])",
                         "parallel.pp_schedule", "(string, default 1f1b; one of gpipe|1f1b|interleaved|zero_bubble)",
                         "parallel.pp_virtual", "(int, default 1; >= 1)", "parallel.pp_layers",
                         "(list, default []; each >= 0)"});
}

// The pipeline keys: what a file, --set and the defaults give.
TEST_F(ConfigTest, PipelineKeysLoadFromFilesAndSet) {
  const RunConfig defaults = load_config({}, {});
  EXPECT_EQ(defaults.parallel.pp_schedule, "1f1b");
  EXPECT_EQ(defaults.parallel.pp_virtual, 1);
  EXPECT_TRUE(defaults.parallel.pp_layers.empty());

  const std::string flow = write("flow.yaml",
                                 "model:\n  layers: 2\ntrain:\n  micro_batches: 4\nparallel:\n  pp: 2\n"
                                 "  pp_schedule: interleaved\n  pp_virtual: 2\n  pp_layers: [0, 1, 1, 0]\n");
  RunConfig config = load_config({flow}, {});
  EXPECT_EQ(config.parallel.pp, 2);
  EXPECT_EQ(config.parallel.pp_schedule, "interleaved");
  EXPECT_EQ(config.parallel.pp_virtual, 2);
  EXPECT_EQ(config.parallel.pp_layers, (std::vector<int64_t>{0, 1, 1, 0}));
  // A block sequence and a comma-separated scalar are the same list.
  const std::string block = write("block.yaml", "model:\n  layers: 3\ntrain:\n  micro_batches: 2\nparallel:\n"
                                                "  pp: 2\n  pp_layers:\n    - 2\n    - 1\n");
  EXPECT_EQ(load_config({block}, {}).parallel.pp_layers, (std::vector<int64_t>{2, 1}));
  const std::string scalar = write("scalar.yaml", "model:\n  layers: 3\ntrain:\n  micro_batches: 2\nparallel:\n"
                                                  "  pp: 2\n  pp_layers: 2,1\n");
  EXPECT_EQ(load_config({scalar}, {}).parallel.pp_layers, (std::vector<int64_t>{2, 1}));
  // A later source replaces the list whole; an empty value clears it (balanced by cost).
  const std::vector<std::string> fourteen = {"model.layers=14", "train.micro_batches=4", "parallel.pp=4"};
  for (const char* text : {"[4,4,3,3]", "4,4,3,3", " [ 4, 4, 3, 3 ] "}) {
    std::vector<std::string> overrides = fourteen;
    overrides.push_back(str("parallel.pp_layers=", text));
    EXPECT_EQ(load_config({}, overrides).parallel.pp_layers, (std::vector<int64_t>{4, 4, 3, 3})) << text;
  }
  EXPECT_EQ(load_config({block}, {"model.layers=4", "parallel.pp_layers=[1,3]"}).parallel.pp_layers,
            (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(load_config({block}, {"parallel.pp_layers="}).parallel.pp_layers.empty());
  EXPECT_TRUE(load_config({block}, {"parallel.pp_layers=[]"}).parallel.pp_layers.empty());
  const std::string cleared = write("cleared.yaml", "parallel:\n  pp_layers:\n");
  EXPECT_TRUE(load_config({block, cleared}, {}).parallel.pp_layers.empty());
  // Every schedule is accepted with a pipeline of two; interleaved with two chunks.
  for (const char* schedule : {"gpipe", "1f1b", "zero_bubble"}) {
    EXPECT_NO_THROW(load_config({}, {"train.micro_batches=2", "parallel.pp=2", str("parallel.pp_schedule=", schedule)}))
        << schedule;
  }
  EXPECT_NO_THROW(load_config({}, {"train.micro_batches=2", "parallel.pp=2", "parallel.pp_schedule=interleaved",
                                   "parallel.pp_virtual=2"}));
  // The embedding, the blocks and the head each may be a stage: layers + 2 stages at most.
  EXPECT_NO_THROW(load_config({}, {"train.micro_batches=4", "parallel.pp=4", "parallel.pp_layers=0,1,1,0"}));
  // The dump writes the list as a YAML sequence that reads back.
  config = load_config({}, fourteen);
  config.parallel.pp_layers = {4, 4, 3, 3};
  const std::string dumped = dump_config(config);
  EXPECT_NE(dumped.find("  pp_layers: [4, 4, 3, 3]\n"), std::string::npos) << dumped;
  expect_same_config(load_config({write("dumped.yaml", dumped)}, {}), config);
}

// parallel.pp_transport: host by default; direct pairs messages by order, which only the auto mode's
// plans keep, so a pipeline in the manual mode refuses it (a single stage ignores the key).
TEST_F(ConfigTest, DirectPipelineTransportNeedsTheAutoMode) {
  EXPECT_EQ(load_config({}, {}).parallel.pp_transport, "host");
  const std::vector<std::string> pipeline = {"train.micro_batches=2", "parallel.pp=2", "parallel.pp_transport=direct"};
  std::vector<std::string> automatic = pipeline;
  automatic.push_back("comm.mode=auto");
  EXPECT_EQ(load_config({}, automatic).parallel.pp_transport, "direct");
  expect_contains(error_message([&] { load_config({}, pipeline); }),
                  {"parallel.pp_transport = direct (--set parallel.pp_transport=direct) needs comm.mode auto",
                   "comm.mode = manual", "set comm.mode to auto, or parallel.pp_transport to host"});
  EXPECT_NO_THROW(load_config({}, {"parallel.pp_transport=direct"}));
  expect_contains(error_message([] { load_config({}, {"parallel.pp_transport=nccl"}); }),
                  {"parallel.pp_transport: must be one of host|direct, got 'nccl'"});
}

TEST_F(ConfigTest, PipelineKeyValuesOutOfRangeSayWhatIsAllowed) {
  expect_contains(error_message([] { load_config({}, {"parallel.pp_schedule=pipedream"}); }),
                  {"parallel.pp_schedule: must be one of gpipe|1f1b|interleaved|zero_bubble, got 'pipedream'"});
  expect_contains(error_message([] { load_config({}, {"parallel.pp_virtual=0"}); }),
                  {"parallel.pp_virtual: must be >= 1, got 0 (--set parallel.pp_virtual=0)"});
  for (const char* text : {"4,x", "[4,4", "4,4]", "4,,4", "[,]", "4.5"}) {
    expect_contains(error_message([&] { load_config({}, {str("parallel.pp_layers=", text)}); }),
                    {str("parallel.pp_layers: expected a list of integers such as [4, 4, 3, 3] or 4,4,3,3, got '", text, "'")});
  }
  expect_contains(error_message([] { load_config({}, {"parallel.pp_layers=2,-1"}); }),
                  {"parallel.pp_layers: each entry must be >= 0, got -1 in '2,-1' (--set parallel.pp_layers=2,-1)"});
  const std::string map = write("map.yaml", "parallel:\n  pp: 1\n  pp_layers: {a: 1}\n");
  expect_contains(error_message([&] { load_config({map}, {}); }),
                  {"parallel.pp_layers: expected a list of integers such as [4, 4, 3, 3], got a map", "map.yaml:3"});
  const std::string nested = write("nested.yaml", "parallel:\n  pp_layers: [1, [2]]\n");
  expect_contains(error_message([&] { load_config({nested}, {}); }),
                  {"parallel.pp_layers: expected a list of integers", "got a list as entry 2", "nested.yaml:2"});
  const std::string word = write("word.yaml", "parallel:\n  pp_layers: [1, two]\n");
  expect_contains(error_message([&] { load_config({word}, {}); }),
                  {"parallel.pp_layers: expected a list of integers", "got '[1, two]'", "word.yaml:2"});
  RunConfig config;
  config.parallel.pp_layers = {1, -1};
  expect_contains(error_message([&] { validate_config(config); }), {"parallel.pp_layers: each entry must be >= 0, got -1"});
}

TEST_F(ConfigTest, PipelineCrossFieldErrorsNameTheKeysAndHowToFix) {
  // One micro-batch per stage at least.
  const std::string pipeline = write("pipeline.yaml", "parallel:\n  pp: 4\n");
  expect_contains(error_message([&] { load_config({pipeline}, {"train.micro_batches=2"}); }),
                  {"train.micro_batches = 2 (--set train.micro_batches=2) is fewer than parallel.pp = 4 (" + pipeline + ":2)",
                   "a pipeline needs at least one micro-batch per stage", "raise train.micro_batches"});
  // interleaved: two chunks or more, micro-batches in groups of pp.
  expect_contains(error_message([] { load_config({}, {"train.micro_batches=2", "parallel.pp=2", "parallel.pp_schedule=interleaved"}); }),
                  {"parallel.pp_virtual = 1 (default)", "parallel.pp_schedule = interleaved (--set parallel.pp_schedule=interleaved)",
                   "set parallel.pp_virtual to 2 or more"});
  expect_contains(error_message([] {
                    load_config({}, {"model.layers=4", "train.batch_size=12", "train.micro_batches=4", "parallel.pp=3",
                                     "parallel.pp_schedule=interleaved", "parallel.pp_virtual=2"});
                  }),
                  {"train.micro_batches = 4 (--set train.micro_batches=4) is not a multiple of parallel.pp = 3",
                   "groups of parallel.pp", "make train.micro_batches a multiple of parallel.pp"});
  // Other schedules: one chunk per rank.
  expect_contains(error_message([] { load_config({}, {"train.micro_batches=2", "parallel.pp=2", "parallel.pp_virtual=2"}); }),
                  {"parallel.pp_virtual = 2 (--set parallel.pp_virtual=2)", "parallel.pp_schedule = 1f1b (default)",
                   "set parallel.pp_virtual to 1, or parallel.pp_schedule to interleaved"});
  // No more virtual stages than the embedding, the blocks and the head.
  expect_contains(error_message([] { load_config({}, {"model.layers=1", "train.micro_batches=4", "parallel.pp=4"}); }),
                  {"parallel.pp = 4 (--set parallel.pp=4) * parallel.pp_virtual = 1 (default) = 4 virtual stages",
                   "model.layers = 1 (--set model.layers=1) gives only 3 pieces", "lower parallel.pp or parallel.pp_virtual"});
  // pp_layers: one entry per virtual stage, none empty, summing to model.layers.
  expect_contains(error_message([] { load_config({}, {"train.micro_batches=2", "parallel.pp=2", "parallel.pp_layers=1,1,0"}); }),
                  {"parallel.pp_layers = [1, 1, 0] (--set parallel.pp_layers=1,1,0) has 3 entries",
                   "parallel.pp = 2 (--set parallel.pp=2) * parallel.pp_virtual = 1 (default) = 2 virtual stages",
                   "one block count per virtual stage", "leave parallel.pp_layers empty"});
  expect_contains(error_message([] { load_config({}, {"train.micro_batches=4", "parallel.pp=3", "parallel.pp_layers=[1,0,1]"}); }),
                  {"parallel.pp_layers = [1, 0, 1]", "entry 2 (virtual stage 1) is 0", "would hold nothing",
                   "only the first stage", "move a block to it"});
  const std::string layers = write("layers.yaml", "parallel:\n  pp: 2\n  pp_layers: [1, 2]\ntrain:\n  micro_batches: 2\n");
  expect_contains(error_message([&] { load_config({layers}, {}); }),
                  {"parallel.pp_layers = [1, 2] (" + layers + ":3) places 3 blocks, but model.layers = 2 (default)",
                   "add up to model.layers"});
  // pp_layers is checked without a pipeline too: one stage takes every block.
  expect_contains(error_message([] { load_config({}, {"parallel.pp_layers=3"}); }), {"places 3 blocks"});
  EXPECT_NO_THROW(load_config({}, {"parallel.pp_layers=2"}));
  // The data-parallel split of each micro-batch still applies.
  expect_contains(error_message([] { load_config({}, {"train.micro_batches=2", "parallel.pp=2", "parallel.dp=3"}); }),
                  {"parallel.dp = 3", "split evenly"});
}

TEST(CommandLineTest, SortsFilesOverridesAndFlags) {
  const char* argv[] = {"weft-train", "base.yaml", "--set", "train.lr=0.1", "more.yaml",
                        "--set=train.steps=5", "--dump-config", "--", "--odd-name.yaml"};
  const CommandLine command_line = parse_command_line(std::size(argv), argv);
  EXPECT_EQ(command_line.files, (std::vector<std::string>{"base.yaml", "more.yaml", "--odd-name.yaml"}));
  EXPECT_EQ(command_line.overrides, (std::vector<std::string>{"train.lr=0.1", "train.steps=5"}));
  EXPECT_TRUE(command_line.dump_config);
  EXPECT_FALSE(command_line.help);

  const char* help[] = {"weft-train", "-h"};
  EXPECT_TRUE(parse_command_line(2, help).help);
  const char* dump[] = {"weft-train", "--dump-config"};
  EXPECT_TRUE(parse_command_line(2, dump).files.empty());
}

TEST_F(ConfigTest, CommandLineGivesTheConfigOrPrintsHelpAndDump) {
  const std::string run = write("run.yaml", "train:\n  lr: 0.25\n");
  CommandLine command_line;
  command_line.files = {run};
  command_line.overrides = {"train.steps=70"};
  const std::optional<RunConfig> config = config_from_command_line(command_line);
  ASSERT_TRUE(config.has_value());
  expect_same_config(*config, load_config({run}, {"train.steps=70"}));
  EXPECT_EQ(config->train.steps, 70);
  EXPECT_EQ(config->train.lr, 0.25);

  command_line.dump_config = true;
  ::testing::internal::CaptureStdout();
  EXPECT_FALSE(config_from_command_line(command_line).has_value());
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), dump_config(*config));

  command_line.help = true;
  ::testing::internal::CaptureStdout();
  EXPECT_FALSE(config_from_command_line(command_line, "  --extra  one more flag\n").has_value());
  EXPECT_EQ(::testing::internal::GetCapturedStdout(),
            command_line_usage() + "  --extra  one more flag\n\n" + config_help());

  command_line = CommandLine{};
  command_line.overrides = {"train.lrr=1"};
  expect_contains(error_message([&] { config_from_command_line(command_line); }), {"unknown key 'train.lrr'"});
}

TEST(CommandLineTest, ErrorsNameTheFlagAndShowUsage) {
  const char* unknown[] = {"weft-train", "run.yaml", "--sett", "train.lr=1"};
  expect_contains(error_message([&] { parse_command_line(4, unknown); }), {"unknown flag '--sett'", "usage: weft-train"});
  const char* dangling[] = {"weft-train", "run.yaml", "--set"};
  expect_contains(error_message([&] { parse_command_line(3, dangling); }), {"--set needs a key=value", "usage:"});
  const char* nothing[] = {"weft-train"};
  expect_contains(error_message([&] { parse_command_line(1, nothing); }), {"no config file given", "usage:"});
  EXPECT_NE(command_line_usage().find("--set"), std::string::npos);
}

}  // namespace
}  // namespace weft
