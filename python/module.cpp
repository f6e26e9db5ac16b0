// The `actorflow` Python module: `import actorflow as af` (docs/python.md).
// One file per area; each registers its part here, in dependency order
// (errors first: the others raise them).
#include "python/bindings.hpp"

#include <string>

namespace py = pybind11;

namespace {

/// NumPy first: without it every part below fails, and pybind11 said only
/// "ImportError: initialization failed" (a pyenv python3 of the same version
/// as Debian's, which the module was built for, has no NumPy).
void require_numpy() {
  try {
    py::module_::import("numpy");
  } catch (py::error_already_set& e) {
    auto exe = py::module_::import("sys").attr("executable").cast<std::string>();
    throw py::import_error("actorflow needs NumPy, which this Python (" + exe + ") cannot import ("
                           + std::string(e.what()).substr(0, 200)
                           + "); the module was built for " ACTORFLOW_PYTHON_EXECUTABLE
                           ": run it with that one (docs/python.md), install NumPy here, or "
                           "build for this Python with cmake -DPython3_EXECUTABLE=" + exe);
  }
}

} // namespace

PYBIND11_MODULE(actorflow, m) {
  require_numpy();
  m.doc() = "actorflow: the TensorFlow 1.x distributed runtime's Python API over actorflow's "
            "C++ library (docs/python.md)";
  namespace ap = af::python;
  ap::register_errors(m);
  ap::register_tensors(m);
  ap::register_ops(m);      // every op of the registry; the explicit builders below may refine
  ap::register_graph(m);
  ap::register_cluster(m);
  ap::register_device(m);   // af.train.replica_device_setter reads af.train.ClusterSpec
  ap::register_optimizers(m);
  ap::register_saver(m);
  ap::register_trace(m);
  ap::register_session(m);
  ap::register_train_job(m);
}
