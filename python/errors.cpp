// af.errors: the library's af_error codes as a hierarchy of Python
// exceptions named as tf.errors names them, each carrying the library's
// sentence (what failed and what to do).
#include "python/bindings.hpp"

#include <pybind11/eval.h>

#include <cmath>

#include "caf/sec.hpp"

#include "messages/error.hpp"

namespace af::python {

namespace {

/// The classes, made once by register_errors (the module lives as long as
/// the interpreter: plain handles, never released).
py::handle errors_module;

/// Written in Python so that they are ordinary exception classes (pickling,
/// tracebacks, `except OpError`). As tf.errors.OpError: .message, .op and
/// .node_def (None: the library does not say which node), .error_code and
/// .code (TF's integer code of the class, af.errors.NOT_FOUND == 5); .af_code
/// is the library's own code name ("peer_down", "gone"), finer than TF's.
constexpr const char* error_classes = R"py(
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16

class OpError(Exception):
    """Base of every actorflow error (tf.errors.OpError): .message is the
    library's sentence, .code and .error_code TF's integer code
    (af.errors.NOT_FOUND, ...), .af_code the library's code name
    ("peer_down", ...; None for an error of the actor framework), .op and
    .node_def None (the library names the node in the message).

    OpError(message, af_code=None), or TF's OpError(node_def, op, message,
    error_code) and SubclassError(node_def, op, message)."""
    _tf_code = UNKNOWN

    def __init__(self, *args, af_code=None):
        if len(args) >= 3:          # TF's form
            if len(args) > 4:
                raise TypeError("OpError takes (message, af_code=None) or TF's (node_def, op, "
                                "message[, error_code]); got %d arguments" % len(args))
            node_def, op, message = args[:3]
            error_code = args[3] if len(args) == 4 else type(self)._tf_code
        elif len(args) in (1, 2):   # actorflow's form: (message[, af_code])
            node_def, op, message, error_code = None, None, args[0], type(self)._tf_code
            if len(args) == 2:
                af_code = args[1]
        else:
            raise TypeError("OpError takes (message, af_code=None) or TF's (node_def, op, "
                            "message[, error_code])")
        super().__init__(message)
        self.message = message
        self.op = op
        self.node_def = node_def
        self.error_code = error_code
        self.af_code = af_code

