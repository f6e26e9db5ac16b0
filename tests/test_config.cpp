#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "config/cluster_spec.hpp"
#include "core/nesting.hpp"
#include "core/read_file.hpp"
#include "messages/error.hpp"
#include "temp_dir.hpp"

using namespace af;

namespace {

std::string toml_error(const std::string& text) {
  auto c = parse_cluster_toml(text, "cluster.toml");
  REQUIRE_FALSE(c);
  return describe(c.error());
}

std::string json_error(const std::string& text) {
  auto c = parse_cluster_json(text, "TF_CONFIG");
  REQUIRE_FALSE(c);
  return describe(c.error());
}

} // namespace

TEST_CASE("a TOML config gives the cluster and the node options", "[config]") {
  auto c = parse_cluster_toml(R"([cluster]
ps = ["localhost:2222"]
worker = ["localhost:2223", "10.0.0.2:2224"]

[node]
cpu_devices = 2
threads = 1
scheduler = "stealing"
)", "cluster.toml");
  REQUIRE(c);
  CHECK(c->cluster.num_tasks("ps") == 1);
  CHECK(c->cluster.num_tasks("worker") == 2);
  CHECK(c->cluster.address("worker", 1)->to_string() == "10.0.0.2:2224");
  CHECK(c->node.cpu_devices == 2);
  CHECK(c->node.threads == 1);
  CHECK(c->node.scheduler == "stealing");
  // what to_toml writes reads back the same
  auto again = parse_cluster_toml(c->cluster.to_toml(c->node), "again");
  REQUIRE(again);
  CHECK(again->cluster.to_json() == c->cluster.to_json());
  CHECK(again->node.cpu_devices == 2);
}

TEST_CASE("TF_CONFIG in TensorFlow's JSON shape gives the cluster and this task", "[config]") {
  auto c = parse_cluster_json(
    R"({"cluster": {"ps": ["127.0.0.1:3335"], "worker": ["127.0.0.1:3333", "[::1]:3334"]},
        "task": {"type": "worker", "index": 1}})", "TF_CONFIG");
  REQUIRE(c);
  CHECK(*c->task_type == "worker");
  CHECK(*c->task_index == 1);
  CHECK(c->cluster.address("worker", 1)->host == "::1");
  CHECK(c->cluster.address("worker", 1)->to_string() == "[::1]:3334");
  CHECK(c->cluster.to_json() == R"({"ps":["127.0.0.1:3335"],"worker":["127.0.0.1:3333","[::1]:3334"]})");
  ::setenv("TF_CONFIG", R"({"cluster": {"local": ["h:1"]}, "task": {"type": "local", "index": 0}})", 1);
  auto env = cluster_config_from_env();
  ::unsetenv("TF_CONFIG");
  REQUIRE(env);
  CHECK(env->cluster.num_tasks("local") == 1);
  auto missing = cluster_config_from_env();
  REQUIRE_FALSE(missing);
  CHECK(describe(missing.error()).find("TF_CONFIG is not set") != std::string::npos);
}

TEST_CASE("config errors are specific: unknown job, task out of range, duplicates, ports",
          "[config][errors]") {
  auto spec = cluster_spec::from_jobs({{"ps", {"h:1"}}, {"worker", {"h:2", "h:3"}}});
  REQUIRE(spec);
  auto job = spec->address("chief", 0);
  REQUIRE_FALSE(job);
  CHECK(is(job.error(), af_error::unknown_job));
  CHECK(describe(job.error()).find("job 'chief' is not in the cluster (jobs: ps, worker)") != std::string::npos);
  auto task = spec->address("worker", 2);
  REQUIRE_FALSE(task);
  CHECK(is(task.error(), af_error::task_out_of_range));
  CHECK(describe(task.error()).find("task index 2 is out of range for job 'worker', which has 2") != std::string::npos);

  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\nworker = [\"b:2\", \"a:1\"]\n")
          .find("duplicate address a:1 used by /job:ps/task:0 and /job:worker/task:1") != std::string::npos);
  auto port = toml_error("[cluster]\nps = [\"a:1\"]\nworker = [\"b:http\"]\n");
  CHECK(port.find("cluster.toml:3") != std::string::npos);
  CHECK(port.find("bad port 'http'") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:70000\"]\n").find("bad port 70000") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:0\"]\n").find("bad port 0") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"nohost\"]\n").find("has no port") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = []\n").find("job 'ps' has no tasks") != std::string::npos);
  CHECK(toml_error("[node]\nthreads = 1\n").find("no [cluster] table") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\n[node]\nthreads = -3\n").find("cluster.toml:4: node.threads") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\n[node]\ncolour = 1\n").find("unknown option") != std::string::npos);
  CHECK(json_error(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "worker", "index": 0}})")
          .find("job 'worker' is not in the cluster") != std::string::npos);
  CHECK(json_error(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 4}})")
          .find("task index 4 is out of range") != std::string::npos);
}

