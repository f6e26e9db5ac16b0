// af.device: `with af.device("/job:ps/task:0"):` (nesting merges, inner fields
// winning, as TF's), `with af.device(None):` (the scopes outside it ignored, as
// TF's), and TF 1.x's between-graph placement helper,
// `with af.device(af.train.replica_device_setter(cluster=spec)):`, which puts
// each new variable on the next ps task (round robin) and everything else on
// the worker's device. Scopes are per thread (graph::push_scope).
#include "python/bindings.hpp"

#include <pybind11/stl.h>

#include <thread>

#include "core/device_name.hpp"

namespace af::python {

namespace py = pybind11;

/// af.train.replica_device_setter(...): where a new variable goes and
/// where the rest goes; `next` is the round robin's next ps task.
struct replica_setter {
  int32_t ps_tasks = 0;
  device_name ps_device;
  device_name worker_device;
  uint64_t next = 0;
};

namespace {

/// One `af.device(...)` object; `entered` has, for each `with` of it still
/// open, the graph it pushed its scope on, the depth of that thread's
/// scopes after the push (a block may be re-entered, nested in itself),
/// and, for af.device(None), the scopes it put aside.
struct device_block {
  enum class kind : uint8_t { name, none, setter };
  kind what = kind::name;
  device_name name; ///< kind::name; kind::setter: the worker's device
  std::shared_ptr<replica_setter> setter;
  struct open {
    graph_ptr g;
    size_t depth;
    std::vector<device_name> aside;
  };
  std::vector<open> entered;

