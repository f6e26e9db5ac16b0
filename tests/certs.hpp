#pragma once
// Certificates for tests that run with [security] (actorflow-test only:
// ACTORFLOW_CERTS_BINARY is its compile definition).

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "net/testing_hooks.hpp"
#include "process_cluster.hpp"

namespace af::testing {

/// Runs actorflow-certs for `config` (its [cluster] only) and returns the
/// [security] table it printed, what a user pastes into the config. Where
/// this test binary trusts the fabric (its hook, net/testing_hooks.hpp: the
/// run over UCX), the table says trusted_fabric = true, so that the node
/// processes of the config trust it too.
inline std::string make_certs(const std::string& config) {
  auto made = run_command({ACTORFLOW_CERTS_BINARY, "--config", config}, std::chrono::seconds{60});
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  auto at = made.output.find("[security]");
  REQUIRE(at != std::string::npos);
  auto table = made.output.substr(at);
  if (test_hooks_trust_fabric())
    table += (table.empty() || table.back() == '\n' ? "" : "\n") + std::string{"trusted_fabric = true\n"};
  return table;
}

} // namespace af::testing
