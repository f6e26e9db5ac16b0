// actorflow-repl's interpreter: the examples/ scripts against an embedded
// cluster and against node processes, the error cases (each followed by a
// command that must still work), completion, save/restore and training.

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kernels/op_registry.hpp"
#include "kernels/table_init.hpp"
#include "process_cluster.hpp"
#include "repl/interpreter.hpp"
#include "repl/parser.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in{path};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string example(const std::string& name) {
  return std::string{ACTORFLOW_SOURCE_DIR} + "/examples/" + name;
}

/// The "# cluster: ps=1,worker=2" line of a script.
std::map<std::string, int> script_jobs(const std::string& text) {
  std::smatch m;
  std::regex re{"# cluster: ([a-z0-9=,]+)"};
  REQUIRE(std::regex_search(text, m, re));
  auto jobs = repl::parse_jobs(m[1]);
  REQUIRE(jobs);
  return *jobs;
}

/// Every line of NAME.expected (comments aside) appears in `output`, in
/// order; a "~ " line is a regex searched for in one output line. Returns
/// the first line not found ("" if all were).
std::string missing_expected(const std::string& expected, const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream out{output};
  for (std::string l; std::getline(out, l);)
    lines.push_back(l);
  size_t at = 0;
  std::istringstream exp{expected};
  for (std::string want; std::getline(exp, want);) {
    if (want.empty() || want[0] == '#')
      continue;
    bool is_regex = want.rfind("~ ", 0) == 0;
    std::regex re{is_regex ? want.substr(2) : std::string{"x"}};
    bool found = false;
    for (; at < lines.size() && !found; ++at)
      found = is_regex ? std::regex_search(lines[at], re) : lines[at] == want;
    if (!found)
      return want;
  }
  return "";
}

/// Runs `text` and returns (ok, stdout, stderr).
struct ran {
  bool ok;
  std::string out;
  std::string err;
};
ran exec(repl::interpreter& in, const std::string& text) {
  std::ostringstream out, err;
  in.clear_interrupt(); // as actorflow-repl does before each command
  bool ok = in.execute(text, out, err);
  return {ok, out.str(), err.str()};
}

std::unique_ptr<repl::interpreter> embedded(const std::map<std::string, int>& jobs,
                                            repl::options opts = {}) {
  auto in = repl::interpreter::embedded(jobs, "", opts);
  REQUIRE(in);
  return std::move(*in);
}

/// One span of a trace: its op, kind and device.
struct span {
  std::string name, kind, device;
  bool operator==(const span& o) const {
    return name == o.name && kind == o.kind && device == o.device;
  }
};

std::ostream& operator<<(std::ostream& os, const span& s) {
  return os << s.name << " (" << s.kind << ") on " << s.device;
}

/// The spans of a Chrome trace-event file, checking its structure on the
/// way: a traceEvents array; each span ("X") with name, cat, ts, dur, pid,
/// tid and its device, on a thread named for that device in a process
/// named for its node (the "M" events before it).
std::vector<span> chrome_spans(const std::string& text) {
  auto json = nlohmann::json::parse(text, nullptr, false);
  REQUIRE_FALSE(json.is_discarded());
  REQUIRE(json.is_object());
  REQUIRE(json.contains("traceEvents"));
  REQUIRE(json["traceEvents"].is_array());
  CHECK(json.value("displayTimeUnit", "") == "ms");
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  std::vector<span> spans;
  for (const auto& ev : json["traceEvents"]) {
    INFO(ev.dump());
    REQUIRE(ev.is_object());
    REQUIRE(ev.contains("name"));
    REQUIRE(ev["name"].is_string());
    REQUIRE(ev.contains("ph"));
    REQUIRE(ev.contains("pid"));
    REQUIRE(ev["pid"].is_number_integer());
    int pid = ev["pid"].get<int>();
    if (ev["ph"] == "M") {
      REQUIRE(ev["args"]["name"].is_string());
      auto label = ev["args"]["name"].get<std::string>();
      if (ev["name"] == "process_name") {
        CHECK(label.rfind("node 127.0.0.1:", 0) == 0);
        processes[pid] = label;
      } else {
        REQUIRE(ev["name"] == "thread_name");
        REQUIRE(ev["tid"].is_number_integer());
        threads[{pid, ev["tid"].get<int>()}] = label;
      }
      continue;
    }
    REQUIRE(ev["ph"] == "X");
    for (const char* key : {"ts", "dur"}) {
      REQUIRE(ev.contains(key));
      REQUIRE(ev[key].is_number());
      CHECK(ev[key].get<double>() >= 0);
    }
    REQUIRE(ev.contains("tid"));
    REQUIRE(ev["tid"].is_number_integer());
    REQUIRE(ev["cat"].is_string());
    REQUIRE(ev["args"]["device"].is_string());
    auto device = ev["args"]["device"].get<std::string>();
    CHECK(processes.count(pid) == 1);
    auto thread = threads.find({pid, ev["tid"].get<int>()});
    REQUIRE(thread != threads.end());
    CHECK(thread->second == device);
    spans.push_back({ev["name"].get<std::string>(), ev["cat"].get<std::string>(), device});
  }
  return spans;
}

/// The spans `trace detail` printed: "OP (KIND): requested R -> DEVICE @ NODE".
std::vector<span> detail_lines(const std::string& out) {
  std::vector<span> spans;
  std::regex line{"^(\\S+) \\((\\w+)\\): requested \\S+ -> (\\S+) @ "};
  std::istringstream in{out};
  for (std::string l; std::getline(in, l);)
    if (std::smatch m; std::regex_search(l, m, line))
      spans.push_back({m[1], m[2], m[3]});
  return spans;
}

const char* examples[] = {"single_device", "shared_variable", "ps_workers", "towers",
                          "model_parallel"};

} // namespace

TEST_CASE("each example script prints the tutorial's values on an embedded cluster",
          "[repl][examples]") {
  for (const char* name : examples) {
    INFO("examples/" << name << ".af");
    auto script = read_file(example(std::string{name} + ".af"));
    auto expected = read_file(example(std::string{name} + ".expected"));
    REQUIRE(!script.empty());
    REQUIRE(!expected.empty());
    auto in = embedded(script_jobs(script));
    auto r = exec(*in, script);
    INFO(r.out << r.err);
    CHECK(r.ok);
    CHECK(r.err.empty());
    CHECK(missing_expected(expected, r.out) == "");
  }
}

