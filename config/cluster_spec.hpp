#pragma once
/// The cluster spec (TF's ClusterSpec): job name -> ordered list of host:port.
///
/// Sources: a TOML file (`[cluster]` table, optional `[node]` options), a JSON
/// file, or the TF_CONFIG environment variable in TensorFlow's exact shape:
///   {"cluster": {"ps": ["h:p"], "worker": [...]}, "task": {"type": "worker", "index": 1}}
/// Every problem is an af_error::invalid_config (or unknown_job /
/// task_out_of_range) whose message names the file, line, job or address.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "config/security.hpp"

namespace af {

struct task_address {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const;   ///< "host:port" ("[::1]:port" for IPv6)
};

/// Parses "host:port" / "[v6]:port"; the error names `where` and what is wrong.
caf::expected<task_address> parse_address(const std::string& text, const std::string& where);

/// How a node runs: its devices and its scheduler (see docs in README).
struct node_options {
  int32_t cpu_devices = 1;          ///< CPU "devices" cpu:0..cpu:N-1
  std::string scheduler = "sharing"; ///< CAF scheduler policy: sharing or stealing
  int32_t threads = 0;              ///< scheduler threads; 0 = one per core
  std::string bind;                 ///< address to listen on; "" = the task's host
  int32_t heartbeat_ms = 1000;      ///< 0 disables; dead or hung peers seen within timeout
  int32_t data_port = 0;            ///< the tensor data plane's port; 0 = any free one
  int32_t connection_timeout_ms = 10000;
  /// The data plane drops a client that sends nothing between frames for this
  /// long (the client reconnects on its next op).
  int32_t data_idle_timeout_ms = 600000;
  /// ... and a peer that stalls in the middle of a frame (a header, a name or
  /// a payload half sent) for this long, so that it cannot hold a thread.
  int32_t data_frame_timeout_ms = 5000;
  /// A node's requests to its own actors (a variable's info for list_vars,
  /// the first ping at start): bounded by this.
  int32_t request_timeout_ms = 10000;

  // -- limits: what one client, peer or stranger may make the node hold -----
  /// The most bytes one variable may hold (its value; each optimizer slot alike).
  int64_t max_variable_bytes = int64_t{2} << 30;
  /// The most bytes one message may carry: a data-plane frame's payload, a
  /// tensor read from CAF's wire.
  int64_t max_message_bytes = int64_t{2} << 30;
  /// Data-plane connections served at once; one more is refused (closed at
  /// once, logged) until one ends.
  int32_t max_data_connections = 256;
  /// The shared memory the data plane maps for its clients on this host, all
  /// together (8 MiB + 4 KiB each); a client past it stays on TCP.
  int64_t max_shm_bytes = int64_t{1} << 30;
  /// What a CAF peer may announce before its handshake completes (BASP's
  /// first message): more and the connection is closed unread.
  int32_t max_handshake_bytes = 65536;
  /// How long a CAF peer may take to finish its handshake (TLS, then BASP's)
  /// before its connection is closed.
  int32_t handshake_timeout_ms = 10000;

  // -- watching: Prometheus metrics and health (docs/watching.md) ------------
  /// Where the node serves /metrics and /healthz (plain HTTP); 0 = not at all.
  int32_t metrics_port = 0;
  /// The address metrics_port listens on: loopback unless [security]
  /// metrics_public (or insecure) allows another.
  std::string metrics_bind = "127.0.0.1";
};

class cluster_spec {
public:
  cluster_spec() = default;

  /// Validates names and addresses: job names, ports, duplicates.
  static caf::expected<cluster_spec>
  from_jobs(const std::map<std::string, std::vector<std::string>>& jobs,
            const std::string& source = "cluster spec");

  const std::map<std::string, std::vector<task_address>>& jobs() const { return jobs_; }

  bool has_job(const std::string& job) const { return jobs_.count(job) > 0; }

  size_t num_tasks(const std::string& job) const;

  /// The address of /job:J/task:T, or unknown_job / task_out_of_range.
  caf::expected<task_address> address(const std::string& job, int32_t task) const;

  /// Checks that job J has a task T (same errors as address()).
  caf::error check_task(const std::string& job, int32_t task) const;

  /// TF's JSON shape: {"ps": ["h:p"], "worker": [...]}.
  std::string to_json() const;

  /// A TOML file with a [cluster] table (and [node] if options are given).
  std::string to_toml(const std::optional<node_options>& opts = std::nullopt) const;

private:
  std::map<std::string, std::vector<task_address>> jobs_;
};

/// What a config file or TF_CONFIG holds.
struct cluster_config {
  cluster_spec cluster;
  node_options node;
  security_options security; ///< [security]; empty: plaintext (loopback only unless insecure)
  std::optional<std::string> task_type;  ///< TF_CONFIG's task.type, if any
  std::optional<int32_t> task_index;     ///< TF_CONFIG's task.index, if any
};

/// In [security]'s certificate, key and passphrase_file, "{name}" stands for
/// the member that reads the config, so that one config serves a whole
/// cluster: "ps-0" for /job:ps/task:0, "client" for a program that runs no
/// task (a session, the REPL, a training client). actorflow-certs names its
/// files so.
inline constexpr const char* security_name_placeholder = "{name}";

/// `sec` with {name} replaced by `name` and the files that named it checked
/// (the passphrase read); unchanged when it has none.
caf::expected<security_options> security_for(const security_options& sec,
                                             const std::string& name);

/// "JOB-TASK", the {name} of a task's node.
std::string security_member_name(const std::string& job, int32_t task);

/// Reads a .toml or .json file (decided by content: '{' first means JSON).
caf::expected<cluster_config> load_cluster_config(const std::string& path);

/// Parses TOML text; `source` names it in errors.
caf::expected<cluster_config> parse_cluster_toml(const std::string& text,
                                                 const std::string& source);

/// Parses TF_CONFIG-shaped JSON (or a bare {"cluster": ...} / job map).
caf::expected<cluster_config> parse_cluster_json(const std::string& text,
                                                 const std::string& source);

/// Reads TF_CONFIG from the environment; not_found if unset.
caf::expected<cluster_config> cluster_config_from_env();

} // namespace af
