// af.train: ClusterSpec, Server (a node of the cluster running in this
// Python process, tf.train.Server), LocalCluster / create_local_cluster
// (af::embedded_cluster: every task of a cluster in this process, on free
// loopback ports, as tf.test.create_local_cluster), and the targets
// ("actorflow://HOST:PORT") a Session is made with.
#include "python/bindings.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <limits>

#include "caf/all.hpp"

#include "actors/node.hpp"
#include "actors/pending_reply.hpp"
#include "actors/system.hpp"
#include "dist/aggregator.hpp"
#include "dist/embedded_cluster.hpp"
#include "messages/error.hpp"

namespace af::python {

namespace {

using spec_ptr = std::shared_ptr<cluster_spec>;

/// Targets of this process's nodes (GIL-guarded). Weak: a target lives as
/// long as its Server, LocalCluster or a session on it does.
std::map<std::string, std::weak_ptr<target_entry>>& registry() {
  static std::map<std::string, std::weak_ptr<target_entry>> targets;
  return targets;
}

std::string target_of(const std::string& address) {
  return "actorflow://" + address;
}

/// A node that af.train.Server started (actorflow-node's steps: an actor
/// system, start_node on the task's address, registered as a node of this
/// process so that sessions in its system call it directly).
struct server_host {
  std::unique_ptr<system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  running_node node;
  std::string address;

