#pragma once
/// The REPL's interpreter (docs/repl.md): runs parsed statements against a
/// cluster through sessions (actors/session.hpp), one per task the user
/// switches to, each with its own graph and names, as each TF client process
/// has. It owns the cluster it talks to: an embedded one (--embedded
/// ps=1,worker=2) or, for a config file, an actor system of its own that
/// connects to the node processes.
///
/// Output goes to the `out` stream given to execute(), errors to `err`. An
/// error ends the statement that failed (and the rest of that input); the
/// interpreter stays usable. interrupt() (from a signal handler: it only sets
/// an atomic flag) abandons the running command: a run's request is dropped
/// by the session, waits and loops stop within 50 ms.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "config/cluster_spec.hpp"
#include "core/tensor_format.hpp"

namespace af::repl {

struct options {
  print_options print;                         ///< --precision
  std::chrono::milliseconds timeout{10000};    ///< each cluster request (--timeout)
  bool echo = false;                           ///< print each statement before it runs
  /// Called with each statement typed (not those inside a block) just
  /// before it runs (tools that log; tests that must know a command began).
  std::function<void(const std::string&)> on_statement;
};

class interpreter {
public:
  /// An embedded cluster of `jobs` (job -> task count) in this process; the
  /// session starts on `target` ("" : the first worker task, else task 0 of
  /// the first job).
  static caf::expected<std::unique_ptr<interpreter>>
  embedded(const std::map<std::string, int>& jobs, const std::string& target, options opts);

  /// A client of the cluster of `config` (its nodes run elsewhere): a
  /// session of `target` ("/job:worker/task:0").
  static caf::expected<std::unique_ptr<interpreter>>
  connect(const cluster_config& config, const std::string& target, options opts);

  ~interpreter();

  /// Parses and runs `text` (one or more statements). Returns false if
  /// something failed (said on `err`). quit_requested() tells if it asked
  /// to leave.
  /// `first_line`: the line of a script `text` starts at (errors name it).
  bool execute(const std::string& text, std::ostream& out, std::ostream& err,
               size_t first_line = 1);

  bool quit_requested() const;

  /// Candidates for completing `word`, the word before the cursor (a device
  /// name whole, from its first '/'), given the `line` up to the cursor:
  /// commands at the start, then functions and op names, names bound in
  /// this session, variable names seen in its graph and listings, words that
  /// follow the command (feed, train's subcommands); device names of the
  /// cluster when `word` starts with '/'.
  std::vector<std::string> complete(const std::string& line, const std::string& word);

  /// Abandons the running command (async-signal-safe: sets a flag). The
  /// flag stays set until clear_interrupt(): the caller clears it before it
  /// starts a command, so that an interrupt that comes just as the command
  /// starts is not lost.
  void interrupt() noexcept;
  void clear_interrupt() noexcept;

  /// The prompt: "actorflow> ", or "actorflow(/job:worker/task:1)> " when
  /// the session is not the one it started with.
  std::string prompt() const;

  struct state;

private:
  explicit interpreter(std::unique_ptr<state> st);
  std::unique_ptr<state> st_;
};

/// "ps=1,worker=2" -> {{"ps",1},{"worker",2}}; errors name the bad part.
caf::expected<std::map<std::string, int>> parse_jobs(const std::string& text);

} // namespace af::repl
