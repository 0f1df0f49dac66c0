// weft-compare: one run, the same config, seeds and data, in comm.mode manual and then in auto,
// side by side — where the step's time went in each, and whether both computed the same losses.
//
//   mpirun -np N weft-compare CONFIG.yaml [MORE.yaml...] [--set section.key=value]... [--steps N] [--out DIR]
//
// It runs under mpirun exactly as weft-train does and takes the same files and overrides; each
// rank trains two weft::Trainer objects, one after the other, in one process. Rank 0 prints one
// table (launcher/comm_mode_comparison.h) and writes into the out folder (by default a new
// weft-compare-YYYYMMDD-HHMMSS under the current directory, named by rank 0 and handed to every
// rank): trace-MODE.json (log.trace_file, every rank's streams), metrics-MODE.jsonl
// (log.metrics_file), timeline.svg (the last step of both modes, stacked: launcher/timeline_picture.h)
// and comparison.json (every figure, step by step, for comparing runs later).
//
// One cost model serves both runs: the manual run measures where the auto run would (comm.calibrate
// auto), or reads comm.calibration_file, and the auto run takes its figures, so the table's
// predictions for the two modes come from the same calibration.
//
// Both runs are forced to log.progress plain, no validation (data.val_every 0) and no checkpoints
// (checkpoint.dir and checkpoint.resume empty): they measure training steps only. Bad input exits 2
// with one line from rank 0, as weft-train does (every rank reaches the same verdict); a rank that
// fails during a run ends the whole job (parallel/comm/fault_handler.h).
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "generated/tensor_parallel_block_lines.h"
#include "launcher/command_line.h"
#include "launcher/comm_mode_comparison.h"
#include "launcher/config_loader.h"
#include "launcher/config_options.h"
#include "launcher/timeline_picture.h"
#include "launcher/trainer.h"
#include "parallel/comm/fault_handler.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/world_exchange.h"
#include "parallel/mesh.h"
#include "runtime/error.h"

namespace {

const char* const kUsage =
    "usage: weft-compare CONFIG.yaml [MORE.yaml...] [--set section.key=value]... [--steps N] [--out DIR]\n"
    "  runs the config in comm.mode manual, then auto, and prints both side by side\n"
    "  (under mpirun as weft-train: mpirun -np 2 weft-compare configs/tiny-cpu.yaml --set parallel.dp=2)\n"
    "  CONFIG.yaml     run config; later files override earlier ones key by key\n"
    "  --set K=V       override one key after the files (also --set=K=V)\n"
    "  --steps N       steps of each run (default: train.steps when at most 20, else 10)\n"
    "  --out DIR       folder for the traces, metrics, timeline.svg and comparison.json\n"
    "                  (default: a new weft-compare-YYYYMMDD-HHMMSS in the current directory)\n"
    "  --help, -h      print this and every config key and exit\n";

constexpr int64_t kLongestDefaultRun = 20;  // a config's own train.steps above this runs 10 steps
constexpr int64_t kDefaultSteps = 10;
const char* const kModes[] = {"manual", "auto"};

// weft-compare's own flags, taken out of argv; the rest is weft-train's command line.
struct CompareArguments {
  std::vector<std::string> train_arguments;  // argv[0] first, for parse_command_line
  std::optional<std::string> steps;          // as given
  std::string out;
  bool help = false;
};

CompareArguments split_arguments(int argc, char** argv) {
  CompareArguments arguments;
  arguments.train_arguments.push_back(argv[0]);
  auto value_of = [&](int& i, const std::string& flag) -> std::string {
    const std::string argument = argv[i];
    if (argument.rfind(flag + "=", 0) == 0) return argument.substr(flag.size() + 1);
    WEFT_CHECK(i + 1 < argc, flag, " needs a value after it (", flag == "--steps" ? "--steps 10" : "--out DIR", ")");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--") {  // files only from here on: parse_command_line takes it as it is
      for (; i < argc; ++i) arguments.train_arguments.push_back(argv[i]);
    } else if (argument == "--steps" || argument.rfind("--steps=", 0) == 0) {
      arguments.steps = value_of(i, "--steps");
    } else if (argument == "--out" || argument.rfind("--out=", 0) == 0) {
      arguments.out = value_of(i, "--out");
      WEFT_CHECK(!arguments.out.empty(), "--out needs a folder name");
    } else if (argument == "--help" || argument == "-h") {
      arguments.help = true;
    } else {
      arguments.train_arguments.push_back(argument);
    }
  }
  return arguments;
}

