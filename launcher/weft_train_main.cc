// weft-train: trains a model from YAML config files.
//
//   weft-train CONFIG.yaml [MORE.yaml...] [--set section.key=value]... [--dump-config] [--help]
//
// Errors in the configuration or the data are reported in one line that names the key, file and
// line where it can, and the program exits with status 2 (1 for a failure during training).
// Under mpirun (`mpirun -np N weft-train run.yaml`) every rank runs this program; a rank that fails
// ends the whole job at once (parallel/comm/fault_handler.h), naming itself, so no rank is left waiting.
// SIGTERM or SIGINT stops the run cleanly after the step in progress, with a checkpoint, and exits 0
// (launcher/stop_signal.h); a second one ends the process at once.
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

#include "launcher/command_line.h"
#include "launcher/config_loader.h"
#include "launcher/stop_signal.h"
#include "launcher/trainer.h"
#include "parallel/comm/fault_handler.h"
#include "parallel/mesh.h"
#include "parallel/comm/mpi_environment.h"
#include "runtime/error.h"

int main(int argc, char** argv) {
  weft::MpiEnvironment mpi(&argc, &argv);  // a world of one when not started by mpirun
  weft::RunConfig config;
  try {
    std::optional<weft::RunConfig> loaded = weft::config_from_command_line(weft::parse_command_line(argc, argv));
    if (!loaded) return 0;  // --help or --dump-config
    config = std::move(*loaded);
  } catch (const weft::Error& error) {
    // Every rank reads the same files and reaches the same verdict, so each exits on its own.
    if (mpi.world_rank() == 0) std::fprintf(stderr, "weft-train: error: %s\n", error.what());
    return 2;
  }
  // A world size that does not fit the mesh: every rank exits at once (status 2), rank 0 says why.
  weft::make_mesh_or_exit(static_cast<int>(config.parallel.dp), static_cast<int>(config.parallel.pp),
                          static_cast<int>(config.parallel.tp));
  // Outside the try: a failing rank aborts the job before the trainer's process groups are torn
  // down, since their teardown may wait for peers that are still running.
  std::unique_ptr<weft::Trainer> trainer;
  try {
    // After MPI_Init (which may install handlers of its own); the trainer stops at a step boundary.
    weft::install_stop_signal_handlers();
    trainer = std::make_unique<weft::Trainer>(config);
    trainer->run();
  } catch (const weft::Error& error) {
    weft::abort_all_if_distributed(std::string("weft-train: error: ") + error.what());
    std::fprintf(stderr, "\nweft-train: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    weft::abort_all_if_distributed(std::string("weft-train: internal error: ") + error.what());
    std::fprintf(stderr, "\nweft-train: internal error: %s\n", error.what());
    return 1;
  }
  return 0;
}
