#include "config/cluster_spec.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <toml.hpp>

#include "core/device_name.hpp"
#include "core/nesting.hpp"
#include "core/read_file.hpp"
#include "core/utf8.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

caf::error config_error(std::string msg) {
  return make_error(af_error::invalid_config, std::move(msg));
}

/// The af_error of `err`; internal for one that is not actorflow's (whose
/// code means something else in its own category).
af_error code_of(const caf::error& err) {
  if (err.category() == error_category && valid_af_error(err.code()))
    return static_cast<af_error>(err.code());
  return af_error::internal;
}

/// "<where>: address '...' holds a control character", the address printed
/// with its control characters as \xNN so that the message shows them.
caf::error control_char_error(const std::string& where, const std::string& text) {
  static const char* hex = "0123456789abcdef";
  std::string shown;
  for (char ch : text) {
    auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7f) {
      shown += "\\x";
      shown += hex[u >> 4];
      shown += hex[u & 15];
    } else {
      shown += ch;
    }
  }
  return make_error(af_error::invalid_config,
                    where + ": address '" + shown + "' holds a control character; write "
                    "host:port with a host name or an IP address and a port 1-65535");
}

std::string lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

caf::error read_node_options_toml(const toml::value& node, node_options& out,
                                  const std::string& source) {
  if (!node.is_table())
    return config_error(source + ":" + std::to_string(node.location().line())
                        + ": [node] must be a table");
  for (const auto& kv : node.as_table()) {
    const auto& key = kv.first; // not a structured binding: clang 14 (fuzz/) cannot capture those
    const auto& v = kv.second;
    auto where = source + ":" + std::to_string(v.location().line()) + ": node." + key;
    auto int_field = [&](int32_t& field, int64_t lo, int64_t hi) -> caf::error {
      if (!v.is_integer())
        return config_error(where + " must be an integer");
      auto x = v.as_integer();
      if (x < lo || x > hi)
        return config_error(where + " = " + std::to_string(x) + " is out of range ["
                            + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      field = static_cast<int32_t>(x);
      return caf::none;
    };
    auto int64_field = [&](int64_t& field, int64_t lo, int64_t hi) -> caf::error {
      if (!v.is_integer())
        return config_error(where + " must be an integer (bytes)");
      auto x = v.as_integer();
      if (x < lo || x > hi)
        return config_error(where + " = " + std::to_string(x) + " is out of range ["
                            + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      field = x;
      return caf::none;
    };
    caf::error err;
    if (key == "cpu_devices") {
      err = int_field(out.cpu_devices, 1, 64);
    } else if (key == "threads") {
      err = int_field(out.threads, 0, 256);
    } else if (key == "heartbeat_ms") {
      err = int_field(out.heartbeat_ms, 0, 600000);
    } else if (key == "connection_timeout_ms") {
      err = int_field(out.connection_timeout_ms, 0, 3600000);
    } else if (key == "data_port") {
      err = int_field(out.data_port, 0, 65535);
    } else if (key == "metrics_port") {
      err = int_field(out.metrics_port, 0, 65535); // 0: no /metrics
    } else if (key == "metrics_bind") {
      if (!v.is_string() || v.as_string().str.empty()
          || std::any_of(v.as_string().str.begin(), v.as_string().str.end(),
                         [](char ch) { return static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f; }))
        err = config_error(where + " must be an address to listen on (a host name or an IP "
                                   "address, no spaces)");
      else
        out.metrics_bind = v.as_string().str;
    } else if (key == "data_idle_timeout_ms") {
      err = int_field(out.data_idle_timeout_ms, 1, 86400000);
    } else if (key == "data_frame_timeout_ms") {
      err = int_field(out.data_frame_timeout_ms, 1, 3600000);
    } else if (key == "request_timeout_ms") {
      err = int_field(out.request_timeout_ms, 1, 3600000);
    } else if (key == "max_variable_bytes") {
      err = int64_field(out.max_variable_bytes, 1, int64_t{1} << 40);
    } else if (key == "max_message_bytes") {
      // A CAF message and a data-plane frame carry at most 4 GiB - 1 on the wire.
      err = int64_field(out.max_message_bytes, 1024, (int64_t{1} << 32) - 1);
    } else if (key == "max_data_connections") {
      err = int_field(out.max_data_connections, 1, 65536);
    } else if (key == "max_shm_bytes") {
      // 0: no client of this host gets shared memory (every one stays on TCP)
      err = int64_field(out.max_shm_bytes, 0, int64_t{1} << 40);
    } else if (key == "max_handshake_bytes") {
      // BASP's first message (the client's handshake) is a few hundred bytes.
      err = int_field(out.max_handshake_bytes, 1024, 64 << 20);
    } else if (key == "handshake_timeout_ms") {
      err = int_field(out.handshake_timeout_ms, 100, 3600000);
    } else if (key == "scheduler") {
      if (!v.is_string() || (v.as_string().str != "sharing" && v.as_string().str != "stealing"))
        err = config_error(where + " must be \"sharing\" or \"stealing\"");
      else
        out.scheduler = v.as_string().str;
    } else if (key == "bind") {
      if (!v.is_string())
        err = config_error(where + " must be a string (an address to listen on)");
      else if (std::any_of(v.as_string().str.begin(), v.as_string().str.end(), [](char ch) {
                 return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f;
               }))
        err = config_error(where + " holds a control character; write a host name or an IP "
                                   "address to listen on");
      else
        out.bind = v.as_string().str;
    } else {
      err = config_error(where + ": unknown option (known: cpu_devices, threads, scheduler, "
                                 "bind, data_port, metrics_port, metrics_bind, heartbeat_ms, connection_timeout_ms, "
                                 "data_idle_timeout_ms, data_frame_timeout_ms, request_timeout_ms, "
                                 "max_variable_bytes, max_message_bytes, max_data_connections, "
                                 "max_shm_bytes, max_handshake_bytes, handshake_timeout_ms)");
    }
    if (err)
      return err;
  }
  return caf::none;
}

/// Where each [security] key was written ("file:line: security.ca"), for errors
/// found after parsing (a file that cannot be read, a missing partner key).
using key_places = std::map<std::string, std::string>;

const char* const security_keys =
  "ca, certificate, key, passphrase_file, insecure, trusted_fabric, metrics_public";

/// Sets one [security] key; `where` names it for errors.
caf::error set_security_key(security_options& out, const std::string& key, const std::string* text,
                            const bool* flag, const std::string& where) {
  if (key == "insecure" || key == "trusted_fabric" || key == "metrics_public") {
    if (flag == nullptr)
      return config_error(where + " must be true or false");
    (key == "insecure" ? out.insecure : key == "trusted_fabric" ? out.trusted_fabric
                                                                : out.metrics_public) = *flag;
    return caf::none;
  }
  std::string* field = key == "ca"                ? &out.ca_file
                       : key == "certificate"     ? &out.cert_file
                       : key == "key"             ? &out.key_file
                       : key == "passphrase_file" ? &out.passphrase_file
                                                  : nullptr;
  if (field == nullptr)
    return config_error(where + ": unknown option (known: " + security_keys + ")");
  if (text == nullptr || text->empty())
    return config_error(where + " must be a non-empty string (a file path)");
  *field = *text;
  return caf::none;
}

caf::error read_security_toml(const toml::value& sec, security_options& out, key_places& places,
                              const std::string& source) {
  auto line = source + ":" + std::to_string(sec.location().line());
  if (!sec.is_table())
    return config_error(line + ": [security] must be a table");
  places["[security]"] = line + ": [security]";
  for (const auto& [key, v] : sec.as_table()) {
    auto where = source + ":" + std::to_string(v.location().line()) + ": security." + key;
    places[key] = where;
    std::string text;
    bool flag = false;
    if (v.is_string())
      text = v.as_string().str;
    if (v.is_boolean())
      flag = v.as_boolean();
    if (auto err = set_security_key(out, key, v.is_string() ? &text : nullptr,
                                    v.is_boolean() ? &flag : nullptr, where))
      return err;
  }
  return caf::none;
}

/// The folder that relative paths of a config resolve against: that of the
/// file `source` names; "" (the working directory) for TF_CONFIG or text.
std::string folder_of(const std::string& source) {
  auto slash = source.rfind('/');
  if (slash == std::string::npos)
    return {};
  return slash == 0 ? std::string{"/"} : source.substr(0, slash);
}

/// Checks that `path` (named by [security] `key`, placed at `where`) is a
/// regular file that can be read, of at most max_pem_file_bytes; reads it
/// into `text` if `text` is given (the passphrase file). A FIFO or a device
/// is refused before anything waits on it.
caf::error check_security_file(const std::string& path, const std::string& where,
                               std::string* text, const std::string& hint) {
  std::string bytes;
  int fd = -1;
  auto why = text ? read_regular_file(path, max_pem_file_bytes, bytes)
                  : open_regular_file(path, max_pem_file_bytes, fd);
  if (fd >= 0)
    ::close(fd);
  if (!why.empty())
    return config_error(where + ": cannot read '" + path + "' (" + why + hint + ")");
  if (text)
    *text = std::move(bytes);
  return caf::none;
}

/// The key's passphrase: the first line of `text` (the file at `path`),
/// without a trailing CR; `where` names it in the error if that line is empty.
caf::error read_passphrase(const std::string& text, const std::string& path,
                           const std::string& where, std::string& out) {
  std::istringstream in{text};
  std::getline(in, out);
  if (!out.empty() && out.back() == '\r')
    out.pop_back();
  if (out.empty())
    return config_error(where + ": the first line of '" + path
                        + "' is empty; it must hold the key's passphrase");
  return caf::none;
}

/// Makes the paths absolute against the config's folder, checks that the keys
/// go together and that each file can be read, and reads the passphrase.
caf::error finish_security(security_options& sec, const key_places& places,
                           const std::string& source) {
  auto place = [&](const std::string& key) {
    auto it = places.find(key);
    if (it != places.end())
      return it->second;
    it = places.find("[security]");
    return it != places.end() ? it->second : source + ": security";
  };
  bool any = !sec.ca_file.empty() || !sec.cert_file.empty() || !sec.key_file.empty()
             || !sec.passphrase_file.empty();
  if (!any)
    return caf::none;
  std::string missing;
  for (auto [name, value] : {std::pair<const char*, const std::string*>{"ca", &sec.ca_file},
                             {"certificate", &sec.cert_file},
                             {"key", &sec.key_file}})
    if (value->empty())
      missing += (missing.empty() ? "" : ", ") + std::string{name};
  if (!missing.empty())
    return config_error(place("[security]") + ": mutual TLS needs ca, certificate and key "
                        "together; missing: " + missing
                        + " (actorflow-certs makes all three for each task)");
  if (sec.insecure)
    return config_error(place("insecure") + ": insecure = true and certificates contradict each "
                        "other; remove insecure to use TLS, or the certificate lines to run "
                        "plaintext");
  auto folder = folder_of(source);
  for (auto [key, path] : {std::pair<const char*, std::string*>{"ca", &sec.ca_file},
                           {"certificate", &sec.cert_file},
                           {"key", &sec.key_file},
                           {"passphrase_file", &sec.passphrase_file}}) {
    if (path->empty())
      continue;
    if (path->front() != '/' && !folder.empty())
      *path = folder + "/" + *path;
    if (path->find(security_name_placeholder) != std::string::npos) {
      if (std::string{key} == "ca")
        return config_error(place(key) + ": the CA is the same for every member; "
                            + security_name_placeholder + " belongs in certificate and key");
      continue; // security_for() reads it, once the member's name is known
    }
    bool pass = std::string{key} == "passphrase_file";
    std::string text;
    if (auto err = check_security_file(*path, place(key), pass ? &text : nullptr,
                                       "; relative paths are relative to the config file's "
                                       "folder"))
      return err;
    if (pass)
      if (auto err = read_passphrase(text, *path, place(key), sec.passphrase))
        return err;
  }
  return caf::none;
}

/// Byte offset -> "line L, column C" of `text`.
std::string line_col(const std::string& text, size_t byte) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

} // namespace

caf::expected<security_options> security_for(const security_options& sec,
                                             const std::string& name) {
  auto out = sec;
  for (auto [key, path] : {std::pair<const char*, std::string*>{"certificate", &out.cert_file},
                           {"key", &out.key_file},
                           {"passphrase_file", &out.passphrase_file}}) {
    auto at = path->find(security_name_placeholder);
    if (at == std::string::npos)
      continue;
    while (at != std::string::npos) {
      path->replace(at, std::string{security_name_placeholder}.size(), name);
      at = path->find(security_name_placeholder);
    }
    bool pass = std::string{key} == "passphrase_file";
    std::string text;
    if (auto err = check_security_file(*path, "[security] " + std::string{key} + " for " + name,
                                       pass ? &text : nullptr,
                                       "; actorflow-certs makes one certificate and key per task "
                                       "and one for clients"))
      return err;
    if (pass)
      if (auto err = read_passphrase(text, *path, "[security] passphrase_file", out.passphrase))
        return err;
  }
  return out;
}

std::string security_member_name(const std::string& job, int32_t task) {
  return job + "-" + std::to_string(task);
}

std::string task_address::to_string() const {
  if (host.find(':') != std::string::npos)
    return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

caf::expected<task_address> parse_address(const std::string& text, const std::string& where) {
  // A NUL would cut the host short where C sees it ("127.0.0.1\0:44335"
  // printed as 127.0.0.1); no host, address or port holds a control
  // character. Checked on the whole text first, so that every message below
  // may quote it (a DEL after the port was echoed raw as a "bad port").
  for (char ch : text)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
      return control_char_error(where, text);
  task_address out;
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return config_error(where + ": address '" + text + "' must look like [ipv6]:port");
    out.host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
    // "[[x]:2" or "[name]:2" would print as an address that does not parse back (fuzz/)
    if (out.host.find(':') == std::string::npos || out.host.find('[') != std::string::npos)
      return config_error(where + ": address '" + text + "' must look like [ipv6]:port");
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos)
      return config_error(where + ": address '" + text + "' has no port (expected host:port)");
    out.host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (out.host.find(':') != std::string::npos)
      return config_error(where + ": address '" + text
                          + "' has several ':'; write IPv6 hosts as [addr]:port");
  }
  if (out.host.empty())
    return config_error(where + ": address '" + text + "' has an empty host");
  if (port_text.empty() || port_text.size() > 5
      || port_text.find_first_not_of("0123456789") != std::string::npos)
    return config_error(where + ": bad port '" + port_text + "' in '" + text
                        + "' (expected a number 1-65535)");
  auto port = std::stoul(port_text);
  if (port == 0 || port > 65535)
    return config_error(where + ": bad port " + port_text + " in '" + text
                        + "' (expected a number 1-65535)");
  out.port = static_cast<uint16_t>(port);
  return out;
}

