#include "actors/node.hpp"

#include "actors/kv_store.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <new>
#include <random>

#include "caf/all.hpp"
#include "caf/io/middleman.hpp"

#include "net/caf_port.hpp"
#include "net/testing_hooks.hpp"
#include "actors/executor.hpp"
#include "core/log.hpp"
#include "actors/system.hpp"
#include "actors/table_shards.hpp"
#include "actors/variable.hpp"
#include "kernels/kernels.hpp"
#include "core/device_name.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

struct local_directory {
  std::mutex mtx;
  std::map<std::string, std::pair<caf::actor_system*, node_actor>> nodes;
};

local_directory& directory() {
  static local_directory dir;
  return dir;
}

/// New at every start, so that a client tells a restarted node from one it
/// reconnected to.
uint64_t new_incarnation() {
  std::random_device rd;
  uint64_t x = 0;
  while (x == 0)
    x = (static_cast<uint64_t>(rd()) << 32) | rd();
  return x;
}

int64_t steady_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

using node_ptr = node_actor::stateful_pointer<node_state>;

/// One executor per device: the configured CPU "devices" share one host
/// backend; each GPU the CUDA runtime finds gets its own backend (stream).
void spawn_executors(node_ptr self, const node_options& opts) {
  auto& st = self->state;
  std::shared_ptr<kernels::backend> cpu = kernels::make_cpu_backend();
  for (int32_t i = 0; i < std::max<int32_t>(1, opts.cpu_devices); ++i) {
    auto local = "CPU:" + std::to_string(i);
    st.info.devices.push_back(local);
    st.executors[local] = self->spawn<caf::linked>(executor_impl, st.device_prefix + "/device:" + local,
                                                   cpu, std::shared_ptr<kernels::backend>{});
  }
  int gpus = kernels::cuda_device_count();
  for (int i = 0; i < gpus; ++i) {
    std::string why;
    std::shared_ptr<kernels::backend> gpu = kernels::make_cuda_backend(i, &why);
    auto local = "GPU:" + std::to_string(i);
    if (!gpu) {
      // Said in the ready line and in ping: a GPU that silently went missing
      // would only show as ops running on the CPU.
      st.info.device_errors.push_back(local + ": " + (why.empty() ? "failed to initialize" : why));
      log::get()->warn("{}: {} is not used: {}", st.device_prefix, local,
                       why.empty() ? "failed to initialize" : why);
      continue;
    }
    st.info.devices.push_back(local);
    st.executors[local] = self->spawn<caf::linked>(executor_impl, st.device_prefix + "/device:" + local,
                                                   gpu, cpu);
  }
  // Edge frames on the data plane find the executors by full device name;
  // they leave the directory with the node (an executor's failure ends it).
  if (st.directory) {
    std::vector<std::string> devices;
    for (const auto& [local, exec] : st.executors) {
      devices.push_back(st.device_prefix + "/device:" + local);
      st.directory->put_executor(devices.back(), exec);
    }
    self->attach_functor([dir = st.directory, devices](const caf::error&) {
      for (const auto& d : devices)
        dir->remove_executor(d);
    });
  }
}

