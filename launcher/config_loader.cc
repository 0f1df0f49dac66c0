// load_config, validate_config and dump_config (see config_loader.h). A ConfigBuilder applies the
// sources one by one and remembers where each key was last set, so that a cross-field error can
// say which file line (or --set, or the default) each of its values came from.
#include "launcher/config_loader.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "launcher/config_options.h"
#include "launcher/gpt2_tokenizer.h"
#include "launcher/hugging_face_config.h"
#include "runtime/error.h"
#include "yaml-cpp/yaml.h"

namespace weft {
namespace {

// Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of two
// neighbouring characters ("trian" -> "train") each cost 1.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The candidate nearest to `word`, or "" when even the nearest is too far to be a typo of it.
std::string nearest(std::string_view word, const std::vector<std::string>& candidates,
                    size_t max_distance) {
  std::string best;
  size_t best_distance = max_distance + 1;
  for (const std::string& candidate : candidates) {
    const size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

// How far a misspelling may be from the word meant: 2 edits, more for long words.
size_t typo_distance(std::string_view word) { return std::max<size_t>(2, word.size() / 3); }

std::string join(const std::vector<std::string>& words, std::string_view separator) {
  std::string joined;
  for (const std::string& word : words) {
    if (!joined.empty()) joined += separator;
    joined += word;
  }
  return joined;
}

std::vector<std::string> all_keys() {
  std::vector<std::string> keys;
  for (const ConfigOption& option : config_options()) keys.push_back(option.key);
  return keys;
}

std::vector<std::string> section_names(std::string_view section) {
  std::vector<std::string> names;
  for (const ConfigOption& option : config_options()) {
    if (option.section() == section) names.emplace_back(option.name());
  }
  return names;
}

// What to say after "unknown key 'KEY'" for "section.name" (from --set, also a bare "name" or an
// unknown section).
std::string unknown_key_advice(const std::string& key) {
  const std::string_view section = std::string_view(key).substr(0, key.find('.'));
  const std::string_view name = std::string_view(key).substr(key.find('.') + 1);
  // The right name under the wrong section ("train.vocab") is closer in meaning than any typo.
  for (const ConfigOption& option : config_options()) {
    if (option.name() == name) return str("; did you mean '", option.key, "'?");
  }
  const std::string suggestion = nearest(key, all_keys(), typo_distance(key));
  if (!suggestion.empty()) return str("; did you mean '", suggestion, "'?");
  const std::vector<std::string> names = section_names(section);
  if (names.empty()) {  // only from --set: a file's unknown section fails before its keys
    const std::string near_section = nearest(section, config_sections(), typo_distance(section));
    if (!near_section.empty()) return str("; did you mean section '", near_section, "'?");
    return str("; the sections are ", join(config_sections(), ", "));
  }
  return str("; the keys of '", section, "' are: ", join(names, ", "),
             " (weft-train --help describes them)");
}

// What to say after "unknown section 'NAME'".
std::string unknown_section_advice(const std::string& name) {
  if (const ConfigOption* option = find_config_option(name)) {
    return str("; write the key nested: '", option->section(), ":' and under it '", option->name(),
               ": ...'");
  }
  for (const ConfigOption& option : config_options()) {
    if (option.name() == name) {
      return str("; did you mean '", option.key, "'? Keys go under their section ('",
                 option.section(), ":' and under it '", name, ": ...')");
    }
  }
  const std::string suggestion = nearest(name, config_sections(), typo_distance(name));
  if (!suggestion.empty()) return str("; did you mean '", suggestion, "'?");
  return str("; the sections are ", join(config_sections(), ", "));
}

std::string node_kind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar: return str("'", node.Scalar(), "'");
    default: return "an undefined value";
  }
}

std::string expected_value(OptionType type) {
  switch (type) {
    case OptionType::integer: return "an integer";
    case OptionType::floating: return "a number";
    case OptionType::string: return "a string";
    case OptionType::boolean: return "true or false";
    case OptionType::string_map: return "a map of NAME: VALUE";
    case OptionType::integer_list: return "a list of integers such as [4, 4, 3, 3]";
  }
  return "a value";
}

class ConfigBuilder {
 public:
  void apply_file(const std::string& path);
  void apply_override(const std::string& assignment);
  void check_cross_fields() const;
  // Keys a model type fixes take its values where the user left them at their defaults, so the
  // config (and --dump-config, and checkpoints) says what is in effect.
  void apply_model_type_settings();
  // model.init_from's config.json sets the model keys it describes (launcher/hugging_face_config.h
  // says how it ranks against the keys a user set).
  void apply_pretrained_config();
  RunConfig take() { return std::move(config_); }

