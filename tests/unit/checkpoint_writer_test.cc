// CheckpointWriter: in line and on a background thread, one write in flight at most, outcomes
// (lines and errors) handed back on the caller's thread.
#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "launcher/checkpoint_writer.h"
#include "runtime/error.h"

namespace weft {
namespace {

TEST(CheckpointWriter, InLineWritesRunAtOnceAndReturnTheirLine) {
  CheckpointWriter writer(false);
  int runs = 0;
  EXPECT_EQ(writer.submit([&] { ++runs; return std::string("saved 1"); }), "saved 1");
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(writer.poll(), std::nullopt);
  EXPECT_THROW(writer.submit([]() -> std::string { WEFT_FAIL("disk full"); }), Error);
}

TEST(CheckpointWriter, BackgroundWritesOneAtATimeAndReportOnTheCallersThread) {
  CheckpointWriter writer(true);
  std::atomic<int> in_flight{0}, most{0};
  auto slow = [&](const std::string& line) {
    return [&, line] {
      most = std::max(most.load(), ++in_flight);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      --in_flight;
      return line;
    };
  };
  EXPECT_EQ(writer.submit(slow("saved 1")), std::nullopt);  // started, not finished
  EXPECT_EQ(writer.submit(slow("saved 2")), "saved 1");     // waited for the first
  EXPECT_EQ(writer.wait(), "saved 2");
  EXPECT_EQ(most.load(), 1) << "two writes were in flight at once";
  EXPECT_EQ(writer.wait(), std::nullopt);
  // A background failure comes back at the next poll or wait, once.
  writer.submit([]() -> std::string { WEFT_FAIL("No space left on device"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  try {
    writer.poll();
    FAIL() << "expected the write's error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("No space left on device"), std::string::npos);
  }
  EXPECT_EQ(writer.wait(), std::nullopt);
}

}  // namespace
}  // namespace weft