/// Variables, aggregators and the kv store end with the node; a variable
/// that ends alone is forgotten. An executor's failure ends the node.
void watch_children(node_ptr self) {
  auto& st = self->state;
  // Variables end with the node; one that ends alone is forgotten, and the
  // node serves on. An executor's failure ends the node.
  st.variable_names = std::make_shared<std::map<caf::actor_addr, std::string>>();
  st.owned = std::make_shared<std::vector<caf::actor_addr>>();
  self->attach_functor([vars = st.variable_names, owned = st.owned](const caf::error&) {
    for (const auto& kvp : *vars)
      caf::anon_send_exit(kvp.first, caf::exit_reason::user_shutdown);
    for (const auto& a : *owned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto it = st.variable_names->find(dm.source);
    if (it == st.variable_names->end())
      return;
    auto name = it->second;
    st.variable_names->erase(it);
    auto var = st.variables.find(name);
    if (var != st.variables.end() && var->second.actor.address() == dm.source)
      st.variables.erase(var);
    if (st.directory)
      st.directory->remove(name, dm.source);
    log::get()->info("{}: variable '{}' removed: its actor ended ({})", st.device_prefix, name,
                     describe(dm.reason));
  });
  self->set_exit_handler([self](caf::exit_msg& em) {
    if (!em.reason)
      return;
    for (const auto& kvp : self->state.executors)
      if (kvp.second.address() == em.source)
        log::get()->error("{}: executor {} failed ({}); stopping the node",
                          self->state.device_prefix, kvp.first, describe(em.reason));
    // Else someone told the node to stop (shutdown, a signal): CAF's default.
    self->quit(std::move(em.reason));
  });
}

/// get_var: the variable `spec` names, made here if new (get-or-create).
caf::result<variable_actor> get_variable(node_ptr self, variable_spec& spec) {
  auto& st = self->state;
  if (spec.name.empty())
    return make_error(af_error::invalid_argument, "a variable needs a non-empty name");
  if (spec.name.size() > wire::max_name)
    return make_error(af_error::invalid_argument,
                      "variable name of " + std::to_string(spec.name.size())
                        + " bytes (at most " + std::to_string(wire::max_name) + ")");
  // Negative dimensions, unknown dtypes and sizes that overflow are
  // refused before anything is allocated for the variable.
  auto bytes = value_bytes(spec);
  if (!bytes)
    return std::move(bytes.error());
  // The same limit as the data plane's ops, here where the buffer (and
  // an optimizer's slots of the same size) would be made.
  if (*bytes > static_cast<uint64_t>(st.max_variable_bytes))
    return make_error(af_error::resource_exhausted,
                      fmt::format("variable '{}' of {}{} needs {} bytes, over node {}'s limit "
                                  "of {} bytes per variable ([node] max_variable_bytes)",
                                  spec.name, dtype_name(spec.type), shape_string(spec.shape),
                                  *bytes, st.device_prefix, st.max_variable_bytes));
  auto dev = device_name::parse(spec.device);
  if (!dev || !st.executors.count(dev->local_device()))
    return make_error(af_error::unknown_device,
                      "variable '" + spec.name + "': node " + st.device_prefix
                        + " has no device " + spec.device);
  auto found = st.find_compatible(spec);
  if (!found)
    return std::move(found.error());
  if (*found != nullptr)
    return variable_actor{(*found)->actor};
  variable_cell_actor actor;
  try {
    auto cell = std::make_shared<variable_cell>(spec);
    actor = self->spawn(variable_impl, cell);
    self->monitor(actor);
    st.variable_names->emplace(actor.address(), spec.name);
    st.variables.emplace(spec.name, node_state::entry{spec, actor});
    if (st.directory)
      st.directory->put(spec.name, {actor, std::move(cell)});
  } catch (const std::bad_alloc&) {
    st.variables.erase(spec.name);
    if (st.directory)
      st.directory->remove(spec.name);
    if (actor) {
      st.variable_names->erase(actor.address());
      self->send_exit(actor, caf::exit_reason::user_shutdown);
    }
    return make_error(af_error::resource_exhausted,
                      "variable '" + spec.name + "': node " + st.device_prefix
                        + " has no memory for another variable");
  }
  return variable_actor{actor};
}

/// list: every variable of the node with what its actor says of itself.
caf::result<std::vector<variable_info>> list_variables(node_ptr self) {
  auto& vars = self->state.variables;
  auto rp = self->make_response_promise<std::vector<variable_info>>();
  if (vars.empty()) {
    rp.deliver(std::vector<variable_info>{});
    return rp;
  }
  struct gather {
    std::vector<variable_info> infos;
    size_t missing;
  };
  auto g = std::make_shared<gather>();
  g->missing = vars.size();
  for (auto& kvp : vars) {
    auto spec = kvp.second.spec;
    self->request(kvp.second.actor, std::chrono::milliseconds{self->state.request_timeout_ms},
                  info_atom::value)
      .then(
        [g, rp](variable_info& info) mutable {
          g->infos.push_back(std::move(info));
          if (--g->missing == 0)
            rp.deliver(std::move(g->infos));
        },
        [g, rp, spec](caf::error&) mutable {
          variable_info unknown; // the actor did not answer: say nothing about it
          unknown.spec = spec;
          g->infos.push_back(std::move(unknown));
          if (--g->missing == 0)
            rp.deliver(std::move(g->infos));
        });
  }
  return rp;
}

/// aggregator: a lookup (`spec.workers == 0`), or get-or-create.
caf::result<aggregator_actor> get_aggregator(node_ptr self, aggregator_spec& spec) {
  auto& st = self->state;
  auto it = st.aggregators.find(spec.name);
  if (spec.workers == 0) {
    // A lookup (a joining worker, a status or switch client): the
    // aggregator as it runs now, whatever mode it has switched to.
    if (it == st.aggregators.end())
      return make_error(af_error::not_found,
                        fmt::format("{} has no aggregator '{}': is the job running, and "
                                    "was it started with this config?",
                                    st.device_prefix, spec.name));
    return it->second.actor;
  }
  if (it != st.aggregators.end()) {
    // Get-or-create hands back the existing one only for the same
    // updates: another optimizer would silently train with the first's.
    auto diff = st.aggregator_kinds.difference
                  ? st.aggregator_kinds.difference(it->second.spec, spec)
                  : std::string{};
    if (!diff.empty())
      return make_error(af_error::already_exists,
                        fmt::format("{} already has aggregator '{}', made with another spec "
                                    "(existing vs asked: {}); give the new one another name "
                                    "or ask with the same spec",
                                    st.device_prefix, spec.name, diff));
    return it->second.actor;
  }
  if (!st.aggregator_kinds.spawn)
    return make_error(af_error::invalid_config,
                      fmt::format("{} cannot host aggregator '{}': this node was started "
                                  "without the training layer (start_node's aggregators, "
                                  "dist/aggregator.hpp node_aggregators())",
                                  st.device_prefix, spec.name));
  std::vector<variable_directory::entry> vars;
  size_t floats = 0;
  variable_directory::aggregator_entry plane_entry; // what a push frame must carry
  for (const auto& name : spec.variables) {
    auto e = st.directory ? st.directory->get(name) : variable_directory::entry{};
    if (!e.cell)
      return make_error(af_error::not_found,
                        fmt::format("aggregator '{}': {} holds no variable '{}'; create the "
                                    "variables (the chief's session does) first",
                                    spec.name, st.device_prefix, name));
    floats += e.cell->value_elements();
    const auto& shape = e.cell->spec().shape;
    if (std::find(spec.sparse.begin(), spec.sparse.end(), name) != spec.sparse.end()
        && !shape.empty()) {
      plane_entry.table_rows.emplace_back(shape.begin() + 1, shape.end());
      plane_entry.table_sizes.push_back(shape[0]);
    } else {
      plane_entry.dense_floats += e.cell->value_elements();
    }
    vars.push_back(std::move(e));
  }
  plane_entry.gate = std::make_shared<push_gate>();
  auto paths = std::make_shared<plane_push_paths>();
  auto agg = st.aggregator_kinds.spawn(self->system(), spec, std::move(vars), plane_entry.gate,
                                       paths);
  plane_entry.paths = std::move(paths); // set by now: only read from here on
  if (!agg)
    return std::move(agg.error());
  st.owned->push_back(agg->address());
  st.aggregators[spec.name] = {spec, *agg};
  if (st.directory) {
    plane_entry.actor = *agg;
    plane_entry.floats = floats;
    plane_entry.wait = std::chrono::milliseconds{spec.step_timeout_ms} + std::chrono::seconds{2};
    st.directory->put_aggregator(spec.name, std::move(plane_entry));
  }
  log::get()->info("{}: {} aggregator '{}' for {} workers over {} variables", st.device_prefix,
                   spec.mode, spec.name, spec.workers, spec.variables.size());
  return *agg;
}

} // namespace

