// Who answers a TLS connection: a session checks that the node it dials shows
// a certificate for that host (subjectAltName) and, when its CN names a task,
// that task. libcaf-openssl checks no name, so any member of the cluster CA
// could answer for any task (caf-0.17.md §8.1).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>
#include <future>
#include <tuple>

#include "caf/all.hpp"
#include "caf/io/all.hpp"

#include "actors/session.hpp"
#include "actors/system.hpp"
#include "config/cluster_spec.hpp"
#include "config/loopback.hpp"
#include "certs.hpp"
#include "process_cluster.hpp"
#include "scenarios.hpp"
#include "temp_dir.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {


} // namespace

// Catches a session that takes any certificate of the cluster CA from
// whoever answers at a task's address (a ps posing as worker 0 after a
// config mix-up, or a member that took another task's port), and an error
// that hides why behind "does the node have a certificate of this CA?".
TEST_CASE("a session refuses a node whose certificate names another task, and says whose it is",
          "[security]") {
  temp_dir dir;
  auto ps_port = free_loopback_port(), worker_port = free_loopback_port();
  auto cluster = "[cluster]\nps = [\"127.0.0.1:" + std::to_string(ps_port)
                 + "\"]\nworker = [\"127.0.0.1:" + std::to_string(worker_port)
                 + "\"]\n\n[node]\nthreads = 2\n";
  auto config = dir.path + "/cluster.toml";
  write_file(config, cluster);
  auto security = make_certs(config);
  write_file(config, cluster + "\n" + security);
  background_process node{{ACTORFLOW_NODE_BINARY, "--config", config, "--job", "ps", "--task", "0"}};
  REQUIRE(node.wait_for("actorflow-node ready", 30s));

  // A client whose config (out of date, say) has worker 0 where the ps listens.
  auto mixed = dir.path + "/mixed.toml";
  write_file(mixed, "[cluster]\nps = [\"127.0.0.1:" + std::to_string(worker_port)
                 + "\"]\nworker = [\"127.0.0.1:" + std::to_string(ps_port) + "\"]\n\n" + security);
  auto session_of = [](caf::actor_system& sys, const cluster_config& cfg,
                       const security_options& sec) {
    session_options opts;
    opts.timeout = 5000ms;
    opts.connect_timeout = 5000ms;
    opts.security = sec;
    return value_of(session::make(sys, cfg.cluster, "/job:ps/task:0", opts));
  };
  auto cfg = value_of(load_cluster_config(mixed));
  auto sec = value_of(security_for(cfg.security, "client"));
  system_config sys_cfg{node_options{}, sec};
  caf::actor_system sys{sys_cfg};
  auto s = session_of(sys, cfg, sec);
  auto wrong = s.ping("worker", 0);
  REQUIRE_FALSE(wrong);
  auto text = describe(wrong.error());
  CHECK(text.find("cannot reach /job:worker/task:0") != std::string::npos);
  CHECK(text.find("its certificate is /job:ps/task:0's, not /job:worker/task:0's")
        != std::string::npos);
  // The same node, dialled as the task it is, answers.
  auto right = session_of(sys, value_of(load_cluster_config(config)), sec);
  CHECK(value_of(right.ping("ps", 0)).job == "ps");
}

// Catches a TLS connection that the broker keeps after its connect failed:
// to a peer that accepts TCP and never answers (a stopped node, another
// program), the handshake waited for ever, and the actor system's end
// joined a multiplexer that still served it, so the client process never
// exited (and libcaf-openssl's session spun a core meanwhile).
TEST_CASE("a TLS session to a port that accepts but never answers fails in time, and its actor "
          "system ends",
          "[security]") {
  temp_dir dir;
  // A listening socket nobody accepts from: the kernel completes TCP
  // connections into its backlog, and nothing is ever sent.
  uint16_t port = 0;
  int lfd = listen_on_loopback(port, 16);
  REQUIRE(lfd >= 0);
  auto config = dir.path + "/cluster.toml";
  auto cluster = "[cluster]\nps = [\"127.0.0.1:" + std::to_string(port) + "\"]\n";
  write_file(config, cluster);
  write_file(config, cluster + "\n" + make_certs(config));
  auto cfg = value_of(load_cluster_config(config));
  auto sec = value_of(security_for(cfg.security, "client"));
  auto ended = std::async(std::launch::async, [&] {
    system_config sys_cfg{node_options{}, sec};
    caf::actor_system sys{sys_cfg};
    session_options opts;
    opts.timeout = 2000ms;
    opts.connect_timeout = 2000ms;
    opts.security = sec;
    auto s = value_of(session::make(sys, cfg.cluster, "/job:ps/task:0", opts));
    auto start = std::chrono::steady_clock::now();
    auto r = s.ping("ps", 0);
    return std::make_tuple(static_cast<bool>(r), r ? std::string{} : describe(r.error()),
                           std::chrono::steady_clock::now() - start);
  });
  if (ended.wait_for(30s) != std::future_status::ready) {
    // The actor system did not end: the bug. Nothing can stop that thread.
    FAIL_CHECK("the session's actor system did not end within 30 s after its connect failed");
    std::_Exit(1);
  }
  auto [ok, text, took] = ended.get();
  ::close(lfd);
  CHECK_FALSE(ok);
  CHECK(text.find("did not complete the handshake") != std::string::npos);
  CHECK(took < 10s);
}
