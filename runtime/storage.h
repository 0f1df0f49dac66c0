// A block of memory that one or more tensors view.
//
// Storage owns its bytes and frees them through the allocator that made them when the last tensor
// (view) sharing it goes away. It knows nothing of dtype or shape.
//
// Activation recomputation (runtime/autograd/recompute.h) frees a saved activation's bytes while
// the views that a backward will read remain, and puts recomputed bytes back before that backward
// runs: release() and adopt(). Between the two, data() is null and nothing may read the views.
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
  // Allocates `bytes` bytes on `device` from `allocator` (which must serve that device), and returns
  // them to it.
  Storage(size_t bytes, Device device, Allocator& allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // Frees the bytes now; views stay, and data() is null until adopt().
  void release();
  bool released() const { return data_ == nullptr && bytes_ > 0; }
  // Takes `other`'s bytes (same size and device) in place of released ones; `other` keeps none.
  void adopt(Storage& other);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
};

}  // namespace weft