caf::expected<cluster_spec>
cluster_spec::from_jobs(const std::map<std::string, std::vector<std::string>>& jobs,
                        const std::string& source) {
  if (jobs.empty())
    return config_error(source + ": the cluster has no jobs (add e.g. ps = [\"host:port\"])");
  cluster_spec spec;
  std::map<std::string, std::string> seen; // normalized address -> /job:J/task:T
  for (const auto& [job, tasks] : jobs) {
    if (!valid_job_name(job))
      return config_error(source + ": job name '" + job
                          + "' must start with a letter and hold only letters, digits and '_'");
    if (tasks.empty())
      return config_error(source + ": job '" + job + "' has no tasks");
    auto& out = spec.jobs_[job];
    for (size_t i = 0; i < tasks.size(); ++i) {
      auto where = source + ": job '" + job + "' task " + std::to_string(i);
      auto addr = parse_address(tasks[i], where);
      if (!addr)
        return std::move(addr.error());
      auto key = lower(addr->host) + ":" + std::to_string(addr->port);
      auto self = "/job:" + job + "/task:" + std::to_string(i);
      if (auto it = seen.find(key); it != seen.end())
        return config_error(source + ": duplicate address " + tasks[i] + " used by " + it->second
                            + " and " + self + " (each task needs its own host:port)");
      seen.emplace(key, self);
      out.push_back(std::move(*addr));
    }
  }
  return spec;
}

