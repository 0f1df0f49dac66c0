// weft-plan: which dp x tp x pp, ZeRO stage, micro-batch count, schedule and sp to run a config
// on N GPUs (or CPU ranks), from the calibrated cost model, before spending hours finding out.
//
//   weft-plan CONFIG.yaml [MORE.yaml...] [--set section.key=value]... --gpus N [--memory-gb M]
//             [--calibration FILE] [--ranks-per-host K] [--top K] [--json FILE]
//
// The figures come from --calibration FILE (written by weft-train or weft-plan with
// comm.calibration_file, possibly on another machine), or from comm.calibration_file where it
// exists (unless comm.calibrate: on), or are measured now: under mpirun over the world's links and
// compute, or in one process the compute only (the links are then the defaults of
// parallel/cost/calibration.h, said so in the output); what was measured is written to
// comm.calibration_file when one is set. --gpus may exceed the machine: a 2-GPU
// calibration plans a 1024-GPU run (the ring model scales each fit). Every layout that
// launcher/layout_search.h enumerates is simulated (parallel/cost/step_simulator.h); those over
// --memory-gb per rank are dropped; the best --top are printed, fastest first, and --json writes
// them all, each with the weft-train settings that run it; the output ends with the command that
// runs the fastest. Bad input exits 2 with one line.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "launcher/calibration_file.h"
#include "launcher/command_line.h"
#include "launcher/compute_anchor.h"
#include "launcher/config_loader.h"
#include "launcher/cost_model_setup.h"
#include "launcher/cpu_threads.h"
#include "launcher/layout_search.h"
#include "parallel/comm/fault_handler.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/mpi_poll_probe.h"
#include "parallel/cost/calibration.h"
#include "parallel/cost/host_topology.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

namespace {

const char* const kUsage =
    "usage: weft-plan CONFIG.yaml [MORE.yaml...] [--set section.key=value]... --gpus N [--memory-gb M]\n"
    "                 [--calibration FILE] [--ranks-per-host K] [--top K] [--json FILE]\n"
    "  ranks the ways to run the config on N GPUs (or CPU ranks) by predicted step time\n"
    "  --gpus N            ranks to plan for (may exceed this machine)\n"
    "  --memory-gb M       memory per rank; layouts predicted to need more are dropped (default: no limit)\n"
    "  --calibration FILE  cost-model figures (weft-train --set comm.calibrate=on --set comm.calibration_file=FILE);\n"
    "                      default: measured now (under mpirun: links and compute; alone: compute only)\n"
    "  --ranks-per-host K  ranks on one host (NVLink/shared memory); default: 8 on GPUs, N on the CPU\n"
    "  --top K             rows to print (default 10)\n"
    "  --json FILE         write every layout and its prediction\n";

struct PlanArguments {
  std::vector<std::string> train_arguments;
  std::string gpus, memory_gb, calibration, ranks_per_host, top = "10", json;
  bool help = false;
};

PlanArguments split_arguments(int argc, char** argv) {
  PlanArguments arguments;
  arguments.train_arguments.push_back(argv[0]);
  const std::vector<std::pair<std::string, std::string*>> flags = {
      {"--gpus", &arguments.gpus}, {"--memory-gb", &arguments.memory_gb}, {"--calibration", &arguments.calibration},
      {"--ranks-per-host", &arguments.ranks_per_host}, {"--top", &arguments.top}, {"--json", &arguments.json}};
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    bool taken = false;
    for (const auto& [flag, value] : flags) {
      if (argument == flag) {
        WEFT_CHECK(i + 1 < argc, flag, " needs a value after it");
        *value = argv[++i];
        taken = true;
      } else if (argument.rfind(flag + "=", 0) == 0) {
        *value = argument.substr(flag.size() + 1);
        taken = true;
      }
    }
    if (taken) continue;
    if (argument == "--help" || argument == "-h") {
      arguments.help = true;
    } else {
      arguments.train_arguments.push_back(argument);
    }
  }
  return arguments;
}

