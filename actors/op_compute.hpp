#pragma once
/// One kernel op of a partition run on a backend, with the errors an
/// executor gives (naming the op, its kind and the device): shared by the
/// executor actor and a step run on its caller's thread (actors/step_here.hpp).

#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"
#include "messages/executor.hpp"

namespace af {

/// Runs `op` on `args` with `backend`; an op the backend lacks runs on
/// `fallback` (if any; `note` then says so). An unknown kind, a kernel's
/// error, or a throw (out of memory, a size refused) is an error naming the
/// op, never an exception.
caf::expected<tensor> compute_op(kernels::backend& backend, kernels::backend* fallback,
                                 const std::string& device, const partition_op& op,
                                 const std::vector<tensor>& args, std::string& note);

} // namespace af
