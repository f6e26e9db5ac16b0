// tools/ctest-failures: what .ci/run prints at the end of a failed ctest run.
#include <chrono>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "process_cluster.hpp"
#include "temp_dir.hpp"

using af::testing::run_command;
using af::testing::temp_dir;

namespace {

/// One test's block of ctest's Testing/Temporary/LastTest.log, as ctest 3.x writes it.
std::string block(int i, const std::string& name, const std::string& command,
                  const std::string& output, bool passed) {
  std::string dash(58, '-');
  return std::to_string(i) + "/4 Testing: " + name + "\n" + std::to_string(i) + "/4 Test: " + name
         + "\nCommand: " + command + "\nDirectory: /src/build-cpu/tests\n\"" + name
         + "\" start time: Dec 06 22:58 UTC\nOutput:\n" + dash + "\n" + output
         + "<end of output>\nTest time =   0.02 sec\n" + dash + "\n"
         + (passed ? "Test Passed.\n" : "Test Failed.\n") + "\"" + name
         + "\" end time: Dec 06 22:58 UTC\n\"" + name + "\" time elapsed: 00:00:00\n" + dash
         + "\n\n";
}

} // namespace

TEST_CASE("tools/ctest-failures lists the failed tests of a run with their output, and no test "
          "that passed",
          "[tools][ci]") {
  // Catches: a passing test listed as failed because "Timeout" is in its
  // name or command line (ctest writes "Test Failed." for a timeout too).
  temp_dir dir;
  std::filesystem::create_directories(dir / "Testing/Temporary");
  std::string long_line(400, 'x');
  {
    std::ofstream log{dir / "Testing/Temporary/LastTest.log", std::ios::binary};
    log << "Start testing: Dec 06 22:58 UTC\n" << std::string(58, '-') << "\n"
        << block(1, "a Timeout of the session is said", "\"/b/actorflow-tests\" \"a Timeout\"",
                 "All tests passed\n", true)
        << block(2, "odd [name] \"q\" a/b: c", "\"/b/actorflow-tests\" \"odd\"",
                 long_line + "\nbad \xff\xfe bytes\nx.cpp:3: FAILED:\n  REQUIRE( a == b )\n", false)
        << block(3, "times out", "\"/b/actorflow-tests\" \"times out\"", "started\n", false)
        << block(4, "passes in TimeoutTests", "\"/b/TimeoutTests/run\"", "ok\n", true)
        << "End testing: Dec 06 22:58 UTC\n";
  }
  auto r = run_command({ACTORFLOW_SOURCE_DIR "/tools/ctest-failures", dir.path},
                       std::chrono::seconds{30});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("===== failed: odd [name] \"q\" a/b: c\n") != std::string::npos);
  CHECK(r.output.find("x.cpp:3: FAILED:\n  REQUIRE( a == b )") != std::string::npos);
  CHECK(r.output.find(std::string(300, 'x') + " [...]") != std::string::npos);
  CHECK(r.output.find(std::string(301, 'x')) == std::string::npos);
  CHECK(r.output.find("===== failed: times out\nstarted") != std::string::npos);
  CHECK(r.output.find("a Timeout of the session") == std::string::npos);
  CHECK(r.output.find("TimeoutTests") == std::string::npos);

  // Catches: a stdout that cannot encode what it prints (a CI with a
  // Latin-1 or ASCII locale; the log's bad bytes read as U+FFFD) ended the
  // tool in a UnicodeEncodeError, and .ci/run (set -e) with it, before the
  // rerun's verdict.
  auto ascii = run_command({ACTORFLOW_SOURCE_DIR "/tools/ctest-failures", dir.path},
                           std::chrono::seconds{30}, {{"PYTHONIOENCODING", "ascii"}});
  INFO(ascii.output);
  CHECK(ascii.exit_code == 0);
  CHECK(ascii.output.find("x.cpp:3: FAILED:") != std::string::npos);
}
