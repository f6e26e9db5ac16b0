#pragma once
/// The project's error codes. Every error a user can cause comes back as a
/// `caf::error` of category "actorflow" whose context is one sentence naming the
/// thing and what to do; `af::describe` turns any caf::error into that sentence.

#include <cstdint>
#include <string>

#include "caf/atom.hpp"
#include "caf/error.hpp"
#include "caf/message.hpp"

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
};

/// The atom naming the category ("actorflow").
constexpr caf::atom_value error_category = caf::atom("actorflow");

/// "shape_mismatch", ...
const char* to_string(af_error x);

/// An actorflow error with a sentence of context.
caf::error make_error(af_error code, std::string context);

/// True if `err` is an actorflow error with code `code`.
bool is(const caf::error& err, af_error code);

/// One readable line for any error: actorflow's own, CAF's system errors
/// (timeouts, unreachable nodes) and anything else.
std::string describe(const caf::error& err);

} // namespace af
