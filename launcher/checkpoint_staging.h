// CheckpointStaging: the host copies an asynchronous checkpoint save writes from, kept from one
// save to the next (checkpoint.async).
//
// A background write needs its own copy of every tensor, since training changes the live ones. A
// fresh host tensor per save costs page faults on every byte, and a copy from the GPU into pageable
// memory goes through the driver's bounce buffer: about a second for GPT-2 124M's 1.7 GB. The staging
// keeps one host buffer per tensor name, page-locked for device tensors (Tensor::empty_pinned), so a
// later save is a DMA at transfer speed into memory already mapped.
//
// Invariant: the buffers are overwritten by the next copies(), so the caller must have waited for
// the write that reads them (CheckpointWriter allows one write in flight; the trainer waits for it
// before copying) and must keep the staging alive until that write has finished.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "runtime/tensor.h"

namespace weft {

class CheckpointStaging {
 public:
  // Host copies of `tensors` (same names, shapes and dtypes; contiguous), in the kept buffers; a
  // buffer is made the first time a name is seen or when its shape or dtype has changed.
  std::map<std::string, Tensor> copies(const std::map<std::string, Tensor>& tensors);

  // Bytes held, and how much of it is page-locked (less than all when pinning failed: the buffer
  // then is pageable, and its copies slower, with the same result).
  int64_t bytes() const;
  int64_t pinned_bytes() const;

 private:
  struct Buffer {
    Tensor host;
    bool pinned = false;
  };
  std::map<std::string, Buffer> buffers_;
};

}  // namespace weft