namespace {

/// How a data-plane thread hands a push or pull frame to its aggregator: a
/// blocking request from a scoped actor; the thread waits, the aggregator
/// does not.
variable_directory::aggregator_call push_call(caf::actor_system& sys) {
  return [&sys](const aggregator_actor& agg, uint8_t kind, uint32_t worker, uint64_t step,
         push_credentials who, tensor values,
         std::chrono::milliseconds wait) -> caf::expected<variable_directory::aggregator_answer> {
    caf::expected<variable_directory::aggregator_answer> out{
      make_error(af_error::internal, "the aggregator did not answer")};
    caf::scoped_actor self{sys};
    // The answer's parameters as the variables hold them (no flat copy).
    auto sink = thread_answer_parts();
    auto on_pushed = [&](uint64_t global_step, tensor& params, bool dropped_late) {
      out = variable_directory::aggregator_answer{global_step, std::move(params), dropped_late,
                                                  sink};
    };
    auto on_value = [&](uint64_t global_step, tensor& params) {
      out = variable_directory::aggregator_answer{global_step, std::move(params), false, nullptr};
    };
    auto on_error = [&](caf::error& err) { out = std::move(err); };
    if (kind == static_cast<uint8_t>(wire::kind::push)
        || kind == static_cast<uint8_t>(wire::kind::push_params)) {
      std::vector<tensor> parts;
      if (!values.empty())
        parts.push_back(std::move(values));
      who.parts = sink;
      if (kind == static_cast<uint8_t>(wire::kind::push_params))
        self->request(agg, wait, push_atom::value, params_atom::value, worker, step,
                      std::move(who), std::move(parts))
          .receive(on_pushed, on_error);
      else
        self->request(agg, wait, push_atom::value, worker, step, std::move(who),
                      std::move(parts))
          .receive(on_pushed, on_error);
    } else {
      self->request(agg, wait, pull_atom::value).receive(on_value, on_error);
    }
    return out;
  };
}

/// How a data-plane thread hands a sparse push (wire::kind::push_sparse) to
/// its aggregator: a blocking request from a scoped actor, as a push's.
variable_directory::sparse_aggregator_call sparse_push_call(caf::actor_system& sys) {
  return [&sys](const aggregator_actor& agg, uint32_t worker, uint64_t step, push_credentials who,
         sparse_push_values values,
         std::chrono::milliseconds wait) -> caf::expected<variable_directory::aggregator_answer> {
    caf::expected<variable_directory::aggregator_answer> out{
      make_error(af_error::internal, "the aggregator did not answer")};
    caf::scoped_actor self{sys};
    self->request(agg, wait, push_atom::value, sparse_atom::value, worker, step, std::move(who),
                  std::move(values))
      .receive(
        [&](uint64_t global_step, tensor&, bool dropped_late) {
          out = variable_directory::aggregator_answer{global_step, tensor{}, dropped_late, nullptr};
        },
        [&](caf::error& err) { out = std::move(err); });
    return out;
  };
}

} // namespace

