// core/child_process: the one launcher of tests, bench, soak, the node's
// supervisor and the gnuplot run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "core/child_process.hpp"
#include "temp_dir.hpp"

using af::child_output;
using af::child_process;
using af::child_spec;
using namespace std::chrono_literals;

namespace {

child_spec shell(const std::string& script) {
  child_spec spec;
  spec.argv = {"/bin/sh", "-c", script};
  spec.out = spec.err = child_output::capture;
  return spec;
}

} // namespace

TEST_CASE("a child's stdout and stderr are captured together and its exit code is reported",
          "[process][child_process]") {
  child_process c{shell("echo out; echo err >&2; exit 3")};
  REQUIRE(c.started());
  auto status = c.wait_for(10s);
  REQUIRE(status);
  CHECK(child_process::exit_code(*status) == 3);
  CHECK(child_process::describe(*status) == "exited with 3");
  CHECK(c.output().find("out\n") != std::string::npos);
  CHECK(c.output().find("err\n") != std::string::npos);
  CHECK_FALSE(c.running());
}

TEST_CASE("a program that cannot be executed is a start error, not a child that exits",
          "[process][child_process]") {
  child_spec spec;
  spec.argv = {"/nonexistent/actorflow-no-such-program"};
  child_process c{spec};
  CHECK_FALSE(c.started());
  CHECK(c.start_error()
        == "cannot run /nonexistent/actorflow-no-such-program: No such file or directory");
  auto status = c.try_wait(); // reads as exited with 127, as a failed exec would
  REQUIRE(status);
  CHECK(child_process::exit_code(*status) == 127);
}

TEST_CASE("a child gets the environment's changes and none of the removed names",
          "[process][child_process]") {
  ::setenv("ACTORFLOW_TEST_GONE", "here", 1);
  ::setenv("ACTORFLOW_TEST_KEPT", "kept", 1);
  auto spec = shell("echo \"[$ACTORFLOW_TEST_SET][${ACTORFLOW_TEST_GONE-unset}][$ACTORFLOW_TEST_KEPT]\"");
  spec.set_env = {{"ACTORFLOW_TEST_SET", "a=b"}};
  spec.unset_env = {"ACTORFLOW_TEST_GONE"};
  child_process c{spec};
  REQUIRE(c.wait_for(10s));
  CHECK(c.output() == "[a=b][unset][kept]\n");
  ::unsetenv("ACTORFLOW_TEST_GONE");
  ::unsetenv("ACTORFLOW_TEST_KEPT");
}

TEST_CASE("wait_for returns at its timeout while the child runs, and SIGKILL reaps it",
          "[process][child_process]") {
  child_process c{shell("echo started; exec sleep 60")};
  REQUIRE(c.started());
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(c.wait_for(300ms));
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  CHECK(c.output() == "started\n");
  CHECK(c.running());
  CHECK(c.signal(SIGKILL));
  CHECK_FALSE(c.running());
  auto status = c.try_wait();
  REQUIRE(status);
  CHECK(child_process::describe(*status) == "died of signal 9");
  CHECK_FALSE(c.signal(SIGTERM)); // reaped: nothing to signal
}

TEST_CASE("SIGSTOP returns once the child has stopped, after SIGCONT it runs on",
          "[process][child_process]") {
  child_process c{shell("exec sleep 60")};
  REQUIRE(c.signal(SIGSTOP));
  std::ifstream stat{"/proc/" + std::to_string(c.pid()) + "/stat"};
  std::string line;
  std::getline(stat, line);
  CHECK(line.substr(line.rfind(')') + 2, 1) == "T"); // stopped, already
  CHECK(c.signal(SIGCONT));
  CHECK(c.running());
  CHECK(c.signal(SIGTERM));
  auto status = c.wait_for(10s);
  REQUIRE(status);
  CHECK(child_process::describe(*status) == "died of signal 15");
}

TEST_CASE("a child's output can go to a file (stdout and stderr in order) or nowhere",
          "[process][child_process]") {
  af::testing::temp_dir dir;
  auto log = dir / "child.log";
  af::testing::write_file(log, "an old incarnation's output, longer than the new one\n");
  child_spec spec;
  spec.argv = {"/bin/sh", "-c", "echo one; echo two >&2; echo three"};
  spec.out = spec.err = child_output::file;
  spec.log_path = log;
  child_process c{spec};
  CHECK(child_process::exit_code(c.wait()) == 0);
  std::ifstream in{log};
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str() == "one\ntwo\nthree\n");

  spec.out = child_output::discard;
  spec.err = child_output::capture;
  child_process quiet{spec};
  quiet.wait();
  CHECK(quiet.output() == "two\n");
}