TEST_CASE("malformed config files are reported with their line number", "[config][errors]") {
  auto toml = toml_error("[cluster]\nps = [\"a:1\"\nworker = 3\n");
  CHECK(toml.find("malformed TOML in cluster.toml") != std::string::npos);
  // what is wrong, and where: line 3, shown as the parser numbers it
  CHECK(toml.find("missing array separator") != std::string::npos);
  CHECK(toml.find(" 3 | worker = 3") != std::string::npos);
  auto json = json_error("{\n  \"cluster\": {\n    \"ps\": [\"a:1\",]\n  }\n}");
  CHECK(json.find("malformed JSON in TF_CONFIG at line 3") != std::string::npos);
  auto missing = load_cluster_config("/nonexistent/cluster.toml");
  REQUIRE_FALSE(missing);
  CHECK(describe(missing.error()).find("cannot open config file '/nonexistent/cluster.toml'") != std::string::npos);
}

TEST_CASE("load_cluster_config reads the example files shipped in config/", "[config]") {
  for (const char* name : {"cluster.toml", "tf_config.json"}) {
    auto c = load_cluster_config(std::string{ACTORFLOW_SOURCE_DIR} + "/config/" + name);
    INFO(name);
    REQUIRE(c);
    CHECK(c->cluster.num_tasks("ps") == 1);
    CHECK(c->cluster.num_tasks("worker") == 2);
  }
}

TEST_CASE("the node's limits are read with their ranges and written back by to_toml", "[config]") {
  auto c = parse_cluster_toml(R"([cluster]
ps = ["localhost:2222"]

[node]
max_variable_bytes = 1048576
max_message_bytes = 4194304
max_data_connections = 8
max_shm_bytes = 0
max_handshake_bytes = 4096
handshake_timeout_ms = 2500
)", "cluster.toml");
  REQUIRE(c);
  CHECK(c->node.max_variable_bytes == 1048576);
  CHECK(c->node.max_message_bytes == 4194304);
  CHECK(c->node.max_data_connections == 8);
  CHECK(c->node.max_shm_bytes == 0);
  CHECK(c->node.max_handshake_bytes == 4096);
  CHECK(c->node.handshake_timeout_ms == 2500);
  auto again = parse_cluster_toml(c->cluster.to_toml(c->node), "again");
  REQUIRE(again);
  CHECK(again->node.max_variable_bytes == 1048576);
  CHECK(again->node.max_message_bytes == 4194304);
  CHECK(again->node.max_data_connections == 8);
  CHECK(again->node.max_shm_bytes == 0);
  CHECK(again->node.max_handshake_bytes == 4096);
  CHECK(again->node.handshake_timeout_ms == 2500);
  // 4 GiB does not fit a frame; 0 connections would serve nobody
  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\n[node]\nmax_message_bytes = 4294967296\n")
          .find("cluster.toml:4: node.max_message_bytes = 4294967296 is out of range") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\n[node]\nmax_data_connections = 0\n")
          .find("node.max_data_connections = 0 is out of range [1, 65536]") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\n[node]\nmax_shm_bytes = -1\n")
          .find("node.max_shm_bytes = -1 is out of range") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\n[node]\nmax_handshake_bytes = \"big\"\n")
          .find("node.max_handshake_bytes must be an integer") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\n[node]\nhandshake_timeout_ms = 0\n")
          .find("node.handshake_timeout_ms = 0 is out of range [100, 3600000]") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\n[node]\nmax_bytes = 1\n").find("handshake_timeout_ms)")
        != std::string::npos);
}