size_t cluster_spec::num_tasks(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second.size();
}

caf::error cluster_spec::check_task(const std::string& job, int32_t task) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    std::string known;
    for (const auto& kvp : jobs_)
      known += (known.empty() ? "" : ", ") + kvp.first;
    return make_error(af_error::unknown_job,
                      "job '" + job + "' is not in the cluster (jobs: " + known + ")");
  }
  if (task < 0 || static_cast<size_t>(task) >= it->second.size())
    return make_error(af_error::task_out_of_range,
                      "task index " + std::to_string(task) + " is out of range for job '" + job
                        + "', which has " + std::to_string(it->second.size()) + " task(s): 0.."
                        + std::to_string(it->second.size() - 1));
  return caf::none;
}

caf::expected<task_address> cluster_spec::address(const std::string& job, int32_t task) const {
  if (auto err = check_task(job, task))
    return err;
  return jobs_.at(job)[static_cast<size_t>(task)];
}

std::string cluster_spec::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [job, tasks] : jobs_) {
    auto arr = nlohmann::json::array();
    for (const auto& t : tasks)
      arr.push_back(t.to_string());
    j[job] = arr;
  }
  return j.dump();
}

std::string cluster_spec::to_toml(const std::optional<node_options>& opts) const {
  std::ostringstream out;
  out << "[cluster]\n";
  for (const auto& [job, tasks] : jobs_) {
    out << job << " = [";
    for (size_t i = 0; i < tasks.size(); ++i)
      out << (i ? ", " : "") << '"' << tasks[i].to_string() << '"';
    out << "]\n";
  }
  if (opts) {
    out << "\n[node]\ncpu_devices = " << opts->cpu_devices << "\nscheduler = \"" << opts->scheduler
        << "\"\nthreads = " << opts->threads << "\nheartbeat_ms = " << opts->heartbeat_ms
        << "\nconnection_timeout_ms = " << opts->connection_timeout_ms
        << "\ndata_idle_timeout_ms = " << opts->data_idle_timeout_ms
        << "\ndata_frame_timeout_ms = " << opts->data_frame_timeout_ms
        << "\nrequest_timeout_ms = " << opts->request_timeout_ms
        << "\nmax_variable_bytes = " << opts->max_variable_bytes
        << "\nmax_message_bytes = " << opts->max_message_bytes
        << "\nmax_data_connections = " << opts->max_data_connections
        << "\nmax_shm_bytes = " << opts->max_shm_bytes
        << "\nmax_handshake_bytes = " << opts->max_handshake_bytes
        << "\nhandshake_timeout_ms = " << opts->handshake_timeout_ms << "\n";
    if (opts->data_port != 0)
      out << "data_port = " << opts->data_port << "\n";
    if (!opts->bind.empty())
      out << "bind = \"" << opts->bind << "\"\n";
    if (opts->metrics_port != 0)
      out << "metrics_port = " << opts->metrics_port << "\nmetrics_bind = \"" << opts->metrics_bind
          << "\"\n";
  }
  return out.str();
}

