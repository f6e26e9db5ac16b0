#pragma once
/// The interpreter's state (interpreter.hpp's interpreter::state), shared by
/// the files that implement it, one job each:
///   interpreter.cpp     the public interpreter, its sessions, completion
///   values.cpp          values, tensors from literals, printing
///   statements.cpp      expressions and statements
///   builtins.cpp        the functions expressions call, and the kernel ops
///   commands.cpp        the commands (run, trace, vars, save, ...)
///   train_commands.cpp  train start/status/mode/wait/stop
/// Internal to the REPL: nothing outside repl/ includes it.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/session.hpp"
#include "actors/system.hpp"
#include "dist/embedded_cluster.hpp"
#include "dist/training.hpp"
#include "kernels/shard_routing.hpp"
#include "messages/error.hpp"
#include "repl/interpreter.hpp"
#include "repl/parser.hpp"
#include "train/config.hpp"

namespace af::repl {

using ms = std::chrono::milliseconds;

/// Wide enough for a literal's exact value (|x| < 2^64) and the sum,
/// difference or product of two of them checked for overflow.
__extension__ typedef __int128 wide_int;

std::string wide_text(wide_int x);

/// An error of one statement: where it points (column 0: nowhere) and why.
struct repl_error {
  position at;
  std::string message;
  bool statement = false; ///< `at` is the failed statement's start (a cluster error)
};

[[noreturn]] inline void fail(position at, std::string message) {
  throw repl_error{at, std::move(message)};
}

[[noreturn]] inline void fail(std::string message) {
  throw repl_error{position{0, 0}, std::move(message)};
}

/// A cluster error: the library's own message, which names the node,
/// variable or device.
[[noreturn]] inline void fail(const caf::error& err, const std::string& doing = "") {
  fail(doing.empty() ? describe(err) : doing + ": " + describe(err));
}

/// What an expression evaluates to.
struct value {
  enum class kind { none, number, boolean, text, tensor, node, list, init };
  kind what = kind::none;
  double number = 0;
  bool integral = false;
  /// A whole number's exact value, as in expr (`number` is the nearest
  /// double): what an int32/int64 tensor takes.
  bool exact = false;
  bool negative = false;
  uint64_t magnitude = 0;
  std::string text;
  tensor t;
  output o;
  std::vector<value> items;
  initializer init;
  std::string source; ///< the expression it came from (labels of run's values)
};


// -- small helpers (values.cpp) ----------------------------------------------

const char* kind_name(value::kind k);
/// A whole number's exact value, if it has one.
std::optional<wide_int> exact_of(const value& v);
/// Makes `x` the exact value of `v` when |x| < 2^64 (else `v` has none).
void set_exact(value& v, wide_int x);
std::optional<dtype> parse_dtype(const std::string& s);
/// "500ms", "2s", "1m" (a bare number is refused: 10 could mean either).
std::optional<ms> parse_duration(const std::string& s);
/// `s` as it may reach a terminal: control bytes (a name typed with an
/// escape sequence, echoed back by the cluster) as \xNN, at most `limit`
/// characters; `keep_lines` keeps newlines and tabs (a message of several
/// lines).
std::string escaped(const std::string& s, size_t limit, bool keep_lines);
/// An error message: at most 2,000 characters.
std::string printable_message(const std::string& s);
/// A name or word quoted in a message: at most 60 characters.
std::string printable(const std::string& s);
/// A number as a person writes it ("2.5", "3e+10").
std::string number_text(double x);
/// "/job:ps/task:0" -> (ps, 0); the message names the word and what to write.
std::pair<std::string, int32_t> parse_task(const word& w, const cluster_spec& spec);
std::string task_name(const std::string& job, int32_t task);
std::string shape_text(const shape_type& s);
/// Left-aligned columns.
std::string table(const std::vector<std::vector<std::string>>& rows);

/// A training job started by `train start`, running in the background: one
/// thread per worker task, each with a session of its own.
struct train_job {
  train::train_config cfg;
  std::string file;
  std::mutex m;
  std::condition_variable cv;
  size_t running = 0;
  std::string last_progress;
  double last_loss = -1; ///< the chief's last reported training loss
  std::vector<std::string> failures;
  std::optional<train_outcome> chief;
  std::vector<std::thread> threads;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);

