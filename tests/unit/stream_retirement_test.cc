// Stream retirement without a GPU: listeners hear each retired stream's key in the order they were
// added, a removed one no more, and a listener may retire another stream or remove itself from
// inside its call. StreamKey orders by device, then id, so that a cache keyed by it finds a
// stream by its process-unique id and never by a handle that CUDA could reuse.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "runtime/stream_retirement.h"

namespace weft {
namespace {

// Ids far above any real stream's, so that the CUDA build's own listeners (the caching allocator's)
// never take a live stream of this process for a retired one.
constexpr uint64_t kBase = uint64_t{1} << 60;

TEST(StreamRetirement, ListenersHearEveryRetiredStreamUntilRemoved) {
  std::vector<std::string> heard;
  const int first = add_stream_retired_listener([&](const StreamKey& stream) {
    heard.push_back("first " + std::to_string(stream.device) + ":" + std::to_string(stream.id - kBase));
  });
  const int second = add_stream_retired_listener(
      [&](const StreamKey& stream) { heard.push_back("second " + std::to_string(stream.id - kBase)); });
  announce_stream_retired({0, kBase + 41});
  remove_stream_retired_listener(first);
  announce_stream_retired({1, kBase + 42});
  remove_stream_retired_listener(second);
  announce_stream_retired({0, kBase + 43});
  EXPECT_EQ(heard, (std::vector<std::string>{"first 0:41", "second 41", "second 42"}));
}

TEST(StreamRetirement, AListenerMayRetireAnotherStreamAndRemoveItself) {
  std::vector<uint64_t> heard;
  int self = 0;
  self = add_stream_retired_listener([&](const StreamKey& stream) {
    heard.push_back(stream.id - kBase);
    // A cache whose entry owns a stream of its own (a retired stream's helper) retires it here.
    if (stream.id == kBase + 1) announce_stream_retired({0, kBase + 2});
    if (stream.id == kBase + 2) remove_stream_retired_listener(self);
  });
  announce_stream_retired({0, kBase + 1});
  announce_stream_retired({0, kBase + 3});  // removed by then
  EXPECT_EQ(heard, (std::vector<uint64_t>{1, 2}));
}

TEST(StreamRetirement, KeysOrderByDeviceThenIdSoACacheDropsExactlyTheRetiredStream) {
  std::map<StreamKey, std::string> workspaces = {
      {{0, kBase + 7}, "a"}, {{0, kBase + 9}, "b"}, {{1, kBase + 7}, "c"}};
  const int listener = add_stream_retired_listener([&](const StreamKey& stream) { workspaces.erase(stream); });
  announce_stream_retired({0, kBase + 7});
  remove_stream_retired_listener(listener);
  EXPECT_EQ(workspaces, (std::map<StreamKey, std::string>{{{0, kBase + 9}, "b"}, {{1, kBase + 7}, "c"}}));
  EXPECT_LT((StreamKey{0, 100}), (StreamKey{1, 0}));
  EXPECT_EQ((StreamKey{2, 5}), (StreamKey{2, 5}));
}

}  // namespace
}  // namespace weft