void register_local_node(const std::string& address, caf::actor_system* sys, node_actor node) {
  std::lock_guard<std::mutex> guard{directory().mtx};
  directory().nodes[address] = {sys, std::move(node)};
}

void unregister_local_node(const std::string& address) {
  std::lock_guard<std::mutex> guard{directory().mtx};
  directory().nodes.erase(address);
}

node_actor find_local_node(const std::string& address, caf::actor_system* sys) {
  std::lock_guard<std::mutex> guard{directory().mtx};
  auto it = directory().nodes.find(address);
  if (it == directory().nodes.end() || it->second.first != sys)
    return node_actor{};
  return it->second.second;
}

caf::expected<const node_state::entry*>
node_state::find_compatible(const variable_spec& spec) const {
  auto it = variables.find(spec.name);
  if (it == variables.end())
    return static_cast<const entry*>(nullptr);
  const auto& have = it->second.spec;
  if (have.type != spec.type)
    return make_error(af_error::dtype_mismatch,
                      "variable '" + spec.name + "' exists on " + have.device + " with dtype "
                        + dtype_name(have.type) + ", requested " + dtype_name(spec.type));
  if (have.shape != spec.shape)
    return make_error(af_error::shape_mismatch,
                      "variable '" + spec.name + "' exists on " + have.device + " with shape "
                        + shape_string(have.shape) + ", requested " + shape_string(spec.shape)
                        + "; use another name or the same shape");
  return &it->second;
}