caf::expected<cluster_config> parse_cluster_toml(const std::string& text,
                                                 const std::string& source) {
  if (auto bad = utf8_problem(text); !bad.empty()) // before toml11 (core/utf8.hpp)
    return config_error("malformed TOML in " + source + ": " + bad);
  if (auto deep = nesting_problem(text, true); !deep.empty()) // before toml11 recurses
    return config_error(source + ": " + deep);
  toml::value data;
  try {
    std::istringstream in{text};
    data = toml::parse(in, source);
  } catch (const std::exception& e) {
    return config_error("malformed TOML in " + source + ": " + e.what());
  }
  if (!data.is_table() || !data.contains("cluster"))
    return config_error(source + ": no [cluster] table (expected e.g. [cluster] ps = [\"localhost:2222\"])");
  cluster_config result;
  const auto& cluster = data.at("cluster");
  if (!cluster.is_table())
    return config_error(source + ":" + std::to_string(cluster.location().line())
                        + ": 'cluster' must be a table of job = [\"host:port\", ...]");
  std::map<std::string, std::vector<std::string>> jobs;
  std::map<std::string, std::vector<size_t>> lines;
  for (const auto& [job, tasks] : cluster.as_table()) {
    auto line = std::to_string(tasks.location().line());
    if (!tasks.is_array())
      return config_error(source + ":" + line + ": job '" + job
                          + "' must be a list of \"host:port\" strings");
    jobs[job]; // an empty list still names the job, so that it is reported
    for (const auto& t : tasks.as_array()) {
      if (!t.is_string())
        return config_error(source + ":" + std::to_string(t.location().line()) + ": job '" + job
                            + "' holds a non-string entry; write \"host:port\"");
      jobs[job].push_back(t.as_string().str);
    }
    lines[job].push_back(tasks.location().line());
  }
  auto spec = cluster_spec::from_jobs(jobs, source);
  if (!spec) {
    // Point at the line of the job that the message names, when there is one.
    auto msg = describe(spec.error());
    for (const auto& [job, ls] : lines)
      if (msg.find("job '" + job + "'") != std::string::npos) {
        auto ctx = spec.error().context();
        std::string inner = ctx.size() == 1 && ctx.match_element<std::string>(0)
                              ? ctx.get_as<std::string>(0) : msg;
        auto prefix = source + ": ";
        if (inner.rfind(prefix, 0) == 0)
          inner = inner.substr(prefix.size());
        return make_error(code_of(spec.error()),
                          source + ":" + std::to_string(ls.front()) + ": " + inner);
      }
    return std::move(spec.error());
  }
  result.cluster = std::move(*spec);
  if (data.contains("node"))
    if (auto err = read_node_options_toml(data.at("node"), result.node, source))
      return err;
  key_places places;
  if (data.contains("security"))
    if (auto err = read_security_toml(data.at("security"), result.security, places, source))
      return err;
  for (const auto& [key, v] : data.as_table())
    if (key != "cluster" && key != "node" && key != "security"
        && key != "train") // [train]: train/config.hpp reads it
      return config_error(source + ":" + std::to_string(v.location().line()) + ": unknown table '"
                          + key + "' (known: cluster, node, security, train)");
  if (auto err = finish_security(result.security, places, source))
    return err;
  return result;
}

