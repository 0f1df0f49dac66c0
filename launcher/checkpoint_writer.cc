// CheckpointWriter (checkpoint_writer.h).
#include "launcher/checkpoint_writer.h"

namespace weft {

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

std::optional<std::string> CheckpointWriter::take_outcome() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!finished_) return std::nullopt;
  finished_ = false;
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    line_.reset();
    std::rethrow_exception(error);
  }
  std::optional<std::string> line = std::move(line_);
  line_.reset();
  return line;
}

std::optional<std::string> CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  return take_outcome();
}

std::optional<std::string> CheckpointWriter::poll() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!finished_) return std::nullopt;
  }
  return wait();  // finished: the join returns at once
}

std::optional<std::string> CheckpointWriter::submit(Write write) {
  std::optional<std::string> previous = wait();
  if (!asynchronous_) return write();
  thread_ = std::thread([this, write = std::move(write)] {
    std::optional<std::string> line;
    std::exception_ptr error;
    try {
      line = write();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    line_ = std::move(line);
    error_ = error;
    finished_ = true;
  });
  return previous;
}

}  // namespace weft