int whole_number(const std::string& text, const char* flag, int least) {
  int value = 0;
  WEFT_CHECK(absl::SimpleAtoi(text, &value) && value >= least, flag, ": expected a whole number of at least ", least,
             ", got '", text, "'");
  return value;
}

nlohmann::json candidate_json(const weft::LayoutCandidate& candidate) {
  const weft::ParallelLayout& l = candidate.layout;
  const weft::StepPrediction& p = candidate.prediction;
  return {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"zero", l.zero}, {"micro_batches", l.micro_batches},
          {"schedule", l.pp > 1 ? l.schedule : ""}, {"pp_virtual", l.virtual_stages},
          {"pp_transport", l.pp > 1 ? l.pp_transport : ""}, {"sp", l.sequence_parallel},
          {"comm_mode", l.comm_mode}, {"fits", candidate.fits}, {"step_ms", p.step_ms}, {"tokens_per_s", p.tokens_per_s},
          {"compute_ms", p.compute_ms}, {"comm_ms", p.comm_ms}, {"exposed_comm_ms", p.exposed_comm_ms},
          {"tp_comm_ms", p.tp_comm_ms}, {"dp_comm_ms", p.dp_comm_ms}, {"pp_comm_ms", p.pp_comm_ms},
          {"optimizer_ms", p.optimizer_ms}, {"bubble", p.bubble}, {"memory_mb", p.memory_bytes / 1048576.0},
          {"activation_mb", p.activation_bytes / 1048576.0}, {"bucket_bytes", p.bucket_bytes},
          {"dp_hierarchical", p.dp_hierarchical}};
}

// An argument as the shell reads it back: quoted where it holds anything but plain characters.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789_-+=.,/:@%") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The command that runs `layout`: weft-train beside this weft-plan (or on the PATH), under mpirun
// for more than one rank, with the config and --set arguments weft-plan was given, then the layout's.
std::string run_command(const PlanArguments& arguments, int ranks, const weft::ParallelLayout& layout) {
  const std::filesystem::path plan_program = arguments.train_arguments.front();
  std::string train_program = "weft-train";
  if (plan_program.has_parent_path() && std::filesystem::exists(plan_program.parent_path() / "weft-train")) {
    train_program = (plan_program.parent_path() / "weft-train").string();
  }
  std::string command = ranks > 1 ? absl::StrFormat("mpirun -np %d %s", ranks, shell_word(train_program))
                                  : shell_word(train_program);
  const std::vector<std::string> settings = weft::layout_settings(layout);
  // A key the layout sets is left out of the given --set arguments, so that each key appears once.
  const auto set_by_layout = [&](const std::string& setting) {
    const std::string key = setting.substr(0, setting.find('='));
    return std::any_of(settings.begin(), settings.end(),
                       [&](const std::string& own) { return own.substr(0, own.find('=')) == key; });
  };
  const std::vector<std::string>& given = arguments.train_arguments;
  for (size_t i = 1; i < given.size(); ++i) {
    if (given[i] == "--set" && i + 1 < given.size() && set_by_layout(given[i + 1])) {
      ++i;
      continue;
    }
    if (given[i].rfind("--set=", 0) == 0 && set_by_layout(given[i].substr(6))) continue;
    command += " " + shell_word(given[i]);
  }
  for (const std::string& setting : settings) command += " --set " + setting;
  return command;
}

