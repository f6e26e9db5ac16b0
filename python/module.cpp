// The `actorflow` Python module: `import actorflow as af` (docs/python.md).
// One file per area; each registers its part here, in dependency order
// (errors first: the others raise them).
#include "python/bindings.hpp"

PYBIND11_MODULE(actorflow, m) {
  m.doc() = "actorflow: the TensorFlow 1.x distributed runtime's Python API over actorflow's "
            "C++ library (docs/python.md)";
  namespace ap = af::python;
  ap::register_errors(m);
  ap::register_tensors(m);
  ap::register_ops(m);      // every op of the registry; the explicit builders below may refine
  ap::register_graph(m);
  ap::register_cluster(m);
  ap::register_optimizers(m);
  ap::register_session(m);
}
