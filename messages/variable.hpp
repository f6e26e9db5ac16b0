#pragma once
/// The variable actor: one per variable, living on the node of its device.
/// Its state (value, initialized flag, version, later optimizer slots) has one
/// owner, actors/variable.hpp's variable_cell, which the actor and the node's
/// data plane both call; the actor alone holds the promises of waiters.
///
/// Protocol (every reply may instead be an error of messages/error.hpp):
///   (var_op, var_op op, tensor operand, bool want_value) -> (tensor, uint64 version)
///        read: the value (operand ignored); uninitialized if it has none, the
///        error naming the variable. assign / assign_add / assign_sub: the
///        operand must have the variable's dtype and shape (add/sub: or be a
///        scalar, broadcast); `want_value` asks for the value after the
///        update, as TensorFlow's assign ops return it (else the tensor is
///        empty). assign_add/sub of an uninitialized variable is an error;
///        assign initializes it. An op byte that is not a var_op is
///        invalid_argument.
///   (var_op, var_op op, tensor operand, bool want_value, uint64 request_id) -> (tensor, uint64 version)
///        the same, exactly once per `request_id` (0: none; a client picks a
///        random 64-bit id per update and sends a retry with the same one):
///        an update whose id the variable applied before is answered with the
///        first try's version (and value) and not applied again, within the
///        bound of actors/variable.hpp's table (the last 1024 ids).
///   (scatter, string op, tensor indices, tensor updates, bool want_value, uint64 request_id)
///        -> (tensor, uint64 version)
///        op is scatter_add, scatter_sub or scatter_update (tf.scatter_*):
///        var[indices[i...]] (op)= updates[i...], updates of shape indices.shape
///        + the variable's shape[1:] (or a scalar). Duplicate ids accumulate
///        for add and sub; for update the last in indices' order wins. An id
///        out of [0, rows) is invalid_argument naming the id, its position and
///        the variable ("scatter_add to variable 'emb' on ...: indices[2] = 17
///        is not in [0, 10)"), and nothing is written; uninitialized if it has
///        no value; request_id as for var_op (0: none).
///   (gather, tensor ids) -> (tensor rows, uint64 version)
///        the rows of a table (a variable of rank >= 1) that `ids` (1-D int32
///        or int64 [n]) name: rows [n] + the variable's shape[1:], a fresh
///        tensor (only those rows travel), and the version read. Every id is
///        checked first: one out of [0, rows) is invalid_argument naming it,
///        the variable and its device ("gather_rows of variable 'emb' on
///        /job:ps/...: ids[1] = 9 is not in [0, 6)"); uninitialized if it
///        has no value. The data plane's gather_rows frame is the same op
///        (core/wire_format.hpp).
///   (init, initializer, bool only_if_uninitialized, string run_id) -> (uint64 version)
///        sets the first value; `run_id` (may be empty) names the run that
///        initialized it, so that waiters of a run do not take a value left by
///        an earlier run.
///   (info)                         -> (variable_info)
///   (wait_init, string run_id, uint32 timeout_ms) -> (uint64 version)
///        answered once the variable has a value set by run `run_id` (any
///        value if empty): at once if it has one. The variable drops the
///        waiter after `timeout_ms` with af_error::timeout, or when the waiter
///        dies (it monitors it), so no waiter outlives its requester.
/// Every successful update bumps the version by one.

#include <cstdint>
#include <string>

#include "caf/meta/type_name.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "messages/atoms.hpp"
#include "messages/serialization.hpp"
#include "core/tensor.hpp"
#include "core/variable_spec.hpp"

namespace af {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, initializer& x) {
  return f(caf::meta::type_name("initializer"), x.kind, x.value, x.a, x.b, x.seed, x.from,
           x.table, x.row_start, x.row_stride);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, variable_spec& x) {
  return f(caf::meta::type_name("variable_spec"), x.name, x.type, x.shape, x.device);
}

struct variable_info {
  variable_spec spec;
  bool initialized = false;
  uint64_t version = 0;
  std::string run_id;   ///< the run that initialized it ("" if none said)
  uint32_t waiters = 0; ///< wait_init requests parked on it now
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, variable_info& x) {
  return f(caf::meta::type_name("variable_info"), x.spec, x.initialized, x.version, x.run_id,
           x.waiters);
}

using variable_actor = caf::typed_actor<
  caf::replies_to<var_op_atom, var_op, tensor, bool>::with<tensor, uint64_t>,
  caf::replies_to<var_op_atom, var_op, tensor, bool, uint64_t>::with<tensor, uint64_t>,
  caf::replies_to<scatter_atom, std::string, tensor, tensor, bool, uint64_t>::with<tensor, uint64_t>,
  caf::replies_to<gather_atom, tensor>::with<tensor, uint64_t>,
  caf::replies_to<init_atom, initializer, bool, std::string>::with<uint64_t>,
  caf::replies_to<info_atom>::with<variable_info>,
  caf::replies_to<wait_init_atom, std::string, uint32_t>::with<uint64_t>>;

} // namespace af