TEST_CASE("each example script prints the same values through actorflow-repl against node "
          "processes", "[repl][examples][processes]") {
  for (const char* name : examples) {
    INFO("examples/" << name << ".af");
    auto script = read_file(example(std::string{name} + ".af"));
    auto expected = read_file(example(std::string{name} + ".expected"));
    node_options opts;
    opts.cpu_devices = 2; // towers and model_parallel use cpu:1
    auto cluster = testing::process_cluster::start(script_jobs(script), opts);
    REQUIRE(cluster);
    auto r = testing::run_command({ACTORFLOW_REPL_BINARY, "--config", (*cluster)->config_path(),
                                   "--script", example(std::string{name} + ".af")},
                                  60s);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(missing_expected(expected, r.output) == "");
  }
}

TEST_CASE("the expected-lines matcher fails on a wrong value and on a wrong order",
          "[repl][examples]") {
  // The check above is only as good as this: a value that differs, or lines
  // out of order, must be reported.
  std::string out = "a\n[[7. 7.]\nb\n";
  CHECK(missing_expected("a\n[[7. 7.]\n", out) == "");
  CHECK(missing_expected("a\n[[7. 8.]\n", out) == "[[7. 8.]");
  CHECK(missing_expected("b\na\n", out) == "a");
  CHECK(missing_expected("~ ^\\[\\[7\n", out) == "");
  CHECK(missing_expected("~ ^\\[\\[8\n", out) == "~ ^\\[\\[8");
}

TEST_CASE("errors name what is wrong and the REPL answers the next command",
          "[repl][errors]") {
  auto in = embedded({{"ps", 1}, {"worker", 1}});
  REQUIRE(exec(*in, "with /job:ps/task:0 { w = variable(\"w\", [2, 2], 2) }\ninit").ok);
  auto alive = [&] {
    auto r = exec(*in, "print \"alive\", 1 + 2");
    CHECK(r.ok);
    CHECK(r.out == "alive\n3\n");
  };

  SECTION("a parse error points at its column") {
    auto r = exec(*in, "run w +* b");
    CHECK_FALSE(r.ok);
    CHECK(r.err.find("parse error at column 8:") != std::string::npos);
    CHECK(r.err.find("\n  run w +* b\n         ^") != std::string::npos);
    alive();
  }
  SECTION("an unknown op suggests the nearest name") {
    auto r = exec(*in, "y = relux(w)");
    CHECK_FALSE(r.ok);
    CHECK(r.err.find("error at column 5: unknown function or op 'relux'; did you mean 'relu'?")
          != std::string::npos);
    alive();
  }
  SECTION("a function named without a call says how to call it") {
    // Not "did you mean 'softplus'?" about 'softplus' itself.
    auto r = exec(*in, "run softplus");
    CHECK_FALSE(r.ok);
    INFO(r.err);
    CHECK(r.err.find("error at column 5: 'softplus' is a function: call it, as in softplus(X)")
          != std::string::npos);
    CHECK(r.err.find("did you mean") == std::string::npos);
    r = exec(*in, "run assign_add");
    CHECK(r.err.find("'assign_add' is a function: call it, as in assign_add(VAR, VALUE)")
          != std::string::npos);
    alive();
  }
  SECTION("a name is never suggested for itself") {
    auto r = exec(*in, "run w(1)"); // w is a variable, not a function
    CHECK_FALSE(r.ok);
    INFO(r.err);
    CHECK(r.err.find("unknown function or op 'w'") != std::string::npos);
    CHECK(r.err.find("did you mean 'w'") == std::string::npos);
    alive();
  }
  SECTION("an unknown device names the job") {
    auto r = exec(*in, "with /job:nope/task:0 { v = variable(\"v\", [1]) }\ninit v");
    CHECK_FALSE(r.ok);
    // Not just "nope" (the input has it): that the job is unknown, and the
    // jobs the cluster has instead.
    CHECK(r.err.find("job 'nope' is not in the cluster (jobs: ps, worker)") != std::string::npos);
    alive();
  }
  SECTION("a device string that does not parse") {
    auto r = exec(*in, "with /job:ps/tusk:0 { v = variable(\"v\", [1]) }");
    CHECK_FALSE(r.ok);
    CHECK(r.err.find("error at column 6") != std::string::npos);
    alive();
  }
  SECTION("a shape mismatch at run time names the op and both shapes") {
    auto r = exec(*in, "run matmul([[1, 2, 3]], w)");
    CHECK_FALSE(r.ok);
    INFO(r.err);
    CHECK(r.err.find("op 'matmul'") != std::string::npos); // the input says only "matmul("
    CHECK(r.err.find("[1,3]") != std::string::npos);       // the literal's shape
    CHECK(r.err.find("[2,2]") != std::string::npos);       // w's
    alive();
  }
  SECTION("a wait that times out names the variables still missing") {
    REQUIRE(exec(*in, "u = variable(\"u_never\", [1])").ok);
    auto start = std::chrono::steady_clock::now();
    auto r = exec(*in, "wait 300ms u");
    CHECK_FALSE(r.ok);
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    CHECK(r.err.find("wait: gave up after 300 ms; still without a value: u_never")
          != std::string::npos);
    alive();
  }
  SECTION("a node that is down: the session's error names it") {
    REQUIRE(exec(*in, "shutdown /job:ps/task:0").ok);
    auto r = exec(*in, "run w");
    CHECK_FALSE(r.ok);
    CHECK(r.err.find("/job:ps/task:0") != std::string::npos);
    alive();
  }
  SECTION("a name that is not bound, and a ragged list") {
    auto r = exec(*in, "run w + bb");
    CHECK(r.err.find("error at column 9: 'bb' is not defined") != std::string::npos);
    r = exec(*in, "run w + [[1, 2], [3]]");
    CHECK(r.err.find("ragged") != std::string::npos);
    alive();
  }
  SECTION("the rest of a failed input is not run") {
    auto r = exec(*in, "print \"one\"; run nothing_here; print \"two\"");
    CHECK_FALSE(r.ok);
    CHECK(r.out == "one\n");
    alive();
  }
}