 private:
  // "path:line" for a node of the file being read.
  std::string where(const std::string& path, const YAML::Node& node) const {
    const YAML::Mark mark = node.Mark();
    if (mark.is_null()) return path;
    return str(path, ":", mark.line + 1);
  }
  // Every key of a YAML map once: a repeated key is almost always an edit gone wrong, and YAML
  // says the second one would silently win.
  void check_unique_keys(const std::string& path, const YAML::Node& map, const std::string& prefix) const;
  void apply_scalar(const ConfigOption& option, const YAML::Node& value, const std::string& origin);
  void apply_map(const ConfigOption& option, const YAML::Node& value, const std::string& path);
  void apply_list(const ConfigOption& option, const YAML::Node& value, const std::string& origin);

  RunConfig config_;
  std::map<std::string, std::string> origin_;  // key -> "run.yaml:5" or "--set key=value"
};

void ConfigBuilder::check_unique_keys(const std::string& path, const YAML::Node& map,
                                      const std::string& prefix) const {
  std::map<std::string, std::string> first_seen;
  for (const auto& entry : map) {
    if (!entry.first.IsScalar()) {
      WEFT_FAIL(where(path, entry.first), ": a key must be a plain name, got ", node_kind(entry.first));
    }
    const std::string& name = entry.first.Scalar();
    const auto [it, inserted] = first_seen.emplace(name, where(path, entry.first));
    if (!inserted) {
      WEFT_FAIL(where(path, entry.first), ": duplicate key '", prefix, name, "' (first set at ",
                it->second, "); keep one of them");
    }
  }
}

void ConfigBuilder::apply_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    WEFT_FAIL("cannot read config file '", path, "': ", std::strerror(errno),
              "; check the path (files are read relative to the current directory)");
  }
  std::stringstream contents;
  contents << file.rdbuf();

  YAML::Node root;
  try {
    root = YAML::Load(contents.str());
  } catch (const YAML::ParserException& error) {
    // Tabs are the most common cause, and YAML's own message does not mention them.
    std::string line_text;
    std::istringstream lines(contents.str());
    for (int line = 0; line <= error.mark.line && std::getline(lines, line_text); ++line) {
    }
    const bool tab = line_text.find('\t') != std::string::npos;
    WEFT_FAIL(path, ":", error.mark.line + 1, ":", error.mark.column + 1, ": YAML syntax error: ",
              error.msg, "; fix the file at that line",
              tab ? " (it holds a tab: YAML indents with spaces only)" : "");
  }
  if (root.IsNull()) return;  // an empty file changes nothing
  if (!root.IsMap()) {
    WEFT_FAIL(where(path, root), ": expected a map of sections (", join(config_sections(), ", "),
              ") at the top level, got ", node_kind(root));
  }
  check_unique_keys(path, root, "");
  for (const auto& section_entry : root) {
    const std::string& section = section_entry.first.Scalar();
    const YAML::Node& keys = section_entry.second;
    if (std::find(config_sections().begin(), config_sections().end(), section) == config_sections().end()) {
      WEFT_FAIL(where(path, section_entry.first), ": unknown section '", section, "'",
                unknown_section_advice(section));
    }
    if (keys.IsNull()) continue;
    if (!keys.IsMap()) {
      WEFT_FAIL(where(path, section_entry.first), ": section '", section,
                "' must be a map of keys (one 'name: value' per line, indented), got ", node_kind(keys));
    }
    check_unique_keys(path, keys, section + ".");
    for (const auto& key_entry : keys) {
      const std::string key = str(section, ".", key_entry.first.Scalar());
      const ConfigOption* option = find_config_option(key);
      if (option == nullptr) {
        WEFT_FAIL(where(path, key_entry.first), ": unknown key '", key, "'", unknown_key_advice(key));
      }
      if (option->type == OptionType::string_map) {
        apply_map(*option, key_entry.second, path);
      } else if (option->type == OptionType::integer_list) {
        apply_list(*option, key_entry.second, where(path, key_entry.first));
      } else {
        apply_scalar(*option, key_entry.second, where(path, key_entry.first));
      }
    }
  }
}

