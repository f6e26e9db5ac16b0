// The interpreter's public face (interpreter.hpp): starting on a cluster,
// execute(), completion; and the sessions it opens, one per task.

#include "repl/interpreter.hpp"

#include <sstream>

#include "repl/interpreter_state.hpp"

namespace af::repl {

// -- sessions ------------------------------------------------------------------

session_options interpreter::state::session_opts() const {
  session_options so;
  so.timeout = opts.timeout;
  so.connect_timeout = std::min(opts.timeout, ms{5000});
  so.cancel = cancel;
  return so;
}

caf::expected<session> interpreter::state::make_session(const std::string& job, int32_t task,
                                                        bool cancellable) {
  auto so = session_opts();
  if (!cancellable)
    so.cancel = nullptr;
  if (embedded)
    return embedded->session_for(job, task, so);
  return session::make(*sys, spec, task_name(job, task), so);
}

client& interpreter::state::use(const std::string& job, int32_t task) {
  auto name = task_name(job, task);
  auto it = clients.find(name);
  if (it == clients.end()) {
    auto s = make_session(job, task);
    if (!s)
      fail(s.error(), "opening a session on " + name);
    auto c = std::make_unique<client>(client{name, std::move(*s), {}, {}, {}, {}});
    it = clients.emplace(name, std::move(c)).first;
  }
  current = it->second.get();
  return *current;
}

std::string interpreter::state::prompt_text() const {
  if (current->target == first_target)
    return "actorflow> ";
  return "actorflow(" + current->target + ")> ";
}

bool interpreter::state::pause(ms d) {
  auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
    if (cancelled())
      return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
      ms{20}, until - std::chrono::steady_clock::now()));
  }
  return !cancelled();
}

// -- interpreter ---------------------------------------------------------------

interpreter::interpreter(std::unique_ptr<state> st) : st_(std::move(st)) {}

interpreter::~interpreter() = default;

namespace {

std::string default_target(const cluster_spec& spec, const std::string& target) {
  if (!target.empty())
    return target;
  if (spec.has_job("worker"))
    return "/job:worker/task:0";
  return "/job:" + spec.jobs().begin()->first + "/task:0";
}

caf::error open_first(interpreter::state& st, const std::string& target) {
  try {
    word w{default_target(st.spec, target), {}};
    auto [job, task] = parse_task(w, st.spec);
    st.use(job, task);
    st.first_target = st.current->target;
  } catch (repl_error& e) {
    return make_error(af_error::invalid_argument, e.message);
  }
  return caf::none;
}

} // namespace

caf::expected<std::unique_ptr<interpreter>>
interpreter::embedded(const std::map<std::string, int>& jobs, const std::string& target,
                      options opts) {
  auto st = std::make_unique<state>();
  st->opts = opts;
  auto node = embedded_cluster::defaults();
  node.cpu_devices = 2; // cpu:0 and cpu:1, for the towers example
  auto ec = embedded_cluster::start(jobs, node);
  if (!ec)
    return std::move(ec.error());
  st->embedded = std::move(*ec);
  st->spec = st->embedded->spec();
  if (auto err = open_first(*st, target))
    return err;
  return std::unique_ptr<interpreter>{new interpreter(std::move(st))};
}

caf::expected<std::unique_ptr<interpreter>>
interpreter::connect(const cluster_config& config, const std::string& target, options opts) {
  auto st = std::make_unique<state>();
  st->opts = opts;
  // The config's heartbeat, so that the nodes do not take an idle REPL for
  // a dead client (and it does not reconnect after every pause).
  node_options client = config.node;
  // A secured cluster's clients show the "client" certificate (actorflow-certs).
  auto sec = security_for(config.security, "client");
  if (!sec)
    return std::move(sec.error());
  st->cfg = std::make_unique<system_config>(client, *sec);
  st->sys = af::start_actor_system(*st->cfg);
  st->spec = config.cluster;
  if (auto err = open_first(*st, target))
    return err;
  return std::unique_ptr<interpreter>{new interpreter(std::move(st))};
}

