#include "actors/variable.hpp"

#include "caf/all.hpp"

#include "kernels/kernels.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

std::string quoted(const variable_spec& spec) {
  return "'" + spec.name + "'";
}

kernels::backend& host_backend() {
  static auto backend = kernels::make_cpu_backend();
  return *backend;
}

} // namespace

caf::expected<tensor> variable_state::read() const {
  if (!initialized)
    return make_error(af_error::uninitialized,
                      "variable " + quoted(spec) + " on " + spec.device
                        + " is read before it was initialized; run initialize() (the chief "
                          "does) or wait_initialized() first");
  return value;
}

caf::expected<uint64_t> variable_state::initialize(const initializer& init,
                                                   bool only_if_uninitialized) {
  if (only_if_uninitialized && initialized)
    return version;
  tensor fresh;
  if (init.kind == "tensor") {
    if (init.from.type() != spec.type)
      return make_error(af_error::dtype_mismatch,
                        "initializer of " + quoted(spec) + ": tensor has dtype "
                          + dtype_name(init.from.type()) + ", variable has " + dtype_name(spec.type));
    if (init.from.shape() != spec.shape)
      return make_error(af_error::shape_mismatch,
                        "initializer of " + quoted(spec) + ": tensor has shape "
                          + shape_string(init.from.shape()) + ", variable has "
                          + shape_string(spec.shape));
    fresh = init.from;
  } else if (init.kind == "constant") {
    fresh = tensor::filled(spec.type, spec.shape, init.value);
  } else if (init.kind == "uniform" || init.kind == "normal") {
    fresh = tensor{spec.type, spec.shape};
    auto st = init.kind == "uniform" ? kernels::fill_uniform(fresh, init.a, init.b, init.seed)
                                     : kernels::fill_normal(fresh, init.a, init.b, init.seed);
    if (!st.ok())
      return make_error(af_error::invalid_argument, "initializer of " + quoted(spec) + ": " + st.error);
  } else {
    return make_error(af_error::invalid_argument,
                      "initializer of " + quoted(spec) + ": unknown kind '" + init.kind
                        + "' (use constant, zeros, ones, uniform, normal or tensor)");
  }
  value = std::move(fresh);
  initialized = true;
  ++version;
  for (auto& rp : waiting_for_init)
    rp.deliver(version);
  waiting_for_init.clear();
  return version;
}

caf::expected<uint64_t> variable_state::update(const char* op, const tensor& operand) {
  std::string what = op == nullptr ? "assign" : std::string{"assign_"} + op;
  if (operand.empty())
    return make_error(af_error::invalid_argument, what + " to " + quoted(spec) + ": no value given");
  if (operand.type() != spec.type)
    return make_error(af_error::dtype_mismatch,
                      what + " to " + quoted(spec) + ": value has dtype " + dtype_name(operand.type())
                        + ", variable has " + dtype_name(spec.type));
  bool scalar = operand.num_elements() == 1 && operand.shape().size() <= spec.shape.size();
  if (operand.shape() != spec.shape && !(scalar && op != nullptr))
    return make_error(af_error::shape_mismatch,
                      what + " to " + quoted(spec) + ": value has shape "
                        + shape_string(operand.shape()) + ", variable has "
                        + shape_string(spec.shape));
  if (op == nullptr) {
    value = operand; // shares the sender's buffer: no copy within a node
    if (!initialized) {
      initialized = true;
      for (auto& rp : waiting_for_init)
        rp.deliver(version + 1);
      waiting_for_init.clear();
    }
  } else {
    if (!initialized)
      return make_error(af_error::uninitialized,
                        what + " to " + quoted(spec) + " before it was initialized; run "
                                                       "initialize() first");
    auto kind = *kernels::parse_binary_op(op);
    auto st = host_backend().binary_inplace(kind, value, operand);
    if (!st.ok())
      return make_error(af_error::invalid_argument, what + " to " + quoted(spec) + ": " + st.error);
  }
  return ++version;
}

variable_actor::behavior_type
variable_impl(variable_actor::stateful_pointer<variable_actor_state> self,
              std::shared_ptr<guarded_variable> var) {
  self->state.var = std::move(var);
  // assign (op == nullptr), assign_add ("add"), assign_sub ("sub")
  auto updater = [self](const char* op) {
    return [self, op](tensor& operand, bool want_value) -> caf::result<tensor, uint64_t> {
      return self->state.var->with([&](variable_state& st) -> caf::result<tensor, uint64_t> {
        auto v = st.update(op, operand);
        if (!v)
          return std::move(v.error());
        return {want_value ? st.value : tensor{}, *v};
      });
    };
  };
  return {
    [=](var_op_atom, var_op op, tensor& operand, bool want_value) -> caf::result<tensor, uint64_t> {
      if (op == var_op::read)
        return self->state.var->with([](variable_state& st) -> caf::result<tensor, uint64_t> {
          auto v = st.read();
          if (!v)
            return std::move(v.error());
          return {std::move(*v), st.version};
        });
      return updater(op == var_op::assign ? nullptr : op == var_op::assign_add ? "add" : "sub")(operand, want_value);
    },
    [self](init_atom, initializer& init, bool only_if_uninitialized, std::string&) -> caf::result<uint64_t> {
      return self->state.var->with([&](variable_state& st) -> caf::result<uint64_t> {
        auto v = st.initialize(init, only_if_uninitialized);
        if (!v)
          return std::move(v.error());
        return *v;
      });
    },
    [self](info_atom) -> variable_info {
      return self->state.var->with([](variable_state& st) { return st.info(); });
    },
    [self](wait_init_atom, std::string&, uint32_t) -> caf::result<uint64_t> {
      return self->state.var->with([&](variable_state& st) -> caf::result<uint64_t> {
        if (st.initialized)
          return st.version;
        auto rp = self->make_response_promise<uint64_t>();
        st.waiting_for_init.push_back(rp);
        return rp;
      });
    },
  };
}

} // namespace af
