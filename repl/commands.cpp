// The commands (docs/repl.md): help, cluster, devices, ping, run, trace,
// vars, init, wait, save, restore, ... (train: train_commands.cpp).

#include "repl/interpreter_state.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>

#include "kernels/op_registry.hpp"
#include "train/checkpoint.hpp"

namespace af::repl {

void interpreter::state::expect_words(const stmt& st, size_t min, size_t max) {
  if (st.words.size() < min || st.words.size() > max) {
    position at = st.words.size() > max ? st.words[max].at : st.command_at;
    fail(at, st.command + ": usage: " + find_command(st.command)->usage);
  }
}

std::vector<output> interpreter::state::named_variables(const stmt& st, size_t from) {
  std::vector<output> vars;
  for (size_t i = from; i < st.words.size(); ++i) {
    const auto& w = st.words[i];
    auto it = current->names.find(w.text);
    if (it != current->names.end() && it->second.what == value::kind::node
        && sess().graph_def().variable_node(it->second.o) != nullptr) {
      vars.push_back(it->second.o);
      continue;
    }
    auto o = sess().graph_def().find_variable(w.text);
    if (!o.valid())
      fail(w.at, "'" + w.text + "' is neither a name bound to a variable nor a variable of this "
                 "session's graph");
    vars.push_back(o);
  }
  return vars;
}

void interpreter::state::command(const stmt& st) {
  const auto& c = st.command;
  if (c == "help")
    return help(st);
  if (c == "quit") {
    expect_words(st, 0, 0);
    quit = true;
    return;
  }
  if (c == "cluster")
    return cluster_cmd(st);
  if (c == "devices")
    return devices_cmd(st);
  if (c == "ping") {
    expect_words(st, 1, 1);
    auto [job, task] = parse_task(st.words[0], spec);
    auto info = sess().ping(job, task);
    if (!info)
      fail(info.error());
    *out << node_line(job, task, *info) << "\n";
    auto transport = sess().data_transport(job, task);
    if (!transport)
      fail(transport.error());
    *out << "  variable ops travel by: " << *transport << "\n";
    return;
  }
  if (c == "shutdown") {
    expect_words(st, 1, 1);
    auto [job, task] = parse_task(st.words[0], spec);
    if (auto err = sess().shutdown(job, task))
      fail(err);
    *out << task_name(job, task) << " is shutting down\n";
    return;
  }
  if (c == "reset") {
    // tf.reset_default_graph(): a fresh session of the same task, with no
    // graph and no names; the cluster's variables stay.
    expect_words(st, 0, 0);
    if (open_scopes > 0)
      fail(st.command_at, "reset: not inside a with block");
    auto d = device_name::parse(current->target);
    auto fresh = make_session(*d->job, *d->task);
    if (!fresh)
      fail(fresh.error(), "reset");
    auto target = current->target;
    auto& slot = clients[target];
    slot = std::make_unique<client>(client{target, std::move(*fresh), {}, {}, {}, {}});
    current = slot.get();
    *out << "the session of " << target << " starts again: no ops, no names (the cluster's "
         << "variables are kept)\n";
    return;
  }
  if (c == "session") {
    expect_words(st, 0, 1);
    if (!st.words.empty()) {
      // A with-scope belongs to the session that opened it: switching
      // inside one would place the other session's ops under no scope.
      if (open_scopes > 0)
        fail(st.command_at, "session: cannot switch sessions inside a with block; close the "
                            "block first");
      auto [job, task] = parse_task(st.words[0], spec);
      use(job, task);
    }
    *out << "session of " << current->target << "\n";
    return;
  }
  if (c == "run")
    return run_cmd(st);
  if (c == "print") {
    for (const auto& e : st.exprs)
      *out << show(eval(*e), e->at) << "\n";
    return;
  }
  if (c == "trace")
    return trace_cmd(st);
  if (c == "vars")
    return vars_cmd(st);
  if (c == "ops") {
    expect_words(st, 0, 0);
    for (const auto& n : sess().graph_def().nodes())
      *out << n.name << "  "
           << (n.kind == node_kind::variable      ? "variable"
               : n.kind == node_kind::constant    ? "constant"
               : n.kind == node_kind::placeholder ? "placeholder"
                                                  : n.op)
           << "\n";
    return;
  }
  if (c == "names") {
    expect_words(st, 0, 0);
    for (const auto& [n, v] : current->names)
      *out << n << ": " << (v.what == value::kind::tensor ? "constant " + describe_shape(v.t)
                                                          : show(v, position{0, 0}))
           << "\n";
    return;
  }
  if (c == "init") {
    auto vars = named_variables(st, 0);
    if (vars.empty() && sess().graph_def().variables().empty())
      fail(st.at, "init: this session's graph has no variables (define one with variable(...))");
    if (auto err = sess().initialize(vars))
      fail(err);
    size_t n = vars.empty() ? sess().graph_def().variables().size() : vars.size();
    *out << "initialized " << n << " variable" << (n == 1 ? "" : "s") << "\n";
    return;
  }
  if (c == "uninit") {
    auto vars = named_variables(st, 0);
    auto names = sess().uninitialized(vars);
    if (!names)
      fail(names.error());
    std::string list;
    for (const auto& n : *names)
      list += (list.empty() ? "" : ", ") + n;
    *out << "uninitialized: [" << list << "]\n";
    return;
  }
  if (c == "wait")
    return wait_cmd(st);
  if (c == "sleep") {
    expect_words(st, 1, 1);
    auto d = parse_duration(st.words[0].text);
    if (!d)
      fail(st.words[0].at, "sleep: '" + printable(st.words[0].text)
                             + "' is not a duration: 500ms, 2s, 1m (at most a day)");
    if (!pause(*d))
      fail(st.at, "cancelled");
    return;
  }
  if (c == "save")
    return save_cmd(st);
  if (c == "restore")
    return restore_cmd(st);
  if (c == "train")
    return train_cmd(st);
  fail(st.command_at, "the command " + c + " is not implemented");
}

void interpreter::state::help(const stmt& st) {
  expect_words(st, 0, 1);
  if (st.words.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& c : commands())
      rows.push_back({c.usage});
    *out << "commands (help COMMAND says more; help functions lists what expressions can call):\n"
         << table(rows)
         << "statements: NAME = EXPR; with DEVICE { ... }; repeat N { ... }; EXPR shows what it is\n"
         << "expressions: numbers, \"text\", [lists] as tensors, + - * / @, calls, x.assign_add(1)\n";
    return;
  }
  const auto& topic = st.words[0].text;
  if (topic == "functions") {
    for (const auto& [n, h] : builtins())
      *out << h << "\n";
    *out << "ops (docs/ops.md):\n";
    for (const auto& def : kernels::op_registry())
      *out << op_help(std::string{def.call_name()}) << "\n";
    return;
  }
  if (const auto* c = find_command(topic)) {
    *out << c->usage << "\n  " << c->help << "\n";
    return;
  }
  auto h = function_help(topic);
  if (!h.empty()) {
    *out << h << "\n";
    return;
  }
  fail(st.words[0].at, "help: no command or function '" + topic + "' (help lists them)");
}

