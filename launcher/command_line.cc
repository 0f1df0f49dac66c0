// parse_command_line (see command_line.h): a hand-written loop, because weft-train takes any
// number of positional files between its flags, which flag libraries handle poorly.
#include "launcher/command_line.h"

#include "runtime/error.h"

namespace weft {

std::string command_line_usage() {
  return "usage: weft-train CONFIG.yaml [MORE.yaml...] [--set section.key=value]... [--dump-config] [--help]\n"
         "  CONFIG.yaml     run config; later files override earlier ones key by key\n"
         "  --set K=V       override one key after the files (also --set=K=V), e.g. --set train.lr=0.001\n"
         "  --dump-config   print the merged config as YAML and exit\n"
         "  --help, -h      print this and every config key and exit\n";
}

CommandLine parse_command_line(int argc, const char* const* argv) {
  CommandLine command_line;
  bool only_files = false;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (only_files || argument.empty() || argument[0] != '-') {
      command_line.files.push_back(argument);
    } else if (argument == "--") {
      only_files = true;
    } else if (argument == "--help" || argument == "-h") {
      command_line.help = true;
    } else if (argument == "--dump-config") {
      command_line.dump_config = true;
    } else if (argument == "--set") {
      WEFT_CHECK(i + 1 < argc, "--set needs a key=value after it, for example --set train.lr=0.001\n",
                 command_line_usage());
      command_line.overrides.push_back(argv[++i]);
    } else if (argument.rfind("--set=", 0) == 0) {
      command_line.overrides.push_back(argument.substr(6));
    } else {
      WEFT_FAIL("unknown flag '", argument, "'\n", command_line_usage());
    }
  }
  WEFT_CHECK(!command_line.files.empty() || command_line.help || command_line.dump_config,
             "no config file given; pass at least one CONFIG.yaml (configs/tiny-cpu.yaml is a "
             "small one to start from)\n", command_line_usage());
  return command_line;
}

}  // namespace weft
