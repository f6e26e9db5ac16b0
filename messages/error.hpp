#pragma once
/// The project's error codes. Every error a user can cause comes back as a
/// `caf::error` of category "actorflow" whose context is one sentence naming the
/// thing and what to do; `af::describe` turns any caf::error into that sentence.

#include <cstdint>
#include <string>

#include "caf/atom.hpp"
#include "caf/error.hpp"
#include "caf/message.hpp"

#include "core/error_code.hpp"

namespace af {

/// The atom naming the category ("actorflow").
constexpr caf::atom_value error_category = caf::atom("actorflow");

/// An actorflow error with a sentence of context.
caf::error make_error(af_error code, std::string context);

/// True if `err` is an actorflow error with code `code`.
bool is(const caf::error& err, af_error code);

/// One readable line for any error: actorflow's own, CAF's system errors
/// (timeouts, unreachable nodes) and anything else.
std::string describe(const caf::error& err);

/// What went wrong, without the code's name when it is one of ours: for an
/// error that wraps another in its own sentence and code.
std::string reason_of(const caf::error& err);

} // namespace af
