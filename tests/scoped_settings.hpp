#pragma once
// Process-wide settings a test changes for its lifetime and puts back: an
// environment variable, this process's trust in the fabric, and the test
// hook's (which the nodes a test starts in this process or as processes of
// its own take). For the tests that move the data plane onto UCX.

#include <cstdlib>
#include <string>

#include "net/testing_hooks.hpp"
#include "net/ucx_link.hpp"

namespace af::testing {

/// Sets an environment variable for its lifetime (nullptr: unsets it), then
/// puts back what was.
struct scoped_env {
  std::string name;
  bool had = false;
  std::string was;
  scoped_env(std::string n, const char* value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) {
      had = true;
      was = v;
    }
    if (value != nullptr)
      setenv(name.c_str(), value, 1);
    else
      unsetenv(name.c_str());
  }
  ~scoped_env() {
    if (had)
      setenv(name.c_str(), was.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
};

/// The process's trust in the fabric for its lifetime (then what it was).
struct scoped_trust {
  bool was = process_trusted_fabric().load();
  explicit scoped_trust(bool on) { process_trusted_fabric() = on; }
  ~scoped_trust() { process_trusted_fabric() = was; }
  scoped_trust(const scoped_trust&) = delete;
  scoped_trust& operator=(const scoped_trust&) = delete;
};

/// The test hook's trust (net/testing_hooks.hpp) for its lifetime: nodes
/// started in this process trust the fabric, and process_cluster writes
/// [security] trusted_fabric = true for the node processes it starts.
struct scoped_hook_trust {
  bool was = wire_test_hooks()->trusted_fabric;
  explicit scoped_hook_trust(bool on) { wire_test_hooks()->trusted_fabric = on; }
  ~scoped_hook_trust() { wire_test_hooks()->trusted_fabric = was; }
  scoped_hook_trust(const scoped_hook_trust&) = delete;
  scoped_hook_trust& operator=(const scoped_hook_trust&) = delete;
};

} // namespace af::testing
