// Stream retirement (see stream_retirement.h).
#include "runtime/stream_retirement.h"

#include <map>
#include <mutex>
#include <utility>

namespace weft {
namespace {

struct Listeners {
  // Recursive: a listener may retire a stream (announce) or remove a listener from inside a call.
  std::recursive_mutex mutex;
  std::map<int, StreamRetiredListener> by_id;
  int next_id = 1;
};

Listeners& listeners() {
  // Leaked on purpose: streams are destroyed from static destructors (cuda::Stream members of
  // leaked or static objects) in an order no one controls.
  static Listeners* registry = new Listeners;
  return *registry;
}

}  // namespace

int add_stream_retired_listener(StreamRetiredListener listener) {
  Listeners& registry = listeners();
  std::lock_guard<std::recursive_mutex> lock(registry.mutex);
  const int id = registry.next_id++;
  registry.by_id.emplace(id, std::move(listener));
  return id;
}

void remove_stream_retired_listener(int id) {
  Listeners& registry = listeners();
  std::lock_guard<std::recursive_mutex> lock(registry.mutex);
  registry.by_id.erase(id);
}

void announce_stream_retired(const StreamKey& stream) {
  Listeners& registry = listeners();
  std::lock_guard<std::recursive_mutex> lock(registry.mutex);
  // By id, looked up afresh after each call: a listener may remove itself or another one.
  for (auto it = registry.by_id.begin(); it != registry.by_id.end();) {
    const int id = it->first;
    StreamRetiredListener listener = it->second;  // a copy: erasing the entry must not destroy it mid-call
    listener(stream);
    it = registry.by_id.upper_bound(id);
  }
}

}  // namespace weft
