#include "messages/variable_spec.hpp"

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

} // namespace af
