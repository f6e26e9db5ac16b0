#pragma once
/// The aggregation actors (protocol: messages/aggregator.hpp). One behavior
/// per mode; a node spawns the one its spec names (spawn_aggregator), so that
/// choosing sync, async or averaging is choosing an actor, never a branch in
/// the worker. They update the variables through their cells
/// (actors/variable.hpp): optimizer slots live beside the values.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/expected.hpp"
#include "caf/typed_response_promise.hpp"

#include "actors/data_plane.hpp"
#include "messages/aggregator.hpp"

namespace af {

/// The aggregator's full interface: the protocol plus its timer.
using aggregator_impl_actor = aggregator_actor::extend<caf::reacts_to<sweep_atom>>;

struct aggregator_actor_state {
  aggregator_spec spec;
  std::vector<variable_directory::entry> vars;
  std::vector<size_t> sizes;   ///< elements per variable
  std::vector<size_t> offsets; ///< where each starts in a flat buffer
  size_t total = 0;
  std::vector<std::string> slot_names;
  uint64_t global_step = 0;
  aggregator_stats stats;

  /// The parameters as one flat tensor, for the global step they were made at.
  tensor params;
  std::optional<uint64_t> params_step;

  // -- one round (sync: one step; average: one average) ---------------------
  struct parked {
    uint32_t worker = 0;
    caf::typed_response_promise<uint64_t, tensor> promise;
  };
  std::vector<parked> waiting;
  std::vector<bool> arrived;  ///< per worker, this round
  std::vector<bool> done;     ///< per worker: pushes no more
  std::vector<float> sum;
  uint32_t contributions = 0;
  uint64_t round_step = 0;    ///< average: the largest local step pushed this round
  std::chrono::steady_clock::time_point round_started;
  bool sweep_pending = false;

  static constexpr const char* name = "aggregator";
};

/// Spawns the aggregator `spec.mode` names over `vars` (the cells of
/// spec.variables, in order), in `sys`. An unknown mode, a variable that is not
/// float32, or no workers is an error naming it.
caf::expected<aggregator_actor> spawn_aggregator(caf::actor_system& sys, aggregator_spec spec,
                                                 std::vector<variable_directory::entry> vars);

} // namespace af
