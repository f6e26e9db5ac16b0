#pragma once
/// The process's logger (spdlog): one line per event worth a look later, on
/// stderr, e.g.
///   [2026-11-30 17:00:00.123] [warning] [/job:ps/task:0] data plane: dropped 10.0.0.7:51234 ...
/// stdout stays for the lines that programs and tests parse (actorflow-node's
/// "ready" line). The level comes from the environment variable ACTORFLOW_LOG:
/// trace, debug, info (the default), warn, error or off.

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <spdlog/logger.h>

namespace af::log {

/// Sets the logger up for this process: `who` (the node's task name, or the
/// program's) appears in every line, the level is ACTORFLOW_LOG's. Calling it
/// again replaces the logger (a node learns its name after parsing options).
void init(std::string who);

/// The logger; a default one (who = "actorflow") until init() is called.
/// Safe from any thread.
std::shared_ptr<spdlog::logger> get();

/// The level named by `text` (an ACTORFLOW_LOG value); nullopt if none is.
std::optional<spdlog::level::level_enum> parse_level(std::string_view text);

} // namespace af::log
