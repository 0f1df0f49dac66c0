// Calibration files: a cost model (parallel/cost/cost_model.h) as JSON, so that figures measured
// on one machine plan a run on another (weft-plan --calibration, comm.calibration_file), and so that
// a resumed run chooses as the run it continues did (weft-train keeps the same JSON in each
// checkpoint's state.json, "cost_model").
//
//   {"format": "weft-calibration", "version": 1, "device": "cuda", "dtype": "bf16",
//    "source": "...", "ranks_per_host": 8,
//    "collectives": [{"kind": "all_reduce", "link": "same_host", "latency_ms": 0.02,
//                     "bytes_per_ms": 3.39e8, "measured_ranks": 2, "measured": true}, ...],
//    "compute": {"matmul_flops_per_ms": ..., "attention_flops_per_ms": ..., "memory_bytes_per_ms": ...},
//    "loaded_waits": [{"ranks": 2, "wait_ms": 0.4}, {"ranks": 4, "wait_ms": 0.6}]}
//
// A collective kind and link the file does not list keeps the default (unmeasured) figure, except
// host_send_recv in a CPU file, which takes send_recv's (older files; on the CPU both are MPI's
// messages); older GPU files' "device_to_host" is not read (cost_model.h says why); a file without
// "loaded_waits" (older ones, hosts that were not oversubscribed) has no loaded wait. Writes
// are atomic (a temporary file renamed over the target): a crash leaves the old file or the new.
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "parallel/cost/cost_model.h"

namespace weft {

// Throws weft::Error naming the file and the problem (missing, not JSON, wrong format, a figure
// that is not a positive number) and how to make a new one.
CostModel read_calibration_file(const std::string& path, CostModel defaults);
void write_calibration_file(const std::string& path, const CostModel& model);

// The file's JSON object, and back: calibration_from_json(calibration_json(m), ...) gives m's
// figures bit for bit (doubles are written with enough digits to round-trip). `origin` names the
// object in messages ("calibration file PATH"); `default_source` is the model's source when the
// object has none.
nlohmann::json calibration_json(const CostModel& model);
CostModel calibration_from_json(const nlohmann::json& json, CostModel defaults, const std::string& origin,
                                const std::string& default_source);

}  // namespace weft