TEST_CASE("feeds, gradients, assign and the trace file", "[repl]") {
  testing::temp_dir dir;
  auto in = embedded({{"ps", 1}, {"worker", 1}});
  auto r = exec(*in, R"(with /job:ps/task:0 { w = variable("w", [2, 2], [[1, 2], [3, 4]]) }
init
x = placeholder("x"); y = matmul(x, w)
run y feed x=[[1, 0], [0, 1]]
g = gradients(reduce_sum(y), w)
run g feed x=[[1, 2], [3, 4]]
trace save )" + dir / "grad.json" + R"(
trace detail
run w.assign_add(1)
trace save )" + dir / "t.json");
  INFO(r.out << r.err);
  REQUIRE(r.ok);
  // x = I gives w back; d sum(x w) / dw = x^T ones = column sums of x per row.
  CHECK(r.out.find("[[1. 2.]\n [3. 4.]]") != std::string::npos);
  CHECK(r.out.find("[[4. 4.]\n [6. 6.]]") != std::string::npos);
  CHECK(r.out.find("[[2. 3.]\n [4. 5.]]") != std::string::npos);

  const std::string worker_cpu = "/job:worker/replica:0/task:0/device:CPU:0";
  const std::string ps_cpu = "/job:ps/replica:0/task:0/device:CPU:0";
  // The gradient step: its ops ran on the worker (the session's task), w
  // came from the ps; the file holds them as `trace detail` lists them.
  auto grad = chrome_spans(read_file(dir / "grad.json"));
  CHECK(grad.size() == detail_lines(r.out).size());
  CHECK(grad == detail_lines(r.out));
  CHECK(std::count(grad.begin(), grad.end(), span{"matmul", "matmul", worker_cpu}) == 1);
  CHECK(std::count(grad.begin(), grad.end(), span{"sum", "sum", worker_cpu}) == 1);
  CHECK(std::count(grad.begin(), grad.end(), span{"w", "transfer", ps_cpu}) == 1);
  // The last run's file holds that run alone: the one assign on the ps.
  auto last = chrome_spans(read_file(dir / "t.json"));
  CHECK(last == std::vector<span>{{"w/assign_add", "assign_add", ps_cpu}});
}

TEST_CASE("save and restore bring the variables back", "[repl]") {
  testing::temp_dir dir;
  auto in = embedded({{"ps", 1}, {"worker", 1}});
  auto r = exec(*in, "with /job:ps/task:0 { a = variable(\"a\", [2], [1, 2]) }\ninit\nsave "
                       + dir / "ck" + "\nrun a.assign([7, 8])\nrestore " + dir / "ck"
                       + "\nrun a");
  INFO(r.out << r.err);
  REQUIRE(r.ok);
  CHECK(r.out.find("saved 1 variable to " + dir / "ck") != std::string::npos);
  CHECK(r.out.find("[7. 8.]") != std::string::npos);
  CHECK(r.out.find("restored 1 variable") != std::string::npos);
  CHECK(r.out.substr(r.out.rfind("variable from")).find("\n[1. 2.]\n") != std::string::npos);

  // A checkpoint with a variable this session has not defined restores nothing.
  auto other = embedded({{"worker", 1}});
  auto r2 = exec(*other, "b = variable(\"b\", [2])\nrestore " + dir / "ck");
  CHECK_FALSE(r2.ok);
  CHECK(r2.err.find("holds a, which this session has not defined") != std::string::npos);
}

TEST_CASE("completion offers commands, names, variables and devices", "[repl]") {
  auto in = embedded({{"ps", 1}, {"worker", 1}});
  REQUIRE(exec(*in, "with /job:ps/task:0 { weights = variable(\"weights_on_ps\", [1]) }").ok);
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  CHECK(has(in->complete("ru", "ru"), "run"));
  CHECK(has(in->complete("run wei", "wei"), "weights"));
  CHECK(has(in->complete("run wei", "wei"), "weights_on_ps"));
  CHECK(has(in->complete("y = mat", "mat"), "matmul"));
  CHECK_FALSE(has(in->complete("y = mat", "mat"), "run"));
  CHECK(has(in->complete("with /job:p", "/job:p"), "/job:ps/task:0"));
}

TEST_CASE("every op of the registry is a REPL function: it runs, help and completion know it",
          "[repl][registry]") {
  auto in = embedded({{"worker", 1}});
  REQUIRE(exec(*in, "x = const([[0.5, 1, 1.5], [2, 0.25, 1.25]])").ok);
  // The arguments of each op by the name users call; an op missing here fails.
  std::map<std::string, std::string> args = {
    {"matmul", "x, x, transpose_b=true"},
    {"reduce_sum", "x, axis=1"},
    {"reduce_mean", "x, axis=-1, keep_dims=true"},
    {"reduce_max", "x"},
    {"softmax_xent", "x, [2, 0]"},
    {"correct_count", "x, [2, 0]"},
    {"gather", "x, const([1, 0, 1], dtype=\"int64\")"},
    {"unique", "const([7, 3, 7], dtype=\"int32\")"},
    {"gather_grad", "x, x, const([1, 1], dtype=\"int32\")"},
    {"unique_idx", "const([7, 3, 7], dtype=\"int64\")"},
    {"unsorted_segment_sum", "x, const([1, 1], dtype=\"int32\"), const(3, dtype=\"int32\")"},
    {"concat", "x, x"},
    {"flatten_rows", "x, const([1, 0], dtype=\"int32\")"},
    {"dynamic_partition", "x, const([1, 0], dtype=\"int32\"), const(2, dtype=\"int32\"), "
                          "const(1, dtype=\"int32\")"},
    {"dynamic_stitch", "const([1, 0], dtype=\"int32\"), x"},
    {"shard_of", "const([4, 0, 6], dtype=\"int64\"), const([3, 2, 2], dtype=\"int64\"), "
                 "const(1, dtype=\"int32\")"},
    {"row_in_shard", "const([4, 0, 6], dtype=\"int64\"), const([3, 2, 2], dtype=\"int64\"), "
                     "const(0, dtype=\"int32\")"},
    {"size", "x"},
    {"range", "const(3, dtype=\"int32\")"},
    {"sum_to", "x, [1, 2, 3]"},
    {"softmax_xent_grad", "[1, 1], x, [2, 0]"},
    {"sum_grad", "[1, 2], x, axis=1"},
    {"mean_grad", "[1, 2], x, axis=1"},
    {"max_grad", "[1, 2], x, [1.5, 2], axis=1"},
  };
  for (const char* op : {"add", "sub", "mul", "div"})
    args[op] = "x, [1, 2, 0.5]";
  for (const char* op : {"neg", "exp", "log", "relu", "sigmoid", "tanh", "square", "sqrt",
                         "softplus", "softmax", "log_softmax", "ones_like"})
    args[op] = "x";
  for (const char* op : {"relu_grad", "sigmoid_grad", "tanh_grad", "softmax_grad",
                         "log_softmax_grad"})
    args[op] = "x, x";
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  auto functions = exec(*in, "help functions");
  REQUIRE(functions.ok);
  for (const auto& def : kernels::op_registry()) {
    std::string name{def.call_name()};
    INFO(name);
    auto it = args.find(name);
    REQUIRE(it != args.end());
    auto r = exec(*in, "run " + name + "(" + it->second + ")");
    CHECK(r.ok);
    CHECK(r.err == "");
    auto help = exec(*in, "help " + name);
    CHECK(help.out.find(std::string{def.help}) != std::string::npos);
    CHECK(help.out.rfind(def.signature(), 0) == 0);
    CHECK(functions.out.find(def.signature() + ": " + std::string{def.help}) != std::string::npos);
    CHECK(has(in->complete(name.substr(0, 4), name.substr(0, 4)), name));
    args.erase(it);
  }
  for (const auto& [name, a] : args)
    FAIL_CHECK("arguments for '" << name << "', which the registry does not have");
  // Keywords come from the op's attributes; labels literals are integers.
  CHECK(exec(*in, "run relu(x, axis=1)").err.find("relu takes no axis=") != std::string::npos);
  auto count = exec(*in, "run correct_count(x, [2, 0])");
  CHECK(count.out.find("2") != std::string::npos);
}

