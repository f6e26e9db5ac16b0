// A client for fault tests: registers a graph that spans two nodes, says so,
// and waits to be killed. The test SIGKILLs it and watches the executors
// forget its graph.
//   actorflow-test-client CONFIG
#include <signal.h>
#include <unistd.h>

#include <iostream>

#include "caf/all.hpp"

#include "actors/session.hpp"
#include "actors/system.hpp"
#include "messages/error.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: actorflow-test-client CONFIG\n";
    return 2;
  }
  auto cfg = af::load_cluster_config(argv[1]);
  if (!cfg) {
    std::cerr << af::describe(cfg.error()) << '\n';
    return 2;
  }
  af::node_options client = cfg->node; // the cluster's heartbeats
  client.threads = 2;
  af::system_config sys_cfg{client};
  caf::actor_system sys{sys_cfg};
  {
    auto s = af::session::make(sys, cfg->cluster, "/job:worker/task:0");
    if (!s) {
      std::cerr << af::describe(s.error()) << '\n';
      return 1;
    }
    af::output v;
    {
      auto d = s->device("/job:ps/task:0");
      v = *s->variable("v", {2}, af::initializer::constant(3));
    }
    auto doubled = s->add(v, v); // runs on the worker, reads v from the ps
    if (auto err = s->initialize()) {
      std::cerr << af::describe(err) << '\n';
      return 1;
    }
    auto r = s->run(doubled);
    if (!r) {
      std::cerr << af::describe(r.error()) << '\n';
      return 1;
    }
    std::cout << "registered " << s->registered_graphs() << " graph(s); value " << r->to_string()
              << std::endl;
    for (;;)
      pause(); // until SIGKILL
  }
}