caf::expected<cluster_config> parse_cluster_json(const std::string& text,
                                                 const std::string& source) {
  if (auto deep = nesting_problem(text, false); !deep.empty()) // before nlohmann recurses
    return config_error(source + ": " + deep);
  nlohmann::json j;
  // nlohmann keeps the last of two equal keys; TOML refuses them, and so
  // does this: {"ps": [...], "ps": [...]} is a mistake, never a wish.
  struct duplicate_key {
    std::string key, in;
  };
  std::vector<std::pair<std::set<std::string>, std::string>> open; // keys seen, object's name
  std::string last_key;
  auto no_duplicates = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using ev_t = nlohmann::json::parse_event_t;
    if (ev == ev_t::object_start) {
      open.emplace_back(std::set<std::string>{}, open.empty() ? std::string{} : last_key);
    } else if (ev == ev_t::object_end && !open.empty()) {
      open.pop_back();
    } else if (ev == ev_t::key && !open.empty()) {
      last_key = parsed.get<std::string>();
      if (!open.back().first.insert(last_key).second)
        throw duplicate_key{last_key, open.back().second};
    }
    return true;
  };
  try {
    j = nlohmann::json::parse(text, no_duplicates);
  } catch (const duplicate_key& dup) {
    return config_error(source + ": key \"" + dup.key + "\" appears twice in "
                        + (dup.in.empty() ? std::string{"the top-level object"}
                                          : "\"" + dup.in + "\"")
                        + "; JSON readers disagree on which one counts: keep one");
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    // nlohmann's text repeats the position; keep only its explanation.
    auto colon = what.find(": ", what.find("parse error"));
    return config_error("malformed JSON in " + source + " at " + line_col(text, e.byte ? e.byte - 1 : 0)
                        + ": " + (colon != std::string::npos ? what.substr(colon + 2) : what));
  } catch (const nlohmann::json::exception& e) {
    // not a syntax error: a number beyond double's range ("1e400"), found by fuzz/
    std::string what = e.what();
    auto bracket = what.find("] ");
    return config_error("malformed JSON in " + source + ": "
                        + (bracket != std::string::npos ? what.substr(bracket + 2) : what));
  }
  if (!j.is_object())
    return config_error(source + ": expected a JSON object like {\"cluster\": {...}, \"task\": {...}}");
  const nlohmann::json* jobs_json = &j;
  if (j.contains("cluster"))
    jobs_json = &j.at("cluster");
  if (!jobs_json->is_object())
    return config_error(source + ": \"cluster\" must be an object of job -> [\"host:port\", ...]");
  std::map<std::string, std::vector<std::string>> jobs;
  for (const auto& [job, tasks] : jobs_json->items()) {
    if ((job == "task" || job == "security") && jobs_json == &j)
      continue;
    if (!tasks.is_array())
      return config_error(source + ": cluster." + job + " must be a list of \"host:port\" strings");
    jobs[job];
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (!tasks[i].is_string())
        return config_error(source + ": cluster." + job + "[" + std::to_string(i)
                            + "] must be a \"host:port\" string");
      jobs[job].push_back(tasks[i].get<std::string>());
    }
  }
  auto spec = cluster_spec::from_jobs(jobs, source);
  if (!spec)
    return std::move(spec.error());
  cluster_config result;
  result.cluster = std::move(*spec);
  if (j.contains("security")) {
    const auto& sec = j.at("security");
    if (!sec.is_object())
      return config_error(source + ": \"security\" must be an object {\"ca\": FILE, "
                                   "\"certificate\": FILE, \"key\": FILE, ...}");
    key_places places;
    for (const auto& [key, v] : sec.items()) {
      auto where = source + ": security." + key;
      places[key] = where;
      std::string text = v.is_string() ? v.get<std::string>() : std::string{};
      bool flag = v.is_boolean() && v.get<bool>();
      if (auto err = set_security_key(result.security, key, v.is_string() ? &text : nullptr,
                                      v.is_boolean() ? &flag : nullptr, where))
        return err;
    }
    places["[security]"] = source + ": security";
    if (auto err = finish_security(result.security, places, source))
      return err;
  }
  if (j.contains("task")) {
    const auto& task = j.at("task");
    if (!task.is_object())
      return config_error(source + ": \"task\" must be an object {\"type\": JOB, \"index\": N}");
    if (task.contains("type")) {
      if (!task.at("type").is_string())
        return config_error(source + ": task.type must be a job name string");
      result.task_type = task.at("type").get<std::string>();
    }
    if (task.contains("index")) {
      const auto& index = task.at("index");
      // get<int32_t> would wrap 4294967296 to task 0 (fuzz/)
      if (!index.is_number_integer()
          || (index.is_number_unsigned() ? index.get<uint64_t>() > INT32_MAX
                                         : index.get<int64_t>() < INT32_MIN
                                             || index.get<int64_t>() > INT32_MAX))
        return config_error(source + ": task.index must be an integer task number");
      result.task_index = index.get<int32_t>();
    }
    if (result.task_type) {
      if (auto err = result.cluster.check_task(*result.task_type, result.task_index.value_or(0)))
        return make_error(code_of(err), source + ": " + describe(err));
    }
  }
  return result;
}

caf::expected<cluster_config> load_cluster_config(const std::string& path) {
  std::string text;
  if (auto why = read_regular_file(path, max_config_file_bytes, text); !why.empty())
    return config_error("cannot open config file '" + path + "': " + why
                        + " (check the path and permissions)");
  // A byte order mark (editors on Windows write one) is no part of either
  // format's text: without this, a JSON file behind one was read as TOML.
  if (text.rfind("\xEF\xBB\xBF", 0) == 0)
    text.erase(0, 3);
  auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{')
    return parse_cluster_json(text, path);
  return parse_cluster_toml(text, path);
}

caf::expected<cluster_config> cluster_config_from_env() {
  const char* env = std::getenv("TF_CONFIG");
  if (env == nullptr || *env == '\0')
    return make_error(af_error::not_found,
                      "TF_CONFIG is not set; pass --config FILE or export TF_CONFIG");
  return parse_cluster_json(env, "TF_CONFIG");
}

} // namespace af
