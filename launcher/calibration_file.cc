// read_calibration_file and write_calibration_file (calibration_file.h).
#include "launcher/calibration_file.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "parallel/cost/calibration.h"
#include "runtime/error.h"

namespace weft {
namespace {

constexpr const char* kFormat = "weft-calibration";

// `origin`: what the messages name ("calibration file PATH", a checkpoint's state).
double positive(const nlohmann::json& object, const char* key, const std::string& origin, bool allow_zero = false) {
  WEFT_CHECK(object.contains(key) && object.at(key).is_number(), origin, ": '", key,
             "' is missing or not a number");
  const double value = object.at(key).get<double>();
  WEFT_CHECK(std::isfinite(value) && (allow_zero ? value >= 0 : value > 0), origin, ": '", key,
             "' = ", value, " must be ", allow_zero ? "zero or more" : "positive");
  return value;
}

}  // namespace

CostModel read_calibration_file(const std::string& path, CostModel model) {
  std::ifstream in(path);
  WEFT_CHECK(in.good(), "calibration file ", path, " cannot be read; measure one with weft-train --set "
             "comm.calibrate=on --set comm.calibration_file=", path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    WEFT_FAIL("calibration file ", path, " is not JSON (", error.what(), "); measure a new one with weft-train --set "
              "comm.calibrate=on --set comm.calibration_file=", path);
  }
  return calibration_from_json(json, std::move(model), "calibration file " + path, "file " + path);
}

CostModel calibration_from_json(const nlohmann::json& json, CostModel model, const std::string& origin,
                                const std::string& default_source) {
  WEFT_CHECK(json.is_object() && json.value("format", "") == kFormat, origin,
             " is not a weft calibration (its \"format\" is not \"", kFormat, "\")");
  try {
    model.device = json.value("device", model.device);
    model.dtype = json.value("dtype", model.dtype);
    model.source = json.value("source", default_source);
    model.ranks_per_host = json.value("ranks_per_host", model.ranks_per_host);
    model.compute_slots_per_host = json.value("compute_slots_per_host", 0.0);
    bool host_route_listed = false;
    for (const nlohmann::json& entry : json.value("collectives", nlohmann::json::array())) {
      const CollectiveKind kind = parse_collective_kind(entry.at("kind").get<std::string>());
      host_route_listed = host_route_listed || kind == CollectiveKind::kHostSendRecv;
      const LinkClass link = parse_link_class(entry.at("link").get<std::string>());
      CollectiveFit& fit = model.fits[static_cast<size_t>(kind)][static_cast<size_t>(link)];
      fit.latency_ms = positive(entry, "latency_ms", origin, /*allow_zero=*/true);
      fit.bytes_per_ms = positive(entry, "bytes_per_ms", origin);
      fit.measured_ranks = entry.value("measured_ranks", 0);
      model.measured[static_cast<size_t>(kind)][static_cast<size_t>(link)] = entry.value("measured", true);
    }
    // Files from before the host route's figures: on the CPU its messages are MPI's, as send_recv's.
    if (!host_route_listed && model.device == "cpu") {
      const auto send_recv = static_cast<size_t>(CollectiveKind::kSendRecv);
      const auto host_send_recv = static_cast<size_t>(CollectiveKind::kHostSendRecv);
      model.fits[host_send_recv] = model.fits[send_recv];
      model.measured[host_send_recv] = model.measured[send_recv];
    }
    // "device_to_host" (files of 2026-12-05 and before: the host route's sender's copy, which no
    // longer holds its compute; cost_model.h) is left unread.
    const nlohmann::json& compute = json.at("compute");
    model.compute.matmul_flops_per_ms = positive(compute, "matmul_flops_per_ms", origin);
    model.compute.attention_flops_per_ms = positive(compute, "attention_flops_per_ms", origin);
    model.compute.memory_bytes_per_ms = positive(compute, "memory_bytes_per_ms", origin);
    model.compute.op_overhead_ms = compute.contains("op_overhead_ms")
                                       ? positive(compute, "op_overhead_ms", origin, /*allow_zero=*/true)
                                       : 0.0;
    model.compute.scale = compute.contains("scale") ? positive(compute, "scale", origin) : 1.0;
    // Files from before the loaded wait have none: no wait, as on a host that was not oversubscribed.
    model.loaded_waits.clear();
    for (const nlohmann::json& entry : json.value("loaded_waits", nlohmann::json::array())) {
      LoadedWait wait;
      wait.ranks = entry.at("ranks").get<int>();
      wait.wait_ms = positive(entry, "wait_ms", origin, /*allow_zero=*/true);
      WEFT_CHECK(wait.ranks >= 2 && (model.loaded_waits.empty() || wait.ranks > model.loaded_waits.back().ranks),
                 origin, ": 'loaded_waits' must list group sizes of 2 ranks or more, ascending "
                 "(found ", wait.ranks, ")");
      model.loaded_waits.push_back(wait);
    }
  } catch (const nlohmann::json::exception& error) {
    WEFT_FAIL(origin, ": ", error.what());
  }
  return model;
}

nlohmann::json calibration_json(const CostModel& model) {
  nlohmann::json json = {{"format", kFormat}, {"version", 1}, {"device", model.device}, {"dtype", model.dtype},
                         {"source", model.source}, {"ranks_per_host", model.ranks_per_host},
                         {"compute_slots_per_host", model.compute_slots_per_host}};
  nlohmann::json collectives = nlohmann::json::array();
  for (CollectiveKind kind : kAllCollectiveKinds) {
    for (LinkClass link : {LinkClass::kSameHost, LinkClass::kAcrossHosts}) {
      const CollectiveFit& fit = model.fit(kind, link);
      collectives.push_back({{"kind", collective_kind_name(kind)}, {"link", link_class_name(link)},
                             {"latency_ms", fit.latency_ms}, {"bytes_per_ms", fit.bytes_per_ms},
                             {"measured_ranks", fit.measured_ranks},
                             {"measured", model.measured[static_cast<size_t>(kind)][static_cast<size_t>(link)]}});
    }
  }
  json["collectives"] = collectives;
  json["compute"] = {{"matmul_flops_per_ms", model.compute.matmul_flops_per_ms},
                     {"attention_flops_per_ms", model.compute.attention_flops_per_ms},
                     {"memory_bytes_per_ms", model.compute.memory_bytes_per_ms},
                     {"op_overhead_ms", model.compute.op_overhead_ms},
                     {"scale", model.compute.scale}};
  nlohmann::json loaded_waits = nlohmann::json::array();
  for (const LoadedWait& wait : model.loaded_waits) loaded_waits.push_back({{"ranks", wait.ranks}, {"wait_ms", wait.wait_ms}});
  json["loaded_waits"] = loaded_waits;
  return json;
}

void write_calibration_file(const std::string& path, const CostModel& model) {
  const nlohmann::json json = calibration_json(model);
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    out << json.dump(2) << "\n";
    WEFT_CHECK(out.good(), "cannot write the calibration file ", temporary);
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  WEFT_CHECK(!error, "cannot write the calibration file ", path, ": ", error.message());
}

}  // namespace weft