  ~train_job() {
    stop->store(true); // each worker ends before its next step
    for (auto& t : threads)
      if (t.joinable())
        t.join();
  }
};


/// One task's client: its session, its graph's names.
struct client {
  std::string target; ///< "/job:worker/task:0"
  session s;
  std::map<std::string, value> names;
  /// Constant nodes by (scope, value) hash: `w + 1` typed again, or in a
  /// repeat, reuses its Const instead of growing the graph every time.
  std::multimap<uint64_t, output> constants;
  /// restore's (placeholder, assign) of each variable, made once.
  std::map<std::string, std::pair<output, output>> restore_ops;
  /// The strategy each partitioned_table of this session was declared with
  /// (embedding_lookup routes by it unless told otherwise).
  std::map<std::string, kernels::partition_strategy> table_strategies;
};

struct interpreter::state {
  options opts;
  std::unique_ptr<embedded_cluster> embedded;
  std::unique_ptr<system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  cluster_spec spec;
  std::map<std::string, std::unique_ptr<client>> clients;
  client* current = nullptr;
  std::string first_target;
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  std::optional<run_trace> last_trace;
  bool quit = false;
  std::unique_ptr<train_job> job;
  std::set<std::string> known_variables; ///< seen in graphs and listings (completion)
  std::ostream* out = nullptr;
  int open_scopes = 0; ///< with blocks being run
  static constexpr size_t max_graph_nodes = 200000;

  ~state() {
    job.reset(); // its threads use sessions of the cluster below
    clients.clear();
  }

  session& sess() { return current->s; }
  bool cancelled() const { return cancel->load(); }

  /// A call's arguments, evaluated: positional ones, then keyword ones.
  struct args_view {
    std::vector<value> positional;
    std::vector<position> positional_at;
    std::map<std::string, std::pair<value, position>> keyword;
    position at;
    std::string fn;

    const value* get(size_t index, const std::string& key, position* where = nullptr) const {
      if (auto it = keyword.find(key); it != keyword.end()) {
        if (where)
          *where = it->second.second;
        return &it->second.first;
      }
      if (index < positional.size()) {
        if (where)
          *where = positional_at[index];
        return &positional[index];
      }
      return nullptr;
    }
  };

  // -- sessions (interpreter.cpp) ----------------------------------------------
  session_options session_opts() const;
  /// `cancellable`: the REPL's own sessions are (Ctrl-C); a training job's
  /// are not (its workers are stopped through train_options::stop).
  caf::expected<session> make_session(const std::string& job, int32_t task,
                                      bool cancellable = true);
  client& use(const std::string& job, int32_t task);
  std::string prompt_text() const;
  /// Sleeps up to `d` in slices; false if Ctrl-C came.
  bool pause(ms d);

  // -- values and printing (values.cpp) ----------------------------------------
  /// A list literal of numbers as a tensor (nested lists: rows), float32
  /// unless `type` says otherwise.
  tensor to_tensor(const value& v, position at, dtype type = dtype::float32);
  /// t[i] = v, refusing what the dtype cannot hold (a cast would be
  /// undefined). An integer tensor takes a whole number's exact value, never
  /// the double nearest to it (2^53 + 1 is not a double).
  static void store(tensor& t, size_t i, const value& v, position at);
  void flatten(const value& v, position at, size_t depth, shape_type& shape,
               std::vector<bool>& rows, std::vector<const value*>& flat);
  bool is_numeric_list(const value& v) const;
  /// The dtype of a graph value when the graph knows it (variables,
  /// constants); float32 otherwise.
  dtype dtype_of(const value& v);
  /// A graph node of the current session for `v`: constants become Const nodes.
  output to_node(const value& v, position at, dtype literal_type = dtype::float32);
  /// The Const node for `t` under the current scopes, made once.
  output constant_node(tensor t);
  value node_value(output o, const std::string& source);
  std::string describe_node(output o);
  /// What `print` and an expression statement show; `at` is the
  /// expression's position, for a list literal that turns out ragged.
  std::string show(const value& v, position at);

  // -- expressions and statements (statements.cpp) -----------------------------
  value eval(const expr& e);
  std::string nearest_name(const std::string& n);
  value binary(const expr& e);