// The config both runs share: the files and overrides, then --steps and what weft-compare forces.
// Returns nothing after --dump-config (printed). Throws weft::Error for bad input.
std::optional<weft::RunConfig> shared_config(const CompareArguments& arguments, weft::CommandLine& command_line) {
  std::vector<const char*> argv;
  for (const std::string& argument : arguments.train_arguments) argv.push_back(argument.c_str());
  command_line = weft::parse_command_line(static_cast<int>(argv.size()), argv.data());
  std::optional<weft::RunConfig> loaded = weft::config_from_command_line(command_line);
  if (!loaded) return std::nullopt;
  weft::RunConfig config = std::move(*loaded);
  int64_t steps = config.train.steps <= kLongestDefaultRun ? config.train.steps : kDefaultSteps;
  if (arguments.steps) {
    WEFT_CHECK(absl::SimpleAtoi(*arguments.steps, &steps) && steps >= 1, "--steps: expected a whole number of "
               "steps, at least 1, got '", *arguments.steps, "'");
  }
  config.train.steps = steps;
  // A short comparison of a long run keeps its learning-rate warm-up within the steps it runs.
  if (config.train.warmup_steps > steps) {
    if (weft::mpi_world_rank() == 0) {
      std::printf("weft-compare: train.warmup_steps lowered from %lld to %lld, the steps each mode runs\n",
                  static_cast<long long>(config.train.warmup_steps), static_cast<long long>(steps));
    }
    config.train.warmup_steps = steps;
  }
  config.log.progress = "plain";
  config.data.val_every = 0;
  config.checkpoint.dir.clear();
  config.checkpoint.resume.clear();
  weft::validate_config(config);
  return config;
}

// "weft-compare-20261202-101500" in the current directory, or "-2", "-3"... after it when a run
// of the same second already has it.
std::filesystem::path default_out_folder() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &local);
  const std::string base = absl::StrCat("weft-compare-", stamp);
  std::filesystem::path folder = base;
  for (int attempt = 2; std::filesystem::exists(folder); ++attempt) folder = absl::StrCat(base, "-", attempt);
  return folder;
}

// Rank 0 names and creates the out folder and hands its name to every rank; "" on every rank when
// it could not (rank 0 says why).
std::string agree_on_out_folder(const std::string& requested) {
  std::string folder;
  if (weft::mpi_world_rank() == 0) {
    std::filesystem::path path = requested.empty() ? default_out_folder() : std::filesystem::path(requested);
    std::error_code error;
    std::filesystem::create_directories(path, error);
    if (std::filesystem::is_directory(path) && access(path.c_str(), W_OK) == 0) {
      folder = path.string();
    } else {
      std::fprintf(stderr, "weft-compare: error: --out: cannot create the folder '%s'%s; choose a writable one\n",
                   path.string().c_str(), error ? (" (" + error.message() + ")").c_str() : "");
    }
  }
  return weft::broadcast_text_from_rank_zero(folder);
}

std::string file_in(const std::string& folder, const std::string& name) {
  return (std::filesystem::path(folder) / name).string();
}