TEST_CASE("[security] and its JSON twin: keys, files and where an error is", "[config][security]") {
  // A file that cannot be read is named with the line that names it.
  auto missing = toml_error("[cluster]\nps = [\"a:1\"]\n[security]\nca = \"/nonexistent/ca.pem\"\n"
                            "certificate = \"/nonexistent/ps.pem\"\nkey = \"/nonexistent/ps.key\"\n");
  CHECK(missing.find("cluster.toml:4: security.ca: cannot read '/nonexistent/ca.pem'") != std::string::npos);
  auto unknown = toml_error("[cluster]\nps = [\"a:1\"]\n[security]\ncafile = \"x\"\n");
  CHECK(unknown.find("cluster.toml:4: security.cafile: unknown option (known: ca, certificate, key, "
                     "passphrase_file, insecure, trusted_fabric, metrics_public)")
        != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\n[security]\ninsecure = \"yes\"\n")
          .find("security.insecure must be true or false") != std::string::npos);
  CHECK(toml_error("[cluster]\nps = [\"a:1\"]\n[securty]\n").find("known: cluster, node, security, train")
        != std::string::npos);
  auto insecure = parse_cluster_toml("[cluster]\nps = [\"a:1\"]\n[security]\ninsecure = true\n", "c.toml");
  REQUIRE(insecure);
  CHECK(insecure->security.insecure);
  CHECK_FALSE(insecure->security.enabled());

  auto json = json_error(R"({"cluster": {"ps": ["a:1"]}, "security": {"ca": "/nonexistent/ca.pem",
                             "certificate": "/nonexistent/c.pem", "key": "/nonexistent/c.key"}})");
  CHECK(json.find("TF_CONFIG: security.ca: cannot read '/nonexistent/ca.pem'") != std::string::npos);
  CHECK(json_error(R"({"cluster": {"ps": ["a:1"]}, "security": {"ca": "x.pem"}})")
          .find("missing: certificate, key") != std::string::npos);
  auto json_insecure = parse_cluster_json(R"({"cluster": {"ps": ["a:1"]}, "security": {"insecure": true}})",
                                          "TF_CONFIG");
  REQUIRE(json_insecure);
  CHECK(json_insecure->security.insecure);
}

// Each case below catches one hostile input of issue 22 (item 6) that was
// accepted, aborted, crashed or blocked before its fix.

TEST_CASE("a host with a control character is refused, showing the character", "[config]") {
  // "127.0.0.1\0:44335" was accepted and printed cut short as 127.0.0.1.
  std::string nul_host = std::string{"127.0.0.1"} + '\0' + ":44335";
  auto err = json_error("{\"cluster\": {\"ps\": [\"127.0.0.1\\u0000:44335\"]}}");
  CHECK(err.find("control character") != std::string::npos);
  CHECK(err.find("127.0.0.1\\x00") != std::string::npos);
  err = toml_error("[cluster]\nps = [\"local\\thost:2222\"]\n");
  CHECK(err.find("control character") != std::string::npos);
  CHECK(err.find("cluster.toml:2") != std::string::npos);
  auto addr = parse_address(nul_host, "x");
  REQUIRE_FALSE(addr);
  CHECK(describe(addr.error()).find("\\x00") != std::string::npos);
  CHECK(parse_address("localhost:2222", "x"));
  err = toml_error("[cluster]\nps = [\"a:1\"]\n[node]\nbind = \"127.0.0.1\\u0000x\"\n");
  CHECK(err.find("cluster.toml:4: node.bind holds a control character") != std::string::npos);
}

