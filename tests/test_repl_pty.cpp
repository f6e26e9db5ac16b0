// actorflow-repl on a terminal: the real program behind a pseudo-terminal,
// typed at as a user types (Tab, Up, Ctrl-C, Ctrl-D), its screen read back.
#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "temp_dir.hpp"
#include "wait.hpp"

namespace {

using namespace std::chrono_literals;

/// Control characters made visible, for failure messages.
std::string visible(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n')
      out += "\\n\n";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else
      out += static_cast<char>(c);
  }
  return out;
}

/// actorflow-repl on the other side of a pseudo-terminal. Killed if a
/// check fails before it exits.
class terminal {
public:
  terminal(const std::vector<std::string>& args, const std::string& home) {
    struct winsize size {};
    size.ws_row = 50;
    size.ws_col = 200; // no line wraps in what is checked
    // The program's path and argv, made before the fork: built_path takes a
    // lock, which another thread may hold at the fork.
    const char* repl = ACTORFLOW_REPL_BINARY;
    std::vector<char*> argv{const_cast<char*>(repl)};
    for (const auto& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const std::string failed = std::string{"exec "} + repl;
    pid_ = ::forkpty(&master_, nullptr, nullptr, &size);
    if (pid_ == 0) {
      ::setenv("HOME", home.c_str(), 1);
      ::setenv("TERM", "xterm", 1);
      ::execv(repl, argv.data());
      std::perror(failed.c_str());
      ::_exit(127);
    }
    REQUIRE(pid_ > 0);
    ::fcntl(master_, F_SETFL, ::fcntl(master_, F_GETFL) | O_NONBLOCK);
  }

  ~terminal() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0)
      ::close(master_);
  }

  terminal(const terminal&) = delete;
  terminal& operator=(const terminal&) = delete;

  void type(const std::string& keys) {
    size_t done = 0;
    while (done < keys.size()) {
      auto n = ::write(master_, keys.data() + done, keys.size() - done);
      if (n < 0 && errno == EINTR)
        continue;
      REQUIRE(n > 0);
      done += static_cast<size_t>(n);
    }
  }

  /// Waits until `text` shows after what the last expect() matched, and
  /// returns what showed before it.
  std::string expect(const std::string& text, const std::string& what,
                     std::chrono::milliseconds timeout = 20s) {
    size_t at = std::string::npos;
    bool seen = af::eventually(
      [&] {
        drain();
        at = screen_.find(text, mark_);
        return at != std::string::npos;
      },
      timeout);
    if (!seen)
      FAIL("waited " << timeout.count() / 1000 << " s for " << what << " (\"" << visible(text)
                     << "\"); the terminal showed after the last match:\n"
                     << visible(screen_.substr(mark_)));
    std::string before = screen_.substr(mark_, at - mark_);
    mark_ = at + text.size();
    return before;
  }

  /// Waits for the program to exit; its wait status.
  int wait_exit(const std::string& what, std::chrono::milliseconds timeout = 20s) {
    int status = 0;
    bool exited = af::eventually(
      [&] {
        drain(); // it may be blocked writing its last lines
        return ::waitpid(pid_, &status, WNOHANG) == pid_;
      },
      timeout);
    if (!exited)
      FAIL("waited " << timeout.count() / 1000 << " s for the REPL to exit after " << what
                     << "; the terminal showed after the last match:\n"
                     << visible(screen_.substr(mark_)));
    pid_ = -1;
    return status;
  }

private:
  void drain() {
    char buf[4096];
    for (;;) {
      auto n = ::read(master_, buf, sizeof buf);
      if (n > 0)
        screen_.append(buf, static_cast<size_t>(n));
      else if (!(n < 0 && errno == EINTR))
        return; // EAGAIN: nothing more now; EIO: the program is gone
    }
  }

  pid_t pid_ = -1;
  int master_ = -1;
  std::string screen_;
  size_t mark_ = 0;
};

