#include "messages/types.hpp"

#include <cstring>

#include "caf/all.hpp"

#include "messages/error.hpp"
#include "messages/aggregator.hpp"
#include "messages/kv_store.hpp"
#include "messages/node.hpp"

namespace af {

caf::error inspect(caf::serializer& f, tensor& x) {
  auto type = static_cast<uint8_t>(x.type());
  auto shape = x.shape();
  uint8_t has_value = x.empty() ? 0 : 1;
  if (auto err = f(has_value, type, shape))
    return err;
  if (!has_value)
    return caf::none;
  size_t n = x.nbytes();
  if (auto err = f.begin_sequence(n))
    return err;
  if (n > 0)
    if (auto err = f.apply_raw(n, const_cast<std::byte*>(x.bytes())))
      return err;
  return f.end_sequence();
}

caf::error inspect(caf::deserializer& f, tensor& x) {
  uint8_t has_value = 0;
  uint8_t type = 0;
  shape_type shape;
  if (auto err = f(has_value, type, shape))
    return err;
  if (!has_value) {
    x = tensor{};
    return caf::none;
  }
  if (!valid_dtype(type))
    return make_error(af_error::invalid_argument,
                      "received a tensor with unknown dtype code " + std::to_string(type));
  size_t n = 0;
  if (auto err = f.begin_sequence(n))
    return err;
  // Checked before allocating: a forged shape or length must not make the
  // node allocate more than [node] max_message_bytes, or more than it sent.
  if (auto why = check_decoded_tensor(type, shape, n); !why.empty())
    return make_error(af_error::invalid_argument, "received a tensor: " + why);
  if (auto* bin = dynamic_cast<caf::binary_deserializer*>(&f); bin != nullptr && n > bin->remaining())
    return make_error(af_error::invalid_argument,
                      "received a tensor " + shape_string(shape) + " announcing " + std::to_string(n)
                        + " bytes, but its message holds " + std::to_string(bin->remaining()));
  x.reset(static_cast<dtype>(type), std::move(shape));
  if (n > 0)
    if (auto err = f.apply_raw(n, x.mutable_bytes()))
      return err;
  return f.end_sequence();
}

// A null actor handle does not survive CAF 0.17's deserializer (the whole
// message arrives empty), so the handle travels only when there is one.
caf::error inspect(caf::serializer& f, op_input& x) {
  uint8_t has_var = x.var ? 1 : 0;
  if (auto err = f(x.kind, x.op, x.var_name, x.value, x.data_plane, x.var_node, has_var))
    return err;
  return has_var ? f(x.var) : caf::none;
}

caf::error inspect(caf::deserializer& f, op_input& x) {
  uint8_t has_var = 0;
  if (auto err = f(x.kind, x.op, x.var_name, x.value, x.data_plane, x.var_node, has_var))
    return err;
  if (x.kind > op_input::remote)
    return make_error(af_error::invalid_argument,
                      "received an op input of unknown kind " + std::to_string(x.kind));
  x.var = variable_actor{};
  return has_var ? f(x.var) : caf::none;
}

void register_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<tensor>("af::tensor");
  cfg.add_message_type<var_op>("af::var_op");
  cfg.add_message_type<initializer>("af::initializer");
  cfg.add_message_type<variable_spec>("af::variable_spec");
  cfg.add_message_type<variable_info>("af::variable_info");
  cfg.add_message_type<std::vector<variable_info>>("std::vector<af::variable_info>");
  cfg.add_message_type<op_input>("af::op_input");
  cfg.add_message_type<partition_op>("af::partition_op");
  cfg.add_message_type<partition>("af::partition");
  cfg.add_message_type<feed>("af::feed");
  cfg.add_message_type<std::vector<feed>>("std::vector<af::feed>");
  cfg.add_message_type<op_timing>("af::op_timing");
  cfg.add_message_type<transfer_timing>("af::transfer_timing");
  cfg.add_message_type<step_result>("af::step_result");
  cfg.add_message_type<node_info>("af::node_info");
  cfg.add_message_type<table_shard_request>("af::table_shard_request");
  cfg.add_message_type<variable_actor>("af::variable_actor");
  cfg.add_message_type<executor_actor>("af::executor_actor");
  cfg.add_message_type<node_actor>("af::node_actor");
  cfg.add_message_type<std::vector<tensor>>("std::vector<af::tensor>");
  cfg.add_message_type<std::vector<std::vector<tensor>>>("std::vector<std::vector<af::tensor>>");
  cfg.add_message_type<aggregator_spec>("af::aggregator_spec");
  cfg.add_message_type<aggregator_stats>("af::aggregator_stats");
  cfg.add_message_type<worker_stats>("af::worker_stats");
  cfg.add_message_type<std::vector<worker_stats>>("std::vector<af::worker_stats>");
  cfg.add_message_type<aggregator_state>("af::aggregator_state");
  cfg.add_message_type<push_credentials>("af::push_credentials");
  cfg.add_message_type<sparse_push_values>("af::sparse_push_values");
  cfg.add_message_type<aggregator_actor>("af::aggregator_actor");
  cfg.add_message_type<kv_store_actor>("af::kv_store_actor");
  cfg.add_error_category(error_category,
                         [](uint8_t code, caf::atom_value, const caf::message& ctx) {
                           return describe(caf::error{code, error_category, ctx});
                         });
}

} // namespace af
