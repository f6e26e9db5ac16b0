#include "messages/error.hpp"

#include "caf/sec.hpp"
#include "caf/deep_to_string.hpp"

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
  }
  return "unknown";
}

caf::error make_error(af_error code, std::string context) {
  return caf::error{static_cast<uint8_t>(code), error_category,
                    caf::make_message(std::move(context))};
}

bool is(const caf::error& err, af_error code) {
  return err && err.category() == error_category
         && err.code() == static_cast<uint8_t>(code);
}

std::string describe(const caf::error& err) {
  if (!err)
    return "no error";
  if (err.category() == error_category) {
    std::string out = to_string(static_cast<af_error>(err.code()));
    const auto& ctx = err.context();
    if (ctx.size() == 1 && ctx.match_element<std::string>(0))
      out += ": " + ctx.get_as<std::string>(0);
    return out;
  }
  if (err == caf::sec::request_timeout)
    return "timeout: the peer did not answer in time (is the node alive and reachable?)";
  return caf::to_string(err);
}

} // namespace af
