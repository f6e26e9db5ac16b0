#include "actors/executor.hpp"

#include <chrono>

#include "caf/all.hpp"

#include "messages/error.hpp"

namespace af {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

/// Variable reads that a compute request waits for.
constexpr auto operand_read_timeout = std::chrono::seconds(30);

caf::expected<compute_result> run_op(executor_state& st, const compute_request& req,
                                     const std::vector<tensor>& args) {
  if (!kernels::known_op(req.op))
    return make_error(af_error::invalid_argument,
                      "op '" + req.name + "': unknown kind '" + req.op + "'");
  // Elementwise ops: typed errors for the mistakes a user makes most.
  if (kernels::parse_binary_op(req.op) && args.size() == 2) {
    if (args[0].type() != args[1].type())
      return make_error(af_error::dtype_mismatch,
                        "op '" + req.name + "' (" + req.op + "): dtypes " + dtype_name(args[0].type())
                          + " and " + dtype_name(args[1].type()) + " differ");
    if (!kernels::broadcast_shapes(args[0].shape(), args[1].shape()))
      return make_error(af_error::shape_mismatch,
                        "op '" + req.name + "' (" + req.op + "): shapes "
                          + shape_string(args[0].shape()) + " and " + shape_string(args[1].shape())
                          + " do not broadcast");
  }
  compute_result res;
  res.device = st.device;
  res.start_ns = now_ns();
  auto status = kernels::run_op(*st.backend, req.op, req.attrs, args, res.value);
  if (!status.ok() && st.fallback && status.error.find("is not implemented on") != std::string::npos) {
    res.note = status.error + "; ran on the node's CPU";
    status = kernels::run_op(*st.fallback, req.op, req.attrs, args, res.value);
  }
  res.end_ns = now_ns();
  if (!status.ok()) {
    auto code = status.error.find("shape") != std::string::npos
                    || status.error.find("dimension") != std::string::npos
                  ? af_error::shape_mismatch
                  : af_error::invalid_argument;
    return make_error(code, "op '" + req.name + "' (" + req.op + "): " + status.error);
  }
  return res;
}

} // namespace

executor_actor::behavior_type executor_impl(executor_actor::stateful_pointer<executor_state> self,
                                            std::string device,
                                            std::shared_ptr<kernels::backend> backend,
                                            std::shared_ptr<kernels::backend> fallback) {
  self->state.device = std::move(device);
  self->state.backend = std::move(backend);
  self->state.fallback = std::move(fallback);
  return {
    [self](compute_atom, compute_request& req) -> caf::result<compute_result> {
      // Gather the operands: tensors are here, variables are read (a local one
      // hands over its buffer; a remote one travels once, node to node).
      struct pending {
        compute_request req;
        std::vector<tensor> args;
        size_t missing = 0;
        bool failed = false;
        caf::typed_response_promise<compute_result> rp;
      };
      auto p = std::make_shared<pending>();
      p->args.resize(req.inputs.size());
      for (size_t i = 0; i < req.inputs.size(); ++i)
        if (req.inputs[i].var)
          ++p->missing;
        else
          p->args[i] = std::move(req.inputs[i].value);
      if (p->missing == 0) {
        auto res = run_op(self->state, req, p->args);
        if (!res)
          return std::move(res.error());
        return std::move(*res);
      }
      p->rp = self->make_response_promise<compute_result>();
      p->req = std::move(req);
      for (size_t i = 0; i < p->req.inputs.size(); ++i) {
        auto& in = p->req.inputs[i];
        if (!in.var)
          continue;
        self->request(in.var, operand_read_timeout, read_atom::value)
          .then(
            [self, p, i](tensor& value, uint64_t) {
              if (p->failed)
                return;
              p->args[i] = std::move(value);
              if (--p->missing == 0) {
                auto res = run_op(self->state, p->req, p->args);
                if (res)
                  p->rp.deliver(std::move(*res));
                else
                  p->rp.deliver(std::move(res.error()));
              }
            },
            [p, i](caf::error& err) {
              if (p->failed)
                return;
              p->failed = true;
              if (err == caf::sec::request_timeout)
                err = make_error(af_error::timeout,
                                 "op '" + p->req.name + "': reading variable '"
                                   + p->req.inputs[i].var_name + "' timed out");
              p->rp.deliver(std::move(err));
            });
      }
      return p->rp;
    },
  };
}

} // namespace af
