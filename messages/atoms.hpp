#pragma once
/// Atoms of actorflow's protocols (CAF 0.17: at most 10 characters).

#include "caf/atom.hpp"

namespace af {

using var_op_atom = caf::atom_constant<caf::atom("var_op")>;
/// A sparse update of a variable's rows (scatter_add / _sub / _update).
using scatter_atom = caf::atom_constant<caf::atom("scatter")>;
/// A table's rows by id (messages/variable.hpp).
using gather_atom = caf::atom_constant<caf::atom("gather")>;
using read_atom = caf::atom_constant<caf::atom("read")>;
/// The data plane gave an uninitialized variable its first value: release waiters.
using released_atom = caf::atom_constant<caf::atom("released")>;
using init_atom = caf::atom_constant<caf::atom("init")>;
using info_atom = caf::atom_constant<caf::atom("info")>;
using wait_init_atom = caf::atom_constant<caf::atom("wait_init")>;
using get_var_atom = caf::atom_constant<caf::atom("get_var")>;
using lookup_atom = caf::atom_constant<caf::atom("lookup")>;
using list_atom = caf::atom_constant<caf::atom("list_vars")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
using executor_atom = caf::atom_constant<caf::atom("executor")>;
using register_atom = caf::atom_constant<caf::atom("register")>;
using run_step_atom = caf::atom_constant<caf::atom("run_step")>;
using edge_atom = caf::atom_constant<caf::atom("edge")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using forget_atom = caf::atom_constant<caf::atom("forget")>;
/// Periodic self-message: drop steps and waiters past their deadline.
using sweep_atom = caf::atom_constant<caf::atom("sweep")>;

// -- training (messages/aggregator.hpp, messages/kv_store.hpp)
using push_atom = caf::atom_constant<caf::atom("push")>;
using pull_atom = caf::atom_constant<caf::atom("pull")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using aggregator_atom = caf::atom_constant<caf::atom("aggregatr")>;
using save_atom = caf::atom_constant<caf::atom("save")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using switch_atom = caf::atom_constant<caf::atom("switch")>;
/// A worker asks whether its step closed without it (messages/aggregator.hpp).
using closed_atom = caf::atom_constant<caf::atom("closed")>;
/// With push_atom: the values are parameters (average), not gradients.
using params_atom = caf::atom_constant<caf::atom("params")>;
/// With push_atom: the gradients of the tables are sparse, (ids, rows).
using sparse_atom = caf::atom_constant<caf::atom("sparse")>;
using kv_store_atom = caf::atom_constant<caf::atom("kv_store")>;
using kv_put_atom = caf::atom_constant<caf::atom("kv_put")>;
using kv_get_atom = caf::atom_constant<caf::atom("kv_get")>;

} // namespace af
