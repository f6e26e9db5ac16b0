/// The stacks of civetweb's threads (metrics/thread_stack.hpp).
#include "metrics/thread_stack.hpp"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>

namespace af {

size_t metrics_thread_stack_floor() {
  return size_t{1} << 20;
}

} // namespace af

/// Every pthread_attr_setstacksize of this process goes through here: a
/// size below the floor is raised to it, a larger one is left alone. (The
/// executable's definition comes first in symbol lookup, so libcivetweb's
/// calls land here; the real one is the next in line.)
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) noexcept {
  using real_fn = int (*)(pthread_attr_t*, size_t);
  static const real_fn real =
    reinterpret_cast<real_fn>(::dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (real == nullptr)
    return 0; // no other definition: leave the default stack size (8 MiB)
  return real(attr, std::max(size, af::metrics_thread_stack_floor()));
}

/// The definition above by an address of this module's own: `&pthread_attr_setstacksize`
/// in a shared object would be whichever comes first in lookup, libc's too.
extern "C" int af_own_pthread_attr_setstacksize(pthread_attr_t*, size_t) noexcept
  __attribute__((alias("pthread_attr_setstacksize"), visibility("hidden"), nonnull(1)));

bool af::metrics_thread_stack_active() {
  void* first = ::dlsym(RTLD_DEFAULT, "pthread_attr_setstacksize");
  return first == reinterpret_cast<void*>(&af_own_pthread_attr_setstacksize);
}
