// af::session: the calls about nodes rather than graphs (ping, waiting for a
// node, listing variables, shutdown, clocks, executor load) and accessors.
#include "actors/session_impl.hpp"

#include <algorithm>
#include <thread>

namespace af {

caf::expected<node_info> session::ping(const std::string& job, int32_t task) {
  return ping(job, task, impl_->opts.timeout);
}

caf::expected<node_info> session::ping(const std::string& job, int32_t task,
                                       std::chrono::milliseconds timeout) {
  // Asked now, not read from the connection: a node stopped since it was
  // connected (SIGSTOP, a hung host) must not look alive.
  node_info got;
  auto conn = impl_->link.ask_node(
    job, task, "ping", timeout, [&](node_info& info) { got = std::move(info); },
    caf::ping_atom::value);
  if (!conn)
    return std::move(conn.error());
  (*conn)->info = got;
  return got;
}

caf::expected<std::string> session::data_transport(const std::string& job, int32_t task) {
  auto& im = *impl_;
  auto conn = im.link.connect(job, task);
  if (!conn)
    return std::move(conn.error());
  auto& c = **conn;
  if (c.channel && c.channel->broken())
    im.link.reopen_channel(c); // a failure leaves no channel: said below
  if (c.channel) {
    if (auto err = c.channel->settle()) // a move it would make before its next op
      return err;
    return c.channel->transport();
  }
  if (!im.opts.data_plane)
    return std::string{"CAF messages (this session's data plane is off)"};
  if (c.info.data_port == 0)
    return std::string{"CAF messages (the node has no data plane)"};
  if (find_local_node(c.address, &im.sys) != nullptr)
    return std::string{"CAF messages (the node runs in this process: no copy)"};
  return std::string{"CAF messages (its data plane at port " + std::to_string(c.info.data_port)
                     + " could not be reached)"};
}

caf::error session::wait_for_node(const std::string& job, int32_t task,
                                  std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto info = ping(job, task);
    if (info)
      return caf::none;
    bool retry = is(info.error(), af_error::unreachable) || is(info.error(), af_error::peer_down);
    if (!retry || std::chrono::steady_clock::now() >= deadline)
      return std::move(info.error());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

caf::expected<std::vector<variable_info>> session::list_variables(const std::string& job,
                                                                  int32_t task) {
  auto& im = *impl_;
  std::vector<variable_info> out;
  auto conn = im.link.ask_node(
    job, task, "variable list", im.opts.timeout,
    [&](std::vector<variable_info>& infos) { out = std::move(infos); }, list_atom::value);
  if (!conn)
    return std::move(conn.error());
  std::sort(out.begin(), out.end(),
            [](const variable_info& a, const variable_info& b) { return a.spec.name < b.spec.name; });
  return out;
}

caf::expected<aggregator_actor> session::aggregator(const std::string& job, int32_t task,
                                                    const aggregator_spec& spec) {
  auto& im = *impl_;
  aggregator_actor out;
  auto conn = im.link.ask_node(
    job, task, "aggregator", im.opts.timeout, [&](aggregator_actor& a) { out = std::move(a); },
    aggregator_atom::value, spec);
  if (!conn)
    return std::move(conn.error());
  return out;
}

caf::expected<kv_store_actor> session::kv_store(const std::string& job, int32_t task) {
  auto& im = *impl_;
  kv_store_actor out;
  auto conn = im.link.ask_node(
    job, task, "kv store", im.opts.timeout, [&](kv_store_actor& a) { out = std::move(a); },
    kv_store_atom::value);
  if (!conn)
    return std::move(conn.error());
  return out;
}

caf::expected<node_actor> session::node(const std::string& job, int32_t task) {
  auto conn = impl_->link.connect(job, task);
  if (!conn)
    return std::move(conn.error());
  return (*conn)->actor;
}

caf::actor_system& session::system() const {
  return impl_->self->home_system();
}

caf::error session::shutdown(const std::string& job, int32_t task) {
  auto& im = *impl_;
  auto conn = im.link.connect(job, task);
  if (!conn)
    return std::move(conn.error());
  caf::error err;
  im.self->request((*conn)->actor, im.opts.timeout, shutdown_atom::value)
    .receive([](caf::ok_atom) {},
             [&](caf::error& e) { err = im.link.explain(std::move(e), "shutdown", *conn); });
  im.link.conns.erase(task_name(job, task));
  return err;
}

std::string session::device_of(output var) const {
  auto n = impl_->g.variable_node(var);
  return n ? n->spec.device : std::string{};
}

size_t session::registered_graphs() const {
  return impl_->prepared.size();
}

variable_actor session::handle_of(output var) const {
  auto it = impl_->bindings.find(var.id);
  return it == impl_->bindings.end() ? variable_actor{} : it->second.actor;
}

const graph& session::graph_def() const {
  return impl_->g;
}

caf::expected<std::shared_ptr<prepared_step>> session::prepare(const std::vector<output>& fetches,
                                                               bool want_values) {
  std::vector<int32_t> roots;
  for (auto o : fetches) {
    if (!impl_->g.contains(o))
      return make_error(af_error::invalid_argument, "prepare() got an output of another graph");
    roots.push_back(o.id);
  }
  return impl_->prepare(roots, want_values);
}

caf::expected<clock_estimate> session::clock_of(const std::string& job, int32_t task) {
  auto conn = impl_->link.connect(job, task);
  if (!conn)
    return std::move(conn.error());
  return (*conn)->clock;
}

caf::expected<std::pair<uint64_t, uint64_t>>
session::executor_load(const std::string& job, int32_t task, const std::string& device) {
  auto& im = *impl_;
  auto conn = im.link.connect(job, task);
  if (!conn)
    return std::move(conn.error());
  auto exec = im.link.executor(**conn, device);
  if (!exec)
    return std::move(exec.error());
  caf::error err;
  std::pair<uint64_t, uint64_t> out;
  im.self->request(*exec, im.opts.timeout, info_atom::value)
    .receive([&](uint64_t graphs, uint64_t steps) { out = {graphs, steps}; },
             [&](caf::error& e) { err = im.link.explain(std::move(e), "executor " + device, *conn); });
  if (err)
    return err;
  return out;
}

} // namespace af
