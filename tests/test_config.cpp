#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>

#include "config/cluster_spec.hpp"
#include "messages/error.hpp"

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
                     "passphrase_file, insecure, trusted_fabric)") != std::string::npos);
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