  std::string describe() const {
    switch (what) {
      case kind::none: return "af.device(None)";
      case kind::setter: return "af.device(af.train.replica_device_setter(...))";
      default: return "af.device(\"" + name.to_string() + "\")";
    }
  }
};

void enter(device_block& d) {
  auto g = default_graph();
  std::vector<device_name> aside;
  if (d.what == device_block::kind::none) {
    aside = g->g.scopes();
    g->g.set_scopes({});
  }
  g->g.push_scope(d.name);
  auto depth = g->g.scopes().size();
  if (d.what != device_block::kind::name)
    g->replica_blocks[std::this_thread::get_id()].push_back({d.setter, depth});
  d.entered.push_back({g, depth, std::move(aside)});
}

void leave(device_block& d) {
  // Re-entering one block (`with dev: with dev:`) left its first scope open for
  // good, and a block closed before one opened inside it popped that one's:
  // every node built after was placed on a device no open block named.
  if (d.entered.empty())
    return;
  auto& top = d.entered.back();
  auto& g = top.g->g;
  if (g.scopes().size() != top.depth)
    throw py::value_error(d.describe() + ".__exit__: a device block opened inside it (or on "
                          "another thread) is still open; close blocks in the reverse order of "
                          "opening (`with` does)");
  g.pop_scope();
  if (d.what == device_block::kind::none)
    g.set_scopes(std::move(top.aside));
  if (d.what != device_block::kind::name) {
    auto& blocks = top.g->replica_blocks;
    auto it = blocks.find(std::this_thread::get_id());
    if (it != blocks.end() && !it->second.empty()) {
      it->second.pop_back();
      if (it->second.empty())
        blocks.erase(it);
    }
  }
  d.entered.pop_back();
}

device_name parse_device(const std::string& text, const std::string& what) {
  std::string why;
  auto d = device_name::parse(text, &why);
  if (!d)
    raise(af_error::invalid_device, what + " '" + text + "': " + why);
  return *d;
}

/// TF's replica_device_setter(ps_tasks, ps_device, worker_device,
/// merge_devices, cluster, ps_ops, ps_strategy): None when there is no ps
/// task (TF's too: `with af.device(None)` then ignores the scopes outside).
py::object make_setter(py::module_& m, const py::object& ps_tasks, const py::object& ps_device,
                       const py::object& worker_device, bool merge_devices,
                       const py::object& cluster, const py::object& ps_ops,
                       const py::object& ps_strategy) {
  const std::string fn = "af.train.replica_device_setter";
  if (!merge_devices)
    throw py::value_error(fn + ": merge_devices=False is not supported: a device the setter "
                          "picks always merges with the scopes around it (TF's default)");
  if (!ps_ops.is_none())
    throw py::value_error(fn + ": ps_ops is not supported: variables go to the ps, every "
                          "other op to worker_device");
  if (!ps_strategy.is_none())
    throw py::value_error(fn + ": ps_strategy is not supported: variables go to the ps tasks "
                          "round robin (TF's default strategy)");
  auto rs = std::make_shared<replica_setter>();
  rs->ps_tasks = static_cast<int32_t>(
    int_arg(ps_tasks, fn + ": ps_tasks", 0, std::numeric_limits<int32_t>::max()));
  if (!cluster.is_none()) {
    auto spec = cluster;
    if (!py::isinstance<cluster_spec>(spec))
      spec = m.attr("train").attr("ClusterSpec")(cluster); // a dict, as TF takes
    auto& cs = spec.cast<const cluster_spec&>();
    rs->ps_tasks = static_cast<int32_t>(cs.num_tasks("ps"));
  }
  if (rs->ps_tasks == 0)
    return py::none();
  rs->ps_device = parse_device(str_arg(ps_device, fn + ": ps_device"), fn + ": ps_device");
  if (!worker_device.is_none())
    rs->worker_device = parse_device(str_arg(worker_device, fn + ": worker_device"),
                                     fn + ": worker_device");
  return py::cast(rs);
}

} // namespace

replica_placement::replica_placement(py_graph& g, const std::string& name) : g_{g} {
  auto it = g.replica_blocks.find(std::this_thread::get_id());
  if (it == g.replica_blocks.end() || it->second.empty() || !it->second.back().setter
      || g.g.find_variable(name).valid())
    return;
  auto& block = it->second.back();
  auto scopes = g.g.scopes();
  if (block.depth == 0 || block.depth > scopes.size())
    return;
  auto& rs = *block.setter;
  auto ps = rs.ps_device;
  // TF picks a task when the ps device names none and the scopes outside
  // name no other job.
  device_name outside;
  for (size_t i = 0; i + 1 < block.depth; ++i)
    outside = scopes[i].merged_into(outside);
  if (!ps.task && (!outside.job || outside.job == ps.job))
    ps.task = static_cast<int32_t>(rs.next++ % static_cast<uint64_t>(rs.ps_tasks));
  saved_ = scopes;
  scopes[block.depth - 1] = ps;
  g.g.set_scopes(std::move(scopes));
}

replica_placement::~replica_placement() {
  if (saved_)
    g_.g.set_scopes(std::move(*saved_));
}

void register_device(py::module_& m) {
  py::class_<device_block>(m, "_DeviceBlock")
    .def("__enter__", [](device_block& d) { enter(d); })
    .def("__exit__", [](device_block& d, py::args) { leave(d); });
  py::class_<replica_setter, std::shared_ptr<replica_setter>>(
    m, "_ReplicaDeviceSetter",
    "af.train.replica_device_setter(...): give it to af.device (TF's device function)")
    .def_property_readonly("ps_tasks", [](const replica_setter& r) { return r.ps_tasks; })
    .def("__repr__", [](const replica_setter& r) {
      return "<af.train.replica_device_setter ps_tasks=" + std::to_string(r.ps_tasks)
             + " ps_device=" + r.ps_device.to_string()
             + " worker_device=" + r.worker_device.to_string() + ">";
    });
  m.def("device", [](const py::object& what) {
    device_block d;
    if (what.is_none()) {
      d.what = device_block::kind::none;
    } else if (py::isinstance<replica_setter>(what)) {
      d.what = device_block::kind::setter;
      d.setter = what.cast<std::shared_ptr<replica_setter>>();
      d.name = d.setter->worker_device;
    } else if (PyUnicode_Check(what.ptr())) {
      d.name = parse_device(str_arg(what, "af.device: device_name"), "device");
    } else {
      throw py::type_error("af.device: device_name is " + py::repr(what).cast<std::string>().substr(0, 80)
                           + "; give a device string (\"/job:ps/task:0\"), None, or "
                             "af.train.replica_device_setter(...)");
    }
    return d;
  }, py::arg("device_name"),
        "`with af.device(\"/job:ps/task:0\"):` places what is built inside it (tf.device); "
        "nested blocks merge, inner fields winning; af.device(None) ignores the blocks outside "
        "it; af.device(af.train.replica_device_setter(cluster=spec)) puts each new variable on "
        "the next ps task, round robin, and the rest on worker_device");
  auto train = m.attr("train").cast<py::module_>();
  train.def("replica_device_setter",
            [m](const py::object& ps_tasks, const py::object& ps_device,
                const py::object& worker_device, bool merge_devices, const py::object& cluster,
                const py::object& ps_ops, const py::object& ps_strategy) mutable {
              return make_setter(m, ps_tasks, ps_device, worker_device, merge_devices, cluster,
                                 ps_ops, ps_strategy);
            },
            py::arg("ps_tasks") = 0, py::arg("ps_device") = "/job:ps",
            py::arg("worker_device") = py::none(), py::arg("merge_devices") = true,
            py::arg("cluster") = py::none(), py::arg("ps_ops") = py::none(),
            py::arg("ps_strategy") = py::none(),
            "TF 1.x's tf.train.replica_device_setter for between-graph replication: a device "
            "function for af.device that puts each new variable on the next of the ps tasks "
            "(round robin; their number from `cluster`'s ps job or `ps_tasks`) and every other "
            "node on `worker_device`; None when there is no ps task");
}

} // namespace af::python
