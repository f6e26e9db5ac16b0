// Expressions (eval) and statements (assignments, with, repeat) of the
// current session.

#include "repl/interpreter_state.hpp"

#include <algorithm>

#include "core/spelling.hpp"

namespace af::repl {

value interpreter::state::eval(const expr& e) {
  if (cancelled())
    fail("cancelled");
  value v;
  v.source = e.source;
  switch (e.what) {
    case expr::kind::number:
      v.what = value::kind::number;
      v.number = e.number;
      v.integral = e.integral;
      v.exact = e.exact;
      v.negative = e.negative;
      v.magnitude = e.magnitude;
      return v;
    case expr::kind::boolean:
      v.what = value::kind::boolean;
      v.number = e.number;
      return v;
    case expr::kind::string:
      v.what = value::kind::text;
      v.text = e.text;
      return v;
    case expr::kind::name: {
      auto it = current->names.find(e.text);
      if (it == current->names.end()) {
        // A function named without a call: what it is and how to call it,
        // not "did you mean" (whose nearest name would be the same one).
        if (auto example = function_example(e.text); !example.empty())
          fail(e.at, "'" + printable(e.text) + "' is a function: call it, as in " + example);
        fail(e.at, "'" + printable(e.text) + "' is not defined in the session of " + current->target
                     + nearest_name(e.text)
                     + (clients.size() > 1 ? " (each session has its own names)" : ""));
      }
      v = it->second;
      v.source = e.source;
      return v;
    }
    case expr::kind::list:
      v.what = value::kind::list;
      for (const auto& item : e.items)
        v.items.push_back(eval(*item));
      return v;
    case expr::kind::negate: {
      auto x = eval(*e.items[0]);
      if (x.what == value::kind::number) {
        x.number = -x.number;
        if (auto exact = exact_of(x))
          set_exact(x, -*exact);
        x.source = e.source;
        return x;
      }
      return node_value(sess().neg(to_node(x, e.items[0]->at)), e.source);
    }
    case expr::kind::binary:
      return binary(e);
    case expr::kind::call:
      return call(e.text, e, {});
    case expr::kind::method: {
      auto receiver = eval(*e.items[0]);
      return call(e.text, e, std::optional<value>{receiver});
    }
  }
  fail(e.at, "cannot evaluate this expression");
}

std::string interpreter::state::nearest_name(const std::string& n) {
  std::vector<std::string> candidates; // the session's names first: they win ties
  for (const auto& [k, v] : current->names)
    candidates.push_back(k);
  for (auto& f : function_names())
    candidates.push_back(std::move(f));
  candidates.push_back("true");
  candidates.push_back("false");
  // The name typed is never its own suggestion (a function named without a
  // call, a variable called like a function).
  candidates.erase(std::remove(candidates.begin(), candidates.end(), n), candidates.end());
  auto best = closest(n, candidates, 2);
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

value interpreter::state::binary(const expr& e) {
  auto a = eval(*e.items[0]);
  auto b = eval(*e.items[1]);
  char op = e.text[0];
  if (a.what == value::kind::number && b.what == value::kind::number && op != '@') {
    value v;
    v.what = value::kind::number;
    v.source = e.source;
    switch (op) {
      case '+': v.number = a.number + b.number; break;
      case '-': v.number = a.number - b.number; break;
      case '*': v.number = a.number * b.number; break;
      case '/': v.number = a.number / b.number; break;
    }
    v.integral = a.integral && b.integral && op != '/';
    auto xa = exact_of(a), xb = exact_of(b);
    wide_int r = 0;
    // |a|, |b| < 2^64: a sum or difference fits; a product may not.
    if (xa && xb && op != '/'
        && !(op == '*' ? __builtin_mul_overflow(*xa, *xb, &r) : false)) {
      if (op == '+')
        r = *xa + *xb;
      else if (op == '-')
        r = *xa - *xb;
      set_exact(v, r);
    }
    return v;
  }
  // A literal takes the other side's dtype when it is known (TF's k / 2
  // with an int32 k): variables and constants know theirs.
  auto x = a.what == value::kind::node ? to_node(a, e.items[0]->at)
                                       : to_node(a, e.items[0]->at, dtype_of(b));
  auto y = b.what == value::kind::node ? to_node(b, e.items[1]->at)
                                       : to_node(b, e.items[1]->at, dtype_of(a));
  switch (op) {
    case '+': return node_value(sess().add(x, y), e.source);
    case '-': return node_value(sess().sub(x, y), e.source);
    case '*': return node_value(sess().mul(x, y), e.source);
    case '/': return node_value(sess().div(x, y), e.source);
    default: return node_value(sess().matmul(x, y), e.source);
  }
}

void interpreter::state::run_program(const std::vector<stmt>& program, bool top) {
  for (const auto& st : program) {
    if (quit)
      return;
    if (cancelled())
      fail(st.at, "cancelled");
    if (top && opts.echo)
      *out << prompt_text() << st.source << "\n" << std::flush;
    if (top && opts.on_statement)
      opts.on_statement(st.source);
    try {
      statement(st);
    } catch (repl_error& e) {
      if (e.at.column == 0) { // a cluster's error: say which statement (a script's line)
        e.at = st.at;
        e.statement = true;
      }
      throw;
    }
  }
}

void interpreter::state::check_graph_size() {
  if (sess().graph_def().size() >= max_graph_nodes)
    fail("this session's graph has " + std::to_string(sess().graph_def().size())
         + " ops, the most the REPL builds: each evaluation adds ops, so bind an op once "
           "(inc = var.assign_add(1)) and run its name in loops; `reset` starts a fresh graph");
}

void interpreter::state::statement(const stmt& st) {
  switch (st.what) {
    case stmt::kind::assign: {
      auto v = eval(*st.value);
      if (is_numeric_list(v)) { // checked once, where it was typed
        v.t = to_tensor(v, st.value->at);
        v.what = value::kind::tensor;
        v.items.clear();
      }
      if (st.targets.size() == 1) {
        current->names[st.targets[0]] = v;
        return;
      }
      if (v.what != value::kind::list || v.items.size() != st.targets.size())
        fail(st.value->at, "cannot unpack " + std::string{kind_name(v.what)}
                             + (v.what == value::kind::list ? " of " + std::to_string(v.items.size()) + " items" : "")
                             + " into " + std::to_string(st.targets.size()) + " names");
      for (size_t i = 0; i < st.targets.size(); ++i)
        current->names[st.targets[i]] = v.items[i];
      return;
    }
    case stmt::kind::expr: {
      auto v = eval(*st.value);
      *out << show(v, st.value->at) << "\n";
      return;
    }
    case stmt::kind::with: {
      auto scope = sess().device(st.device.text);
      if (!scope)
        fail(st.device.at, describe(scope.error()));
      ++open_scopes;
      try {
        run_program(st.body);
      } catch (...) {
        --open_scopes;
        throw;
      }
      --open_scopes;
      return;
    }
    case stmt::kind::repeat:
      for (int64_t i = 0; i < st.count; ++i) {
        auto say_cancelled = [&] {
          fail(st.at, "repeat: cancelled after " + std::to_string(i) + " of "
                        + std::to_string(st.count) + " rounds");
        };
        if (cancelled())
          say_cancelled();
        try {
          run_program(st.body);
        } catch (const repl_error&) {
          // An interrupt seen inside the body (before one of its statements)
          // is the repeat's: say how far it got, whichever check saw it.
          if (cancelled())
            say_cancelled();
          throw;
        }
      }
      return;
    case stmt::kind::command:
      command(st);
      return;
  }
}

} // namespace af::repl
