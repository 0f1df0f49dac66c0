#include "runtime/storage.h"

namespace weft {

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  allocator_ = &allocator_for(device);
  data_ = allocator_->allocate(bytes, device);
}

Storage::~Storage() {
  if (data_ != nullptr) allocator_->deallocate(data_, bytes_, device_);
}

}  // namespace weft