  ~server_host() {
    // As embedded_cluster's members: the data plane's threads hold actors
    // of the system, so they stop first; the system waits for its actors.
    if (node.data_plane)
      node.data_plane->stop();
    unregister_local_node(address);
    caf::anon_send_exit(node.actor, caf::exit_reason::user_shutdown);
    node.actor = nullptr;
    sys.reset();
  }
};

/// af.train.Server: one task's node in this process.
struct py_server {
  std::shared_ptr<target_entry> entry;
  std::string target;
  /// The node this Server started (null for a LocalCluster's task, whose
  /// nodes stop with the cluster).
  std::shared_ptr<server_host> host;
};

std::shared_ptr<target_entry> add_target(std::shared_ptr<target_entry> e) {
  registry()[target_of(e->address)] = e;
  return e;
}

std::string short_repr(py::handle h) {
  auto r = py::repr(h).cast<std::string>();
  return r.size() > 80 ? r.substr(0, 77) + "..." : r;
}

spec_ptr to_spec(py::handle cluster) {
  if (py::isinstance<spec_ptr::element_type>(cluster))
    return cluster.cast<spec_ptr>();
  // A list or a string was read as a dict with no jobs, and a job's value
  // of the wrong type was pybind11's "Unable to cast Python instance to C++
  // type": the TypeError says which job and what it takes.
  if (!py::isinstance<py::dict>(cluster))
    throw py::type_error("ClusterSpec: the cluster is a dict of job name: [\"host:port\", ...] "
                         "(or a ClusterSpec); got " + short_repr(cluster));
  std::map<std::string, std::vector<std::string>> jobs;
  for (auto item : py::reinterpret_borrow<py::dict>(cluster)) {
    if (!py::isinstance<py::str>(item.first))
      throw py::type_error("ClusterSpec: a job name is a string; got " + short_repr(item.first));
    auto job = str_arg(item.first, "ClusterSpec: a job name");
    if (py::isinstance<py::dict>(item.second)) {
      // TF's sparse form {index: address}: every index from 0 must be there.
      std::map<int64_t, std::string> tasks;
      for (auto task : py::reinterpret_borrow<py::dict>(item.second)) {
        if (!py::isinstance<py::int_>(task.first) || !py::isinstance<py::str>(task.second))
          throw py::type_error("ClusterSpec: job '" + job + "' as a dict maps task indexes (ints) "
                               "to \"host:port\" strings; got " + short_repr(task.first) + ": "
                               + short_repr(task.second));
        tasks[task.first.cast<int64_t>()] = str_arg(task.second, "ClusterSpec: job '" + job + "': an address");
      }
      int64_t next = 0;
      for (auto& [index, address] : tasks) {
        if (index != next++)
          raise(af_error::invalid_config, "ClusterSpec: job '" + job + "' has no task "
                                            + std::to_string(next - 1) + "; give tasks 0 to N-1");
        jobs[job].push_back(address);
      }
    } else {
      bool addresses = py::isinstance<py::list>(item.second) || py::isinstance<py::tuple>(item.second);
      if (addresses)
        for (auto a : item.second)
          addresses = addresses && py::isinstance<py::str>(a);
      if (!addresses)
        throw py::type_error("ClusterSpec: job '" + job + "' is a list of \"host:port\" strings "
                             "(or a dict of task index: \"host:port\"); got "
                             + short_repr(item.second));
      for (auto a : item.second)
        jobs[job].push_back(str_arg(a, "ClusterSpec: job '" + job + "': an address"));
    }
  }
  auto spec = cluster_spec::from_jobs(jobs, "ClusterSpec");
  if (!spec)
    raise(spec.error());
  return std::make_shared<cluster_spec>(std::move(*spec));
}

py::dict as_dict(const cluster_spec& spec) {
  py::dict out;
  for (const auto& [job, tasks] : spec.jobs()) {
    py::list addresses;
    for (const auto& t : tasks)
      addresses.append(t.to_string());
    out[py::str(job)] = addresses;
  }
  return out;
}

/// A task index argument (`what`: "Server: task_index").
int32_t task_arg(py::handle task, const std::string& what) {
  return static_cast<int32_t>(int_arg(task, what, 0, std::numeric_limits<int32_t>::max()));
}

py_server start_server(py::handle cluster, py::handle job_name, py::handle task_index,
                       py::handle thread_count) {
  auto spec = to_spec(cluster);
  auto job = str_arg(job_name, "Server: job_name");
  auto task = task_arg(task_index, "Server: task_index");
  auto threads = static_cast<int32_t>(int_arg(thread_count, "Server: threads", 0, 1024));
  auto address = spec->address(job, task);
  if (!address)
    raise(address.error());
  node_options opts = embedded_cluster::defaults();
  if (threads > 0)
    opts.threads = threads;
  auto host = std::make_shared<server_host>();
  caf::error err;
  {
    py::gil_scoped_release unlocked;
    host->cfg = std::make_unique<system_config>(opts);
    host->sys = start_actor_system(*host->cfg);
    auto node = start_node(*host->sys, job, task, address->host, address->port, opts, {},
                           node_aggregators());
    if (node) {
      host->node = std::move(*node);
      host->address = address->to_string();
      register_local_node(host->address, host->sys.get(), host->node.actor);
    } else {
      err = std::move(node.error());
    }
  }
  if (err)
    raise(err);
  auto e = std::make_shared<target_entry>();
  e->system = host->sys.get();
  e->job = job;
  e->task = task;
  e->address = host->address;
  e->spec = spec;
  e->owner = host;
  add_target(e);
  return py_server{e, target_of(e->address), host};
}

/// af.train.LocalCluster: an embedded_cluster and a Server for each task.
struct py_local_cluster {
  std::shared_ptr<embedded_cluster> cluster;
  spec_ptr spec;
  std::vector<py_server> servers;