node_actor::behavior_type node_impl(node_actor::stateful_pointer<node_state> self,
                                    std::string job, int32_t task, node_options opts,
                                    std::shared_ptr<variable_directory> directory,
                                    uint16_t data_port, aggregator_services aggregators,
                                    node_clock clock) {
  auto& st = self->state;
  st.clock = clock;
  st.directory = std::move(directory);
  st.aggregator_kinds = std::move(aggregators);
  st.request_timeout_ms = opts.request_timeout_ms;
  st.max_variable_bytes = opts.max_variable_bytes;
  st.info.data_port = data_port;
  st.info.job = job;
  st.info.task = task;
  st.info.pid = static_cast<int32_t>(::getpid());
  st.info.incarnation = new_incarnation();
  st.device_prefix = "/job:" + job + "/replica:0/task:" + std::to_string(task);
  spawn_executors(self, opts);
  watch_children(self);
  return {
    [self](caf::ping_atom) -> node_info {
      auto info = self->state.info;
      info.clock_ns = self->state.clock ? self->state.clock() : steady_clock_ns();
      return info;
    },
    [self](get_var_atom, variable_spec& spec) -> caf::result<variable_actor> {
      return get_variable(self, spec);
    },
    [self](lookup_atom, std::string& name) -> caf::result<variable_actor> {
      auto it = self->state.variables.find(name);
      if (it == self->state.variables.end())
        return make_error(af_error::not_found,
                          "no variable '" + name + "' on " + self->state.device_prefix);
      return variable_actor{it->second.actor};
    },
    [self](list_atom) -> caf::result<std::vector<variable_info>> { return list_variables(self); },
    [self](executor_atom, std::string& device) -> caf::result<executor_actor> {
      auto it = self->state.executors.find(device);
      if (it == self->state.executors.end())
        return make_error(af_error::unknown_device,
                          "node " + self->state.device_prefix + " has no device " + device);
      return it->second;
    },
    [self](aggregator_atom, aggregator_spec& spec) -> caf::result<aggregator_actor> {
      return get_aggregator(self, spec);
    },
    [self](kv_store_atom) -> caf::result<kv_store_actor> {
      auto& st = self->state;
      if (!st.kv) {
        st.kv = spawn_kv_store(self->system());
        st.owned->push_back(st.kv.address());
      }
      return st.kv;
    },
    [self](save_atom, table_shard_request& req) -> caf::result<std::string> {
      auto e = self->state.directory->get(req.variable);
      if (!e.cell)
        return make_error(af_error::not_found, "table checkpoint: no variable '" + req.variable
                                                 + "' on " + self->state.device_prefix);
      return self->delegate(spawn_table_shard_worker(self->system(), e.cell, e.actor),
                            save_atom::value, std::move(req));
    },
    [self](restore_atom, table_shard_request& req) -> caf::result<uint64_t> {
      auto e = self->state.directory->get(req.variable);
      if (!e.cell)
        return make_error(af_error::not_found, "table restore: no variable '" + req.variable
                                                 + "' on " + self->state.device_prefix);
      return self->delegate(spawn_table_shard_worker(self->system(), e.cell, e.actor),
                            restore_atom::value, std::move(req));
    },
    [self](shutdown_atom) -> caf::result<caf::ok_atom> {
      // Answer first, then stop: linked variables and executors stop with us.
      auto rp = self->make_response_promise<caf::ok_atom>();
      rp.deliver(caf::ok_atom::value);
      self->quit(caf::exit_reason::user_shutdown);
      return rp;
    },
  };
}

