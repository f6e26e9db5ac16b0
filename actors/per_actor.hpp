#pragma once
/// A process-wide table of one shared object per actor (an executor's edge
/// byte budget, its step latency histogram): made on first use, kept by the
/// actor, and looked up by others (the data plane, the metrics) by the
/// actor's address, not its id, since a process may run several actor
/// systems. The table holds weak pointers: an object outlives its entry
/// only while someone still holds it.
#include <map>
#include <memory>
#include <mutex>

#include "caf/actor_addr.hpp"

namespace af {

template <class T>
class per_actor {
public:
  /// The object of `id`; made (value-initialized) if there is none and
  /// `make`, else null.
  std::shared_ptr<T> get(const caf::actor_addr& id, bool make) {
    std::lock_guard<std::mutex> guard{mtx_};
    auto it = objects_.find(id);
    if (it != objects_.end())
      if (auto p = it->second.lock())
        return p;
    if (!make)
      return nullptr;
    auto p = std::make_shared<T>();
    objects_[id] = p;
    return p;
  }

  /// Drops `id`'s entry (its actor exits).
  void forget(const caf::actor_addr& id) {
    std::lock_guard<std::mutex> guard{mtx_};
    objects_.erase(id);
  }

private:
  std::mutex mtx_;
  std::map<caf::actor_addr, std::weak_ptr<T>> objects_;
};

} // namespace af
