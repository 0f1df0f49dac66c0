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
  integer_list,  // list of whole numbers (std::vector<int64_t>): YAML [4, 4, 3, 3], --set 4,4,3,3
};

// "int", "float", "string", "bool", "map", "list": the names --help shows.
std::string_view option_type_name(OptionType type);

// What values an option accepts beyond its type. Empty members accept anything.
struct OptionLimits {
  // Numbers: the value's range; lists: each entry's range.
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

  // Every type but string_map: parse `text`, check the limits, store. Returns "" on success, else
  // the problem, and then the config is unchanged. A list's text is "[4, 4, 3, 3]", "4,4,3,3" or
  // "" / "[]" (empty); a list is replaced whole, never merged.
  std::function<std::string(RunConfig& config, const std::string& text)> assign;
  // Every type but string_map: the canonical text of the current value ("[4, 4, 3, 3]", "[]").
  std::function<std::string(const RunConfig& config)> format;
  // string_map options: the map itself (entries layer one by one; assign/format are empty).
  std::function<std::map<std::string, std::string>&(RunConfig& config)> entries;
  // integer_list options: each entry's canonical text, in order, so that --dump-config can write a
  // YAML sequence rather than a quoted string.
  std::function<std::vector<std::string>(const RunConfig& config)> format_items;

  std::string_view section() const;  // "train" for "train.lr"
  std::string_view name() const;     // "lr" for "train.lr"
  // The limits in words, for help and errors: "> 0", "in [0, 1)", "one of cosine|linear|constant",
  // "each >= 0" (a list); "" when the option has none.
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
