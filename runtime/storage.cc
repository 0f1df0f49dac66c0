#include "runtime/storage.h"

#include "runtime/error.h"

namespace weft {

Storage::Storage(size_t bytes, Device device) : Storage(bytes, device, allocator_for(device)) {}

Storage::Storage(size_t bytes, Device device, Allocator& allocator)
    : bytes_(bytes), device_(device), allocator_(&allocator) {
  data_ = allocator_->allocate(bytes, device);
}

Storage::~Storage() {
  if (data_ != nullptr) allocator_->deallocate(data_, bytes_, device_);
}

void Storage::release() {
  if (data_ != nullptr) allocator_->deallocate(data_, bytes_, device_);
  data_ = nullptr;
}

void Storage::adopt(Storage& other) {
  WEFT_CHECK(released() && other.bytes_ == bytes_ && other.device_ == device_ && other.allocator_ == allocator_,
             "Storage::adopt: only released storage takes bytes, and only bytes of its own size and device (",
             bytes_, " bytes on ", device_.to_string(), ", given ", other.bytes_, " bytes on ", other.device_.to_string(), ")");
  data_ = other.data_;
  other.data_ = nullptr;
}

}  // namespace weft
