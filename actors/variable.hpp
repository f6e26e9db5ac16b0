#pragma once
/// The variable actor's implementation (interface: messages/variable.hpp).

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/expected.hpp"
#include "caf/typed_response_promise.hpp"

#include "messages/variable.hpp"

namespace af {

/// The variable's bookkeeping, usable without an actor system.
struct variable_state {
  variable_spec spec;
  tensor value;
  bool initialized = false;
  uint64_t version = 0;
  std::vector<caf::typed_response_promise<uint64_t>> waiting_for_init;

  /// Computes the initial value; skips if `only_if_uninitialized` and set.
  caf::expected<uint64_t> initialize(const initializer& init, bool only_if_uninitialized);

  /// assign (`op` empty), assign_add ("add") or assign_sub ("sub").
  caf::expected<uint64_t> update(const char* op, const tensor& operand);

  caf::expected<tensor> read() const;

  variable_info info() const { return {spec, initialized, version}; }
};

/// A variable's state behind a mutex, shared by its actor and the node's
/// data-plane threads (actors/data_plane.hpp). The data plane applies ops to
/// an initialized variable directly, saving the two thread hand-offs of an
/// actor request per remote op; a first value, and the waiters it releases,
/// always go through the actor, so promises are delivered on its thread only.
class guarded_variable {
public:
  explicit guarded_variable(variable_spec spec) {
    state_.spec = std::move(spec);
  }

  /// Runs `f(variable_state&)` under the lock.
  template <class F>
  auto with(F&& f) {
    std::lock_guard<std::mutex> guard{mtx_};
    return f(state_);
  }

private:
  std::mutex mtx_;
  variable_state state_;
};

struct variable_actor_state {
  std::shared_ptr<guarded_variable> var;
};

/// The behavior; node actors spawn it linked to themselves.
variable_actor::behavior_type
variable_impl(variable_actor::stateful_pointer<variable_actor_state> self,
              std::shared_ptr<guarded_variable> var);

} // namespace af
