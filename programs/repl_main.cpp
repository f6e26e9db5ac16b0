// actorflow-repl: a read-eval-print loop on an actorflow cluster
// (docs/repl.md; the language is in repl/parser.hpp, the work in
// repl/interpreter.hpp).
//
//   actorflow-repl                                    # embedded: 1 ps + 2 workers
//   actorflow-repl --embedded ps=2,worker=4 --job worker --task 1
//   actorflow-repl --config cluster.toml              # nodes started by actorflow-node
//   actorflow-repl --script steps.af --echo           # or: actorflow-repl < steps.af
//
// On a terminal it edits lines with libedit (history in ~/.actorflow_history,
// Tab completes names); a statement left open ('{', '(', '[', a string)
// continues on the next line. Ctrl-C abandons the running command, or the
// line being typed; Ctrl-D on an empty line or `quit` leaves.
// Exit codes: 0 done; 1 a command of a script failed; 2 bad usage, or the
// cluster could not be started or reached; 130 a script stopped by SIGINT.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <editline/readline.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cwchar>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/log.hpp"
#include "config/cluster_spec.hpp"
#include "messages/error.hpp"
#include "repl/interpreter.hpp"
#include "repl/parser.hpp"
#include "programs/last_resort.hpp"

namespace {

int fail(const std::string& msg, int code = 2) {
  std::cout.flush();
  std::fprintf(stderr, "actorflow-repl: %s\n", msg.c_str());
  std::fflush(stderr);
  return code;
}

// --- signals. SIGINT may land on any thread: CAF's, and OpenBLAS's, which
// start before main. The handler touches only atomics, interrupt()
// (async-signal-safe), write, pthread_kill and _exit.
//
// libedit's own signal handling is off (rl_catch_signals = 0): on SIGINT it
// re-raises the signal to the process group from inside its handler, and
// that second delivery lands on some other thread at some later time, after
// readline() has returned, where it would cancel the next command. libedit
// reads keys through read_key() instead, which cannot miss a Ctrl-C.

af::repl::interpreter* the_interpreter = nullptr; // set before the handler is installed
bool script_mode = false;                          // likewise
pthread_t main_thread;                             // likewise
std::atomic<bool> command_running{false};
std::atomic<bool> reading_line{false}; // main is in readline(): the terminal echoes nothing
volatile sig_atomic_t sigint_seen = 0;
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_sigint(int) {
  int saved_errno = errno;
  if (reading_line.load() && !pthread_equal(pthread_self(), main_thread)) {
    ::pthread_kill(main_thread, SIGINT); // read_key() must wake up
  } else {
    sigint_seen = 1;
    if (script_mode && !command_running.load())
      _exit(130); // between a script's commands (maybe blocked reading stdin)
    if (!script_mode && !reading_line.load()) {
      // The terminal echoed "^C": the command's error goes on the next line.
      [[maybe_unused]] auto n = ::write(STDOUT_FILENO, "\n", 1);
    }
    if (command_running.load())
      the_interpreter->interrupt();
  }
  errno = saved_errno;
}

void install_sigint_handler() {
  struct sigaction action {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART; // a command's output is not cut short
  sigaction(SIGINT, &action, nullptr);
}

/// libedit's source of keys (rl_getc_function): the next character typed,
/// or -1 (end of input: readline() returns NULL) once Ctrl-C was pressed.
/// SIGINT is blocked but while ppoll() waits, so one that comes between the
/// check of the flag and the wait still ends the wait.
int read_key(FILE* /* in */) {
  sigset_t sigint, saved, waiting;
  sigemptyset(&sigint);
  sigaddset(&sigint, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigint, &saved);
  waiting = saved;
  sigdelset(&waiting, SIGINT);
  std::mbstate_t state{};
  int key = -1;
  while (sigint_seen == 0) {
    pollfd in{STDIN_FILENO, POLLIN, 0};
    if (::ppoll(&in, 1, nullptr, &waiting) < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    char byte = 0;
    auto n = ::read(STDIN_FILENO, &byte, 1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break; // the terminal is gone
    wchar_t wide = 0;
    auto used = std::mbrtowc(&wide, &byte, 1, &state);
    if (used == static_cast<size_t>(-2))
      continue; // more bytes of a multibyte character
    key = used == static_cast<size_t>(-1) ? static_cast<unsigned char>(byte) : static_cast<int>(wide);
    break;
  }
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  return key;
}

/// Runs one complete statement text. A Ctrl-C while it runs abandons it; one
/// pressed after its Enter but before it began keeps it from running. The
/// interrupt flag is cleared before command_running is set, so a Ctrl-C from
/// then on reaches the command.
bool run_command(af::repl::interpreter& interp, const std::string& text, size_t first_line = 1) {
  interp.clear_interrupt();
  command_running.store(true);
  if (sigint_seen) {
    command_running.store(false);
    std::cerr << "error: cancelled (Ctrl-C before it ran)" << std::endl;
    return false;
  }
  bool ok = interp.execute(text, std::cout, std::cerr, first_line);
  std::cout.flush();
  command_running.store(false);
  return ok;
}

/// Nothing to run: blanks and comments only.
bool nothing_to_run(const std::string& text) {
  auto parsed = af::repl::parse(text);
  return !parsed.error && parsed.program.empty();
}

/// Appends `line` to a statement being read (lines joined by '\n', none
/// after the last: a one-line statement's errors then say just "column N").
void append_line(std::string& pending, std::string line) {
  if (!line.empty() && line.back() == '\r')
    line.pop_back(); // a script written on Windows
  if (!pending.empty())
    pending += '\n';
  pending += line;
}

// --- scripts (--script FILE, or stdin when it is not a terminal)

/// The longest line a script may have: an endless one (/dev/zero) is refused
/// instead of filling memory.
constexpr size_t max_line_bytes = size_t{1} << 20;

/// The longest statement (a block) a script may have: one that never closes
/// is refused instead of filling memory.
constexpr size_t max_statement_bytes = size_t{64} << 20;

/// std::getline with a bound: false at the end of the input; `too_long` when
/// the line ran past max_line_bytes (the rest of it is not read).
bool read_line(std::istream& in, std::string& line, bool& too_long) {
  line.clear();
  too_long = false;
  std::streambuf* buf = in.rdbuf();
  for (;;) {
    int c = buf->sbumpc(); // may throw on a read error (caught by the caller)
    if (c == std::char_traits<char>::eof())
      return !line.empty();
    if (c == '\n')
      return true;
    if (line.size() >= max_line_bytes) {
      too_long = true;
      return true;
    }
    line += static_cast<char>(c);
  }
}

int run_script(af::repl::interpreter& interp, std::istream& in, bool keep_going) {
  bool failed = false;
  std::string pending, line;
  size_t line_number = 0, first_line = 1; // of `pending`
  int balance = 0;                         // brackets `pending` leaves open
  auto run_pending = [&]() -> int {
    std::string text;
    text.swap(pending);
    size_t starts_at = first_line;
    first_line = line_number + 1;
    balance = 0;
    if (nothing_to_run(text))
      return -1;
    bool ok = run_command(interp, text, starts_at);
    if (sigint_seen)
      return 130;
    if (!ok) {
      failed = true;
      if (!keep_going)
        return 1;
    }
    return interp.quit_requested() ? (failed ? 1 : 0) : -1;
  };
  bool too_long = false;
  size_t pending_lines = 0;
  for (;;) {
    try {
      if (!read_line(in, line, too_long))
        break;
    } catch (const std::exception& e) {
      std::cerr << "error after line " << line_number << ": reading the script failed (" << e.what()
                << ")" << std::endl;
      return 1;
    }
    line_number += 1;
    if (too_long) {
      std::cerr << "error at line " << line_number << ": the line is longer than "
                << max_line_bytes << " bytes; is this a script?" << std::endl;
      return 1;
    }
    append_line(pending, line);
    pending_lines += 1;
    if (pending.size() > max_statement_bytes) {
      std::cerr << "error at line " << first_line << ": the statement that starts there is still "
                << "open after " << pending_lines << " lines (" << pending.size()
                << " bytes): a '{', '[' or '(' is not closed" << std::endl;
      return 1;
    }
    // While brackets are open the statement cannot be complete, but a parse
    // error inside it can show already: a short statement is parsed at each
    // line (so an error is reported at its line, not lines later), a long
    // block only when its brackets may have closed (parsing it at each of
    // its n lines would cost n^2).
    balance += af::repl::bracket_balance(line);
    if (balance > 0 && pending_lines > 200)
      continue;
    if (af::repl::incomplete(pending))
      continue;
    pending_lines = 0;
    if (int rc = run_pending(); rc >= 0)
      return rc;
  }
  // The input ended inside a block, list or string: running it lets the
  // parser say what is missing.
  if (!pending.empty())
    if (int rc = run_pending(); rc >= 0)
      return rc;
  return failed ? 1 : 0;
}

// --- the terminal: libedit through its readline interface

std::vector<std::string> completion_candidates;

char* next_candidate(const char* /* word */, int state) {
  static size_t next = 0;
  if (state == 0)
    next = 0;
  if (next < completion_candidates.size())
    return ::strdup(completion_candidates[next++].c_str());
  return nullptr;
}

/// Where the device name that ends `line` begins ("ping /job:ps/ta"), or
/// npos. libedit's word stops at the last '/', which would leave the
/// interpreter only "ta" to complete.
size_t device_name_start(const std::string& line) {
  auto before = line.find_last_of(" \t\n\"'([,=+-*@;{");
  size_t start = before == std::string::npos ? 0 : before + 1;
  return start < line.size() && line[start] == '/' ? start : std::string::npos;
}

char** complete_word(const char* word, int /* start */, int /* end */) {
  rl_attempted_completion_over = 1; // never fall back to file names
  completion_candidates.clear();
  try {
    std::string line = rl_line_buffer != nullptr ? rl_line_buffer : "";
    line.resize(std::min(line.size(), static_cast<size_t>(std::max(rl_point, 0))));
    std::string typed = word;
    // The candidates extend `whole`; libedit replaces only `typed`, its tail.
    std::string whole = typed;
    if (auto start = device_name_start(line); start != std::string::npos)
      whole = line.substr(start);
    if (whole.size() < typed.size() || whole.compare(whole.size() - typed.size(), typed.size(), typed) != 0)
      whole = typed;
    for (const auto& c : the_interpreter->complete(line, whole))
      // A candidate that does not extend the word would replace what was typed.
      if (c.compare(0, whole.size(), whole) == 0)
        completion_candidates.push_back(c.substr(whole.size() - typed.size()));
  } catch (const std::exception&) {
    return nullptr; // no completion rather than no REPL
  }
  std::sort(completion_candidates.begin(), completion_candidates.end());
  completion_candidates.erase(std::unique(completion_candidates.begin(), completion_candidates.end()),
                              completion_candidates.end());
  if (completion_candidates.empty())
    return nullptr;
  return rl_completion_matches(word, next_candidate);
}

/// "      ...> ": as wide as `prompt`, so that continued lines line up.
std::string continuation_prompt(const std::string& prompt) {
  const std::string dots = "...> ";
  return std::string(prompt.size() > dots.size() ? prompt.size() - dots.size() : 0, ' ') + dots;
}

/// The history file: read at the start, written after each command (a
/// killed REPL keeps what was typed) and at the end. Empty path: none.
class history_file {
public:
  explicit history_file(std::string path) : path_(std::move(path)) {
    using_history();
    stifle_history(1000);
    if (path_.empty())
      return;
    if (int err = read_history(path_.c_str()); err != 0 && err != ENOENT)
      warn("cannot read", err);
    // It holds what was typed: readable by its owner only.
    int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0)
      ::close(fd);
  }

  void add(const std::string& entry) {
    add_history(entry.c_str());
    save();
  }

  void save() {
    if (path_.empty())
      return;
    if (int err = write_history(path_.c_str()); err != 0)
      warn("cannot write", err);
  }

private:
  void warn(const char* what, int err) {
    if (warned_)
      return;
    warned_ = true;
    fail(std::string{what} + " the history file " + path_ + ": " + std::strerror(err)
         + "; pass --history FILE or --no-history");
  }

  std::string path_;
  bool warned_ = false;
};

int run_interactive(af::repl::interpreter& interp, const std::string& history_path,
                    const std::string& banner) {
  // Set before the first libedit call (history_file's), which reads them.
  rl_catch_signals = 0;
  rl_getc_function = read_key;
  std::setlocale(LC_CTYPE, ""); // keys and lines in the terminal's encoding
  rl_readline_name = const_cast<char*>("actorflow");
  rl_attempted_completion_function = complete_word;
  // Names after "(" or an operator complete too.
  rl_basic_word_break_characters = " \t\n\"'([,=+-*/@;{";
  history_file history{history_path};
  std::cout << banner << std::endl;
  std::string pending;
  for (;;) {
    std::string prompt = interp.prompt();
    if (!pending.empty())
      prompt = continuation_prompt(prompt);
    rl_resize_terminal(); // libedit no longer follows SIGWINCH itself
    sigint_seen = 0;
    reading_line.store(true);
    char* typed = readline(prompt.c_str());
    reading_line.store(false);
    if (typed == nullptr) {
      if (sigint_seen) {
        // Ctrl-C at the prompt: drop what was typed, statement included.
        std::cout << "^C" << std::endl;
        pending.clear();
        continue;
      }
      std::cout << std::endl; // Ctrl-D: the shell's prompt starts on a line of its own
      if (!pending.empty())
        std::cerr << "actorflow-repl: the unfinished statement was not run" << std::endl;
      break;
    }
    append_line(pending, typed);
    std::free(typed);
    if (af::repl::incomplete(pending))
      continue;
    std::string text;
    text.swap(pending);
    if (text.find_first_not_of(" \t") == std::string::npos)
      continue;
    history.add(text);
    if (nothing_to_run(text))
      continue;
    run_command(interp, text);
    if (interp.quit_requested())
      break;
  }
  history.save();
  return 0;
}

/// Why the session's own task does not answer; empty if it does. connect()
/// only sets a session up, so a REPL on a cluster that is not there would
/// otherwise start and fail at each command.
std::string unreachable(af::repl::interpreter& interp, const std::string& target) {
  std::ostringstream out, err;
  if (interp.execute("ping " + target, out, err))
    return {};
  auto why = err.str();
  while (!why.empty() && why.back() == '\n')
    why.pop_back();
  if (why.rfind("error", 0) == 0 && why.find(": ") != std::string::npos)
    why.erase(0, why.find(": ") + 2); // "error at column 6: "
  return why;
}

std::string default_history_path() {
  const char* home = std::getenv("HOME");
  return home != nullptr && *home != '\0' ? std::string{home} + "/.actorflow_history" : "";
}

} // namespace

static int main_body(int argc, char** argv) {
  CLI::App app{"actorflow-repl: type graph statements and commands against an actorflow cluster"};
  std::string embedded, config_path, job, script, history_path;
  int task = -1, precision = 0, timeout_ms = 0;
  bool keep_going = false, echo = false, no_history = false;
  auto* embedded_opt =
    app.add_option("--embedded", embedded,
                   "start a cluster in this process: JOB=TASKS,... (default ps=1,worker=2 when "
                   "there is no --config)");
  app.add_option("-c,--config", config_path,
                 "cluster config (TOML or JSON) of running actorflow-node tasks to talk to")
    ->excludes(embedded_opt);
  app.add_option("-j,--job", job, "the session's task: its job (default worker)");
  app.add_option("-t,--task", task, "the session's task: its index (default 0)")
    ->check(CLI::Range(0, 65535));
  app.add_option("--script", script,
                 "run the commands of FILE and exit (without it, a stdin that is not a terminal "
                 "is read the same way)");
  app.add_flag("--keep-going", keep_going,
               "a script goes on after a command fails (and exits 1 at the end)");
  app.add_flag("--echo", echo, "print each command, after the prompt, before its output");
  app.add_option("--precision", precision, "most digits after the point in printed tensors")
    ->check(CLI::Range(1, 17));
  app.add_option("--timeout", timeout_ms, "each request to the cluster gives up after MS ms")
    ->check(CLI::Range(1, 86400000));
  auto* history_opt = app.add_option("--history", history_path,
                                     "the line history file (default $HOME/.actorflow_history)");
  app.add_flag("--no-history", no_history, "keep no line history")->excludes(history_opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2; // --help: 0
  }

  // A node's info lines would be mixed with the commands' output.
  ::setenv("ACTORFLOW_LOG", "warn", 0);
  af::log::init("actorflow-repl");

  af::repl::options opts;
  if (precision > 0)
    opts.print.precision = precision;
  if (timeout_ms > 0)
    opts.timeout = std::chrono::milliseconds{timeout_ms};
  opts.echo = echo;

  std::ifstream script_file;
  if (!script.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(script, ec))
      return fail("--script " + script + " is a directory; pass a file of REPL statements");
    script_file.open(script);
    if (!script_file)
      return fail("--script " + script + ": cannot read it (" + std::strerror(errno)
                  + "); check the path");
  }
  bool interactive = script.empty() && ::isatty(STDIN_FILENO) == 1;
  script_mode = !interactive;

  if (!job.empty() && task < 0)
    task = 0;
  std::unique_ptr<af::repl::interpreter> interp;
  std::string banner;
  if (!config_path.empty()) {
    auto config = af::load_cluster_config(config_path);
    if (!config)
      return fail(af::describe(config.error()));
    const auto& jobs = config->cluster.jobs();
    if (jobs.empty())
      return fail(config_path + " names no job: add a [cluster] table with its tasks");
    if (job.empty())
      job = config->cluster.has_job("worker") ? "worker" : jobs.begin()->first;
    if (task < 0)
      task = 0;
    auto target = "/job:" + job + "/task:" + std::to_string(task);
    if (auto err = config->cluster.check_task(job, task))
      return fail("--job " + job + " --task " + std::to_string(task) + ": " + af::describe(err)
                  + "; pass a task of " + config_path);
    std::string why;
    auto made = af::repl::interpreter::connect(*config, target, opts);
    if (!made)
      why = af::describe(made.error());
    else
      why = unreachable(**made, target);
    if (!why.empty()) // it names the task and what to do
      return fail(config_path + ": " + why);
    interp = std::move(*made);
    banner = "actorflow-repl: cluster " + config_path + ", session on " + target;
  } else {
    if (embedded.empty())
      embedded = "ps=1,worker=2";
    auto jobs = af::repl::parse_jobs(embedded);
    if (!jobs)
      return fail(af::describe(jobs.error()));
    std::string target;
    if (task >= 0) {
      if (job.empty())
        job = jobs->count("worker") > 0 ? "worker" : jobs->begin()->first;
      auto it = jobs->find(job);
      if (it == jobs->end() || task >= it->second)
        return fail("--job " + job + " --task " + std::to_string(task) + ": the embedded cluster "
                    + embedded + " has no such task; pass one of its tasks");
      target = "/job:" + job + "/task:" + std::to_string(task);
    }
    caf::expected<std::unique_ptr<af::repl::interpreter>> made{caf::error{}};
    try {
      made = af::repl::interpreter::embedded(*jobs, target, opts);
    } catch (const std::exception& e) { // threads or memory the system would not give
      return fail("cannot start the embedded cluster " + embedded + ": " + e.what()
                  + "; try fewer tasks, or --config FILE to use running nodes");
    }
    if (!made)
      return fail("cannot start the embedded cluster " + embedded + ": "
                  + af::describe(made.error())
                  + "; try fewer tasks, or --config FILE to use running nodes");
    interp = std::move(*made);
    banner = "actorflow-repl: embedded cluster " + embedded;
  }
  banner += "; type help for the commands, Ctrl-D or quit to leave";

  the_interpreter = interp.get();
  main_thread = ::pthread_self();
  install_sigint_handler();
  int rc = 0;
  if (interactive)
    rc = run_interactive(*interp, no_history ? "" : history_path.empty() ? default_history_path()
                                                                         : history_path,
                         banner);
  else if (!script.empty())
    rc = run_script(*interp, script_file, keep_going);
  else
    rc = run_script(*interp, std::cin, keep_going);
  std::cout.flush();
  // From here on a Ctrl-C ends the program as it would any other.
  signal(SIGINT, SIG_DFL);
  the_interpreter = nullptr;
  return rc;
}

int main(int argc, char** argv) {
  return af::last_resort("actorflow-repl", [&] { return main_body(argc, argv); });
}
