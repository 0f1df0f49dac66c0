// The table of run options: every key of every RunConfig section, declared once.
//
// Each ConfigOption names its full key ("train.lr"), its type, one line of help and its
// validation (a range, a list of allowed values, non-empty), and knows how to write a value into
// a RunConfig and read it back as text. Everything that handles keys goes through this table:
// the YAML loader and --set (launcher/config_loader.h), --dump-config and --help. So a new option
// is one new entry in config_options.cc (plus its field in launcher/run_config.h), and nothing
// else changes.
//
// Invariants:
// - Defaults are not written in the table: they are the RunConfig member initializers, read back
//   through `format` (so the help text and the struct cannot disagree).
// - `format` prints a canonical text that `assign` parses back to the identical value (floats in
//   their shortest round-trip form), which is what makes dump_config -> load_config exact.
// - `assign` either stores the value and returns "", or leaves the config untouched and returns
//   what is wrong ("expected an integer, got 'ten'"); the caller adds the key and where the value
//   came from.
// - Keys are "section.name", sections in config_sections() order; within a section the table
//   order is the order of --help and --dump-config.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/run_config.h"

namespace weft {

enum class OptionType {
  integer,     // whole number (int64_t or uint64_t field)
  floating,    // double
  string,
  boolean,     // true|false (also yes|no, on|off)
  string_map,  // free name -> text map (model.options: keys of custom layers)
};

// "int", "float", "string", "bool", "map": the names --help shows.
std::string_view option_type_name(OptionType type);

// What values an option accepts beyond its type. Empty members accept anything.
struct OptionLimits {
  std::optional<double> minimum;
  bool minimum_exclusive = false;     // true: value > minimum; false: value >= minimum
  std::optional<double> maximum;
  bool maximum_exclusive = false;
  // Allowed canonical texts; an entry ending in ":N" (as in "cuda:N") accepts its prefix followed
  // by a non-negative integer.
  std::vector<std::string> allowed;
  bool non_empty = false;             // strings: "" is not a valid value
};

struct ConfigOption {
  std::string key;      // "section.name"
  OptionType type;
  std::string help;     // one line, no trailing period
  OptionLimits limits;

  // Scalar options (every type but string_map): parse `text`, check the limits, store. Returns ""
  // on success, else the problem, and then the config is unchanged.
  std::function<std::string(RunConfig& config, const std::string& text)> assign;
  // Scalar options: the canonical text of the current value.
  std::function<std::string(const RunConfig& config)> format;
  // string_map options: the map itself (entries layer one by one; assign/format are empty).
  std::function<std::map<std::string, std::string>&(RunConfig& config)> entries;

  std::string_view section() const;  // "train" for "train.lr"
  std::string_view name() const;     // "lr" for "train.lr"
  // The limits in words, for help and errors: "> 0", "in [0, 1)", "one of cosine|linear|constant";
  // "" when the option has none.
  std::string describe_limits() const;
};

// The sections in their fixed order: model, train, data, parallel, comm, checkpoint, log.
const std::vector<std::string>& config_sections();

// Every option, grouped by section in config_sections() order.
const std::vector<ConfigOption>& config_options();

// The option with this full key, or nullptr.
const ConfigOption* find_config_option(std::string_view key);

// Every option, one line each, grouped by section, for `weft-train --help`:
//   "  train.lr  (float, default 0.003; > 0)  peak learning rate"
std::string config_help();

}  // namespace weft