TEST_CASE("train start runs a job on the REPL's cluster, train mode switches it live",
          "[repl][train]") {
  testing::temp_dir dir;
  {
    std::ofstream f{dir / "job.toml"};
    f << "[train]\nmode = \"sync\"\nmodel = \"softmax\"\ndata = \"synthetic\"\nsteps = 200\n"
         "batch_size = 16\n";
  }
  auto in = embedded({{"ps", 1}, {"worker", 2}});
  // 200 steps of at least 20 ms: the switch lands while the job runs.
  auto r = exec(*in, "train start " + dir / "job.toml" + " step_delay_ms=20\ntrain mode async\n"
                       "train status\ntrain wait 120s");
  INFO(r.out << r.err);
  REQUIRE(r.ok);
  CHECK(r.out.find("/job:ps/task:0: now async") != std::string::npos);
  // The status has the aggregator's table of members (a member's task name
  // may not be known yet this early: not checked).
  CHECK(r.out.find("/job:ps/task:0: mode async, global step") != std::string::npos);
  CHECK(r.out.find("worker task") != std::string::npos);
  CHECK(r.out.find("mode async (after 1 live switch from sync)") != std::string::npos);

  // A job far longer than the test: train stop ends it before its next step
  // (without the stop reaching the workers, the wait inside runs out).
  auto stopped = exec(*in, "train start " + dir / "job.toml" + " steps=1000000 step_delay_ms=5\n"
                             "train stop");
  INFO(stopped.out << stopped.err);
  CHECK(stopped.ok);
  CHECK(stopped.out.find("train stopped (train stop)") != std::string::npos);

  auto bad = exec(*in, "train mode allreduce");
  CHECK_FALSE(bad.ok);
  CHECK(bad.err.find("allreduce") != std::string::npos);
  auto missing = exec(*in, "train start " + dir / "nope.toml");
  CHECK_FALSE(missing.ok);
  CHECK(missing.err.find("nope.toml") != std::string::npos);
  // Catches: a sparse config started as a dense job, each worker failing
  // with "model 'recommender' is unknown".
  auto sparse = exec(*in, "train start " + std::string{ACTORFLOW_SOURCE_DIR}
                            + "/config/embeddings.toml");
  CHECK_FALSE(sparse.ok);
  CHECK(sparse.err.find("model 'recommender' is a sparse job") != std::string::npos);
  CHECK(sparse.err.find("actorflow-train --config") != std::string::npos);
}

/// The interpreter a signal interrupts, as actorflow-repl's SIGINT handler
/// does: the signal also breaks the running thread's system call (EINTR),
/// which a plain interrupt() from another thread would not.
std::atomic<repl::interpreter*> signalled{nullptr};

void on_test_signal(int) {
  if (auto* in = signalled.load())
    in->interrupt();
}

/// Runs `text` on another thread, signals it once the statement has begun
/// (options::on_statement), and returns what it printed and how long it took.
struct interrupted {
  ran r;
  std::chrono::steady_clock::duration took;
};
interrupted interrupt_once_started(repl::interpreter& in, std::atomic<bool>& started,
                                   const std::string& text) {
  interrupted got{};
  std::atomic<bool> done{false};
  started = false;
  auto start = std::chrono::steady_clock::now();
  std::thread t{[&] {
    got.r = exec(in, text);
    done = true;
  }};
  REQUIRE(eventually([&] { return started.load(); }, 20s));
  struct sigaction action {};
  action.sa_handler = on_test_signal; // no SA_RESTART: calls in progress see EINTR
  sigemptyset(&action.sa_mask);
  sigaction(SIGUSR1, &action, nullptr);
  signalled = &in;
  // Once, to the thread running the command: the flag stays set until the
  // next command clears it.
  pthread_kill(t.native_handle(), SIGUSR1);
  bool ended = eventually([&] { return done.load(); }, 60s);
  t.join();
  got.took = std::chrono::steady_clock::now() - start;
  signalled = nullptr;
  CHECK(ended);
  return got;
}

TEST_CASE("interrupt abandons a wait, a sleep and a repeat, the next command runs", "[repl]") {
  std::atomic<bool> started{false};
  repl::options opts;
  opts.on_statement = [&](const std::string&) { started = true; };
  auto in = embedded({{"worker", 1}}, opts);
  REQUIRE(exec(*in, "u = variable(\"u\", [1])").ok);
  auto w = interrupt_once_started(*in, started, "wait 60s u");
  CHECK(w.took < 30s);
  CHECK(w.r.err.find("wait: cancelled") != std::string::npos);
  auto s = interrupt_once_started(*in, started, "sleep 60s");
  CHECK(s.took < 30s);
  CHECK(s.r.err.find("cancelled") != std::string::npos);
  auto n = interrupt_once_started(*in, started, "repeat 1000000 { repeat 1000000 { x = 1 } }");
  CHECK(n.took < 30s);
  CAPTURE(n.r.err);
  CHECK(n.r.err.find("repeat: cancelled after") != std::string::npos);
  CHECK(exec(*in, "print 1").out == "1\n");
}

