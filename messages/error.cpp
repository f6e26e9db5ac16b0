#include "messages/error.hpp"

#include "caf/sec.hpp"
#include "caf/deep_to_string.hpp"

namespace af {

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

std::string reason_of(const caf::error& err) {
  if (err.category() == error_category) {
    const auto& ctx = err.context();
    if (ctx.size() == 1 && ctx.match_element<std::string>(0))
      return ctx.get_as<std::string>(0);
  }
  return describe(err);
}

} // namespace af
