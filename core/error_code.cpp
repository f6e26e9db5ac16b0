#include "core/error_code.hpp"

namespace af {

const char* to_string(af_error x) {
  switch (x) {
    case af_error::invalid_config: return "invalid_config";
    case af_error::unknown_job: return "unknown_job";
    case af_error::task_out_of_range: return "task_out_of_range";
    case af_error::invalid_device: return "invalid_device";
    case af_error::unknown_device: return "unknown_device";
    case af_error::shape_mismatch: return "shape_mismatch";
    case af_error::dtype_mismatch: return "dtype_mismatch";
    case af_error::uninitialized: return "uninitialized";
    case af_error::not_found: return "not_found";
    case af_error::unreachable: return "unreachable";
    case af_error::timeout: return "timeout";
    case af_error::invalid_argument: return "invalid_argument";
    case af_error::unsupported: return "unsupported";
    case af_error::peer_down: return "peer_down";
    case af_error::bind_failed: return "bind_failed";
    case af_error::internal: return "internal";
    case af_error::aborted: return "aborted";
    case af_error::resource_exhausted: return "resource_exhausted";
    case af_error::gone: return "gone";
    case af_error::already_exists: return "already_exists";
    case af_error::non_finite: return "non_finite";
    case af_error::mode_changed: return "mode_changed";
    case af_error::cancelled: return "cancelled";
    case af_error::left: return "left";
  }
  return "unknown";
}

} // namespace af