TEST_CASE("a DEL or another control character anywhere in an address is named escaped, "
          "before the port is read (issue 22)", "[config]") {
  // An address with a DEL (0x7f) was refused as "bad port '47301'" with the
  // raw DEL byte in the message.
  for (const std::string& text :
       {std::string{"127.0.0.1\x7f:47301"}, std::string{"127.0.0.1:47301\x7f"},
        std::string{"127.0.0.1:\x7f" "47301"}, std::string{"[::1\x7f]:47301"},
        std::string{"[::1]:4730\x7f"}, std::string{"\x7f:47301"}, std::string{"host\x1b:1"}}) {
    CAPTURE(text);
    auto addr = parse_address(text, "x");
    REQUIRE_FALSE(addr);
    auto err = describe(addr.error());
    CAPTURE(err);
    CHECK(err.find("control character") != std::string::npos);
    CHECK((err.find("\\x7f") != std::string::npos || err.find("\\x1b") != std::string::npos));
    CHECK(err.find("bad port") == std::string::npos);
    CHECK(err.find('\x7f') == std::string::npos);
    CHECK(err.find('\x1b') == std::string::npos);
  }
  auto err = json_error("{\"cluster\": {\"ps\": [\"127.0.0.1\\u007f:47301\"]}}");
  CHECK(err.find("127.0.0.1\\x7f:47301") != std::string::npos);
  err = toml_error("[cluster]\nps = [\"127.0.0.1:47301\\u007f\"]\n");
  CHECK(err.find("127.0.0.1:47301\\x7f") != std::string::npos);
  CHECK(err.find('\x7f') == std::string::npos);
}

TEST_CASE("a JSON config with a key twice is refused, naming the key", "[config]") {
  // nlohmann kept the last one silently (TOML refuses duplicates).
  auto err = json_error(R"({"cluster": {"ps": ["a:1"], "ps": ["b:2"]}})");
  CHECK(err.find("\"ps\" appears twice in \"cluster\"") != std::string::npos);
  err = json_error(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}, "cluster": {}})");
  CHECK(err.find("\"cluster\" appears twice in the top-level object") != std::string::npos);
  // The same key in two different objects is fine.
  CHECK(parse_cluster_json(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})",
                           "TF_CONFIG"));
}

TEST_CASE("a JSON config file behind a UTF-8 byte order mark is read as JSON", "[config]") {
  // It was read as TOML and refused with a TOML syntax error.
  testing::temp_dir dir;
  testing::write_file(dir / "tf.json",
                      "\xEF\xBB\xBF{\"cluster\": {\"ps\": [\"127.0.0.1:2222\"]}, "
                      "\"task\": {\"type\": \"ps\", \"index\": 0}}");
  auto c = load_cluster_config(dir / "tf.json");
  INFO((c ? std::string{} : describe(c.error())));
  REQUIRE(c);
  CHECK(c->task_type == "ps");
  testing::write_file(dir / "c.toml", "\xEF\xBB\xBF[cluster]\nps = [\"127.0.0.1:2222\"]\n");
  CHECK(load_cluster_config(dir / "c.toml"));
}