void ConfigBuilder::apply_scalar(const ConfigOption& option, const YAML::Node& value,
                                 const std::string& origin) {
  std::string text;
  if (value.IsScalar()) {
    text = value.Scalar();
  } else if (!(value.IsNull() && option.type == OptionType::string)) {  // "key:" alone is "" for strings
    WEFT_FAIL(option.key, ": expected ", expected_value(option.type), ", got ", node_kind(value), " (",
              origin, ")");
  }
  const std::string problem = option.assign(config_, text);
  if (!problem.empty()) WEFT_FAIL(option.key, ": ", problem, " (", origin, ")");
  origin_[option.key] = origin;
}

void ConfigBuilder::apply_map(const ConfigOption& option, const YAML::Node& value,
                              const std::string& path) {
  if (value.IsNull()) return;
  if (!value.IsMap()) {
    WEFT_FAIL(option.key, ": expected ", expected_value(option.type), ", got ", node_kind(value), " (",
              where(path, value), ")");
  }
  check_unique_keys(path, value, option.key + ".");
  std::map<std::string, std::string>& entries = option.entries(config_);
  for (const auto& entry : value) {
    const std::string name = entry.first.Scalar();
    if (!entry.second.IsScalar() && !entry.second.IsNull()) {
      WEFT_FAIL(option.key, ".", name, ": expected a single value, got ", node_kind(entry.second), " (",
                where(path, entry.first), ")");
    }
    entries[name] = entry.second.IsScalar() ? entry.second.Scalar() : "";
    origin_[str(option.key, ".", name)] = where(path, entry.first);
  }
}

// A YAML sequence of scalars becomes the list text assign parses; a scalar ("4,4,3,3") goes as it
// is, and "key:" alone is the empty list, as it is the empty string for strings.
void ConfigBuilder::apply_list(const ConfigOption& option, const YAML::Node& value, const std::string& origin) {
  std::string text;
  if (value.IsSequence()) {
    std::vector<std::string> items;
    for (const YAML::Node& item : value) {
      if (!item.IsScalar()) {
        WEFT_FAIL(option.key, ": expected ", expected_value(option.type), ", got ", node_kind(item),
                  " as entry ", items.size() + 1, " (", origin, ")");
      }
      items.push_back(item.Scalar());
    }
    text = str("[", join(items, ", "), "]");
  } else if (value.IsScalar()) {
    text = value.Scalar();
  } else if (!value.IsNull()) {
    WEFT_FAIL(option.key, ": expected ", expected_value(option.type), ", got ", node_kind(value), " (", origin, ")");
  }
  const std::string problem = option.assign(config_, text);
  if (!problem.empty()) WEFT_FAIL(option.key, ": ", problem, " (", origin, ")");
  origin_[option.key] = origin;
}

std::string trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return "";
  const size_t end = text.find_last_not_of(" \t");
  return std::string(text.substr(begin, end - begin + 1));
}

void ConfigBuilder::apply_override(const std::string& assignment) {
  const std::string origin = str("--set ", assignment);
  const size_t equals = assignment.find('=');
  const std::string key = trim(std::string_view(assignment).substr(0, equals));
  if (equals == std::string::npos || key.empty()) {
    WEFT_FAIL("--set '", assignment, "': expected key=value, for example --set train.lr=0.001");
  }
  const std::string value = trim(std::string_view(assignment).substr(equals + 1));

  // Map-valued keys take their entry's name after the key: --set model.options.NAME=VALUE,
  // --set parallel.tp_plan.blocks.*.mlp.fc=column.
  for (const char* map_key : {"model.options", "parallel.tp_plan"}) {
    const ConfigOption* options_map = find_config_option(map_key);
    const std::string map_prefix = options_map->key + ".";
    if (key.compare(0, map_prefix.size(), map_prefix) == 0 && key.size() > map_prefix.size()) {
      options_map->entries(config_)[key.substr(map_prefix.size())] = value;
      origin_[key] = origin;
      return;
    }
  }
  const ConfigOption* option = find_config_option(key);
  if (option == nullptr) {
    WEFT_FAIL(origin, ": unknown key '", key, "'", unknown_key_advice(key));
  }
  if (option->type == OptionType::string_map) {
    WEFT_FAIL(origin, ": ", option->key, " is a map; set one entry with --set ", option->key,
              ".NAME=VALUE");
  }
  const std::string problem = option->assign(config_, value);
  if (!problem.empty()) WEFT_FAIL(option->key, ": ", problem, " (", origin, ")");
  origin_[option->key] = origin;
}