int plan(int argc, char** argv) {
  const int world_rank = weft::mpi_world_rank();
  const bool leader = world_rank == 0;
  PlanArguments arguments;
  weft::RunConfig config;
  int gpus = 0, ranks_per_host = 0, top = 10;
  double memory_gb = 0.0;
  try {
    arguments = split_arguments(argc, argv);
    if (arguments.help) {
      if (leader) std::printf("%s", kUsage);
      return 0;
    }
    std::vector<const char*> train_argv;
    for (const std::string& argument : arguments.train_arguments) train_argv.push_back(argument.c_str());
    const weft::CommandLine command_line = weft::parse_command_line(static_cast<int>(train_argv.size()), train_argv.data());
    std::optional<weft::RunConfig> loaded = weft::config_from_command_line(command_line);
    if (!loaded) return 0;
    config = std::move(*loaded);
    WEFT_CHECK(!arguments.gpus.empty(), "--gpus N is required: the number of GPUs (or CPU ranks) to plan for");
    gpus = whole_number(arguments.gpus, "--gpus", 1);
    top = whole_number(arguments.top, "--top", 1);
    ranks_per_host = arguments.ranks_per_host.empty() ? 0 : whole_number(arguments.ranks_per_host, "--ranks-per-host", 1);
    if (!arguments.memory_gb.empty()) {
      WEFT_CHECK(absl::SimpleAtod(arguments.memory_gb, &memory_gb) && memory_gb > 0, "--memory-gb: expected a "
                 "positive number of GB, got '", arguments.memory_gb, "'");
    }
  } catch (const weft::Error& error) {
    if (leader) std::fprintf(stderr, "weft-plan: error: %s\n%s", error.what(), kUsage);
    return 2;
  }

  const weft::Device device = weft::Device::parse(config.train.device.rfind("cuda", 0) == 0 ? "cuda:0" : "cpu");
  std::string waits;  // how CPU ranks wait for MPI (parallel/comm/mpi_poll_probe.h)
  if (device.is_cpu()) {
    // Measured as weft-train will run.
    weft::share_cpu_cores_between_ranks();
    const weft::MpiPollChoice choice = weft::choose_mpi_poll_pause();
    if (choice.measured) waits = choice.describe();
  }
  weft::CostModel model;
  std::string anchor;  // what the compute anchor measured (launcher/compute_anchor.h)
  std::vector<int> host_ids;
  // comm.calibration_file works as in weft-train: read where it exists (unless comm.calibrate: on),
  // written after a measurement, so that figures measured here can plan elsewhere.
  const std::string& kept = config.comm.calibration_file;
  const bool read_kept = !kept.empty() && config.comm.calibrate != "on" && std::filesystem::exists(kept);
  std::string written;
  if (!arguments.calibration.empty() || read_kept) {
    const std::string& file = !arguments.calibration.empty() ? arguments.calibration : kept;
    model = weft::read_calibration_file(file, weft::default_cost_model(device));
    host_ids = weft::world_host_ids();
  } else {
    // Measured now at the config's micro-batch on unsplit shapes (dp 1, tp 1: every layout's
    // rates come from this one shape).
    weft::RunConfig unsplit = config;
    unsplit.parallel.dp = 1;
    host_ids = weft::world_host_ids();
    const weft::DType dtype = weft::parse_dtype(config.train.dtype);
    model = weft::calibrate(device, dtype, weft::calibration_shapes(unsplit, 1), host_ids).model;
    anchor = weft::anchor_compute(unsplit, device, dtype, host_ids, model);
    if (!kept.empty() && leader) {
      weft::write_calibration_file(kept, model);
      written = kept;
    }
  }
  if (!leader) return 0;
  if (ranks_per_host == 0) ranks_per_host = device.is_cpu() ? gpus : 8;

  weft::LayoutSearchOptions options;
  options.ranks = gpus;
  options.ranks_per_host = ranks_per_host;
  options.memory_limit_bytes = memory_gb * 1024.0 * 1024.0 * 1024.0;
  options.comm_mode = config.comm.mode;
  options.dp_all_reduce = config.comm.dp_all_reduce;
  options.on_gpus = model.device == "cuda";
  const weft::Workload workload = weft::workload_of(config);
  const weft::LayoutSearch search = weft::search_layouts(workload, model, options);

  std::printf("weft-plan: %s model, %lld layers x %lld wide, batch %lld x %lld tokens, %s, on %d rank(s) of %s, %d per "
              "host, comm %s\n",
              config.model.type.c_str(), static_cast<long long>(config.model.layers),
              static_cast<long long>(config.model.dim), static_cast<long long>(config.train.batch_size),
              static_cast<long long>(config.model.seq_len), config.train.dtype.c_str(), gpus, model.device.c_str(),
              ranks_per_host, config.comm.mode.c_str());
  if (!arguments.calibration.empty() || read_kept) {
    std::printf("cost model: figures from %s (%s)\n", (!arguments.calibration.empty() ? arguments.calibration : kept).c_str(),
                model.source.c_str());
  } else {
    std::printf("cost model: %s\n", model.source.c_str());
  }
  for (const std::string& line : model.describe()) std::printf("  %s\n", line.c_str());
  if (!anchor.empty()) std::printf("%s\n", anchor.c_str());
  if (!waits.empty()) std::printf("%s\n", waits.c_str());
  if (!written.empty()) std::printf("cost model: written to %s (comm.calibration_file)\n", written.c_str());
  bool any_assumed = false;
  for (const auto& by_link : model.measured) {
    for (bool measured : by_link) any_assumed = any_assumed || !measured;
  }
  if (any_assumed) {
    std::printf("  (assumed figures were not measured: give --calibration FILE measured where the run will be, or run "
                "weft-plan under mpirun there)\n");
  }
  std::printf("%d layouts considered", search.considered);
  if (memory_gb > 0) std::printf(", %d need more than %.1f GB per rank", search.too_large, memory_gb);
  if (search.refused_hierarchical > 0) {
    std::printf(" (and %d left out: comm.dp_all_reduce hierarchical needs zero 0 and a dp group spanning hosts with "
                "two or more of its ranks on each)", search.refused_hierarchical);
  }
  std::printf("; predicted, fastest first:\n%s", weft::layout_table(search, top).c_str());
  if (search.considered == 0 && search.refused_hierarchical > 0) {
    std::printf("no layout takes comm.dp_all_reduce hierarchical on %d ranks of %d per host: set it to auto or flat\n",
                options.ranks, options.ranks_per_host);
  } else if (search.considered == search.too_large) {
    std::printf("no layout fits: raise --memory-gb, use more GPUs, or lower train.batch_size\n");
  }
  // On GPUs the two pipeline routes differ: say which one the shown pipeline layouts were predicted on.
  const std::vector<const weft::LayoutCandidate*> shown = weft::shown_layouts(search, top);
  const bool pipeline_shown = std::any_of(shown.begin(), shown.end(),
                                          [](const weft::LayoutCandidate* c) { return c->layout.pp > 1; });
  if (pipeline_shown && model.device == "cuda") {
    if (options.comm_mode == "auto") {
      std::printf("pipeline layouts are predicted with NCCL send/recv between stages (parallel.pp_transport direct, "
                  "set in the command below); the host route, the default, copies every activation through host "
                  "memory\n");
    } else {
      std::printf("pipeline layouts are predicted with the manual mode's route between stages: through host memory "
                  "(parallel.pp_transport host), its copies included; the auto mode can send GPU to GPU "
                  "(comm.mode auto, parallel.pp_transport direct)\n");
    }
  }
  if (!shown.empty()) {
    std::printf("to run #1: %s\n", run_command(arguments, gpus, shown.front()->layout).c_str());
    const unsigned cores = std::thread::hardware_concurrency();
    if (model.device == "cpu" && cores > 0 && static_cast<unsigned>(gpus) > cores) {
      std::printf("  (%d ranks on this machine's %u cores: Open MPI's mpirun needs --oversubscribe for that)\n", gpus,
                  cores);
    }
  }
  if (!arguments.json.empty()) {
    nlohmann::json out = {{"ranks", gpus}, {"ranks_per_host", ranks_per_host}, {"source", model.source},
                          {"layouts", nlohmann::json::array()}};
    for (const weft::LayoutCandidate& candidate : search.candidates) {
      nlohmann::json layout = candidate_json(candidate);
      layout["settings"] = weft::layout_settings(candidate.layout);
      out["layouts"].push_back(std::move(layout));
    }
    std::ofstream file(arguments.json);
    file << out.dump(1) << "\n";
    WEFT_CHECK(file.good(), "--json: cannot write '", arguments.json, "'");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  weft::MpiEnvironment mpi(&argc, &argv);
  try {
    return plan(argc, argv);
  } catch (const weft::Error& error) {
    weft::abort_all_if_distributed(std::string("weft-plan: error: ") + error.what());
    std::fprintf(stderr, "weft-plan: error: %s\n", error.what());
    return 1;
  }
}