TEST_CASE("against node processes: Ctrl-C abandons runs on a stopped ps, a killed ps is named",
          "[repl][processes]") {
  auto cluster = testing::process_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto config = load_cluster_config((*cluster)->config_path());
  REQUIRE(config);
  std::atomic<bool> started{false};
  repl::options opts;
  opts.timeout = 20s; // far longer than a cancel may take
  opts.on_statement = [&](const std::string&) { started = true; };
  auto in = repl::interpreter::connect(*config, "/job:worker/task:0", opts);
  REQUIRE(in);
  auto& repl = **in;
  REQUIRE(exec(repl, "with /job:ps/task:0 { w = variable(\"w\", [2], 4) }\ninit\ny = w * 2\n"
                     "inc = w.assign_add(1)\nrun y").ok);

  // SIGSTOP: each request reaches a ps that takes it and never answers. A
  // step (y), a read of the variable by the client (w), an update with a
  // value the client has (inc), the initializer's requests (init) and the
  // request that makes a variable on its node (z) each go their own way to
  // the ps (the last two ended at the 20 s timeout before they went
  // through actors/pending_reply.hpp's ask_cancellable).
  REQUIRE((*cluster)->signal("ps", 0, SIGSTOP));
  for (const char* what : {"run y", "run w", "run inc", "init",
                           "with /job:ps/task:0 { z = variable(\"z\", [2], 1) }"}) {
    INFO(what);
    auto got = interrupt_once_started(repl, started, what);
    INFO(got.r.out << got.r.err);
    CHECK(got.r.err.find("cancelled") != std::string::npos);
    CHECK(got.took < 10s); // the request timeout is 20 s: abandoned, not timed out
  }
  (*cluster)->signal("ps", 0, SIGCONT);
  auto again = exec(repl, "run w");
  INFO(again.err);
  // The cancelled assign_add may or may not have reached the variable.
  CHECK((again.out == "[4. 4.]\n" || again.out == "[5. 5.]\n"));

  // SIGKILL: the error names the task that is gone, and the REPL goes on.
  REQUIRE((*cluster)->signal("ps", 0, SIGKILL));
  auto dead = exec(repl, "run y");
  CHECK_FALSE(dead.ok);
  CHECK(dead.err.find("/job:ps/task:0") != std::string::npos);
  CHECK(exec(repl, "print \"alive\"").out == "alive\n");
}

TEST_CASE("leaving after a cancelled run does not wait for the abandoned request",
          "[repl][processes]") {
  auto cluster = testing::process_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto config = load_cluster_config((*cluster)->config_path());
  REQUIRE(config);
  std::atomic<bool> started{false};
  repl::options opts;
  opts.timeout = 20s;
  opts.on_statement = [&](const std::string&) { started = true; };
  auto in = repl::interpreter::connect(*config, "/job:worker/task:0", opts);
  REQUIRE(in);
  REQUIRE(exec(**in, "with /job:ps/task:0 { w = variable(\"w\", [2], 4) }\ninit\ny = w * 2\nrun y").ok);
  REQUIRE((*cluster)->signal("ps", 0, SIGSTOP));
  auto got = interrupt_once_started(**in, started, "run y");
  CHECK(got.r.err.find("cancelled") != std::string::npos);
  // Destroying the interpreter ends its actor system; a helper still
  // holding the abandoned request would keep it for twice the timeout (40 s).
  auto start = std::chrono::steady_clock::now();
  in->reset();
  CHECK(std::chrono::steady_clock::now() - start < 15s);
  (*cluster)->signal("ps", 0, SIGCONT);
}

TEST_CASE("MIN / -1 on a node gives the wrapped MIN and the node answers on (issue 22)",
          "[repl][processes]") {
  // INT32_MIN / -1 once killed the ps that ran it with SIGFPE (exit 136).
  auto cluster = testing::process_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto config = load_cluster_config((*cluster)->config_path());
  REQUIRE(config);
  repl::options opts;
  opts.timeout = 20s;
  auto in = repl::interpreter::connect(*config, "/job:worker/task:0", opts);
  REQUIRE(in);
  auto& repl = **in;
  REQUIRE(exec(repl, "with /job:ps/task:0 {\n"
                     "  k = const(-2147483648, dtype=\"int32\")\n"
                     "  q = k / const(-1, dtype=\"int32\")\n"
                     "  k64 = const(-9223372036854775808, dtype=\"int64\")\n"
                     "  q64 = k64 / const(-1, dtype=\"int64\")\n"
                     "  w = variable(\"w\", [2], 4)\n"
                     "}\ninit").ok);
  auto q = exec(repl, "run q");
  INFO(q.out << q.err);
  CHECK(q.ok);
  CHECK(q.out == "-2147483648\n");
  auto q64 = exec(repl, "run q64");
  INFO(q64.out << q64.err);
  CHECK(q64.ok);
  CHECK(q64.out == "-9223372036854775808\n");
  // The ps is alive and serves its variable.
  auto w = exec(repl, "run w");
  INFO(w.err);
  CHECK(w.out == "[4. 4.]\n");
  auto ping = exec(repl, "ping /job:ps/task:0");
  INFO(ping.err);
  CHECK(ping.out.find("/job:ps/task:0  pid") != std::string::npos);
}

TEST_CASE("MIN / -1 in the embedded REPL gives the wrapped MIN", "[repl]") {
  auto in = embedded({{"ps", 1}, {"worker", 1}});
  auto r = exec(*in, "with /job:ps/task:0 { q = const(-2147483648, dtype=\"int32\") / "
                     "const(-1, dtype=\"int32\") }\nrun q");
  INFO(r.out << r.err);
  CHECK(r.out == "-2147483648\n");
  CHECK(exec(*in, "print \"alive\"").out == "alive\n");
}

TEST_CASE("ragged lists, mixed depths and values an int tensor cannot hold are refused",
          "[repl][errors]") {
  auto in = embedded({{"worker", 1}});
  for (const char* bad : {"print [1, [2]]", "print [1, []]", "print const([1, [2, 3, 4]])",
                          "x = [[1, 2], [3]]", "print const([1.5], dtype=\"int32\")",
                          "print const([3e10], dtype=\"int32\")", "print zeros(1e300)",
                          "print zeros(-1)", "y = uniform(0, 1, -5)"}) {
    INFO(bad);
    auto r = exec(*in, bad);
    CHECK_FALSE(r.ok);
    CHECK(r.err.find("error at column") != std::string::npos);
  }
  // A refused binding leaves nothing behind that breaks `names`.
  auto names = exec(*in, "names");
  CHECK(names.ok);
  CHECK(names.out.find("x:") == std::string::npos);
  CHECK(exec(*in, "print [[1, 2], [3, 4]]").out == "[[1. 2.]\n [3. 4.]]\n");
}