// The pipeline's checks (parallel.pp, pp_schedule, pp_virtual, pp_layers against the model and the
// micro-batches); `show` writes "key = value (origin)".
void check_pipeline_fields(const RunConfig& config, const std::function<std::string(const std::string& key)>& show) {
  const ParallelConfig& parallel = config.parallel;
  const int64_t micro_batches = config.train.micro_batches;
  WEFT_CHECK(micro_batches >= parallel.pp, show("train.micro_batches"), " is fewer than ", show("parallel.pp"),
             ": a pipeline needs at least one micro-batch per stage to keep every stage busy; raise "
             "train.micro_batches to parallel.pp or more (several per stage keep the pipeline bubble small), "
             "or lower parallel.pp");
  WEFT_CHECK(parallel.pp == 1 || parallel.pp_transport != "direct" || config.comm.mode == "auto",
             show("parallel.pp_transport"), " needs comm.mode auto, but ", show("comm.mode"), ": a direct send waits for its receive, and the manual "
             "mode posts a stage's sends and receives on one stream, where 1F1B's sends on both sides of a boundary "
             "would wait for each other; set comm.mode to auto, or parallel.pp_transport to host");
  if (parallel.pp_schedule == "interleaved") {
    WEFT_CHECK(parallel.pp_virtual >= 2, show("parallel.pp_virtual"), ": ", show("parallel.pp_schedule"),
               " runs several model chunks on each rank; set parallel.pp_virtual to 2 or more, or choose "
               "parallel.pp_schedule 1f1b");
    WEFT_CHECK(micro_batches % parallel.pp == 0, show("train.micro_batches"), " is not a multiple of ",
               show("parallel.pp"), ": ", show("parallel.pp_schedule"),
               " runs micro-batches in groups of parallel.pp; make train.micro_batches a multiple of parallel.pp");
  } else {
    WEFT_CHECK(parallel.pp_virtual == 1, show("parallel.pp_virtual"), ": only parallel.pp_schedule interleaved "
               "runs several model chunks per rank, and ", show("parallel.pp_schedule"),
               " does not; set parallel.pp_virtual to 1, or parallel.pp_schedule to interleaved");
  }
  // A virtual stage holds at least one segment: the embedding, a block or the head.
  const int64_t stages = parallel.pp * parallel.pp_virtual;
  const int64_t segments = config.model.layers + 2;
  WEFT_CHECK(stages <= segments, show("parallel.pp"), " * ", show("parallel.pp_virtual"), " = ", stages,
             " virtual stages, but ", show("model.layers"), " gives only ", segments,
             " pieces to place (the embedding, ", config.model.layers,
             " blocks, the head) and every stage needs one; lower parallel.pp or parallel.pp_virtual, or raise "
             "model.layers");
  if (parallel.pp_layers.empty()) return;  // balanced by cost when the model is built
  const std::vector<int64_t>& layers = parallel.pp_layers;
  WEFT_CHECK(static_cast<int64_t>(layers.size()) == stages, show("parallel.pp_layers"), " has ", layers.size(),
             " entries, but ", show("parallel.pp"), " * ", show("parallel.pp_virtual"), " = ", stages,
             " virtual stages; give one block count per virtual stage, or leave parallel.pp_layers empty to "
             "balance the stages by cost");
  for (size_t stage = 1; stage + 1 < layers.size(); ++stage) {
    WEFT_CHECK(layers[stage] > 0, show("parallel.pp_layers"), ": entry ", stage + 1, " (virtual stage ", stage,
               ") is 0, and that stage would hold nothing: only the first stage (which also holds the "
               "embedding) and the last (the head) may have 0 blocks; move a block to it");
  }
  int64_t sum = 0;
  for (const int64_t count : layers) sum += count;
  WEFT_CHECK(sum == config.model.layers, show("parallel.pp_layers"), " places ", sum, " blocks, but ",
             show("model.layers"), "; make the entries add up to model.layers");
}

