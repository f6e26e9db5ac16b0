#pragma once
/// Executor actors (interface: messages/executor.hpp): one per device of a node.

#include <memory>
#include <string>

#include "caf/actor_system.hpp"

#include "kernels/kernels.hpp"
#include "messages/executor.hpp"

namespace af {

struct executor_state {
  std::string device;                        ///< full device name
  std::shared_ptr<kernels::backend> backend; ///< CPU or CUDA
  std::shared_ptr<kernels::backend> fallback; ///< the node's CPU, for ops a GPU lacks
};

executor_actor::behavior_type executor_impl(executor_actor::stateful_pointer<executor_state> self,
                                            std::string device,
                                            std::shared_ptr<kernels::backend> backend,
                                            std::shared_ptr<kernels::backend> fallback);

} // namespace af