  // -- functions (builtins.cpp) ------------------------------------------------
  static const std::vector<std::pair<std::string, std::string>>& builtins();
  static std::vector<std::string> function_names();
  static std::string function_help(const std::string& name);
  /// How to call the builtin or op `name` ("softplus(x)"), or "" when no
  /// function has that name.
  static std::string function_example(const std::string& name);
  value call(const std::string& fn, const expr& e, std::optional<value> receiver);
  void check_arity(const args_view& a, size_t min, size_t max, const std::vector<std::string>& keys);
  std::string text_arg(const args_view& a, size_t i, const std::string& key, const std::string& what);
  double number_arg(const args_view& a, size_t i, const std::string& key, double fallback);
  bool bool_arg(const args_view& a, const std::string& key);
  shape_type shape_arg(const value& v, position at, const std::string& fn);
  dtype dtype_arg(const args_view& a);
  /// A tensor of `shape` holding the scalar `one`'s element (its dtype's own
  /// bits, not through a double).
  static tensor filled_exact(const tensor& one, const shape_type& shape, position at);
  initializer init_arg(const value& v, position at, shape_type& shape, bool shape_given, dtype type);
  /// A call of `a.fn`: a builtin function, else a kernel op (call_op).
  value call_builtin(const std::string& fn, const args_view& a);
  value call_variable(const args_view& a);
  value call_const(const args_view& a);
  value call_fill(const std::string& fn, const args_view& a);        ///< zeros, ones, fill
  value call_random_init(const std::string& fn, const args_view& a); ///< uniform, normal
  value call_placeholder(const args_view& a);
  value call_gradients(const args_view& a);
  value call_assign(const std::string& fn, const args_view& a); ///< assign, assign_add, assign_sub
  value call_device_of(const args_view& a);
  // -- sparse training (embedding_builtins.cpp) --------------------------------
  /// strategy= (or partition_strategy=): mod, div or contiguous; `fallback` if not given.
  kernels::partition_strategy strategy_arg(const args_view& a,
                                           kernels::partition_strategy fallback);
  /// partitioned_table(NAME, SHAPE, DEVICES, INIT=0, strategy="mod"): the
  /// shard variables NAME/part_i, shard i on DEVICES[i], as a list.
  value call_partitioned_table(const args_view& a);
  /// embedding_lookup(PARAMS, IDS): a gather of one table, or the
  /// partitioned lookup (graph/embedding.hpp) over a list of shards.
  value call_embedding_lookup(const args_view& a);
  /// sparse_gradients(LOSS, X or [X, ...]): each gradient as [ids, values]
  /// where it is sparse (a table read through a lookup), else dense.
  value call_sparse_gradients(const args_view& a);

  // -- ops (builtins.cpp): read from the op registry (kernels/op_registry.hpp) --
  /// The help line of the op `name` (its graph name or its function name:
  /// sum, reduce_sum); "" if there is none.
  static std::string op_help(const std::string& name);
  /// `fn(a...)` as the op `fn` (reduce_sum: sum); nothing if no op has that
  /// name.
  std::optional<value> call_op(const std::string& fn, const args_view& a);

  // -- statements (statements.cpp) ---------------------------------------------
  /// `top`: statements the user typed, not those of a block (--echo prints
  /// only those).
  void run_program(const std::vector<stmt>& program, bool top = false);
  /// Every evaluation adds ops, as in TF 1.x: a loop that builds ops each
  /// round would grow the graph (and the REPL's memory) without bound. Only
  /// what makes ops is refused at the cap: print, help, reset still work.
  void check_graph_size();
  void statement(const stmt& st);

  // -- commands (commands.cpp) -------------------------------------------------
  void expect_words(const stmt& st, size_t min, size_t max);
  std::vector<output> named_variables(const stmt& st, size_t from);
  void command(const stmt& st);
  void help(const stmt& st);
  std::string node_line(const std::string& job, int32_t task, const node_info& info);
  void cluster_cmd(const stmt& st);
  void devices_cmd(const stmt& st);
  void run_cmd(const stmt& st);
  void trace_cmd(const stmt& st);
  void vars_cmd(const stmt& st);
  void wait_cmd(const stmt& st);
  void save_cmd(const stmt& st);
  void restore_cmd(const stmt& st);

  // -- training commands (train_commands.cpp) ----------------------------------
  void train_cmd(const stmt& st);
  bool train_running();
  void train_start(const stmt& st);
  std::string train_result_text();
  void train_status();
  void train_wait(const stmt& st, ms total);
};

} // namespace af::repl
