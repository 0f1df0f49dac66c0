// CheckpointWriter: runs checkpoint writes on a background thread, so training goes on while a
// checkpoint reaches the disk (checkpoint.async), or in line (the default).
//
// The caller hands it a write that owns everything it needs: copies of the tensors on the host,
// the state, the folder. One write is in flight at most: submitting waits for the one before.
// A write's outcome (a line to log, or its weft::Error) is handed back on the caller's thread,
// by poll() between steps or by wait(), so the logger is only ever used by the caller's thread and
// a failed asynchronous save is reported at the next step boundary, the next save or the end.
//
// Crash safety is save_checkpoint's (launcher/checkpoint.h): a process killed during a background
// write leaves `latest` naming the previous complete checkpoint.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace weft {

class CheckpointWriter {
 public:
  // A write returns the line to log when it is done; it reports failure by throwing.
  using Write = std::function<std::string()>;

  explicit CheckpointWriter(bool asynchronous) : asynchronous_(asynchronous) {}
  // Waits for a write in flight (its outcome is dropped: the caller is gone).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Starts `write` (after the one in flight has finished, whose outcome is then returned as by
  // wait()); in line when not asynchronous, returning its line.
  std::optional<std::string> submit(Write write);
  // The line of a finished write, if one finished since the last call; rethrows its error. Never blocks.
  std::optional<std::string> poll();
  // Waits for the write in flight and returns its line; rethrows its error.
  std::optional<std::string> wait();
  bool asynchronous() const { return asynchronous_; }

 private:
  std::optional<std::string> take_outcome();

  bool asynchronous_;
  std::thread thread_;
  std::mutex mutex_;
  bool finished_ = false;                // the thread's write is done (outcome below)
  std::optional<std::string> line_;
  std::exception_ptr error_;
};

}  // namespace weft