TEST_CASE("int64 literals are read exactly, and one out of range names itself and the range "
          "(issue 22)", "[repl][errors]") {
  // They went through a double: 2^53 + 1 printed as 2^53, INT64_MAX was
  // refused as "9.223372037e+18 does not fit int64", and a sum near 2^63
  // was off by hundreds.
  auto in = embedded({{"ps", 1}, {"worker", 1}});
  auto out = [&](const std::string& text) {
    auto r = exec(*in, text);
    INFO(text << "\n" << r.out << r.err);
    CHECK(r.ok);
    return r.out;
  };
  CHECK(out("run const(9007199254740993, dtype=\"int64\")") == "9007199254740993\n");
  CHECK(out("run const([9223372036854775807, 9223372036854775806], dtype=\"int64\")")
        == "[9223372036854775807 9223372036854775806]\n");
  CHECK(out("run const(-9223372036854775808, dtype=\"int64\")") == "-9223372036854775808\n");
  CHECK(out("run const([-9223372036854775808, --9223372036854775807], dtype=\"int64\")")
        == "[-9223372036854775808  9223372036854775807]\n");
  CHECK(out("run const(2147483647, dtype=\"int32\")") == "2147483647\n");
  CHECK(out("run const(-2147483648, dtype=\"int32\")") == "-2147483648\n");
  CHECK(out("print 9007199254740993") == "9007199254740993\n");
  CHECK(out("run const(9007199254740992 + 1, dtype=\"int64\")") == "9007199254740993\n");
  CHECK(out("run fill([2], 9007199254740993, dtype=\"int64\")")
        == "[9007199254740993 9007199254740993]\n");
  REQUIRE(exec(*in, "with /job:ps/task:0 { v = variable(\"v\", [2], 5, dtype=\"int64\"); "
                    "u = variable(\"u\", [], 9007199254740993, dtype=\"int64\") }\ninit").ok);
  CHECK(out("run v.assign_add(const([9223372036854775000, 1], dtype=\"int64\"))")
        == "[9223372036854775005                   6]\n");
  CHECK(out("run u") == "9007199254740993\n");

  // Out of range: the literal itself and the dtype's range, no float hint.
  for (auto [bad, literal, range] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
         {"print const([9223372036854775808], dtype=\"int64\")", "9223372036854775808",
          "int64 holds -9223372036854775808 to 9223372036854775807"},
         {"print const(-9223372036854775809, dtype=\"int64\")", "-9223372036854775809",
          "int64 holds -9223372036854775808 to 9223372036854775807"},
         {"print const(18446744073709551616, dtype=\"int64\")", "18446744073709551616",
          "int64 holds -9223372036854775808 to 9223372036854775807"},
         {"print const(2147483648, dtype=\"int32\")", "2147483648",
          "int32 holds -2147483648 to 2147483647"},
         {"print fill([1], 9223372036854775808, dtype=\"int64\")", "9223372036854775808",
          "int64 holds"}}) {
    INFO(bad);
    auto r = exec(*in, bad);
    INFO(r.err);
    CHECK_FALSE(r.ok);
    CHECK(r.err.find("the value " + literal + " does not fit") != std::string::npos);
    CHECK(r.err.find(range) != std::string::npos);
    CHECK(r.err.find("float32") == std::string::npos);
  }
  // A fraction still gets the float hint.
  auto frac = exec(*in, "print const(2.5, dtype=\"int32\")");
  CHECK(frac.err.find("write const(2.5, dtype=\"float32\")") != std::string::npos);
}

TEST_CASE("numbers print as typed, with --precision for fractions", "[repl]") {
  repl::options opts;
  opts.print.precision = 3;
  auto in = embedded({{"worker", 1}}, opts);
  CHECK(exec(*in, "print 2.0, 7, 1 / 3, 10 / 4, 2 * 3").out == "2.0\n7\n0.333\n2.5\n6\n");
  CHECK(exec(*in, "run const([1, 2]) / 3").out == "[0.333 0.667]\n");
}

TEST_CASE("a with block keeps its session: switching inside one is refused", "[repl][errors]") {
  auto in = embedded({{"ps", 1}, {"worker", 1}});
  auto prompt = in->prompt();
  auto r = exec(*in, "with /job:ps/task:0 { session /job:ps/task:0; v = variable(\"v\", [1]) }");
  CHECK_FALSE(r.ok);
  CHECK(r.err.find("cannot switch sessions inside a with block") != std::string::npos);
  CHECK(in->prompt() == prompt);
  // The scope was closed with the block: a variable now lands on the session's task.
  REQUIRE(exec(*in, "u = variable(\"u_here\", [1])").ok);
  CHECK(exec(*in, "print device_of(u)").out == "/job:worker/replica:0/task:0/device:CPU:0\n");
}

TEST_CASE("leaving the REPL while a training job runs stops the job", "[repl][train]") {
  testing::temp_dir dir;
  {
    std::ofstream f{dir / "job.toml"};
    f << "[train]\nmode = \"sync\"\nmodel = \"softmax\"\ndata = \"synthetic\"\nsteps = 1000000\n"
         "batch_size = 16\n";
  }
  auto in = embedded({{"ps", 1}, {"worker", 2}});
  REQUIRE(exec(*in, "train start " + dir / "job.toml" + " step_delay_ms=1000").ok);
  // A million steps of a second each: only the stop ends it.
  auto start = std::chrono::steady_clock::now();
  in.reset();
  CHECK(std::chrono::steady_clock::now() - start < 15s);
}

