// Per-parameter updates grouped by device, so that an optimizer step makes one Backend call per
// device (Backend::adamw_update, sgd_update): on CUDA, one launch for all of a device's parameters.
//
// Groups come in the order their device is first seen; within a group the updates keep the order
// they were given in (the order of the optimizer's parameter groups).
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "runtime/device.h"

namespace weft {

template <class Update>
struct DeviceUpdates {
  Device device;
  std::vector<Update> updates;  // every one with update.parameter on `device`
};

// `Update` is a runtime/optimizer_update.h struct (anything with a `parameter` tensor).
template <class Update>
std::vector<DeviceUpdates<Update>> updates_by_device(std::vector<Update> updates) {
  std::vector<DeviceUpdates<Update>> groups;
  for (Update& update : updates) {
    const Device device = update.parameter.device();
    auto found = std::find_if(groups.begin(), groups.end(),
                              [&](const DeviceUpdates<Update>& group) { return group.device == device; });
    if (found == groups.end()) found = groups.insert(groups.end(), DeviceUpdates<Update>{device, {}});
    found->updates.push_back(std::move(update));
  }
  return groups;
}

}  // namespace weft