/// libedit's history file: a header line, then one entry a line with
/// blanks as \040 (strvis).
std::vector<std::string> read_history(const std::string& path) {
  std::ifstream in{path};
  std::vector<std::string> entries;
  std::string line;
  while (std::getline(in, line)) {
    if (line == "_HiStOrY_V2_")
      continue;
    std::string entry;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 3 < line.size()
          && std::isdigit(static_cast<unsigned char>(line[i + 1]))) {
        entry += static_cast<char>(std::stoi(line.substr(i + 1, 3), nullptr, 8));
        i += 3;
      } else if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '\\') {
        entry += '\\';
        i += 1;
      } else {
        entry += line[i];
      }
    }
    while (!entry.empty() && entry.back() == ' ')
      entry.pop_back(); // a completed word is followed by a blank
    entries.push_back(entry);
  }
  return entries;
}

bool holds(const std::vector<std::string>& entries, const std::string& entry) {
  for (const auto& e : entries)
    if (e == entry)
      return true;
  return false;
}

} // namespace

TEST_CASE("a user at a terminal completes a name with Tab, recalls a command with Up, stops a "
          "wait with Ctrl-C and leaves with Ctrl-D",
          "[repl][pty]") {
  af::testing::temp_dir home;
  REQUIRE(!home.path.empty());
  terminal repl{{"--embedded", "ps=1,worker=1"}, home.path};
  const std::string prompt = "actorflow> ";
  repl.expect(prompt, "the first prompt");

  repl.type("weights = variable(\"weights\", [2], 3)\r");
  CHECK_THAT(repl.expect(prompt, "the prompt after binding weights"),
             !Catch::Contains("error"));
  repl.type("init\r");
  CHECK_THAT(repl.expect(prompt, "the prompt after init"), !Catch::Contains("error"));

  // A statement left open goes on on the next line.
  repl.type("w2 = variable(\"w2\", [2],\r");
  repl.expect("...> ", "the continuation prompt of an open call");
  repl.type("4)\r");
  CHECK_THAT(repl.expect(prompt, "the prompt after the call was closed"),
             !Catch::Contains("error"));

  repl.type("run wei\t");
  // libedit redraws only what changed: "wei" stays, "ghts" is added.
  repl.expect("ghts", "Tab completing 'wei' to 'weights'");
  repl.type("\r");
  repl.expect("[3. 3.]", "the value of weights");
  repl.expect(prompt, "the prompt after run weights");

  repl.type("\x1b[A"); // Up
  repl.expect("run weights", "Up recalling 'run weights'");
  repl.type("\r");
  repl.expect("[3. 3.]", "the value of weights, run again from the history");
  repl.expect(prompt, "the prompt after the recalled command");

  // Ctrl-C at the prompt drops the line being typed.
  repl.type("print \"dropped\"");
  repl.expect("print \"dropped\"", "the echo of a line that Ctrl-C will drop");
  repl.type("\x03");
  repl.expect(prompt, "a fresh prompt after Ctrl-C at the prompt");

  repl.type("u = variable(\"u\", [1])\r");
  CHECK_THAT(repl.expect(prompt, "the prompt after binding u"), !Catch::Contains("error"));
  repl.type("print \"waiting\"; wait 60s u\r");
  // "waiting" shows once the command runs: the Ctrl-C after it lands in the
  // wait itself (not before the command began, which says so differently).
  repl.expect("\r\nwaiting\r\n", "the command's first output, before its wait");
  auto interrupted_at = std::chrono::steady_clock::now();
  repl.type("\x03");
  repl.expect("wait: cancelled", "the wait's error after Ctrl-C");
  repl.expect(prompt, "the prompt after the interrupted wait");
  repl.type("print \"alive\"\r");
  repl.expect("\r\nalive\r\n", "the answer of print \"alive\" after Ctrl-C");
  repl.expect(prompt, "the prompt after print");
  CHECK(std::chrono::steady_clock::now() - interrupted_at < 30s);

  repl.type("\x04"); // Ctrl-D on an empty line
  int status = repl.wait_exit("Ctrl-D");
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  auto history = read_history(home / ".actorflow_history");
  INFO("history entries: " << history.size());
  CHECK(holds(history, "weights = variable(\"weights\", [2], 3)"));
  CHECK(holds(history, "init"));
  CHECK(holds(history, "w2 = variable(\"w2\", [2],\n4)"));
  CHECK(holds(history, "run weights"));
  CHECK(holds(history, "print \"waiting\"; wait 60s u"));
  CHECK(holds(history, "print \"alive\""));
  CHECK_FALSE(holds(history, "print \"dropped\""));
}