// The cross-field checks, given a way to say where a key's value came from ("" when unknown).
void check_related_fields(const RunConfig& config,
                        const std::function<std::string(const std::string& key)>& origin_of) {
  auto show = [&](const std::string& key) {
    const std::string value = find_config_option(key)->format(config);
    const std::string origin = origin_of(key);
    return origin.empty() ? str(key, " = ", value) : str(key, " = ", value, " (", origin, ")");
  };
  const ModelConfig& model = config.model;
  WEFT_CHECK(model.dim % model.heads == 0, show("model.dim"), " is not a multiple of ",
             show("model.heads"), ": each head takes dim / heads channels; change one of them");
  WEFT_CHECK(model.kv_heads == 0 || model.heads % model.kv_heads == 0, show("model.heads"),
             " is not a multiple of ", show("model.kv_heads"),
             ": each key/value head serves heads / kv_heads query heads; set kv_heads to a divisor "
             "of heads, or 0 for one per head");
  if (model.type == "llama") {
    // The llama model type fixes these (layers/llama.h); a value set to something else would be
    // ignored silently.
    const std::vector<std::pair<std::string, std::string>> fixed = {
        {"model.norm", "rms_norm"}, {"model.mlp", "swiglu_mlp"}, {"model.positions", "rope"},
        {"model.bias", "false"}, {"model.tie_embeddings", "false"}};
    for (const auto& [key, value] : fixed) {
      const std::string origin = origin_of(key);
      WEFT_CHECK(origin.empty() || origin == "default" || find_config_option(key)->format(config) == value,
                 show(key), ": model.type llama always uses ", value,
                 "; remove the key, or use model.type: gpt to combine layers freely");
    }
  }
  const TrainConfig& train = config.train;
  WEFT_CHECK(train.batch_size % train.micro_batches == 0, show("train.batch_size"),
             " is not a multiple of ", show("train.micro_batches"),
             ": every micro-batch holds batch_size / micro_batches sequences");
  const ParallelConfig& parallel = config.parallel;
  check_pipeline_fields(config, show);
  WEFT_CHECK(train.steps_in_flight != 2 || parallel.pp == 1, show("train.steps_in_flight"), " is not offered on a "
             "pipeline (", show("parallel.pp"), "), which completes its sends at each step's end; set "
             "train.steps_in_flight to 0 or 1");
  WEFT_CHECK(!parallel.sp || parallel.tp > 1, show("parallel.sp"), " splits the sequence over the tensor-parallel "
             "group, and ", show("parallel.tp"), " has none; raise parallel.tp or set parallel.sp: false");
  WEFT_CHECK(parallel.tp_plan.empty() || config.comm.mode == "auto", "parallel.tp_plan (",
             parallel.tp_plan.size(), " entries) is the auto comm mode's plan; set comm.mode: auto (now ", show("comm.mode"),
             "), or remove it (the manual mode's tensor-parallel layers are written by hand)");
  WEFT_CHECK((train.batch_size / train.micro_batches) % parallel.dp == 0, show("train.batch_size"), " / ",
             show("train.micro_batches"), " = ", train.batch_size / train.micro_batches,
             " sequences per micro-batch do not split evenly over ", show("parallel.dp"),
             " ranks; make batch_size a multiple of micro_batches * dp");
  WEFT_CHECK(config.checkpoint.resume != "latest" || !config.checkpoint.dir.empty(),
             show("checkpoint.resume"), " needs checkpoint.dir, the folder to look in; set "
             "checkpoint.dir or give resume a checkpoint path");
  WEFT_CHECK(config.checkpoint.every_minutes == 0 || !config.checkpoint.dir.empty(),
             show("checkpoint.every_minutes"), " needs checkpoint.dir, the folder to save into; set "
             "checkpoint.dir or checkpoint.every_minutes: 0");
  if (config.data.tokenizer == "gpt2") {
    WEFT_CHECK(model.vocab >= Gpt2Tokenizer::kVocabSize, show("data.tokenizer"), " gives ids up to ",
               Gpt2Tokenizer::kVocabSize - 1, ", beyond ", show("model.vocab"), "; set model.vocab: ",
               Gpt2Tokenizer::kVocabSize, " (or more), or data.tokenizer: ids");
    WEFT_CHECK(config.data.format == "tokens", show("data.tokenizer"), " is for GPT-2 token shards, but ",
               show("data.format"), " trains on bytes; use data.tokenizer: bytes (or auto)");
  }
}