namespace {

testing::command_result repl_script(const std::string& script, std::vector<std::string> flags,
                                    const testing::temp_dir& dir) {
  {
    std::ofstream f{dir / "s.af"};
    f << script;
  }
  std::vector<std::string> argv{ACTORFLOW_REPL_BINARY, "--embedded", "worker=1", "--script",
                                dir / "s.af"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return testing::run_command(argv, 60s);
}

} // namespace

TEST_CASE("actorflow-repl --script: exit codes, --keep-going, --echo, --precision, stdin",
          "[repl][script]") {
  testing::temp_dir dir;
  const std::string script = "print \"a\"\nrun nope\nprint \"b\"\n";
  auto stop = repl_script(script, {}, dir);
  INFO(stop.output);
  CHECK(stop.exit_code == 1);
  CHECK(stop.output.find("a\n") != std::string::npos);
  CHECK(stop.output.find("error at line 2, column 5: 'nope' is not defined") != std::string::npos);
  CHECK(stop.output.find("b\n") == std::string::npos); // it stopped at the error

  auto go_on = repl_script(script, {"--keep-going"}, dir);
  INFO(go_on.output);
  CHECK(go_on.exit_code == 1);
  CHECK(go_on.output.find("b\n") != std::string::npos);

  auto echo = repl_script("print 1 / 3\n", {"--echo", "--precision", "2"}, dir);
  INFO(echo.output);
  CHECK(echo.exit_code == 0);
  CHECK(echo.output.find("actorflow> print 1 / 3\n0.33\n") != std::string::npos);

  auto piped = testing::run_command(
    {"/bin/bash", "-c", std::string{"printf 'print 40 + 2\\nquit\\nprint 0\\n' | "} + ACTORFLOW_REPL_BINARY
                     + " --embedded worker=1"},
    60s);
  INFO(piped.output);
  CHECK(piped.exit_code == 0);
  CHECK(piped.output.find("42\n") != std::string::npos);
  CHECK(piped.output.find("\n0\n") == std::string::npos); // nothing after quit

  auto usage = testing::run_command({ACTORFLOW_REPL_BINARY, "--script", dir / "missing.af"}, 60s);
  CHECK(usage.exit_code == 2);
  CHECK(usage.output.find("missing.af") != std::string::npos);

  // A long block is read and run in one piece (each line re-parsed the whole
  // block once; with a rescan per position that took minutes at 3,000 lines).
  std::string block = "repeat 2 {\n";
  for (int i = 0; i < 3000; ++i)
    block += "  x" + std::to_string(i) + " = " + std::to_string(i) + "\n";
  block += "}\nprint x2999\n";
  auto long_block = repl_script(block, {}, dir);
  CHECK(long_block.exit_code == 0);
  CHECK(long_block.output.find("2999\n") != std::string::npos);
}

TEST_CASE("actorflow-repl --script exits 130 on SIGINT while a command runs", "[repl][script]") {
  testing::temp_dir dir;
  {
    std::ofstream f{dir / "s.af"};
    f << "print \"ready\"\nsleep 1m\nprint \"not reached\"\n";
  }
  testing::background_process p{
    {ACTORFLOW_REPL_BINARY, "--embedded", "worker=1", "--script", dir / "s.af"}};
  REQUIRE(p.wait_for("ready", 60s));
  p.signal(SIGINT);
  auto rc = p.wait_exit(20s);
  INFO(p.output());
  REQUIRE(rc);
  CHECK(*rc == 130);
  CHECK(p.output().find("not reached") == std::string::npos);
}

TEST_CASE("variables as tf.Variable and tf.get_variable make them, a failed one leaves no trace",
          "[repl]") {
  auto in = embedded({{"ps", 1}, {"worker", 2}});
  auto r = exec(*in, "s = variable(\"s5\", 5)\nk = variable(\"k\", 7, dtype=\"int32\")\ninit\n"
                     "run s, k / 2, k + 1");
  INFO(r.out << r.err);
  REQUIRE(r.ok);
  // A scalar starting at 5 (tf.Variable(5)); the literal 2 takes k's int32.
  CHECK(r.out == "initialized 2 variables\ns = 5.0\nk / 2 = 3\nk + 1 = 8\n");
  auto shape_number = exec(*in, "bad = variable(\"bad\", 5, 1)");
  CHECK(shape_number.err.find("a shape is a [list] ([5], not 5") != std::string::npos);
  auto rank9 = exec(*in, "r9 = variable(\"r9\", [1, 1, 1, 1, 1, 1, 1, 1, 1])");
  CHECK(rank9.err.find("at most 8 dimensions") != std::string::npos);

  // q exists on the cluster as [2, 2]: asking for it as a scalar fails, and
  // must not leave a half-made variable that breaks init, uninit and save.
  REQUIRE(exec(*in, "session /job:worker/task:1\nq = variable(\"q\", [2, 2], 1)\ninit").ok);
  REQUIRE(exec(*in, "session /job:worker/task:0").ok);
  auto clash = exec(*in, "q = variable(\"q\", 5.0)");
  CHECK_FALSE(clash.ok);
  auto after = exec(*in, "init\nuninit");
  INFO(after.err);
  CHECK(after.ok);
  CHECK(after.out == "initialized 2 variables\nuninitialized: []\n");
}

TEST_CASE("reset gives the session a fresh graph and keeps the cluster's variables", "[repl]") {
  auto in = embedded({{"ps", 1}, {"worker", 1}});
  REQUIRE(exec(*in, "with /job:ps/task:0 { w = variable(\"w\", [1], 3) }\ninit\nrun w + 1").ok);
  auto r = exec(*in, "reset\nops\nnames");
  CHECK(r.ok);
  CHECK(r.out.find("starts again") != std::string::npos);
  CHECK(r.out.find("add") == std::string::npos); // no ops, no names left
  CHECK_FALSE(exec(*in, "run w").ok);
  // The variable is still on the ps, with its value.
  CHECK(exec(*in, "with /job:ps/task:0 { w = variable(\"w\", [1], 0) }\nrun w").out == "[3.]\n");
}

TEST_CASE("actorflow-repl refuses an endless line and a directory as a script", "[repl][script]") {
  auto zero = testing::run_command({ACTORFLOW_REPL_BINARY, "--embedded", "worker=1", "--script",
                                    "/dev/zero"},
                                   60s);
  CHECK(zero.exit_code == 1);
  CHECK(zero.output.find("longer than 1048576 bytes") != std::string::npos);
  auto dir = testing::run_command({ACTORFLOW_REPL_BINARY, "--script", "/tmp"}, 60s);
  CHECK(dir.exit_code == 2);
  CHECK(dir.output.find("is a directory") != std::string::npos);
}

// Catches also: ping not saying how variable ops reach the node, or saying a
// transport the session does not use (shared memory to a node process on
// this host; TCP when ACTORFLOW_DATA_SHM=off).
TEST_CASE("ping and devices ask the node now: a stopped node is not reported up",
          "[repl][processes]") {
  auto cluster = testing::process_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto config = load_cluster_config((*cluster)->config_path());
  REQUIRE(config);
  repl::options opts;
  opts.timeout = 2s;
  auto in = repl::interpreter::connect(*config, "/job:worker/task:0", opts);
  REQUIRE(in);
  auto up = exec(**in, "ping /job:ps/task:0");
  INFO(up.err);
  REQUIRE(up.ok);
  CHECK(up.out.find("/job:ps/task:0  pid ") == 0);
  const char* shm = std::getenv("ACTORFLOW_DATA_SHM");
  bool shm_off = shm != nullptr && std::string{shm} == "off";
  CHECK(up.out.find(std::string{"variable ops travel by: "} + (shm_off ? "tcp" : "shared memory")
                    + "\n")
        != std::string::npos);
  REQUIRE((*cluster)->signal("ps", 0, SIGSTOP));
  auto stopped = exec(**in, "ping /job:ps/task:0");
  (*cluster)->signal("ps", 0, SIGCONT);
  INFO(stopped.out << stopped.err);
  CHECK_FALSE(stopped.ok);
  CHECK(stopped.err.find("/job:ps/task:0") != std::string::npos);
}

TEST_CASE("a script error with an open bracket does not swallow the lines after it",
          "[repl][script]") {
  testing::temp_dir dir;
  auto r = repl_script("x = 1\nx [ = 1\nprint 2\nprint 3 ]\nprint 4\n", {"--keep-going"}, dir);
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("parse error at line 2") != std::string::npos);
  CHECK(r.output.find("\n2\n") != std::string::npos);
  CHECK(r.output.find("parse error at line 4") != std::string::npos);
  CHECK(r.output.find("\n4\n") != std::string::npos);
}

