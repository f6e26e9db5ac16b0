#pragma once
/// The variable actor's implementation (interface: messages/variable.hpp).

#include <cstdint>
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

/// The behavior; node actors spawn it linked to themselves.
variable_actor::behavior_type variable_impl(variable_actor::stateful_pointer<variable_state> self,
                                            variable_spec spec);

} // namespace af
