#pragma once
/// The pieces of the `actorflow` Python module (python/module.cpp) and what
/// they share: one file per area (errors, tensors, graph building, the
/// registry's ops, sessions, clusters), each with its register_*() that
/// module.cpp calls in order. The module is a binding over the library as it
/// is: graphs are af::graph (graph/graph.hpp), runs are af::session's
/// (actors/session.hpp), clusters are af::embedded_cluster's and start_node's
/// nodes (dist/, actors/). docs/python.md maps TensorFlow 1.x to it.

#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "caf/error.hpp"

#include "actors/trace.hpp"
#include "config/cluster_spec.hpp"
#include "core/error_code.hpp"
#include "core/tensor.hpp"
#include "graph/graph.hpp"
#include "graph/shapes.hpp"

namespace af::python {

namespace py = pybind11;

// -- errors (python/errors.cpp) ----------------------------------------------

/// Raises the af.errors exception of `code` with `message` (throws
/// py::error_already_set; the GIL must be held).
[[noreturn]] void raise(af_error code, const std::string& message);

/// Raises the af.errors exception of any caf::error (CAF's own errors, such
/// as a request timeout, as theirs), carrying af::describe()'s sentence.
[[noreturn]] void raise(const caf::error& err);

void register_errors(py::module_& m);

/// Argument checks of the module's public calls (python/errors.cpp), for
/// the arguments pybind11 would refuse with "incompatible function
/// arguments": the TypeError or ValueError names the argument (`what`,
/// e.g. "Server: task_index") and what to pass.
/// A whole number: an int or anything with __index__ (NumPy's ints), not a
/// bool, a float or a str; from `lo` to `hi` (else ValueError).
int64_t int_arg(py::handle value, const std::string& what, int64_t lo, int64_t hi);
/// A str.
std::string str_arg(py::handle value, const std::string& what);
/// A number of seconds (an int or a float, or what has __float__; not a str).
double number_arg(py::handle value, const std::string& what);

// -- tensors and NumPy (python/tensors.cpp) ----------------------------------

/// The af::dtype of anything np.dtype() takes (np.float32, "int64", af.int32);
/// a dtype actorflow lacks raises TypeError naming it and the four it has.
dtype to_dtype(py::handle spec);

/// The NumPy dtype of `t`.
py::dtype numpy_dtype(dtype t);

/// A NumPy array over the tensor's own buffer (no copy): the array holds the
/// tensor, so the buffer lives as long as the array. Writable only when no
/// one else holds the buffer (the library treats a shared buffer as
/// immutable). An empty tensor is None.
py::object to_numpy(tensor&& t);

/// A tensor holding `value` (an array, a number, nested lists), converted to
/// `want` when given (as TF converts a feed to its placeholder's dtype).
/// Without `want`, Python floats become float32 and ints int32 (int64 when
/// one does not fit), as in TF;
/// a NumPy array keeps its dtype. One copy into the tensor's buffer.
tensor from_python(py::handle value, std::optional<dtype> want = std::nullopt);

void register_tensors(py::module_& m);

// -- graph building (python/graph.cpp) ---------------------------------------

/// af.Graph: an af::graph plus what Python needs that the graph does not
/// keep. Built under the GIL only.
struct replica_setter;

/// An open af.train.replica_device_setter block on one thread (python/device.cpp):
/// the setter (null for af.device(None), which hides those outside it) and
/// the depth of the thread's device scopes with its own scope pushed.
struct replica_block {
  std::shared_ptr<replica_setter> setter;
  size_t depth = 0;
};

struct py_graph {
  graph g;
  /// Each thread's open replica_device_setter blocks, innermost last.
  std::map<std::thread::id, std::vector<replica_block>> replica_blocks;
  /// Each node's static dtype and shape (Tensor.shape), filled as asked.
  mutable static_shapes shapes;
  /// Variables made with trainable=False (TF's global_step idiom): left out
  /// of trainable_variables() and of an optimizer's default var_list.
  std::set<int32_t> untrainable;
};

/// The node of `g` a TF name names: "x:0" (a tensor; *is_tensor true) or
/// "x" (its operation); KeyError naming it when `g` has no such node.
output node_by_name(const py_graph& g, const std::string& name, bool* is_tensor);

/// Raises ValueError when `value` does not fit placeholder `o`'s declared
/// shape (its rank, and each axis the placeholder fixes), naming both
/// shapes as TF does ("Cannot feed value of shape (2, 4) for Tensor 'x:0',
/// which has shape '(?, 3)'").
void check_feed_shape(const py_graph& g, output o, const tensor& value);
using graph_ptr = std::shared_ptr<py_graph>;

/// af.Tensor: one node of a graph (TF's Tensor, and Variable for a variable node).
struct py_tensor {
  graph_ptr owner;
  output out;
};

/// af.global_variables_initializer() / report_uninitialized_variables():
/// session requests rather than graph nodes; `vars` are the graph's
/// variables when it was made (as TF's captures them).
struct py_variables_op {
  enum class kind : uint8_t { initialize, report_uninitialized };
  kind what = kind::initialize;
  graph_ptr owner;
  std::vector<output> vars;
};

/// af.group(...) and an optimizer's minimize(): nodes run for their effect
/// (TF's Operation); fetched, it gives None.
struct py_group {
  graph_ptr owner;
  std::vector<output> members;
};

/// The graph new nodes go to: the innermost `with g.as_default()`, else
/// the process's default graph.
graph_ptr default_graph();

/// The dtype `o` has, as far as the graph says (variables, constants,
/// placeholders, and ops through the registry's shape rules); float32 when
/// it cannot tell.
dtype dtype_hint(const py_graph& g, output o);

/// Op `kind` of the registry on `inputs`, added to `g` once its static
/// shapes fit (graph/shapes.hpp); ValueError with TF's sentence, naming the
/// op and its input shapes, when they cannot.
output checked_op(const graph_ptr& g, const std::string& kind, std::vector<output> inputs,
                  const op_attrs& attrs = {}, const std::string& name = "");

/// `value` as a node of `g`: a Tensor of g as it is, anything else as a
/// constant (of dtype `like` when given). A Tensor of another graph raises.
output as_node(const graph_ptr& g, py::handle value, std::optional<dtype> like = std::nullopt);

void register_graph(py::module_& m);
/// af.device (names, None, af.train.replica_device_setter); after register_cluster.
void register_device(py::module_& m);

/// While alive: this thread's device scopes with its innermost
/// replica_device_setter's own scope swapped for the ps task a new variable
/// `name` of `g` goes to (round robin, as TF's); nothing if no setter is
/// open or `name` exists already (get_variable's reuse makes no variable).
class replica_placement {
public:
  replica_placement(py_graph& g, const std::string& name);
  ~replica_placement();
  replica_placement(const replica_placement&) = delete;
  replica_placement& operator=(const replica_placement&) = delete;

private:
  py_graph& g_;
  std::optional<std::vector<device_name>> saved_;
};

// -- the registry's ops (python/ops.cpp) ---------------------------------------

void register_ops(py::module_& m);

// -- traces and checkpoints (python/trace.cpp, python/saver.cpp) ---------------

/// af.RunOptions: what one Session.run is asked to do besides running.
struct py_run_options {
  bool trace = false; ///< fill the run_metadata's trace (TF's FULL_TRACE)
};

/// af.RunMetadata: the trace of the last traced run it was given to.
struct py_run_metadata {
  run_trace trace;
};

/// af.RunOptions, af.RunMetadata, af.TraceEntry; before register_session.
void register_trace(py::module_& m);

/// af.train.Saver and af.train.latest_checkpoint; after register_cluster (af.train).
void register_saver(py::module_& m);

// -- sessions (python/session.cpp) and clusters (python/cluster.cpp) -----------

/// Where a session runs: a node's actor system in this process (a Server's,
/// a LocalCluster's task) or a client system of its own, the cluster, the
/// task it belongs to. `owner` keeps that system alive while sessions use it.
struct target_entry {
  caf::actor_system* system = nullptr;
  std::shared_ptr<void> owner;
  std::string job;
  int32_t task = 0;
  std::string address; ///< host:port of the task
  std::shared_ptr<const cluster_spec> spec;
};

/// The entry of `target` ("actorflow://127.0.0.1:PORT", a Server's .target);
/// "" is the process's local one-task cluster, started when first asked for.
/// With `cluster` (a ClusterSpec or a dict), the task of `cluster` at that
/// address, reached as a client of its own actor system (the nodes may run
/// in other processes). Unknown: NotFoundError naming it.
std::shared_ptr<target_entry> resolve_target(const std::string& target,
                                             py::handle cluster = py::none());

/// af.group and af.train's optimizers (python/optimizers.cpp); after register_cluster.
void register_optimizers(py::module_& m);

void register_session(py::module_& m);
void register_cluster(py::module_& m);

// -- training jobs (python/train_job.cpp, python/train_job_run.cpp) ----------

/// af.train.Job, af.train.run, af.train.Progress, af.train.load_digits;
/// after register_cluster (af.train).
void register_train_job(py::module_& m);

} // namespace af::python
