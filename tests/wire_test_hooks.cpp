// The one definition of the wire's test hooks (net/testing_hooks.hpp), and
// of the splits' (core/parallel_ranges.hpp), compiled into the test binary
// only: the library refers to them weakly, so a program has none. Tests set
// their members in code; at the start of the run, this binary (never the
// library) reads ACTORFLOW_TRUSTED_FABRIC=1, which tests/CMakeLists.txt sets
// to run the data-plane tests over UCX.
#define CATCH_CONFIG_EXTERNAL_INTERFACES // Catch::TestEventListenerBase
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "core/parallel_ranges.hpp"
#include "net/testing_hooks.hpp"
#include "net/ucx_link.hpp"

namespace af {

wire_hooks wire_hooks_of_tests;
parallel_hooks parallel_hooks_of_tests;

} // namespace af

namespace {

struct trusted_fabric_from_environment : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;

  void testRunStarting(const Catch::TestRunInfo& info) override {
    TestEventListenerBase::testRunStarting(info);
    const char* v = std::getenv("ACTORFLOW_TRUSTED_FABRIC");
    std::string s = v != nullptr ? v : "";
    if (s == "1" || s == "true" || s == "yes") {
      af::wire_hooks_of_tests.trusted_fabric = true;
      af::process_trusted_fabric() = true;
    }
  }
};

} // namespace

CATCH_REGISTER_LISTENER(trusted_fabric_from_environment)