std::string interpreter::state::node_line(const std::string& job, int32_t task,
                                          const node_info& info) {
  std::string devs;
  for (const auto& d : info.devices)
    devs += (devs.empty() ? "" : ", ") + d;
  std::string line = task_name(job, task) + "  pid " + std::to_string(info.pid) + "  devices "
                     + devs + "  data port " + std::to_string(info.data_port);
  for (const auto& e : info.device_errors)
    line += "\n  device not available: " + e;
  return line;
}

void interpreter::state::cluster_cmd(const stmt& st) {
  expect_words(st, 0, 0);
  std::vector<std::vector<std::string>> rows;
  for (const auto& [job, tasks] : spec.jobs())
    for (size_t t = 0; t < tasks.size(); ++t) {
      auto name = task_name(job, static_cast<int32_t>(t));
      rows.push_back({name == current->target ? "*" : " ", name, tasks[t].to_string()});
    }
  *out << (embedded ? "embedded cluster (in this process)" : "cluster") << ", session of "
       << current->target << " (*):\n" << table(rows);
}

void interpreter::state::devices_cmd(const stmt& st) {
  expect_words(st, 0, 0);
  bool all_up = true;
  for (const auto& [job, tasks] : spec.jobs())
    for (size_t t = 0; t < tasks.size(); ++t) {
      if (cancelled())
        fail(st.at, "cancelled");
      auto info = sess().ping(job, static_cast<int32_t>(t));
      if (info) {
        *out << node_line(job, static_cast<int32_t>(t), *info) << "\n";
      } else {
        all_up = false;
        *out << task_name(job, static_cast<int32_t>(t)) << "  down: " << describe(info.error())
             << "\n";
      }
    }
  if (!all_up)
    fail("devices: some tasks did not answer (above)");
}

