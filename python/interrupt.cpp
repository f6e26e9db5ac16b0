// Ctrl-C in the module's waits (python/interrupt.hpp).
#include "python/interrupt.hpp"

#include <signal.h>

#include <chrono>

#include "messages/error.hpp"

namespace af::python {

namespace {

/// Ctrl-C during a run. While the run waits with the GIL released,
/// Python's SIGINT handler cannot run (it only marks the signal for later),
/// so on the main thread, while Python's handler is its default (raise
/// KeyboardInterrupt), a handler of ours takes SIGINT during the wait: it
/// sets the session's cancel flag (session_options::cancel) and the run
/// ends with af_error::cancelled, raised as KeyboardInterrupt. Ours stays
/// installed between runs and hands the signal to Python's C handler then
/// (`python_sigint`), so a run costs one sigaction (whether ours is still
/// there: signal.signal() puts Python's back) instead of two.
std::atomic<std::atomic<bool>*> sigint_cancels{nullptr};
std::atomic<bool> sigint_seen{false};
static_assert(std::atomic<std::atomic<bool>*>::is_always_lock_free);
/// The handler ours replaced (Python's): written before ours is installed.
struct sigaction python_sigint {};

extern "C" void cancel_on_sigint(int sig) {
  if (auto* flag = sigint_cancels.load()) {
    sigint_seen.store(true);
    flag->store(true);
    return;
  }
  if (python_sigint.sa_flags & SA_SIGINFO) {
    if (python_sigint.sa_sigaction != nullptr)
      python_sigint.sa_sigaction(sig, nullptr, nullptr);
  } else if (python_sigint.sa_handler != SIG_DFL && python_sigint.sa_handler != SIG_IGN) {
    python_sigint.sa_handler(sig);
  }
}

/// Installs ours unless it is installed (the main thread, in arm()); whether it is.
bool sigint_handler_installed() {
  struct sigaction now {};
  if (::sigaction(SIGINT, nullptr, &now) != 0)
    return false;
  if (!(now.sa_flags & SA_SIGINFO) && now.sa_handler == cancel_on_sigint)
    return true;
  python_sigint = now;
  struct sigaction ours {};
  ours.sa_handler = cancel_on_sigint;
  ours.sa_flags = SA_ONSTACK; // as Python installs its own
  sigemptyset(&ours.sa_mask);
  return ::sigaction(SIGINT, &ours, nullptr) == 0;
}

/// What interruptible_wait asks Python at every run, looked up once: the
/// imports and attribute lookups cost a few microseconds a run
/// (python_run_overhead, docs/python.md). Made under the GIL; never
/// destroyed, as the interpreter's modules outlive every run.
struct sigint_probe {
  py::object main_thread, getsignal, sigint, default_handler;
};

/// threading.main_thread().ident, asked once (a Python call and an attribute
/// a run); a fork forgets it, since the child's main thread is the one that forked.
std::atomic<unsigned long> main_thread_ident{0};

const sigint_probe& probe() {
  static const auto* p = [] {
    auto threading = py::module_::import("threading");
    // _signal's getsignal, not signal's: that one wraps it in Python that
    // tries Handlers(handler) and catches the ValueError, ~3 us a run.
    auto signal = py::module_::import("_signal");
    py::module_::import("os").attr("register_at_fork")(
      py::arg("after_in_child") = py::cpp_function([] { main_thread_ident.store(0); }));
    return new sigint_probe{threading.attr("main_thread"), signal.attr("getsignal"),
                            signal.attr("SIGINT"), signal.attr("default_int_handler")};
  }();
  return *p;
}

unsigned long main_ident() {
  auto ident = main_thread_ident.load();
  if (ident == 0) {
    ident = probe().main_thread().attr("ident").cast<unsigned long>();
    main_thread_ident.store(ident);
  }
  return ident;
}

} // namespace

interruptible_wait::interruptible_wait() {
  const auto& p = probe();
  py::object handler = p.getsignal(p.sigint);
  eligible_ = handler.is(p.default_handler) && PyThread_get_thread_ident() == main_ident();
}

std::unique_lock<std::timed_mutex> interruptible_wait::lock(std::timed_mutex& m) {
  std::unique_lock<std::timed_mutex> held{m, std::try_to_lock};
  if (held.owns_lock())
    return held;
  if (eligible_ && !installed_) {
    sigint_seen.store(false);
    installed_ = sigint_handler_installed();
  }
  if (!installed_) {
    held.lock();
    return held;
  }
  waiting_.store(false);
  sigint_cancels.store(&waiting_);
  while (!held.try_lock_for(std::chrono::milliseconds{20}))
    if (waiting_.load()) {
      disarm();
      seen_ = true;
      return held;
    }
  return held;
}

void interruptible_wait::arm(std::atomic<bool>& cancel) {
  cancel.store(false);
  if (!eligible_)
    return;
  if (!installed_) {
    sigint_seen.store(false);
    installed_ = sigint_handler_installed();
  }
  if (installed_) {
    sigint_cancels.store(&cancel);
    if (waiting_.load()) // Ctrl-C came as lock() took the lock: the run starts cancelled
      cancel.store(true);
  }
}

void interruptible_wait::disarm() {
  if (!installed_)
    return;
  installed_ = false;
  sigint_cancels.store(nullptr);
  seen_ = sigint_seen.exchange(false);
}

void raise_interrupt(const caf::error& err) {
  py::object why;
  if (err && !is(err, af_error::cancelled)) {
    try {
      raise(err);
    } catch (py::error_already_set& e) {
      why = e.value();
    }
  }
  PyErr_SetNone(PyExc_KeyboardInterrupt);
  if (why) {
    PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyException_SetContext(value, why.release().ptr());
    PyErr_Restore(type, value, tb);
  }
  throw py::error_already_set();
}

} // namespace af::python
