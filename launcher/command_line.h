// The command line of weft-train:
//   weft-train CONFIG.yaml [MORE.yaml...] [--set key=value]... [--dump-config] [--help]
//
// parse_command_line only sorts argv into files and flags; what the files and overrides mean is
// load_config's business (launcher/config_loader.h). Flags and files may come in any order; files
// keep their order (later ones override earlier ones), and so do the --set overrides. "--set" takes
// the next argument or is written "--set=key=value"; after "--" every argument is a file.
#pragma once

#include <string>
#include <vector>

namespace weft {

struct CommandLine {
  std::vector<std::string> files;      // YAML config files, in order
  std::vector<std::string> overrides;  // "section.key=value", in order
  bool dump_config = false;            // print the merged config and exit
  bool help = false;                   // print usage and every option and exit
};

// Sorts argv (argv[0] is the program) into a CommandLine. Throws weft::Error for an unknown flag
// or a --set without a value, naming it and showing the usage, and when no config file is given
// (allowed only with --help or --dump-config, which then show the defaults).
CommandLine parse_command_line(int argc, const char* const* argv);

// The usage lines, ending in a newline; --help prints them before config_help().
std::string command_line_usage();

}  // namespace weft
