#include "dist/embedded_cluster.hpp"

#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "caf/all.hpp"

#include "actors/node.hpp"
#include "core/log.hpp"
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
      // Started here, maybe ended on another thread: this one lets go.
      release_thread_logger(*m.sys);
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
  if (auto err = shutdown())
    log::get()->error("embedded cluster: {}", describe(err));
}

caf::error embedded_cluster::shutdown(std::chrono::milliseconds timeout) {
  // Data-plane threads hold scoped actors of their node's system: stop them first.
  for (auto& m : members_)
    if (m.data_plane)
      m.data_plane->stop();
  for (auto& m : members_) {
    unregister_local_node(m.address);
    caf::anon_send_exit(m.node, caf::exit_reason::user_shutdown);
    m.node = nullptr;
    release_thread_logger(*m.sys); // else the thread below would wait for this one
  }
  // Each system waits for its actors in its destructor, without a bound;
  // configs outlive them. They end in order on a thread of their own; one
  // that does not end in time is left to it, and the rest after it.
  struct ending {
    std::mutex mutex;
    std::condition_variable changed;
    size_t ended = 0;
  };
  auto state = std::make_shared<ending>();
  std::vector<std::string> names;
  auto systems = std::make_shared<
    std::vector<std::pair<std::unique_ptr<system_config>, std::unique_ptr<caf::actor_system>>>>();
  for (auto& m : members_) {
    names.push_back("/job:" + m.job + "/task:" + std::to_string(m.task));
    systems->emplace_back(std::move(m.cfg), std::move(m.sys));
  }
  members_.clear();
  auto end_all = [state, systems] {
    for (auto& [cfg, sys] : *systems) {
      sys.reset();
      cfg.reset();
      std::lock_guard<std::mutex> guard{state->mutex};
      ++state->ended;
      state->changed.notify_all();
    }
  };
  std::thread ender;
  try {
    ender = std::thread{end_all};
  } catch (const std::system_error&) {
    end_all(); // no thread to spare (a memory cap): unbounded, here, as before
    return caf::none;
  }
  std::unique_lock<std::mutex> lock{state->mutex};
  for (size_t k = 0; k < names.size(); ++k) {
    if (state->changed.wait_for(lock, timeout, [&] { return state->ended > k; }))
      continue;
    lock.unlock();
    ender.detach();
    return make_error(af_error::timeout,
                      "the actor system of " + names[k] + " did not end within "
                        + std::to_string(timeout.count())
                        + " ms of its node's stop: an actor of it still runs, or a thread that "
                          "last spawned an actor in it (a session's, a scoped_actor's) lives on "
                          "and holds it (CAF 0.17; release_thread_logger() lets go); it ends "
                          "in the background once they do. Destroy the cluster's sessions "
                          "before it, on the threads that used them");
  }
  lock.unlock();
  ender.join();
  return caf::none;
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
  if (find(job, task) == nullptr)
    return make_error(af_error::unreachable,
                      "embedded cluster: it was shut down; start another for a session");
  return session::make(*find(job, task)->sys, spec_,
                       "/job:" + job + "/task:" + std::to_string(task), opts);
}

} // namespace af