  const py_server& server(py::handle job_name, py::handle task_index) const {
    auto job = str_arg(job_name, "LocalCluster: job_name");
    auto task = task_arg(task_index, "LocalCluster: task_index");
    for (const auto& s : servers)
      if (s.entry->job == job && s.entry->task == task)
        return s;
    if (auto err = spec->check_task(job, task))
      raise(err);
    raise(af_error::not_found, "this LocalCluster was stopped");
  }
};

/// LocalCluster's jobs argument: {"ps": 1, "worker": 2}; a count that is
/// not a whole number (2.5, "2") was pybind11's "incompatible constructor
/// arguments".
std::map<std::string, int> jobs_arg(py::handle value, const std::string& what) {
  if (!py::isinstance<py::dict>(value))
    throw py::type_error(what + ": jobs is a dict of job name: task count, {\"ps\": 1, "
                                "\"worker\": 2}; got " + short_repr(value));
  std::map<std::string, int> jobs;
  for (auto item : py::reinterpret_borrow<py::dict>(value)) {
    auto job = str_arg(item.first, what + ": a job name");
    jobs[job] = static_cast<int>(int_arg(item.second, what + ": the task count of job '" + job + "'",
                                         0, 1 << 20));
  }
  return jobs;
}

py_local_cluster start_local(const std::map<std::string, int>& jobs) {
  // Every task is a node of this process (an actor system, its threads and
  // sockets): {"worker": 100000} started nodes until the process ran out of
  // file descriptors, for seconds, and then failed or exited.
  constexpr int64_t most_tasks = 128;
  int64_t tasks = 0;
  for (const auto& kv : jobs)
    tasks += std::max(kv.second, 0);
  if (tasks > most_tasks)
    raise(af_error::invalid_argument,
          "LocalCluster: " + std::to_string(tasks) + " tasks, at most " + std::to_string(most_tasks)
            + " in one process (each is a node with its own threads and sockets); for more, "
              "run actorflow-node per task and af.Session(target, cluster=spec)");
  caf::expected<std::unique_ptr<embedded_cluster>> ec{caf::error{}};
  {
    py::gil_scoped_release unlocked;
    ec = embedded_cluster::start(jobs);
  }
  if (!ec)
    raise(ec.error());
  py_local_cluster lc;
  lc.cluster = std::shared_ptr<embedded_cluster>(std::move(*ec));
  lc.spec = std::make_shared<cluster_spec>(lc.cluster->spec());
  for (const auto& [job, tasks] : lc.spec->jobs())
    for (int32_t t = 0; t < static_cast<int32_t>(tasks.size()); ++t) {
      auto e = std::make_shared<target_entry>();
      e->system = &lc.cluster->system(job, t);
      e->owner = lc.cluster;
      e->job = job;
      e->task = t;
      e->address = tasks[static_cast<size_t>(t)].to_string();
      e->spec = lc.spec;
      add_target(e);
      lc.servers.push_back(py_server{e, target_of(e->address), nullptr});
    }
  return lc;
}

/// Waits until the server's node stops: asked to (stop(), a client's
/// shutdown) or failed. Then its data plane stops too, as actorflow-node's
/// does: nothing of the task answers any more. The wait goes in slices of
/// 20 ms with the GIL released, Python's signal handlers run between them:
/// Ctrl-C raises KeyboardInterrupt (TF's join blocked it for good) and the
/// node runs on.
void join(const py_server& s) {
  auto sys = s.entry->system;
  auto stopped = std::make_shared<pending_reply<bool>>();
  caf::actor helper;
  {
    py::gil_scoped_release unlocked;
    if (auto node = find_local_node(s.entry->address, sys))
      helper = sys->spawn([stopped, node](caf::event_based_actor* a) -> caf::behavior {
        a->set_down_handler([stopped, a](caf::down_msg&) {
          stopped->settle(true);
          a->quit();
        });
        a->monitor(node);
        return {[](caf::unit_t) {}}; // waits for the down message only
      });
    else
      stopped->settle(true);
  }
  for (;;) {
    bool done = false;
    {
      py::gil_scoped_release unlocked;
      done = stopped->wait_for(std::chrono::milliseconds{20});
    }
    if (done)
      break;
    if (PyErr_CheckSignals() != 0) {
      caf::anon_send_exit(helper, caf::exit_reason::user_shutdown);
      throw py::error_already_set();
    }
  }
  py::gil_scoped_release unlocked;
  if (s.host && s.host->node.data_plane)
    s.host->node.data_plane->stop();
}

/// Stops a Server's node (join() returns); a LocalCluster's tasks stop
/// with their cluster.
void stop(const py_server& s) {
  if (!s.host)
    raise(af_error::invalid_argument,
          "this Server is a task of a cluster of this process (a LocalCluster's, or made by "
          "Server.create_local_server() or create_local_cluster()), which stops as a whole: "
          "LocalCluster.stop(), or, for the others, once no Server and no Session of that "
          "cluster is left (del them); start an af.train.Server(spec, job, task) to stop one "
          "task alone");
  caf::anon_send_exit(s.host->node.actor, caf::exit_reason::user_shutdown);
}

void register_server(py::module_& train) {
  py::class_<py_server>(train, "Server",
    "A task's node running in this process (tf.train.Server); sessions reach it by .target.")
    .def(py::init(&start_server), py::arg("cluster"), py::arg("job_name"), py::arg("task_index") = 0,
         py::arg("threads") = 0,
         "starts the node of /job:job_name/task:task_index on its address in `cluster` (a "
         "ClusterSpec or a dict); threads: its scheduler's (0: two)")
    .def_readonly("target", &py_server::target, "\"actorflow://HOST:PORT\", for af.Session")
    .def_property_readonly("job_name", [](const py_server& s) { return s.entry->job; })
    .def_property_readonly("task_index", [](const py_server& s) { return s.entry->task; })
    .def_property_readonly("server_def", [](const py_server& s) { return as_dict(*s.entry->spec); })
    .def("join", &join, "blocks until this node stops (the GIL is released)")
    .def("stop", &stop, "stops the node (not in TF): join() returns, sessions on it then fail "
         "with PeerDownError")
    .def_static("create_local_server", [] {
      auto lc = start_local({{"local", 1}});
      return lc.servers.front();
    }, "a one-task cluster of this process, on a free loopback port");
}

void register_local_cluster(py::module_& train) {
  py::class_<py_local_cluster>(train, "LocalCluster",
    "Every task of a cluster as a node of this process, on free loopback ports (tests, scripts).")
    .def(py::init([](py::handle jobs) { return start_local(jobs_arg(jobs, "LocalCluster")); }),
         py::arg("jobs"), "jobs: job name -> task count, {\"ps\": 1, \"worker\": 2}")
    .def_readonly("cluster_spec", &py_local_cluster::spec)
    .def("server", &py_local_cluster::server, py::arg("job_name"), py::arg("task_index") = 0)
    .def("target", [](const py_local_cluster& lc, py::handle job, py::handle task) {
      return lc.server(job, task).target;
    }, py::arg("job_name"), py::arg("task_index") = 0)
    .def("stop", [](py_local_cluster& lc) {
      // The nodes stop once the sessions still on them are closed too.
      py::gil_scoped_release unlocked;
      lc.servers.clear();
      lc.cluster.reset();
    })
    .def("__enter__", [](py_local_cluster& lc) -> py_local_cluster& { return lc; },
         py::return_value_policy::reference)
    .def("__exit__", [](py_local_cluster& lc, py::args) {
      py::gil_scoped_release unlocked;
      lc.servers.clear();
      lc.cluster.reset();
    });
  train.def("create_local_cluster", [](py::handle worker_count, py::handle ps_tasks) {
    auto num_workers = static_cast<int>(int_arg(worker_count, "create_local_cluster: num_workers", 0, 1 << 20));
    auto num_ps = static_cast<int>(int_arg(ps_tasks, "create_local_cluster: num_ps", 0, 1 << 20));
    std::map<std::string, int> jobs{{"worker", num_workers}};
    if (num_ps > 0)
      jobs["ps"] = num_ps;
    auto lc = start_local(jobs);
    py::list workers, ps;
    for (auto& s : lc.servers)
      (s.entry->job == "worker" ? workers : ps).append(s);
    return py::make_tuple(workers, ps);
  }, py::arg("num_workers"), py::arg("num_ps"),
     "(workers, ps_servers): Servers of a new cluster of this process (tf.test.create_local_cluster)");
}

/// A client of a cluster whose nodes may run elsewhere: an actor system of
/// its own (as actorflow-repl --config has), shared by the sessions made
/// with it.
struct client_host {
  std::unique_ptr<system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
};

/// The task of `spec` whose address `target` names ("actorflow://H:P",
/// "grpc://H:P" or "H:P"), reached from a client system of its own.
std::shared_ptr<target_entry> client_target(const std::string& target, spec_ptr spec) {
  auto address = target;
  for (const char* scheme : {"actorflow://", "grpc://"})
    if (address.rfind(scheme, 0) == 0)
      address = address.substr(std::string(scheme).size());
  for (const auto& [job, tasks] : spec->jobs())
    for (size_t t = 0; t < tasks.size(); ++t) {
      if (tasks[t].to_string() != address)
        continue;
      auto host = std::make_shared<client_host>();
      {
        py::gil_scoped_release unlocked;
        host->cfg = std::make_unique<system_config>(node_options{});
        host->sys = start_actor_system(*host->cfg);
      }
      auto e = std::make_shared<target_entry>();
      e->system = host->sys.get();
      e->owner = host;
      e->job = job;
      e->task = static_cast<int32_t>(t);
      e->address = address;
      e->spec = spec;
      return e;
    }
  raise(af_error::not_found, "no task of the cluster " + spec->to_json() + " is at '" + address
                               + "'; give the address of one of its tasks");
}

} // namespace

std::shared_ptr<target_entry> resolve_target(const std::string& target, py::handle cluster) {
  if (!cluster.is_none())
    return client_target(target, to_spec(cluster));
  if (target.empty()) {
    // tf.Session() with no target: a one-task cluster of this process,
    // shared by the sessions that use it and stopped after the last.
    static std::weak_ptr<target_entry> local;
    if (auto e = local.lock())
      return e;
    auto lc = start_local({{"local", 1}});
    local = lc.servers.front().entry;
    return lc.servers.front().entry;
  }
  auto it = registry().find(target);
  if (it != registry().end())
    if (auto e = it->second.lock())
      return e;
  raise(af_error::not_found, "no node of this process has target '" + target
                               + "'; use the .target of a live af.train.Server or LocalCluster "
                                 "(\"actorflow://HOST:PORT\")");
}

void register_cluster(py::module_& m) {
  auto train = m.def_submodule("train", "clusters and servers (tf.train)");
  py::class_<cluster_spec, spec_ptr>(train, "ClusterSpec",
    "Job names and their tasks' addresses (tf.train.ClusterSpec).")
    .def(py::init(&to_spec), py::arg("cluster"), "cluster: {\"ps\": [\"host:port\"], \"worker\": [...]}")
    .def("as_dict", &as_dict)
    .def_property_readonly("jobs", [](const cluster_spec& s) {
      std::vector<std::string> jobs;
      for (const auto& kv : s.jobs())
        jobs.push_back(kv.first);
      return jobs;
    })
    .def("num_tasks", [](const cluster_spec& s, py::handle job_name) {
      auto job = str_arg(job_name, "ClusterSpec.num_tasks: job_name");
      if (!s.has_job(job))
        raise(af_error::unknown_job, "the cluster has no job '" + job + "'");
      return s.num_tasks(job);
    }, py::arg("job_name"))
    .def("task_address", [](const cluster_spec& s, py::handle job_name, py::handle task_index) {
      auto a = s.address(str_arg(job_name, "ClusterSpec.task_address: job_name"),
                         task_arg(task_index, "ClusterSpec.task_address: task_index"));
      if (!a)
        raise(a.error());
      return a->to_string();
    }, py::arg("job_name"), py::arg("task_index"))
    .def_static("from_tf_config", [] {
      auto config = cluster_config_from_env();
      if (!config)
        raise(config.error());
      return std::make_shared<cluster_spec>(config->cluster);
    }, "the cluster of the TF_CONFIG environment variable (TensorFlow's JSON); its task is "
       "json.loads(os.environ[\"TF_CONFIG\"])[\"task\"]")
    .def("__repr__", [](const cluster_spec& s) { return "ClusterSpec(" + s.to_json() + ")"; });
  register_server(train);
  register_local_cluster(train);
  py::module_::import("sys").attr("modules")["actorflow.train"] = train;
}

} // namespace af::python
