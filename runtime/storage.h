// A block of memory that one or more tensors view.
//
// Storage owns its bytes and frees them through the allocator that made them when the last tensor
// (view) sharing it goes away. It knows nothing of dtype or shape.
#pragma once

#include <cstddef>
#include <memory>

#include "runtime/allocator.h"
#include "runtime/device.h"

namespace weft {

class Storage {
 public:
  // Allocates `bytes` bytes on `device`.
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
};

}  // namespace weft