bool interpreter::execute(const std::string& text, std::ostream& out, std::ostream& err,
                          size_t first_line) {
  auto& st = *st_;
  st.open_scopes = 0;
  st.out = &out;
  auto parsed = parse(text, first_line);
  if (parsed.error) {
    err << explain(*parsed.error, text) << "\n";
    return false;
  }
  client* before = st.current;
  try {
    st.run_program(parsed.program, true);
    out << std::flush;
    return true;
  } catch (repl_error& e) {
    out << std::flush;
    bool multiline = text.find('\n') != std::string::npos || first_line > 1;
    std::string where;
    if (e.statement && multiline)
      where = " at line " + std::to_string(e.at.line);
    else if (e.at.column > 0 && !e.statement)
      where = multiline ? " at line " + std::to_string(e.at.line) + ", column "
                            + std::to_string(e.at.column)
                        : " at column " + std::to_string(e.at.column);
    err << "error" << where << ": " << printable_message(e.message) << "\n";
  } catch (std::bad_alloc&) {
    out << std::flush;
    err << "error: out of memory in this process while running the statement (a tensor too "
           "large for the REPL: make it a variable, which its node allocates)\n";
  } catch (std::exception& e) {
    out << std::flush;
    err << "error: " << printable_message(e.what()) << "\n";
  }
  if (st.current == nullptr)
    st.current = before;
  return false;
}

bool interpreter::quit_requested() const {
  return st_->quit;
}

void interpreter::interrupt() noexcept {
  st_->cancel->store(true);
}

void interpreter::clear_interrupt() noexcept {
  st_->cancel->store(false);
}

std::string interpreter::prompt() const {
  return st_->prompt_text();
}

std::vector<std::string> interpreter::complete(const std::string& line, const std::string& word) {
  auto& st = *st_;
  std::set<std::string> cands;
  auto first = line.find_first_not_of(" \t");
  bool at_start = first == std::string::npos || line.substr(first) == word;
  if (at_start) {
    for (const auto& c : commands())
      cands.insert(c.name);
    cands.insert("with");
    cands.insert("repeat");
  }
  if (!word.empty() && word[0] == '/') {
    for (const auto& [job, tasks] : st.spec.jobs())
      for (size_t t = 0; t < tasks.size(); ++t) {
        auto n = task_name(job, static_cast<int32_t>(t));
        cands.insert(n);
        cands.insert(n + "/cpu:0");
        cands.insert(n + "/gpu:0");
      }
    cands.insert("/cpu:0");
    cands.insert("/cpu:1");
    cands.insert("/gpu:0");
  } else {
    for (const auto& f : state::function_names())
      cands.insert(f);
    for (const auto& [n, v] : st.current->names)
      cands.insert(n);
    for (const auto& v : st.current->s.graph_def().variables())
      st.known_variables.insert(st.current->s.graph_def().variable_node(v)->spec.name);
    for (const auto& v : st.known_variables)
      cands.insert(v);
    cands.insert("true");
    cands.insert("false");
    // Words that only follow a command.
    std::string head = first == std::string::npos ? "" : line.substr(first, line.find_first_of(" \t", first) - first);
    if (head == "run")
      cands.insert("feed");
    if (head == "train")
      for (const char* kw : {"start", "status", "mode", "wait", "stop", "sync", "async", "ssp", "average"})
        cands.insert(kw);
    if (head == "trace") {
      cands.insert("save");
      cands.insert("detail");
    }
    if (head == "help") {
      cands.insert("functions");
      for (const auto& c : commands())
        cands.insert(c.name);
    }
  }
  std::vector<std::string> out;
  for (const auto& c : cands)
    if (c.compare(0, word.size(), word) == 0)
      out.push_back(c);
  return out;
}

caf::expected<std::map<std::string, int>> parse_jobs(const std::string& text) {
  std::map<std::string, int> jobs;
  std::stringstream in{text};
  std::string part;
  while (std::getline(in, part, ',')) {
    auto eq = part.find('=');
    std::string job = part.substr(0, eq);
    if (eq == std::string::npos || job.empty())
      return make_error(af_error::invalid_config,
                        "--embedded: '" + part + "' is not JOB=COUNT (e.g. ps=1,worker=2)");
    char* end = nullptr;
    long n = std::strtol(part.c_str() + eq + 1, &end, 10);
    if (*end != '\0' || n < 1 || n > 64 || end == part.c_str() + eq + 1)
      return make_error(af_error::invalid_config,
                        "--embedded: the count of '" + job + "' must be from 1 to 64, found '"
                          + part.substr(eq + 1) + "'");
    if (jobs.count(job))
      return make_error(af_error::invalid_config, "--embedded: job '" + job + "' is given twice");
    jobs[job] = static_cast<int>(n);
  }
  if (jobs.empty())
    return make_error(af_error::invalid_config,
                      "--embedded: name at least one job, e.g. ps=1,worker=2");
  return jobs;
}

} // namespace af::repl