TEST_CASE("a config nested thousands deep is refused before a parser recurses", "[config]") {
  // toml11 recursed into each [ and { and overflowed the stack (SIGSEGV).
  auto deep = [](size_t n, char open, char close, const std::string& inner) {
    return std::string(n, open) + inner + std::string(n, close);
  };
  auto err = toml_error("[cluster]\nps = [\"a:1\"]\nx = " + deep(100000, '[', ']', "1") + "\n");
  CHECK(err.find("cluster.toml: line 3: an array nests more than 64 levels") != std::string::npos);
  std::string tables = "x = ";
  for (int i = 0; i < 50000; ++i)
    tables += "{a = ";
  tables += "1" + std::string(50000, '}');
  err = toml_error("[cluster]\nps = [\"a:1\"]\n" + tables + "\n");
  CHECK(err.find("an inline table nests more than 64") != std::string::npos);
  std::string dotted = "a";
  for (int i = 0; i < 50000; ++i)
    dotted += ".a";
  err = toml_error("[cluster]\nps = [\"a:1\"]\n" + dotted + " = 1\n");
  CHECK(err.find("a dotted key nests more than 64") != std::string::npos);
  err = json_error("{\"cluster\": {\"ps\": [\"a:1\"]}, \"x\": " + deep(100000, '[', ']', "")
                   + "}");
  CHECK(err.find("TF_CONFIG: line 1: an array nests more than 64") != std::string::npos);
  err = json_error(deep(100000, '{', '}', ""));
  CHECK(err.find("an object nests more than 64") != std::string::npos);

  // Brackets inside strings and comments do not count; 64 levels are fine.
  CHECK(nesting_problem("a = \"[[[[[[[[\" # {{{{{{{{{\nb = '[[[[' \nc = \"\"\"[[[\n[[\"\"\"\n",
                        true, 2)
        == "");
  CHECK(nesting_problem(R"({"a": "[[[[\"[[[["})", false, 1) == "");
  CHECK(nesting_problem(deep(64, '[', ']', ""), false) == "");
  CHECK(nesting_problem(deep(65, '[', ']', ""), false) != "");
  CHECK(nesting_problem("[a.b]\nc.d = {e.f = [1, 2.5]}\n", true, 4) == "");

  // A multi-line string may end in one or two quotes of its own ("""q"""",
  // '''q'''''); the scan took the fourth quote for a string that ran to the
  // end of the file, and toml11 then crashed on the arrays after it. A
  // one-line string that is not closed on its line ends there too.
  const std::string deep_array = "steps = " + deep(20000, '[', ']', "") + "\n";
  for (const std::string hiding : {"x = \"\"\"q\"\"\"\"\n", "x = '''q''''\n",
                                   "x = \"\"\"q\"\"\"\"\"\n", "x = '''q'''''\n", "x = \"q\n",
                                   "x = 'q\n"}) {
    CAPTURE(hiding);
    CHECK(nesting_problem("[train]\n" + hiding + deep_array, true)
          == "line 3: an array nests more than 64 levels deep (the most a config may)");
  }
  CHECK(nesting_problem("x = \"\"\"q\"\"\"\"\ny = [[1]]\n", true, 2) == "");
}

TEST_CASE("a FIFO or a device named where a file is expected is refused at once, naming the key",
          "[config][security]") {
  // A FIFO as [security] ca blocked the node for ever before it said
  // anything; /dev/zero as ca aborted it with bad_alloc.
  testing::temp_dir dir;
  auto fifo = dir / "ca.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  testing::write_file(dir / "x.pem", "not read\n");
  auto with_ca = [&](const std::string& ca) {
    return "[cluster]\nps = [\"127.0.0.1:2222\"]\n[security]\nca = \"" + ca
           + "\"\ncertificate = \"" + dir / "x.pem" + "\"\nkey = \"" + dir / "x.pem" + "\"\n";
  };
  auto err = toml_error(with_ca(fifo));
  CHECK(err.find("cluster.toml:4: security.ca: cannot read '" + fifo + "'") != std::string::npos);
  CHECK(err.find("a FIFO (named pipe), not a regular file") != std::string::npos);
  err = toml_error(with_ca("/dev/zero"));
  CHECK(err.find("security.ca: cannot read '/dev/zero' (it is a character device") != std::string::npos);
  // The config file itself.
  auto c = load_cluster_config(fifo);
  REQUIRE_FALSE(c);
  CHECK(describe(c.error()).find("a FIFO (named pipe), not a regular file") != std::string::npos);
  c = load_cluster_config("/dev/zero");
  REQUIRE_FALSE(c);
  CHECK(describe(c.error()).find("character device") != std::string::npos);

  // The helper behind them: limits and kinds.
  std::string text;
  testing::write_file(dir / "ten", "0123456789");
  CHECK(read_regular_file(dir / "ten", 10, text) == "");
  CHECK(text == "0123456789");
  CHECK(read_regular_file(dir / "ten", 9, text) == "it is 10 bytes, more than the limit of 9");
  CHECK(read_regular_file(dir.path, 100, text) == "it is a directory, not a regular file");
  CHECK(read_regular_file(dir / "none", 100, text) == "No such file or directory");
}