void interpreter::state::run_cmd(const stmt& st) {
  std::vector<output> fetches;
  std::vector<std::string> labels;
  // A list of nodes (gradients) runs each; nested lists (sparse_gradients'
  // [ids, values] per table) are walked down.
  std::function<void(const value&, position, const std::string&)> add;
  add = [&](const value& v, position at, const std::string& label) {
    if (v.what == value::kind::list && !is_numeric_list(v)) {
      for (const auto& item : v.items)
        add(item, at, item.source);
      return;
    }
    fetches.push_back(to_node(v, at));
    labels.push_back(label);
  };
  for (const auto& e : st.exprs)
    add(eval(*e), e->at, e->source);
  std::vector<std::pair<output, tensor>> feeds;
  for (const auto& [w, e] : st.feeds) {
    auto it = current->names.find(w.text);
    if (it == current->names.end() || it->second.what != value::kind::node
        || sess().graph_def().at(it->second.o).kind != node_kind::placeholder)
      fail(w.at, "feed: '" + w.text + "' is not a name bound to a placeholder (x = placeholder(\"x\"))");
    feeds.emplace_back(it->second.o, to_tensor(eval(*e), e->at));
  }
  run_trace trace;
  auto values = sess().run(fetches, feeds, &trace);
  if (!values) {
    auto why = describe(values.error());
    if (why.find("run()'s feeds") != std::string::npos) // the library speaks C++
      why += " (here: run ... feed NAME=[...])";
    fail(why);
  }
  last_trace = std::move(trace);
  for (size_t i = 0; i < values->size(); ++i) {
    auto text = format_numpy((*values)[i], opts.print);
    if (values->size() > 1)
      *out << labels[i] << " =" << (text.find('\n') == std::string::npos ? " " : "\n") << text
           << "\n";
    else
      *out << text << "\n";
  }
}

void interpreter::state::trace_cmd(const stmt& st) {
  expect_words(st, 0, 2);
  if (!last_trace)
    fail(st.at, "trace: nothing has run yet in this REPL (run something first)");
  if (st.words.empty()) {
    *out << last_trace->by_device();
    return;
  }
  if (st.words[0].text == "detail" && st.words.size() == 1) {
    *out << last_trace->to_string();
    return;
  }
  if (st.words[0].text != "save" || st.words.size() != 2)
    fail(st.words[0].at, "trace: usage: " + std::string{find_command("trace")->usage});
  const auto& path = st.words[1].text;
  std::ofstream f{path, std::ios::binary | std::ios::trunc};
  if (!f)
    fail(st.words[1].at, "trace save: cannot write '" + path + "' (" + std::strerror(errno)
                           + "): check the directory exists and is writable");
  f << last_trace->to_chrome_json();
  f.close();
  if (!f)
    fail(st.words[1].at, "trace save: writing '" + path + "' failed");
  *out << "wrote " << last_trace->entries.size() << " trace events to " << path
       << " (open in https://ui.perfetto.dev or chrome://tracing)\n";
}

void interpreter::state::vars_cmd(const stmt& st) {
  expect_words(st, 0, 1);
  std::vector<std::pair<std::string, int32_t>> tasks;
  if (st.words.empty()) {
    for (const auto& [job, addrs] : spec.jobs())
      for (size_t t = 0; t < addrs.size(); ++t)
        tasks.emplace_back(job, static_cast<int32_t>(t));
  } else {
    tasks.push_back(parse_task(st.words[0], spec));
  }
  std::vector<std::vector<std::string>> rows{
    {"name", "shape", "dtype", "initialized", "version", "bytes", "device"}};
  for (const auto& [job, task] : tasks) {
    auto vars = sess().list_variables(job, task);
    if (!vars)
      fail(vars.error());
    auto sorted = *vars;
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& x, const auto& y) { return x.spec.name < y.spec.name; });
    for (const auto& v : sorted) {
      known_variables.insert(v.spec.name);
      size_t elements = 1;
      for (auto d : v.spec.shape)
        elements *= static_cast<size_t>(d);
      rows.push_back({v.spec.name, shape_text(v.spec.shape), to_string(v.spec.type),
                      v.initialized ? "yes" : "no", std::to_string(v.version),
                      std::to_string(elements * dtype_size(v.spec.type)), v.spec.device});
    }
  }
  if (rows.size() == 1) {
    *out << "no variables on " << (st.words.empty() ? "any task" : st.words[0].text) << "\n";
    return;
  }
  *out << table(rows);
}

