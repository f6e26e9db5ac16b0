#pragma once
/// The op graph and its builder: plain C++ on plain data, no CAF and no
/// cluster. A session (actors/session.hpp) and a worker actor build steps with
/// it; gradients (graph/gradients.hpp), placement (graph/placement.hpp),
/// partitioning (graph/partition.hpp), in-graph replication
/// (graph/replicate.hpp) and a one-process evaluator (graph/evaluate.hpp)
/// work on it.
///
///   af::graph g;
///   g.push_scope(*af::device_name::parse("/job:ps/task:0"));
///   auto w = g.variable("w", {2, 2}, af::initializer::constant(2));
///   g.pop_scope();
///   auto y = g.matmul(g.placeholder("x"), w);
///
/// Node ids are handed out in creation order and every node's inputs are
/// older than it, so ascending ids are a topological order.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "graph/op_builder.hpp"
#include "graph/outcome.hpp"
#include "core/device_name.hpp"
#include "core/op_attrs.hpp"
#include "core/tensor.hpp"
#include "core/variable_spec.hpp"

namespace af {

enum class node_kind : uint8_t { variable, constant, compute, update, placeholder };

struct graph_node {
  node_kind kind = node_kind::constant;
  std::string name;         ///< unique within the graph ("add", "add_1", ...)
  std::string op;           ///< compute: a kernels::run_op name; update: assign/assign_add/assign_sub
                            ///< (inputs: var, value) or scatter_add/_sub/_update (var, indices, updates)
  op_attrs attrs;
  std::vector<int32_t> inputs;
  device_name requested;    ///< the scopes merged at creation (may be partial)
  // -- variables
  variable_spec spec;       ///< spec.device is empty until placement fills it
  initializer init;
  std::string placement_note; ///< e.g. why soft placement moved it
  // -- constants
  tensor value;
  // -- placeholders
  std::optional<dtype> feed_type;       ///< as declared (tf.placeholder's dtype), if it was
  std::optional<shape_type> feed_shape; ///< as declared, -1 for an axis of any size; none: any shape
};

class graph : public op_builder<graph> {
public:
  // -- device scopes (tf.device) ----------------------------------------------
  //
  // Each thread has its own stack of scopes on each graph (TF's
  // Graph._thread_local device stack): two threads building on one graph
  // under different scopes do not see each other's. A thread's stack is
  // dropped when it is emptied. The graph is otherwise not thread-safe:
  // threads take turns building it (Python's GIL does).

  void push_scope(device_name d);
  void pop_scope();
  /// The merged device of this thread's open scopes (empty if none).
  device_name current_scope() const;
  /// This thread's open scopes, outermost first.
  const std::vector<device_name>& scopes() const;
  void set_scopes(std::vector<device_name> s);

  // -- building ---------------------------------------------------------------

  /// A variable node named `name` (not uniquified: the name is the variable's
  /// identity in the cluster). An empty name or a negative dimension is an
  /// error; so is a name this graph already has as a variable with another
  /// shape or dtype (the same name and shape returns the existing node).
  outcome<output> variable(const std::string& name, shape_type shape,
                           initializer init = initializer::zeros(), dtype type = dtype::float32);

  output constant(tensor value, const std::string& name = "Const");

  /// A value given at run time (tf.placeholder).
  output placeholder(const std::string& name = "Placeholder");
  /// One of a declared dtype and shape (-1: any size on that axis; no
  /// shape: any): what its static shape (graph/shapes.hpp) starts from.
  output placeholder(const std::string& name, dtype type, std::optional<shape_type> shape);

  /// Any op of the registry by name (kernels/op_registry.hpp); the typed
  /// methods (add, matmul, reduce_sum, ...) come from op_builder. Inputs are
  /// not checked here; running reports an invalid one naming the op.
  output op(const std::string& kind, std::vector<output> inputs, op_attrs attrs = {},
            const std::string& name = "");

  /// Updates of a variable node; an invalid output when `var` is not one
  /// (validate() and running name it).
  output assign(output var, output value, const std::string& name = "");
  output assign_add(output var, output value, const std::string& name = "");
  output assign_sub(output var, output value, const std::string& name = "");

  /// Sparse updates of a variable's rows (tf.scatter_add / _sub / _update):
  /// var[indices[i...]] (op)= updates[i...], updates of shape indices.shape +
  /// var.shape[1:]. Duplicate ids accumulate for add and sub; for update the
  /// last in indices' order wins. An id out of range is refused naming it and
  /// the variable, which is then unchanged (kernels/sparse.hpp).
  output scatter_add(output var, output indices, output updates, const std::string& name = "");
  output scatter_sub(output var, output indices, output updates, const std::string& name = "");
  output scatter_update(output var, output indices, output updates, const std::string& name = "");

