#pragma once
// Certificates for tests that run with [security] (actorflow-test only:
// ACTORFLOW_CERTS_BINARY is its compile definition).

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "process_cluster.hpp"

namespace af::testing {

/// Runs actorflow-certs for `config` (its [cluster] only) and returns the
/// [security] table it printed, what a user pastes into the config.
inline std::string make_certs(const std::string& config) {
  auto made = run_command({ACTORFLOW_CERTS_BINARY, "--config", config}, std::chrono::seconds{60});
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  auto at = made.output.find("[security]");
  REQUIRE(at != std::string::npos);
  return made.output.substr(at);
}

} // namespace af::testing
