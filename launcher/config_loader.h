// Loading a RunConfig from layered YAML files and --set overrides, and printing it back.
//
// load_config starts from the RunConfig defaults, applies each YAML file in order (a later file
// overrides an earlier one key by key; model.options entries merge one by one), then each --set
// "section.key=value" in order, then checks the fields that constrain each other. Every key goes
// through the option table (launcher/config_options.h), so the files, --set, --help and
// --dump-config accept and print exactly the same keys.
//
// A YAML file is a map of sections, each a map of keys:
//   train:
//     lr: 0.001
//     steps: 500
// A section may be empty; model.options is a map of NAME: VALUE for custom layers.
//
// Errors are weft::Error with a message that says where, what and what to do, for example:
//   run.yaml:7: unknown key 'train.lrr'; did you mean 'train.lr'?
//   train.steps: expected an integer, got 'ten' (run.yaml:5)
//   train.schedule: must be one of cosine|linear|constant, got 'cosin' (--set train.schedule=cosin)
//   model.dim = 65 (run.yaml:2) is not a multiple of model.heads = 4 (default): ...
// File lines are 1-based; the file is named as it was given.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/command_line.h"
#include "launcher/run_config.h"

namespace weft {

// The merged config of `yaml_files` (applied in order) and `set_overrides` ("section.key=value",
// applied after the files, in order). Throws weft::Error on the first problem found.
RunConfig load_config(const std::vector<std::string>& yaml_files,
                      const std::vector<std::string>& set_overrides);

// The checks load_config makes, for a config built in code: each value within its option's limits,
// then the fields that constrain each other (dim % heads, batch_size % micro_batches, one process
// only, ...). Throws weft::Error naming the keys and values.
void validate_config(const RunConfig& config);

// The config as YAML with every key of every section, sections in config_sections() order and keys
// in table order; load_config reads it back to an identical config. What --dump-config prints.
std::string dump_config(const RunConfig& config);

// What a training program does with its parsed command line: the merged config of its files and
// overrides, or, for --help (usage, `extra_usage`, then every option) and --dump-config (the merged
// config as YAML), that text printed to stdout and no config (the program then exits 0). Throws
// weft::Error as load_config does.
std::optional<RunConfig> config_from_command_line(const CommandLine& command_line,
                                                  const std::string& extra_usage = "");

}  // namespace weft