bool is_loopback_host(const std::string& host) {
  if (host.empty())
    return false;
  if (host == "localhost")
    return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr)
    return false;
  bool all_loopback = true;
  for (auto* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      auto ip = ntohl(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr);
      all_loopback = all_loopback && (ip >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      auto& ip6 = reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr;
      all_loopback = all_loopback && IN6_IS_ADDR_LOOPBACK(&ip6);
    } else {
      all_loopback = false;
    }
  }
  ::freeaddrinfo(found);
  return all_loopback;
}

namespace {

/// The data plane's limits from [node].
data_plane_limits plane_limits(const node_options& opts) {
  data_plane_limits limits;
  limits.idle = std::chrono::milliseconds{opts.data_idle_timeout_ms};
  limits.frame = std::chrono::milliseconds{opts.data_frame_timeout_ms};
  limits.max_message_bytes = opts.max_message_bytes;
  limits.max_variable_bytes = opts.max_variable_bytes;
  limits.max_connections = opts.max_data_connections;
  limits.max_shm_bytes = opts.max_shm_bytes;
  return limits;
}

} // namespace

caf::expected<running_node> start_node(caf::actor_system& sys, const std::string& job,
                                       int32_t task, const std::string& bind_host,
                                       uint16_t port, const node_options& opts,
                                       const security_options& sec,
                                       aggregator_services aggregators, node_clock clock) {
  auto name = "/job:" + job + "/task:" + std::to_string(task);
  // The files are loaded here, before CAF reads them at its first connection.
  // No `sec` given: the system's own (a training task's node and sessions).
  auto tls = check_security(sys, sec, name);
  if (!tls)
    return std::move(tls.error());
  // Another task's certificate: every session that dials this node would
  // refuse it (the name check), so say it at start.
  if (*tls != nullptr) {
    auto mine = tls_own_task(**tls);
    if (!mine.empty() && mine != name) {
      auto* own = dynamic_cast<const system_config*>(&sys.config());
      const auto& file = sec.enabled() || own == nullptr ? sec.cert_file
                                                         : own->security().cert_file;
      return make_error(af_error::invalid_config,
                        fmt::format("{}: its certificate '{}' ([security] certificate) is {}'s: "
                                    "every session that dials this node would refuse it; use "
                                    "the certificate made for {} (actorflow-certs writes one "
                                    "per task; certificate = \"certs/{{name}}.pem\" picks it)",
                                    name, file, mine, name));
    }
  }
  auto* own = dynamic_cast<const system_config*>(&sys.config());
  bool insecure = sec.insecure || (own != nullptr && own->security().insecure);
  if (*tls == nullptr && !insecure && !is_loopback_host(bind_host))
    return make_error(af_error::invalid_config,
                      name + " refuses to listen on "
                        + (bind_host.empty() ? std::string{"every address"} : "'" + bind_host + "'")
                        + " without [security]: anyone who reaches the port could read, "
                          "overwrite or stop every variable. Add [security] (actorflow-certs "
                          "makes the files), bind a loopback address, or set [security] "
                          "insecure = true (or --insecure) to run plaintext on purpose");
  auto directory = std::make_shared<variable_directory>();
  auto limits = plane_limits(opts);
  // max_message_bytes for tensors that come through CAF too (messages/types.cpp's decoder), until it stops
  auto decode_cap = hold_max_decoded_tensor_bytes(static_cast<uint64_t>(opts.max_message_bytes));
  // [security] trusted_fabric: this node takes UCX from clients of other
  // hosts, and its own data channels (pushes, remote reads) offer it. (A
  // test binary's hook counts as its config's: net/testing_hooks.hpp; in a
  // program there is none, and no environment variable does this.)
  limits.trusted_fabric = sec.trusted_fabric || (own != nullptr && own->security().trusted_fabric)
                          || test_hooks_trust_fabric();
  if (limits.trusted_fabric)
    process_trusted_fabric() = true;
  auto data_plane = data_plane_server::start(directory, bind_host,
                                             static_cast<uint16_t>(opts.data_port), name, limits, *tls);
  if (!data_plane)
    return std::move(data_plane.error());
  std::shared_ptr<data_plane_server> plane = std::move(*data_plane);
  // Push and pull frames reach their aggregators through blocking requests.
  directory->set_aggregator_call(push_call(sys));
  directory->set_sparse_aggregator_call(sparse_push_call(sys));
  auto node = sys.spawn(node_impl, job, task, opts, directory, plane->port(),
                        std::move(aggregators), clock);
  // An exception from here on (bad_alloc in a spawn or a scoped_actor) would
  // unwind into ~actor_system, which waits for this node to end: it never
  // would. Stop it (and the data plane) on the way out.
  struct stop_if_thrown {
    caf::actor node;
    std::shared_ptr<data_plane_server> plane;
    int uncaught = std::uncaught_exceptions();
    ~stop_if_thrown() {
      if (std::uncaught_exceptions() <= uncaught)
        return;
      plane->stop();
      caf::anon_send_exit(node, caf::exit_reason::kill);
    }
  } on_throw{caf::actor_cast<caf::actor>(node), plane};
  // Our middleman actor publishes (CAF's would let a stranger's first header
  // size a buffer); it ends with the node.
  caf_port_options port_opts;
  port_opts.max_handshake_bytes = static_cast<uint32_t>(opts.max_handshake_bytes);
  port_opts.handshake_timeout = std::chrono::milliseconds{opts.handshake_timeout_ms};
  // A tensor travels inside a message: its header, names, shape.
  port_opts.max_message_bytes = static_cast<uint64_t>(opts.max_message_bytes) + (1 << 20);
  port_opts.tls = *tls;
  port_opts.who = name;
  auto port_keeper = spawn_guarded_middleman(sys, port_opts);
  caf::actor_cast<caf::abstract_actor*>(node)->attach_functor(
    [port_keeper, decode_cap](const caf::error&) {
      caf::anon_send_exit(port_keeper, caf::exit_reason::kill);
    });
  auto published = publish_guarded(sys, port_keeper, caf::actor_cast<caf::strong_actor_ptr>(node),
                                   sys.message_types(node), port, bind_host);
  if (!published) {
    plane->stop();
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
    if (is(published.error(), af_error::resource_exhausted))
      return std::move(published.error());
    return make_error(af_error::bind_failed,
                      "/job:" + job + "/task:" + std::to_string(task) + " cannot listen on "
                        + (bind_host.empty() ? std::string{"*"} : bind_host) + ":"
                        + std::to_string(port) + " (" + caf::to_string(published.error())
                        + "); is another process using the port? Pick a free port in the config");
  }
  running_node out;
  out.actor = node;
  out.port = *published;
  out.data_plane = std::move(plane);
  out.directory = directory;
  out.tls = *tls != nullptr;
  out.address = (bind_host.empty() ? std::string{"0.0.0.0"} : bind_host) + ":" + std::to_string(out.port);
  caf::scoped_actor self{sys, true};
  self->request(node, std::chrono::milliseconds{opts.request_timeout_ms}, caf::ping_atom::value)
    .receive(
      [&](node_info& info) {
        out.devices = info.devices;
        out.device_errors = info.device_errors;
      },
             [&](caf::error&) { /* devices stay empty; the node still serves */ });
  return out;
}

} // namespace af
