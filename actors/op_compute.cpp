#include "actors/op_compute.hpp"

#include <new>
#include <stdexcept>

#include "messages/error.hpp"

namespace af {

caf::expected<tensor> compute_op(kernels::backend& backend, kernels::backend* fallback,
                                 const std::string& device, const partition_op& op,
                                 const std::vector<tensor>& args, std::string& note) {
  if (!kernels::known_op(op.op))
    return make_error(af_error::invalid_argument, "op '" + op.name + "': unknown kind '" + op.op + "'");
  tensor out;
  kernels::status status;
  using kind = kernels::status::kind;
  try {
    status = kernels::run_op(backend, op.op, op.attrs, args, out);
    if (status.what == kind::unsupported && fallback != nullptr) {
      note = status.error + "; ran on the node's CPU";
      status = kernels::run_op(*fallback, op.op, op.attrs, args, out);
    }
  } catch (const std::bad_alloc&) {
    return make_error(af_error::resource_exhausted,
                      "op '" + op.name + "' (" + op.op + ") on " + device
                        + ": out of memory for its result");
  } catch (const std::exception& e) {
    // Any other throw from a kernel (a size tensor::reset refuses, a
    // library's logic_error) is this op's error, never the node's end.
    return make_error(af_error::invalid_argument,
                      "op '" + op.name + "' (" + op.op + ") on " + device + ": " + e.what());
  }
  if (!status.ok()) {
    auto code = status.what == kind::shape         ? af_error::shape_mismatch
                : status.what == kind::dtype       ? af_error::dtype_mismatch
                : status.what == kind::unsupported ? af_error::unsupported
                                                   : af_error::invalid_argument;
    return make_error(code, "op '" + op.name + "' (" + op.op + "): " + status.error);
  }
  return out;
}

} // namespace af