TEST_CASE("a child keeps only the descriptor it is given when the others are closed",
          "[process][child_process]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0); // neither end close-on-exec
  auto open_in_child = [&](bool close_fds) {
    // `test` is the shell's own: /proc/self is the child itself.
    auto spec = shell("for fd in " + std::to_string(fds[0]) + " " + std::to_string(fds[1])
                      + "; do test -e /proc/self/fd/$fd && echo $fd; done");
    spec.close_fds = close_fds;
    spec.keep_fd = fds[0];
    child_process c{spec};
    c.wait();
    return c.output();
  };
  CHECK(open_in_child(true) == std::to_string(fds[0]) + "\n");
  CHECK(open_in_child(false) == std::to_string(fds[0]) + "\n" + std::to_string(fds[1]) + "\n");
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("captured output beyond max_output is read and dropped, so the child still ends",
          "[process][child_process]") {
  auto spec = shell("head -c 1000000 /dev/zero");
  spec.max_output = 1000;
  child_process c{spec};
  auto status = c.wait_for(30s);
  REQUIRE(status);
  CHECK(child_process::exit_code(*status) == 0);
  CHECK(c.output().size() == 1000);
}

TEST_CASE("a reaped child's CPU time is known: a busy one's, not a sleeping one's",
          "[process][child_process]") {
  // Bugs it catches: the CPU time not taken where the child is reaped
  // (try_wait, wait_for, wait, SIGKILL), taken from a look that found it
  // running or from a stop (neither is an end), or without its system time
  // (actorflow-bench divides it by a job's steps).
  auto t0 = std::chrono::steady_clock::now();
  child_process busy{shell("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")};
  child_process idle{shell("exec sleep 0.3")};
  REQUIRE((busy.started() && idle.started()));
  CHECK_FALSE(busy.cpu_seconds()); // running
  REQUIRE(busy.wait_for(60s));
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(idle.wait_for(60s));
  REQUIRE(busy.cpu_seconds());
  REQUIRE(idle.cpu_seconds());
  INFO("busy " << *busy.cpu_seconds() << " s of CPU in " << wall << " s; idle "
               << *idle.cpu_seconds() << " s");
  CHECK(*busy.cpu_seconds() > 0.02);
  CHECK(*busy.cpu_seconds() < wall + 0.1); // one thread: no more CPU than its time
  CHECK(*idle.cpu_seconds() < *busy.cpu_seconds() / 2);

  // Nearly all system time: reading 8 GiB of /dev/zero (the kernel clears
  // the buffer); reaped by wait().
  child_process kernel_side{
    shell("exec dd if=/dev/zero of=/dev/null bs=1M count=8192 2>/dev/null")};
  REQUIRE(child_process::exit_code(kernel_side.wait()) == 0);
  REQUIRE(kernel_side.cpu_seconds());
  CHECK(*kernel_side.cpu_seconds() > 0.02);

  child_process stopped{shell("exec sleep 60")};
  REQUIRE(stopped.signal(SIGSTOP));
  CHECK_FALSE(stopped.try_wait()); // stopped, not ended
  CHECK_FALSE(stopped.cpu_seconds());
  REQUIRE(stopped.signal(SIGKILL));
  CHECK(stopped.cpu_seconds());
  child_process moved{std::move(stopped)};
  CHECK(moved.cpu_seconds());
}

TEST_CASE("SIGSTOP to a child stopped already returns at once", "[process][child_process]") {
  // Bug it catches: the second SIGSTOP waiting for a stop that the kernel
  // reported once, at the first, so it waited for ever.
  child_process c{shell("exec sleep 60")};
  REQUIRE(c.signal(SIGSTOP));
  auto second = std::async(std::launch::async, [&c] { return c.signal(SIGSTOP); });
  bool returned = second.wait_for(10s) == std::future_status::ready;
  if (!returned)
    ::kill(c.pid(), SIGKILL); // ends its wait, so that the thread can be joined
  CHECK(returned);
  CHECK(second.get());
  CHECK(c.running());
  CHECK(c.signal(SIGCONT));
  REQUIRE(c.signal(SIGSTOP)); // stopped again after it ran on
  CHECK(c.signal(SIGKILL));
}
