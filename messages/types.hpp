#pragma once
/// The one registration of actorflow's message types and error category.
/// Every program and test calls it on every actor system config, with the same
/// names on every node (a type missing on one side arrives as an empty message).

#include "caf/actor_system_config.hpp"

namespace af {

void register_types(caf::actor_system_config& cfg);

} // namespace af