void interpreter::state::wait_cmd(const stmt& st) {
  ms total{10000};
  size_t from = 0;
  auto numeric = [](const std::string& w) {
    size_t k = (w[0] == '-' || w[0] == '+') ? 1 : 0;
    return k < w.size() && (std::isdigit(static_cast<unsigned char>(w[k])) || w[k] == '.');
  };
  if (!st.words.empty() && numeric(st.words[0].text)) {
    auto d = parse_duration(st.words[0].text);
    if (!d)
      fail(st.words[0].at, "wait: '" + printable(st.words[0].text)
                             + "' is not a duration: write 500ms, 10s or 1m (at most a day)");
    total = *d;
    from = 1;
  }
  auto vars = named_variables(st, from);
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto left = total - std::chrono::duration_cast<ms>(std::chrono::steady_clock::now() - start);
    auto slice = std::clamp(left, ms{1}, ms{50});
    auto err = sess().wait_initialized(slice, vars);
    if (!err) {
      *out << "initialized\n";
      return;
    }
    // Interrupted: the session's wait ends on the cancel flag itself
    // (cancelled), or the slice ran out as it came.
    if (is(err, af_error::cancelled) || cancelled())
      fail(st.at, "wait: cancelled");
    if (!is(err, af_error::timeout))
      fail(err);
    if (std::chrono::steady_clock::now() - start >= total) {
      // The last slice's error names what it waited for; asking the
      // variables again could block on a node that does not answer.
      // ("... for initialization of 1 variable(s): u (on ...); is the chief ...")
      auto why = describe(err);
      auto names = why;
      if (auto p = why.find("variable(s): "); p != std::string::npos)
        names = why.substr(p + 13, why.find("; is the chief") - p - 13);
      fail("wait: gave up after " + std::to_string(total.count())
           + " ms; still without a value: " + names
           + " (another client's init, or `init` here, gives them one)");
    }
  }
}

void interpreter::state::save_cmd(const stmt& st) {
  expect_words(st, 1, 1);
  auto vars = sess().graph_def().variables();
  if (vars.empty())
    fail(st.at, "save: this session's graph has no variables");
  auto values = sess().run(vars);
  if (!values)
    fail(values.error(), "save: reading the variables");
  train::checkpoint ck;
  for (size_t i = 0; i < vars.size(); ++i)
    ck.variables.push_back({sess().graph_def().variable_node(vars[i])->spec.name, (*values)[i], {}});
  auto path = train::save(st.words[0].text, ck, 0);
  if (!path)
    fail(st.words[0].at, path.error().what);
  *out << "saved " << vars.size() << " variable" << (vars.size() == 1 ? "" : "s") << " to "
       << *path << "\n";
}

void interpreter::state::restore_cmd(const stmt& st) {
  expect_words(st, 1, 1);
  const auto& dir = st.words[0].text;
  auto path = train::latest(dir);
  if (!path)
    fail(st.words[0].at, path.error().what);
  if (path->empty())
    fail(st.words[0].at, "restore: '" + dir + "' holds no checkpoint (save DIR writes one)");
  auto ck = train::load(*path);
  if (!ck)
    fail(st.words[0].at, ck.error().what);
  std::vector<output> targets;
  std::vector<std::pair<output, tensor>> feeds;
  std::vector<std::string> missing;
  for (const auto& sv : ck->variables) {
    auto var = sess().graph_def().find_variable(sv.name);
    if (!var.valid()) {
      missing.push_back(sv.name);
      continue;
    }
    const auto& spec_here = sess().graph_def().variable_node(var)->spec;
    if (spec_here.shape != sv.value.shape() || spec_here.type != sv.value.type())
      fail(st.words[0].at, "restore: " + sv.name + " is " + shape_text(spec_here.shape) + " "
                             + to_string(spec_here.type) + " here and "
                             + shape_text(sv.value.shape()) + " " + to_string(sv.value.type())
                             + " in " + *path);
    auto& ops = current->restore_ops[sv.name];
    if (!ops.first.valid()) {
      ops.first = sess().placeholder(sv.name + "/restore_value");
      ops.second = sess().assign(var, ops.first);
    }
    targets.push_back(ops.second);
    feeds.emplace_back(ops.first, sv.value);
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& n : missing)
      names += (names.empty() ? "" : ", ") + n;
    fail(st.words[0].at, "restore: " + *path + " holds " + names
                           + ", which this session has not defined: define them with "
                             "variable(...) first (nothing was restored)");
  }
  if (auto r = sess().run(targets, feeds); !r)
    fail(r.error(), "restore");
  *out << "restored " << targets.size() << " variable" << (targets.size() == 1 ? "" : "s")
       << " from " << *path << "\n";
}

} // namespace af::repl
