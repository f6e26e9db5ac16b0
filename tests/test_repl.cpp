// actorflow-repl's interpreter: the examples/ scripts against an embedded
// cluster and against node processes, the error cases (each followed by a
// command that must still work), completion, save/restore and training.

#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

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
  bool ok = in.execute(text, out, err);
  return {ok, out.str(), err.str()};
}

std::unique_ptr<repl::interpreter> embedded(const std::map<std::string, int>& jobs,
                                            repl::options opts = {}) {
  auto in = repl::interpreter::embedded(jobs, "", opts);
  REQUIRE(in);
  return std::move(*in);
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
  SECTION("an unknown device names the job") {
    auto r = exec(*in, "with /job:nope/task:0 { v = variable(\"v\", [1]) }\ninit v");
    CHECK_FALSE(r.ok);
    CHECK(r.err.find("nope") != std::string::npos);
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
    CHECK(r.err.find("matmul") != std::string::npos);
    CHECK(r.err.find("[1,3]") != std::string::npos);
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
run w.assign_add(1)
trace save )" + dir / "t.json");
  INFO(r.out << r.err);
  REQUIRE(r.ok);
  // x = I gives w back; d sum(x w) / dw = x^T ones = column sums of x per row.
  CHECK(r.out.find("[[1. 2.]\n [3. 4.]]") != std::string::npos);
  CHECK(r.out.find("[[4. 4.]\n [6. 6.]]") != std::string::npos);
  CHECK(r.out.find("[[2. 3.]\n [4. 5.]]") != std::string::npos);
  auto json = read_file(dir / "t.json");
  CHECK(json.find("\"traceEvents\"") != std::string::npos);
  CHECK(json.find("assign_add") != std::string::npos);
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
  CHECK(r.out.find("/job:worker/task:1") != std::string::npos); // status names the members
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
}

TEST_CASE("interrupt abandons a wait and the next command runs", "[repl]") {
  auto in = embedded({{"worker", 1}});
  REQUIRE(exec(*in, "u = variable(\"u\", [1])").ok);
  ran r{};
  std::atomic<bool> done{false};
  auto start = std::chrono::steady_clock::now();
  std::thread t{[&] {
    r = exec(*in, "wait 60s u");
    done = true;
  }};
  // The interrupt may come before the wait starts; execute() clears the
  // flag when it begins, so keep interrupting until it returns.
  while (!eventually([&] { return done.load(); }, 50ms))
    in->interrupt();
  t.join();
  CHECK(std::chrono::steady_clock::now() - start < 30s);
  CHECK(r.err.find("cancelled") != std::string::npos);
  CHECK(exec(*in, "print 1").out == "1\n");
}

TEST_CASE("against node processes: Ctrl-C abandons a run on a stopped ps, a killed ps is named",
          "[repl][processes]") {
  auto cluster = testing::process_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto config = load_cluster_config((*cluster)->config_path());
  REQUIRE(config);
  repl::options opts;
  opts.timeout = 20s; // far longer than the cancel may take
  auto in = repl::interpreter::connect(*config, "/job:worker/task:0", opts);
  REQUIRE(in);
  auto& repl = **in;
  REQUIRE(exec(repl, "with /job:ps/task:0 { w = variable(\"w\", [2], 4) }\ninit\ny = w * 2\nrun y").ok);

  // SIGSTOP: the step waits for a ps that takes the request and never answers.
  REQUIRE((*cluster)->signal("ps", 0, SIGSTOP));
  ran r{};
  std::atomic<bool> done{false};
  auto start = std::chrono::steady_clock::now();
  std::thread t{[&] {
    r = exec(repl, "run y");
    done = true;
  }};
  while (!eventually([&] { return done.load(); }, 100ms))
    repl.interrupt();
  t.join();
  auto took = std::chrono::steady_clock::now() - start;
  (*cluster)->signal("ps", 0, SIGCONT);
  INFO(r.out << r.err);
  CHECK(r.err.find("cancelled") != std::string::npos);
  CHECK(took < 10s); // the request timeout is 20 s: it was abandoned, not timed out
  auto again = exec(repl, "run y");
  INFO(again.err);
  CHECK(again.out == "[8. 8.]\n");

  // SIGKILL: the error names the task that is gone, and the REPL goes on.
  REQUIRE((*cluster)->signal("ps", 0, SIGKILL));
  auto dead = exec(repl, "run y");
  CHECK_FALSE(dead.ok);
  CHECK(dead.err.find("/job:ps/task:0") != std::string::npos);
  CHECK(exec(repl, "print \"alive\"").out == "alive\n");
}
