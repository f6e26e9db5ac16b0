// af.errors: the library's af_error codes as a hierarchy of Python
// exceptions named as tf.errors names them, each carrying the library's
// sentence (what failed and what to do).
#include "python/bindings.hpp"

#include <pybind11/eval.h>

#include "caf/sec.hpp"

#include "messages/error.hpp"

namespace af::python {

namespace {

/// The classes, made once by register_errors (the module lives as long as
/// the interpreter: plain handles, never released).
py::handle errors_module;

/// Written in Python so that they are ordinary exception classes (pickling,
/// tracebacks, `except OpError`): OpError has .message and .code (the
/// library's code name, "peer_down"), as tf.errors.OpError has .message.
constexpr const char* error_classes = R"(
class OpError(Exception):
    """Base of every actorflow error (tf.errors.OpError): .message is the
    library's sentence, .code the af_error's name ("peer_down", ...)."""
    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        self.code = code

class InvalidArgumentError(OpError):
    """A value, shape, dtype, device name or config the caller got wrong."""
class NotFoundError(OpError):
    """A name the cluster does not have: job, task, variable, target."""
class GoneError(NotFoundError):
    """A variable its restarted node no longer holds: initialize it again."""
class AlreadyExistsError(OpError):
    """An id another owner holds."""
class FailedPreconditionError(OpError):
    """Not ready yet: a variable read before it was initialized."""
class UnavailableError(OpError):
    """A node that cannot be reached, or a port that cannot be listened on."""
class PeerDownError(UnavailableError):
    """A node that died (or stopped answering heartbeats) during the request."""
class DeadlineExceededError(OpError):
    """A wait that ran out; the message names what it waited for."""
class ResourceExhaustedError(OpError):
    """A limit or an allocation that failed; the message names the limit."""
class UnimplementedError(OpError):
    """A feature compiled out or absent on this machine."""
class InternalError(OpError):
    """A bug in actorflow: please report it with the message."""
class AbortedError(OpError):
    """A step stopped because another part of it failed, a mode switch, or a
    worker its ps took as left when their link broke (it joins again)."""
class CancelledError(OpError):
    """The caller gave up on the request (interrupt)."""
class UnknownError(OpError):
    """An error of the actor framework itself (not one of actorflow's codes)."""
class OutOfRangeError(OpError):
    """tf.errors' name; the library raises none (a TF script's `except` finds it)."""
class PermissionDeniedError(OpError):
    """tf.errors' name; the library raises none (a TF script's `except` finds it)."""
class UnauthenticatedError(OpError):
    """tf.errors' name; the library raises none (a TF script's `except` finds it)."""
class DataLossError(OpError):
    """tf.errors' name; the library raises none (a TF script's `except` finds it)."""
)";

/// The class name of each code (TF's names where TF has the case).
const char* class_of(af_error code) {
  switch (code) {
    case af_error::invalid_config:
    case af_error::invalid_device:
    case af_error::unknown_device:
    case af_error::shape_mismatch:
    case af_error::dtype_mismatch:
    case af_error::invalid_argument:
    case af_error::non_finite:
      return "InvalidArgumentError";
    case af_error::unknown_job:
    case af_error::task_out_of_range:
    case af_error::not_found:
      return "NotFoundError";
    case af_error::gone:
      return "GoneError";
    case af_error::already_exists:
      return "AlreadyExistsError";
    case af_error::uninitialized:
      return "FailedPreconditionError";
    case af_error::unreachable:
    case af_error::bind_failed:
      return "UnavailableError";
    case af_error::peer_down:
      return "PeerDownError";
    case af_error::timeout:
      return "DeadlineExceededError";
    case af_error::resource_exhausted:
      return "ResourceExhaustedError";
    case af_error::unsupported:
      return "UnimplementedError";
    case af_error::internal:
      return "InternalError";
    case af_error::aborted:
    case af_error::mode_changed:
    case af_error::left: // the worker joins again and retries, as after a switch
      return "AbortedError";
    case af_error::cancelled:
      return "CancelledError";
  }
  return "UnknownError";
}

[[noreturn]] void raise_as(const char* cls_name, const std::string& message, py::object code) {
  auto cls = errors_module.attr(cls_name);
  // A message may quote bytes of outside input (TF_CONFIG's JSON parser
  // quotes the byte it stopped at, half of a UTF-8 character): py::str()
  // raised UnicodeDecodeError instead of the error. Such bytes show as \xNN.
  auto text = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
    message.data(), static_cast<Py_ssize_t>(message.size()), "backslashreplace"));
  if (!text)
    throw py::error_already_set();
  PyErr_SetObject(cls.ptr(), cls(text, code).ptr());
  throw py::error_already_set();
}

} // namespace

void raise(af_error code, const std::string& message) {
  raise_as(class_of(code), message, py::str(to_string(code)));
}

void raise(const caf::error& err) {
  if (err.category() == error_category)
    raise_as(class_of(static_cast<af_error>(err.code())), reason_of(err),
             py::str(to_string(static_cast<af_error>(err.code()))));
  if (err == caf::sec::request_timeout)
    raise_as("DeadlineExceededError", describe(err), py::str("timeout"));
  raise_as("UnknownError", describe(err), py::none());
}

void register_errors(py::module_& m) {
  auto errors = m.def_submodule("errors", "actorflow's errors, as tf.errors names them");
  py::dict scope;
  scope["__builtins__"] = py::module_::import("builtins");
  scope["__name__"] = "actorflow.errors";
  py::exec(error_classes, scope);
  for (auto item : scope) {
    auto name = item.first.cast<std::string>();
    if (name.size() > 5 && name.compare(name.size() - 5, 5, "Error") == 0)
      errors.attr(name.c_str()) = item.second;
  }
  // For tests: raises the class of af_error `code` (1..af_error_max), so
  // that every code is seen to have its class (a code added to the library
  // without one here would be an UnknownError, which says "not one of
  // actorflow's codes").
  errors.def("_raise_code", [](uint8_t code, const std::string& message) {
    if (!valid_af_error(code))
      throw py::value_error("no af_error has code " + std::to_string(code));
    raise(static_cast<af_error>(code), message);
  });
  errors.attr("_max_code") = af_error_max;
  errors_module = errors.release(); // its reference is kept for the interpreter's life
  // `import actorflow.errors` and `from actorflow.errors import X` find it.
  py::module_::import("sys").attr("modules")["actorflow.errors"] = errors_module;
}

} // namespace af::python