  // -- inspecting -------------------------------------------------------------

  size_t size() const { return nodes_.size(); }
  bool contains(output o) const { return o.id >= 0 && static_cast<size_t>(o.id) < nodes_.size(); }
  const graph_node& at(output o) const { return nodes_.at(static_cast<size_t>(o.id)); }
  graph_node& at(output o) { return nodes_.at(static_cast<size_t>(o.id)); }
  const std::vector<graph_node>& nodes() const { return nodes_; }

  /// The variable node `o`, or nullptr if `o` is not a variable of this graph.
  const graph_node* variable_node(output o) const;

  /// The variable node named `name`, or an invalid output.
  output find_variable(const std::string& name) const;

  /// All variable nodes, in creation order.
  std::vector<output> variables() const;

  /// Node names in creation order (graph.get_operations()).
  std::vector<std::string> operations() const;

  /// Everything `roots` need (compute and update nodes, ascending ids), up to
  /// variables, constants and placeholders. An input that is not a node of
  /// this graph is an error naming the op that has it.
  outcome<std::vector<int32_t>> closure(const std::vector<int32_t>& roots) const;

  /// The graph in a line per node, for logs and the REPL.
  std::string to_string() const;

private:
  std::string unique_name(const std::string& base);
  output update(const char* kind, output var, std::vector<output> operands, const std::string& name);

  std::vector<graph_node> nodes_;
  std::map<std::thread::id, std::vector<device_name>> scopes_; ///< each thread's
  std::map<std::string, int> name_counts_;
  std::set<std::string> used_names_; ///< every node name, so that "add_1" is never handed out twice
};

/// Reverse-mode gradients of the scalar `loss` with respect to `xs`
/// (tf.gradients). The backward ops are added to `g`, each in the scope of
/// its forward op (so on its device). An x that `loss` does not depend on is
/// an error naming it; so is an op on the path that has no gradient.
outcome<std::vector<output>> gradients(graph& g, output loss, const std::vector<output>& xs);

/// One gradient as sparse_gradients() gives it. Dense: `dense`, a node of
/// x's shape. Sparse (TF's IndexedSlices), for an x that the loss reads only
/// through gather (embedding_lookup): `ids`, 1-D int32 or int64 [n], the
/// rows touched (an id may repeat, in no order), and `values` [n] +
/// x.shape[1:], row i's gradient being values[i] (a repeated id's rows add
/// up); `dense_like` is the node whose shape the dense gradient has (the
/// gathered tensor, x itself for a variable). Nothing of x's size is
/// computed until densify() is asked for.
struct gradient_value {
  output dense;      ///< valid iff the gradient is dense
  output ids;        ///< sparse: [n]
  output values;     ///< sparse: [n] + x.shape[1:]
  output dense_like; ///< sparse: a node of the dense gradient's shape
  bool is_sparse() const { return ids.valid(); }

  static gradient_value dense_value(output d) {
    gradient_value v;
    v.dense = d;
    return v;
  }
  static gradient_value sparse_value(output ids, output values, output dense_like) {
    gradient_value v;
    v.ids = ids;
    v.values = values;
    v.dense_like = dense_like;
    return v;
  }
};

/// gradients(), but sparse where the gradient is: an x read only through
/// gather gets the sparse value (two gathers of one x: their ids and values
/// concatenated, as TF adds IndexedSlices); an x also read densely gets the
/// dense sum. The dense entry point gradients() is this, densified.
outcome<std::vector<gradient_value>> sparse_gradients(graph& g, output loss,
                                                      const std::vector<output>& xs);

/// The dense gradient of `v`: v.dense, or the sparse rows summed into
/// dense_like's shape (gather_grad: unsorted_segment_sum, untouched rows 0).
output densify(graph& g, const gradient_value& v);

/// `v` with each id once, its rows summed (TF's _deduplicate_indexed_slices:
/// unique, then unsorted_segment_sum of the values by the unique index into
/// size(unique ids) rows); ids in the order they first occur. A dense `v`
/// comes back as it is.
gradient_value deduplicate(graph& g, const gradient_value& v);

/// True if gradients() knows how to differentiate kernel op `op`.
bool has_gradient(const std::string& op);

/// Every op gradients() has a rule for (the registry's op_gradient::rule ops).
std::vector<std::string> gradient_ops();

} // namespace af
