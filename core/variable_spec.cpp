#include "core/variable_spec.hpp"

#include <atomic>
#include <random>

namespace af {

const char* to_string(var_op op) {
  switch (op) {
    case var_op::read: return "read";
    case var_op::assign: return "assign";
    case var_op::assign_add: return "assign_add";
    case var_op::assign_sub: return "assign_sub";
  }
  return "unknown variable op";
}

bool parse_var_op(const std::string& name, var_op& out) {
  for (auto op : {var_op::read, var_op::assign, var_op::assign_add, var_op::assign_sub})
    if (name == to_string(op)) {
      out = op;
      return true;
    }
  return false;
}

uint64_t new_request_id() {
  static const uint64_t seed = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<uint64_t> counter{0};
  for (;;) {
    // splitmix64's finalizer is a bijection: distinct counters, distinct ids.
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * ++counter;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    if (z != 0)
      return z;
  }
}

} // namespace af