void ConfigBuilder::apply_model_type_settings() {
  if (config_.model.type != "llama") return;
  config_.model.norm = "rms_norm";
  config_.model.mlp = "swiglu_mlp";
  config_.model.positions = "rope";
  config_.model.bias = false;
  config_.model.tie_embeddings = false;
}

void ConfigBuilder::apply_pretrained_config() {
  apply_hugging_face_config(
      config_,
      [this](const std::string& key) {
        const auto it = origin_.find(key);
        return it == origin_.end() ? std::string() : it->second;
      },
      [this](const std::string& key, const std::string& origin) { origin_[key] = origin; });
}

void ConfigBuilder::check_cross_fields() const {
  check_related_fields(config_, [this](const std::string& key) -> std::string {
    const auto it = origin_.find(key);
    return it == origin_.end() ? "default" : it->second;
  });
}

// Strings YAML would read back as something else than this exact text are written quoted.
bool needs_quotes(const std::string& text) {
  static const char* const null_words[] = {"", "~", "null", "Null", "NULL"};
  return std::find(std::begin(null_words), std::end(null_words), text) != std::end(null_words) ||
         text.front() == ' ' || text.back() == ' ';
}

void emit_text(YAML::Emitter& out, const std::string& text) {
  if (needs_quotes(text)) {
    out << YAML::DoubleQuoted << text;
  } else {
    out << text;
  }
}

}  // namespace

RunConfig load_config(const std::vector<std::string>& yaml_files,
                      const std::vector<std::string>& set_overrides) {
  ConfigBuilder builder;
  for (const std::string& path : yaml_files) builder.apply_file(path);
  for (const std::string& assignment : set_overrides) builder.apply_override(assignment);
  builder.apply_pretrained_config();
  builder.check_cross_fields();
  builder.apply_model_type_settings();
  return builder.take();
}

void validate_config(const RunConfig& config) {
  for (const ConfigOption& option : config_options()) {
    if (option.type == OptionType::string_map) continue;
    RunConfig scratch = config;
    const std::string text = option.format(config);
    const std::string problem = option.assign(scratch, text);
    if (!problem.empty()) WEFT_FAIL(option.key, ": ", problem);
  }
  check_related_fields(config, [](const std::string&) { return std::string(); });
}

std::string dump_config(const RunConfig& config) {
  RunConfig copy = config;  // entries() hands out a mutable map; read it from a copy
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string_view open_section;
  for (const ConfigOption& option : config_options()) {
    if (option.section() != open_section) {
      if (!open_section.empty()) out << YAML::EndMap;
      open_section = option.section();
      out << YAML::Key << std::string(open_section) << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << std::string(option.name()) << YAML::Value;
    if (option.type == OptionType::integer_list) {
      out << YAML::Flow << YAML::BeginSeq;
      for (const std::string& item : option.format_items(config)) out << item;
      out << YAML::EndSeq;
    } else if (option.type == OptionType::string_map) {
      const std::map<std::string, std::string>& entries = option.entries(copy);
      if (entries.empty()) out << YAML::Flow;
      out << YAML::BeginMap;
      for (const auto& [name, value] : entries) {
        out << YAML::Key;
        emit_text(out, name);
        out << YAML::Value;
        emit_text(out, value);
      }
      out << YAML::EndMap;
    } else {
      emit_text(out, option.format(config));
    }
  }
  if (!open_section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  WEFT_CHECK(out.good(), "dump_config: YAML emitter error: ", out.GetLastError());
  return str("# weft run config: every key, merged from the defaults, files and --set\n", out.c_str(),
             "\n");
}

std::optional<RunConfig> config_from_command_line(const CommandLine& command_line, const std::string& extra_usage) {
  if (command_line.help) {
    std::printf("%s%s\n%s", command_line_usage().c_str(), extra_usage.c_str(), config_help().c_str());
    return std::nullopt;
  }
  RunConfig config = load_config(command_line.files, command_line.overrides);
  if (command_line.dump_config) {
    std::printf("%s", dump_config(config).c_str());
    return std::nullopt;
  }
  return config;
}

}  // namespace weft
