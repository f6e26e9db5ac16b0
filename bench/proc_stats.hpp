#pragma once
// What actorflow-bench reads about other processes, measured rather than
// computed: a process's resident memory (/proc/PID/status) and the bytes its
// TCP sockets moved (the kernel's per-socket counters, through `ss`).
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace af::bench {

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM); -1 if it cannot be read.
inline long proc_kib(pid_t pid, const std::string& field) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0)
      return std::stol(line.substr(field.size() + 1));
  return -1;
}

/// Prints `# NAME: LABEL VmRSS MiB: a b c (each holds X MiB of its own)`: the
/// resident memory of `pids` beside a line, against what each must hold.
inline void print_rss(const std::string& name, const std::string& label,
                      const std::vector<pid_t>& pids, double own_mib) {
  std::string line = "# " + name + ": " + label + " VmRSS MiB:";
  char buf[64];
  for (pid_t p : pids) {
    std::snprintf(buf, sizeof(buf), " %.1f", proc_kib(p, "VmRSS") / 1024.0);
    line += buf;
  }
  std::snprintf(buf, sizeof(buf), " (each holds %.1f MiB of its own)", own_mib);
  std::printf("%s%s\n", line.c_str(), buf);
  std::fflush(stdout);
}

/// The bytes sent plus received so far by every established TCP socket that
/// one of `pids` holds, from the kernel's tcp_info counters (`ss -tinp`):
/// what crossed the wire at those processes, headers of the layers above TCP
/// included. Nothing if `ss` cannot be run. A socket is counted once however
/// many of `pids` hold it; sockets that closed are no longer counted, so take
/// the difference of two readings over connections that stay open.
inline std::optional<uint64_t> socket_bytes_of(const std::vector<pid_t>& pids) {
  FILE* p = popen("ss -tinpH state established 2>/dev/null", "r");
  if (p == nullptr)
    return std::nullopt;
  std::set<std::string> wanted;
  for (pid_t pid : pids)
    wanted.insert("pid=" + std::to_string(pid) + ",");
  auto field = [](const std::string& line, const char* key) -> uint64_t {
    auto at = line.find(key);
    return at == std::string::npos ? 0 : std::stoull(line.substr(at + std::string{key}.size()));
  };
  uint64_t total = 0;
  bool any_line = false, counting = false;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) {
    std::string line = buf;
    any_line = true;
    bool info = !line.empty() && (line[0] == ' ' || line[0] == '\t');
    if (!info) { // a socket's line: its owners; its counters are on the next line
      counting = false;
      for (const auto& w : wanted)
        counting |= line.find(w) != std::string::npos;
      continue;
    }
    if (!counting)
      continue;
    // bytes_sent counts retransmissions too (none on loopback); older ss
    // versions print only bytes_acked
    auto sent = field(line, "bytes_sent:");
    total += (sent != 0 ? sent : field(line, "bytes_acked:")) + field(line, "bytes_received:");
    counting = false;
  }
  int rc = pclose(p);
  if (rc != 0 && !any_line)
    return std::nullopt;
  return total;
}

} // namespace af::bench