TEST_CASE("at the graph cap only what makes ops is refused, reset starts over", "[repl]") {
  auto in = embedded({{"worker", 1}});
  auto full = exec(*in, "repeat 300000 { y = const(1) + 1 }");
  CHECK_FALSE(full.ok);
  CHECK(full.err.find("ops, the most the REPL builds") != std::string::npos);
  CHECK(exec(*in, "print \"still here\"").out == "still here\n");
  CHECK(exec(*in, "help reset").ok);
  CHECK(exec(*in, "reset").ok);
  CHECK(exec(*in, "run const(2) + 1").out == "3.0\n");
}

TEST_CASE("a partitioned table over two ps, looked up by id, with gradients that stay sparse "
          "(catches a lookup routed to the wrong shard, or a gradient of the table's shape)",
          "[repl][sparse]") {
  auto in = embedded({{"ps", 2}, {"worker", 1}});
  // mod: shard 0 holds ids 0, 2, 4, shard 1 ids 1, 3, 5; row id i is [i, i].
  auto r = exec(*in, R"(p0, p1 = partitioned_table("emb", [6, 2], ["/job:ps/task:0", "/job:ps/task:1"])
init
run p0.assign([[0, 0], [2, 2], [4, 4]]), p1.assign([[1, 1], [3, 3], [5, 5]])
rows = embedding_lookup([p0, p1], [5, 0, 5, 2])
run rows
g = sparse_gradients(sum(rows * rows), [[p0, p1]])
run g
trace
w = variable("w", [4, 2], 1.0)
init w
ids, values = sparse_gradients(sum(embedding_lookup(w, [3, 1, 3])), w)
run ids, values)");
  INFO(r.out << r.err);
  REQUIRE(r.ok);
  CHECK(r.out.find("[[5. 5.]\n [0. 0.]\n [5. 5.]\n [2. 2.]]") != std::string::npos);
  // Each shard's gradient names its own rows, once each (the lookup sends
  // each distinct id once): shard 0 rows 0 and 1 (ids 0, 2), shard 1 row 2
  // (id 5, looked up twice: 2 x 2 x 5 = 20).
  CHECK(r.out.find("d(sum(rows * rows))/d(p0) ids = [0 1]") != std::string::npos);
  CHECK(r.out.find("d(sum(rows * rows))/d(p0) values =\n[[0. 0.]\n [4. 4.]]") != std::string::npos);
  CHECK(r.out.find("d(sum(rows * rows))/d(p1) ids = [2]") != std::string::npos);
  CHECK(r.out.find("d(sum(rows * rows))/d(p1) values = [[20. 20.]]") != std::string::npos);
  // Each shard's gather ran on its own ps.
  CHECK(std::regex_search(r.out, std::regex{"/job:ps/replica:0/task:1/device:CPU:0\n(   .*\n)*"
                                            "   \\S*gather"}));
  // One table: embedding_lookup is gather, its gradient the ids as looked up.
  CHECK(r.out.find("ids = [3 1 3]") != std::string::npos);
  CHECK(r.out.find("values =\n[[1. 1.]\n [1. 1.]\n [1. 1.]]") != std::string::npos);
}

TEST_CASE("partitioned_table: div routing, the declared strategy remembered by the lookup, and "
          "bad arguments named (catches a lookup that routes a div table by mod)",
          "[repl][sparse]") {
  auto in = embedded({{"ps", 2}, {"worker", 1}});
  auto r = exec(*in, R"(t = partitioned_table("d", [6, 1], ["/job:ps/task:0", "/job:ps/task:1"], strategy="div")
p0, p1 = t
init
run p0.assign([[0], [1], [2]]), p1.assign([[3], [4], [5]])
run embedding_lookup(t, [4, 1, 3]))");
  INFO(r.out << r.err);
  REQUIRE(r.ok);
  CHECK(r.out.find("[[4.]\n [1.]\n [3.]]") != std::string::npos);
  struct bad_case {
    std::string text, want;
  };
  for (const auto& b : std::vector<bad_case>{
         {R"(partitioned_table("x", [4, 2], ["/job:ps/task:0"], strategy="hash"))",
          "strategy is \"mod\""},
         {R"(partitioned_table("x", [4, 2], "/job:ps/task:0"))", "devices is a [list]"},
         {R"(partitioned_table("x", [4, 2], ["/job:ps/task:0"], [[1, 2]]))", "not a tensor"},
         {R"(embedding_lookup([p0 + 1, p1], [0]))", "the shards of a table are variables"},
         // Routed by mod, ids [0..5] of this div table read other ids' rows.
         {R"(embedding_lookup(t, [0, 1], strategy="mod"))",
          "table 'd' was declared with strategy=\"div\""},
       }) {
    auto e = exec(*in, b.text);
    INFO(b.text << "\n" << e.err);
    CHECK_FALSE(e.ok);
    CHECK(e.err.find(b.want) != std::string::npos);
    CHECK(exec(*in, "print 1 + 1").out == "2\n"); // the REPL answers the next command
  }
}

TEST_CASE("partitioned_table with a random initializer: each shard holds its own rows of the "
          "one-piece table (catches every shard drawing the same stream of the seed)",
          "[repl][sparse]") {
  auto in = embedded({{"ps", 2}, {"worker", 1}});
  auto r = exec(*in, R"(p0, p1 = partitioned_table("u", [4, 3], ["/job:ps/task:0", "/job:ps/task:1"], uniform(0, 1, 7))
init
run p0
run p1)");
  INFO(r.out << r.err);
  REQUIRE(r.ok);
  // The one-piece table's values: (seed 7, global row, column) alone.
  tensor whole{dtype::float32, {4, 3}};
  REQUIRE(kernels::fill_table(whole, kernels::table_distribution::uniform, 0, 1, 7, {0, 1}).ok());
  // mod: shard 0 holds global rows 0 and 2, shard 1 rows 1 and 3.
  std::vector<float> want;
  for (int64_t row : {0, 2, 1, 3})
    for (int64_t c = 0; c < 3; ++c)
      want.push_back(whole.data<float>()[row * 3 + c]);
  std::vector<float> got;
  std::regex number{"[0-9]+\\.[0-9]+(e-?[0-9]+)?"};
  for (std::sregex_iterator it{r.out.begin(), r.out.end(), number}, end; it != end; ++it)
    got.push_back(std::stof(it->str()));
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k)
    CHECK(got[k] == Approx(want[k]).epsilon(1e-6));
}