    @property
    def code(self):
        """TF's integer code (af.errors.NOT_FOUND, ...), as .error_code."""
        return self.error_code

class InvalidArgumentError(OpError):
    """A value, shape, dtype, device name or config the caller got wrong."""
    _tf_code = INVALID_ARGUMENT
class NotFoundError(OpError):
    """A name the cluster does not have: job, task, variable, target."""
    _tf_code = NOT_FOUND
class GoneError(NotFoundError):
    """A variable its restarted node no longer holds: initialize it again."""
class AlreadyExistsError(OpError):
    """An id another owner holds."""
    _tf_code = ALREADY_EXISTS
class FailedPreconditionError(OpError):
    """Not ready yet: a variable read before it was initialized."""
    _tf_code = FAILED_PRECONDITION
class UnavailableError(OpError):
    """A node that cannot be reached, or a port that cannot be listened on."""
    _tf_code = UNAVAILABLE
class PeerDownError(UnavailableError):
    """A node that died (or stopped answering heartbeats) during the request."""
class DeadlineExceededError(OpError):
    """A wait that ran out; the message names what it waited for."""
    _tf_code = DEADLINE_EXCEEDED
class ResourceExhaustedError(OpError):
    """A limit or an allocation that failed; the message names the limit."""
    _tf_code = RESOURCE_EXHAUSTED
class UnimplementedError(OpError):
    """A feature compiled out or absent on this machine."""
    _tf_code = UNIMPLEMENTED
class InternalError(OpError):
    """A bug in actorflow: please report it with the message."""
    _tf_code = INTERNAL
class AbortedError(OpError):
    """A step stopped because another part of it failed, a mode switch, or a
    worker its ps took as left when their link broke (it joins again)."""
    _tf_code = ABORTED
class CancelledError(OpError):
    """The caller gave up on the request (interrupt)."""
    _tf_code = CANCELLED
class UnknownError(OpError):
    """An error of the actor framework itself (not one of actorflow's codes)."""
    _tf_code = UNKNOWN
class OutOfRangeError(OpError):
    """tf.errors' name; the library raises none (a TF script's `except` finds it)."""
    _tf_code = OUT_OF_RANGE
class PermissionDeniedError(OpError):
    """tf.errors' name; the library raises none (a TF script's `except` finds it)."""
    _tf_code = PERMISSION_DENIED
class UnauthenticatedError(OpError):
    """tf.errors' name; the library raises none (a TF script's `except` finds it)."""
    _tf_code = UNAUTHENTICATED
class DataLossError(OpError):
    """tf.errors' name; the library raises none (a TF script's `except` finds it)."""
    _tf_code = DATA_LOSS
_classes = {cls._tf_code: cls for cls in [
    CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError, NotFoundError,
    AlreadyExistsError, PermissionDeniedError, ResourceExhaustedError, FailedPreconditionError,
    AbortedError, OutOfRangeError, UnimplementedError, InternalError, UnavailableError,
    DataLossError, UnauthenticatedError]}

def exception_type_from_error_code(error_code):
    """The class of TF's integer code (tf.errors.exception_type_from_error_code)."""
    try:
        return _classes[error_code]
    except (KeyError, TypeError):
        raise KeyError("no af.errors class has code %r; the codes are af.errors.CANCELLED (1) "
                       "to af.errors.UNAUTHENTICATED (16)" % (error_code,)) from None

def error_code_from_exception_type(cls):
    """TF's integer code of an af.errors class (tf.errors.error_code_from_exception_type)."""
    if not (isinstance(cls, type) and issubclass(cls, OpError)):
        raise TypeError("error_code_from_exception_type takes an af.errors class; got %r" % (cls,))
    return cls._tf_code
)py";

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
  PyErr_SetObject(cls.ptr(), cls(text, py::arg("af_code") = code).ptr());
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

namespace {

std::string shown(py::handle value) {
  auto r = py::repr(value).cast<std::string>();
  if (r.size() > 60)
    r = r.substr(0, 57) + "...";
  return r + " (" + std::string{Py_TYPE(value.ptr())->tp_name} + ")";
}

} // namespace

int64_t int_arg(py::handle value, const std::string& what, int64_t lo, int64_t hi) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    std::string hint;
    if (PyFloat_Check(value.ptr())) {
      double d = PyFloat_AsDouble(value.ptr());
      if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 1e15)
        hint = ", e.g. " + std::to_string(static_cast<int64_t>(d));
    } else if (PyUnicode_Check(value.ptr())) {
      hint = ", e.g. int(" + py::repr(value).cast<std::string>().substr(0, 40) + ")";
    }
    throw py::type_error(what + " is " + shown(value) + "; give a whole number (an int)" + hint);
  }
  auto index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index)
    throw py::error_already_set();
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow == 0 && v == -1 && PyErr_Occurred())
    throw py::error_already_set();
  if (overflow != 0 || v < lo || v > hi)
    throw py::value_error(what + " is " + py::repr(index).cast<std::string>().substr(0, 40)
                          + "; give a whole number from " + std::to_string(lo) + " to "
                          + std::to_string(hi));
  return static_cast<int64_t>(v);
}

std::string str_arg(py::handle value, const std::string& what) {
  if (!PyUnicode_Check(value.ptr()))
    throw py::type_error(what + " is " + shown(value) + "; give a str");
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
  if (text == nullptr) {
    // A lone surrogate (os.fsdecode of bytes that are not UTF-8) has no UTF-8 form: without
    // this it was pybind11's RuntimeError "Unable to cast Python instance to C++ type".
    PyErr_Clear();
    throw py::value_error(what + " is " + shown(value)
                          + ", which is not valid Unicode text (a lone surrogate, as os.fsdecode "
                            "makes of bytes that are not UTF-8); give a str of real characters");
  }
  return std::string(text, static_cast<size_t>(size));
}

double number_arg(py::handle value, const std::string& what) {
  if (PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr())
      || !(PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr())
           || PyObject_HasAttrString(value.ptr(), "__float__")))
    throw py::type_error(what + " is " + shown(value) + "; give a number of seconds");
  double d = PyFloat_AsDouble(value.ptr());
  if (d == -1.0 && PyErr_Occurred())
    throw py::error_already_set();
  return d;
}

void register_errors(py::module_& m) {
  auto errors = m.def_submodule("errors", "actorflow's errors, as tf.errors names them");
  py::dict scope;
  scope["__builtins__"] = py::module_::import("builtins");
  scope["__name__"] = "actorflow.errors";
  py::exec(error_classes, scope);
  for (auto item : scope) {
    auto name = item.first.cast<std::string>();
    bool constant = !name.empty() && name[0] != '_' && name == py::str(name).attr("upper")().cast<std::string>();
    bool public_function = name.rfind("exception_type", 0) == 0 || name.rfind("error_code_from", 0) == 0;
    if ((name.size() > 5 && name.compare(name.size() - 5, 5, "Error") == 0) || constant
        || public_function)
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