// One mode's run: the trainer, then every rank's peak memory and mean exposed communication
// gathered to rank 0.
// `cost_model`: in, the figures the earlier mode's run used (null: this run calibrates as its
// config says); out, this run's (null: it had none).
weft::ModeRun run_mode(const weft::RunConfig& shared, const std::string& mode, const std::string& folder,
                       std::shared_ptr<const weft::CostModel>& cost_model) {
  weft::RunConfig config = shared;
  config.comm.mode = mode;
  // One cost model for both modes: the manual run measures where the auto run would (comm.calibrate
  // auto measures for the auto mode only), unless a calibration file is there to read, and the
  // auto run takes the same figures. So both rows of "predicted by the cost model" come from one
  // calibration, paid once.
  const std::string& kept = config.comm.calibration_file;
  if (mode == "manual" && config.comm.calibrate == "auto" && (kept.empty() || !std::filesystem::exists(kept))) {
    config.comm.calibrate = "on";
  }
  // The manual mode's pipelines post a stage's sends and receives on one stream, which the direct
  // route's in-order rendezvous would deadlock (config_loader.cc refuses the pair in weft-train):
  // its run sends pipeline messages over the host route, and the log says so.
  if (mode == "manual" && config.parallel.pp > 1 && config.parallel.pp_transport == "direct") {
    config.parallel.pp_transport = "host";
    if (weft::mpi_world_rank() == 0) {
      std::printf("weft-compare: the manual mode's pipeline messages go over parallel.pp_transport host (direct "
                  "needs comm.mode auto); the auto mode's go direct\n");
    }
  }
  config.log.trace_file = file_in(folder, "trace-" + mode + ".json");
  config.log.metrics_file = file_in(folder, "metrics-" + mode + ".jsonl");
  weft::ModeRun run;
  run.mode = mode;
  double peak_mb = 0;
  {
    // Gone before the next mode's trainer: its process groups, threads and buffers too.
    weft::Trainer trainer(config, cost_model);
    weft::TrainResult result = trainer.run();
    run.steps = std::move(result.steps);
    run.description = std::move(result.description);
    if (result.cost_model != nullptr && result.cost_model != cost_model) {
      auto kept_model = std::make_shared<weft::CostModel>(*result.cost_model);
      kept_model->source = "the " + mode + " run's: " + kept_model->source;
      cost_model = std::move(kept_model);
    }
  }
  for (const weft::StepMetrics& step : run.steps) peak_mb = std::max(peak_mb, step.memory_mb);
  const double exposed_ms = weft::mode_figures(run).exposed_comm_ms;  // this rank's steps
  for (const std::string& text : weft::gather_text_to_rank_zero(absl::StrFormat("%.17g %.17g", peak_mb, exposed_ms))) {
    const std::vector<std::string> numbers = absl::StrSplit(text, ' ');
    double megabytes = 0, milliseconds = 0;
    WEFT_CHECK(numbers.size() == 2 && absl::SimpleAtod(numbers[0], &megabytes) &&
                   absl::SimpleAtod(numbers[1], &milliseconds),
               "weft-compare: a rank sent '", text, "' as its peak memory and exposed communication");
    run.peak_memory_mb_per_rank.push_back(megabytes);
    run.exposed_comm_ms_per_rank.push_back(milliseconds);
  }
  // On the CPU memory_mb is the process's resident memory: hand what the trainer freed back to the
  // system, so that the next mode's figure is its own rather than this one's high-water mark.
  malloc_trim(0);
  return run;
}

// timeline.svg: each mode's last step, manual above auto, on one time scale.
void write_timeline(const std::string& folder, const std::vector<weft::ModeRun>& runs) {
  std::vector<weft::TimelinePanel> panels;
  for (const weft::ModeRun& run : runs) {
    const weft::StepMetrics& last = run.steps.back();
    const weft::Trace trace = weft::read_chrome_trace(file_in(folder, "trace-" + run.mode + ".json"));
    panels.push_back({absl::StrFormat("%s: step %lld, %.1f ms, exposed communication %.1f ms (rank 0)", run.mode,
                                      static_cast<long long>(last.step), last.step_ms, last.exposed_comm_ms),
                      weft::events_of_step(trace, last.step)});
  }
  const std::string path = file_in(folder, "timeline.svg");
  std::ofstream out(path);
  out << weft::render_timeline_svg(panels);
  WEFT_CHECK(out.good(), "cannot write '", path, "'");
}

