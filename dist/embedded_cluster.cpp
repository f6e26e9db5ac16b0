#include "dist/embedded_cluster.hpp"

#include <stdexcept>

#include "caf/all.hpp"

#include "actors/node.hpp"
#include "dist/aggregator.hpp"
#include "messages/error.hpp"

namespace af {

node_options embedded_cluster::defaults() {
  node_options opts;
  opts.threads = 2;
  return opts;
}

caf::expected<std::unique_ptr<embedded_cluster>>
embedded_cluster::start(const std::map<std::string, int>& jobs, node_options opts) {
  std::unique_ptr<embedded_cluster> result{new embedded_cluster};
  std::map<std::string, std::vector<std::string>> addresses;
  for (const auto& [job, count] : jobs) {
    if (count <= 0)
      return make_error(af_error::invalid_config,
                        "embedded cluster: job '" + job + "' needs at least one task");
    for (int32_t t = 0; t < count; ++t) {
      member m;
      m.job = job;
      m.task = t;
      m.cfg = std::make_unique<system_config>(opts);
      m.sys = af::start_actor_system(*m.cfg);
      auto node = start_node(*m.sys, job, t, "127.0.0.1", 0, opts, {}, node_aggregators());
      if (!node)
        return std::move(node.error());
      m.node = node->actor;
      m.data_plane = node->data_plane;
      m.directory = node->directory;
      m.port = node->port;
      m.address = "127.0.0.1:" + std::to_string(node->port);
      register_local_node(m.address, m.sys.get(), m.node);
      addresses[job].push_back(m.address);
      result->members_.push_back(std::move(m));
    }
  }
  auto spec = cluster_spec::from_jobs(addresses, "embedded cluster");
  if (!spec)
    return std::move(spec.error());
  result->spec_ = std::move(*spec);
  return result;
}

embedded_cluster::~embedded_cluster() {
  // Data-plane threads hold scoped actors of their node's system: stop them first.
  for (auto& m : members_)
    if (m.data_plane)
      m.data_plane->stop();
  for (auto& m : members_) {
    unregister_local_node(m.address);
    caf::anon_send_exit(m.node, caf::exit_reason::user_shutdown);
    m.node = nullptr;
  }
  // Each system waits for its actors in its destructor; configs outlive them.
  for (auto& m : members_)
    m.sys.reset();
}

embedded_cluster::member* embedded_cluster::find(const std::string& job, int32_t task) {
  for (auto& m : members_)
    if (m.job == job && m.task == task)
      return &m;
  return nullptr;
}

caf::actor_system& embedded_cluster::system(const std::string& job, int32_t task) {
  auto m = find(job, task);
  if (m == nullptr)
    throw std::out_of_range("embedded cluster has no /job:" + job + "/task:" + std::to_string(task));
  return *m->sys;
}

running_node embedded_cluster::node(const std::string& job, int32_t task) {
  system(job, task); // throws if there is no such task
  auto m = find(job, task);
  running_node out;
  out.actor = m->node;
  out.port = m->port;
  out.address = m->address;
  out.data_plane = m->data_plane;
  out.directory = m->directory;
  return out;
}

caf::expected<session> embedded_cluster::session_for(const std::string& job, int32_t task,
                                                     session_options opts) {
  if (auto err = spec_.check_task(job, task))
    return err;
  return session::make(*find(job, task)->sys, spec_,
                       "/job:" + job + "/task:" + std::to_string(task), opts);
}

} // namespace af
