#pragma once
/// The project's error codes, with no CAF: the graph library (graph/) and the
/// kernels report these; messages/error.hpp wraps them in caf::error.

#include <cstdint>

namespace af {

enum class af_error : uint8_t {
  invalid_config = 1,     ///< malformed or inconsistent cluster configuration
  unknown_job,            ///< a job name that the cluster spec does not have
  task_out_of_range,      ///< a task index past the end of its job
  invalid_device,         ///< a device string that does not parse
  unknown_device,         ///< a device that no node offers and soft placement cannot map
  shape_mismatch,         ///< shapes that must agree do not
  dtype_mismatch,         ///< dtypes that must agree do not
  uninitialized,          ///< read of a variable that has no value yet
  not_found,              ///< a name that is not registered
  unreachable,            ///< a node that cannot be connected to
  timeout,                ///< a wait that ran out; names what it waited for
  invalid_argument,       ///< anything else a caller got wrong
  unsupported,            ///< a feature compiled out or absent on this machine
  peer_down,              ///< a node or actor that died during the request
  bind_failed,            ///< a node that cannot listen on its address
  internal,               ///< a bug: please report
  aborted,                ///< a step stopped because another part of it failed
  resource_exhausted,     ///< a limit or an allocation failed; names the limit
  gone,                   ///< a variable that its restarted node no longer holds
  already_exists,         ///< an id another owner holds (a graph id on an executor)
  non_finite,             ///< a NaN or infinity refused before it reached a variable
  mode_changed,           ///< a push of the other kind (gradients vs parameters) after a live switch
  cancelled,              ///< the caller gave up (Ctrl-C in the REPL); the request was abandoned
  left,                   ///< a worker its aggregator took as left when its link went down: it joins again
};

/// The largest code: a status byte from a peer above it is not an af_error.
constexpr uint8_t af_error_max = static_cast<uint8_t>(af_error::left);

/// True if `code` is one of af_error's values (checks bytes from the wire).
constexpr bool valid_af_error(uint8_t code) {
  return code >= 1 && code <= af_error_max;
}

/// "shape_mismatch", ...
const char* to_string(af_error x);

} // namespace af
