#include "actors/kv_store.hpp"
#include "actors/answer_if_down.hpp"

#include <algorithm>
#include <limits>
#include <new>

#include "caf/all.hpp"

#include "messages/error.hpp"

namespace af {

namespace {

using self_pointer = kv_store_server_actor::stateful_pointer<kv_store_state>;
using clock_type = std::chrono::steady_clock;

/// A key for an error message: long keys are cut, the limit is 64 KiB.
std::string shown(const std::string& key) {
  constexpr size_t most = 200;
  if (key.size() <= most)
    return "'" + key + "'";
  return "'" + key.substr(0, most) + "...' (" + std::to_string(key.size()) + " bytes)";
}

caf::error check_key(const std::string& key) {
  if (key.size() > kv_store_limits::max_key_bytes)
    return make_error(af_error::resource_exhausted,
                      "kv store: key " + shown(key) + " is longer than the limit of "
                        + std::to_string(kv_store_limits::max_key_bytes) + " bytes");
  return caf::none;
}

void sweep(self_pointer self) {
  self->state.waiters.sweep(self, [](const auto& w) {
    return make_error(af_error::timeout, "kv store: waited " + std::to_string(w.timeout_ms)
                                           + " ms for key " + shown(w.key)
                                           + "; nobody put it (did its writer start?)");
  });
}

/// Answers the waiters of `key` with `value`.
void release_waiters(self_pointer self, const std::string& key, const std::string& value) {
  self->state.waiters.release(self, [&](const std::string& k) { return k == key; },
                              [&](const std::string&) { return value; });
}

} // namespace

kv_store_server_actor::behavior_type kv_store_impl(self_pointer self) {
  // A requester that dies takes its waiters with it: nobody is left to answer.
  self->set_down_handler([self](caf::down_msg& dm) { self->state.waiters.drop(dm.source); });
  return {
    [self](kv_put_atom, std::string& key, std::string& value) -> caf::result<caf::ok_atom> {
      if (auto err = check_key(key))
        return err;
      if (value.size() > kv_store_limits::max_value_bytes)
        return make_error(af_error::resource_exhausted,
                          "kv store: the value of key " + shown(key) + " has "
                            + std::to_string(value.size()) + " bytes, more than the limit of "
                            + std::to_string(kv_store_limits::max_value_bytes));
      auto& values = self->state.values;
      auto it = values.find(key);
      try {
        if (it == values.end()) {
          if (values.size() >= kv_store_limits::max_keys)
            return make_error(af_error::resource_exhausted,
                              "kv store: holds " + std::to_string(values.size())
                                + " keys, the limit; cannot add key " + shown(key));
          it = values.emplace(key, std::move(value)).first;
        } else {
          it->second = std::move(value);
        }
        release_waiters(self, it->first, it->second);
      } catch (const std::bad_alloc&) {
        return make_error(af_error::resource_exhausted,
                          "kv store: no memory to store key " + shown(key));
      }
      return caf::ok_atom::value;
    },
    [self](kv_get_atom, std::string& key, uint32_t timeout_ms) -> caf::result<std::string> {
      if (auto err = check_key(key))
        return err;
      auto& st = self->state;
      if (auto it = st.values.find(key); it != st.values.end())
        return it->second;
      if (timeout_ms == 0)
        return make_error(af_error::timeout, "kv store: key " + shown(key) + " has no value");
      if (st.waiters.size() >= kv_store_limits::max_waiters)
        return make_error(af_error::resource_exhausted,
                          "kv store: " + std::to_string(st.waiters.size())
                            + " gets are already waiting, the limit; cannot wait for key "
                            + shown(key));
      try {
        return st.waiters.park(self, std::move(key), timeout_ms);
      } catch (const std::bad_alloc&) {
        return make_error(af_error::resource_exhausted,
                          "kv store: no memory to park a get of key " + shown(key));
      }
    },
    [self](sweep_atom) { sweep(self); },
  };
}

kv_store_actor spawn_kv_store(caf::actor_system& sys) {
  return sys.spawn(kv_store_impl);
}

// -- kv_client -------------------------------------------------------------------

namespace {

/// The client's own failures (the store's errors pass through unchanged).
caf::error client_error(caf::error err, const std::string& what, std::chrono::milliseconds waited) {
  if (err == caf::sec::request_timeout)
    return make_error(af_error::timeout, "the kv store did not answer " + what + " within "
                                           + std::to_string(waited.count())
                                           + " ms; is its node alive and reachable?");
  if (err == caf::sec::request_receiver_down)
    return make_error(af_error::peer_down, "the kv store is gone (" + what + ")");
  return err;
}

} // namespace

kv_client::kv_client(caf::actor_system& sys, kv_store_actor store,
                     std::chrono::milliseconds request_timeout)
  : sys_(sys), store_(std::move(store)), request_timeout_(request_timeout) {
  // nop
}

caf::error kv_client::put(const std::string& key, const std::string& value) {
  if (!store_)
    return make_error(af_error::invalid_argument, "kv client: no store to put " + shown(key) + " in");
  caf::scoped_actor self{sys_, true};
  caf::error result;
  auto request = self->request(store_, request_timeout_, kv_put_atom::value, key, value);
  answer_if_down guard{caf::actor_cast<caf::strong_actor_ptr>(store_),
                       caf::strong_actor_ptr{self->ctrl()}, request.id()};
  request.receive([](caf::ok_atom) {},
                  [&](caf::error& err) {
                    result = client_error(std::move(err), "the put of key " + shown(key),
                                          request_timeout_);
                  });
  return result;
}

caf::expected<std::string> kv_client::get(const std::string& key, std::chrono::milliseconds timeout) {
  if (!store_)
    return make_error(af_error::invalid_argument, "kv client: no store to get " + shown(key) + " from");
  auto ms = std::clamp<int64_t>(timeout.count(), 0, std::numeric_limits<uint32_t>::max());
  // The store answers a get's own timeout; the request's is only for a store
  // that does not answer at all.
  auto limit = std::chrono::milliseconds{ms} + request_timeout_;
  caf::scoped_actor self{sys_, true};
  caf::expected<std::string> result{std::string{}};
  auto request = self->request(store_, limit, kv_get_atom::value, key, static_cast<uint32_t>(ms));
  // A store whose CAF link breaks meanwhile (its node died, or this one was
  // stopped past connection_timeout_ms) says so at once, not at `limit`.
  answer_if_down guard{caf::actor_cast<caf::strong_actor_ptr>(store_),
                       caf::strong_actor_ptr{self->ctrl()}, request.id()};
  request.receive([&](std::string& value) { result = std::move(value); },
                  [&](caf::error& err) {
                    result = client_error(std::move(err), "the get of key " + shown(key), limit);
                  });
  return result;
}

} // namespace af
