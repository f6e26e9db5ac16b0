#pragma once
/// Forward declarations of the messages layer, for headers that only name a
/// message type or pass it by reference (as caf/fwd.hpp does for CAF): they
/// include this instead of the interface headers and the CAF templates
/// behind them. The handles (node_actor, variable_actor, executor_actor,
/// aggregator_actor, kv_store_actor) are aliases of caf::typed_actor and are
/// declared once, in their interface headers:
///
///   messages/node.hpp        node_actor, node_info
///   messages/variable.hpp    variable_actor, variable_info
///   messages/executor.hpp    executor_actor, partition, feed, step_result, ...
///   messages/aggregator.hpp  aggregator_actor, aggregator_spec, push_credentials, ...
///   messages/kv_store.hpp    kv_store_actor
///   messages/atoms.hpp       the atoms
///   messages/error.hpp       af_error as caf::error, make_error, describe
///   messages/types.hpp       register_types: the one registration of every message type

namespace af {

// messages/node.hpp
struct node_info;
// messages/variable.hpp
struct variable_info;
// messages/executor.hpp
struct op_input;
struct partition_op;
struct partition;
struct feed;
struct op_timing;
struct transfer_timing;
struct step_result;
// messages/aggregator.hpp
struct aggregator_spec;
struct worker_stats;
struct aggregator_stats;
struct aggregator_state;
struct push_credentials;
// core/ (the vocabulary the messages carry)
class tensor;
struct variable_spec;

} // namespace af