// Rank 0's report: the table, comparison.json and timeline.svg.
void report(const std::string& folder, const weft::ComparisonContext& context, const std::vector<weft::ModeRun>& runs) {
  const std::string table = weft::comparison_table(context, runs[0], runs[1]);
  nlohmann::json json = weft::comparison_json(context, runs[0], runs[1]);
  for (const weft::ModeRun& run : runs) {
    json["modes"][run.mode]["trace_file"] = "trace-" + run.mode + ".json";
    json["modes"][run.mode]["metrics_file"] = "metrics-" + run.mode + ".jsonl";
  }
  const std::string json_path = file_in(folder, "comparison.json");
  std::ofstream(json_path) << json.dump(2) << "\n";
  WEFT_CHECK(std::filesystem::file_size(json_path) > 0, "cannot write '", json_path, "'");
  write_timeline(folder, runs);
  std::printf("\n%s\nwritten to %s/: comparison.json, timeline.svg, trace-manual.json, trace-auto.json, "
              "metrics-manual.jsonl, metrics-auto.jsonl\n",
              table.c_str(), folder.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  weft::MpiEnvironment mpi(&argc, &argv);  // a world of one when not started by mpirun
  const bool leader = mpi.world_rank() == 0;
  weft::CommandLine command_line;
  weft::RunConfig config;
  std::string requested_out;
  try {
    const CompareArguments arguments = split_arguments(argc, argv);
    if (arguments.help) {
      if (leader) std::printf("%s\n%s", kUsage, weft::config_help().c_str());
      return 0;
    }
    std::optional<weft::RunConfig> loaded = shared_config(arguments, command_line);
    if (!loaded) return 0;  // --dump-config
    config = std::move(*loaded);
    requested_out = arguments.out;
  } catch (const weft::Error& error) {
    // Every rank reads the same files and reaches the same verdict, so each exits on its own. A
    // command-line error ends in weft-train's usage: weft-compare points to its own instead.
    if (leader) {
      const std::string message = error.what();
      const size_t end = message.find('\n');
      std::fprintf(stderr, "weft-compare: error: %s%s\n", message.substr(0, end).c_str(),
                   end == std::string::npos ? "" : " (weft-compare --help for usage)");
    }
    return 2;
  }
  weft::make_mesh_or_exit(static_cast<int>(config.parallel.dp), static_cast<int>(config.parallel.pp),
                          static_cast<int>(config.parallel.tp));
  const std::string folder = agree_on_out_folder(requested_out);
  if (folder.empty()) return 2;
  if (leader) std::printf("weft-compare: writing into %s/\n", folder.c_str());

  std::vector<weft::ModeRun> runs;
  std::shared_ptr<const weft::CostModel> cost_model;  // the first run's, for the second
  try {
    for (const char* mode : kModes) {
      if (leader) std::printf("\n== comm.mode %s ==\n", mode);
      std::fflush(stdout);
      runs.push_back(run_mode(config, mode, folder, cost_model));
    }
  } catch (const weft::Error& error) {
    weft::abort_all_if_distributed(std::string("weft-compare: error: ") + error.what());
    std::fprintf(stderr, "\nweft-compare: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    weft::abort_all_if_distributed(std::string("weft-compare: internal error: ") + error.what());
    std::fprintf(stderr, "\nweft-compare: internal error: %s\n", error.what());
    return 1;
  }
  if (!leader) return 0;
  try {
    weft::ComparisonContext context;
    context.config = config;
    context.world_size = mpi.world_size();
    context.config_files = command_line.files;
    context.overrides = command_line.overrides;
    context.tensor_parallel_block_lines_manual = weft::kTensorParallelBlockLinesManual;
    context.tensor_parallel_block_lines_auto = weft::kTensorParallelBlockLinesAuto;
    report(folder, context, runs);
  } catch (const std::exception& error) {
    // Only rank 0 writes the report; the others have finished their runs and exit normally.
    std::fprintf(stderr, "\nweft-compare: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
