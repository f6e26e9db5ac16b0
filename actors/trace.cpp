#include "actors/trace.hpp"

#include <algorithm>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace af {

// -- run_trace ---------------------------------------------------------------

std::string run_trace::by_device() const {
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::string>> ops;
  for (const auto& e : entries) {
    if (!ops.count(e.device))
      order.push_back(e.device);
    ops[e.device].push_back(e.op);
  }
  std::ostringstream out;
  for (const auto& dev : order) {
    out << dev << '\n';
    for (const auto& op : ops[dev])
      out << "   " << op << '\n';
  }
  return out.str();
}

std::string run_trace::to_string() const {
  std::ostringstream out;
  for (const auto& e : entries) {
    out << e.op << " (" << e.kind << "): requested " << (e.requested.empty() ? "(none)" : e.requested)
        << " -> " << e.device << " @ " << e.node;
    if (!e.note.empty())
      out << " [" << e.note << "]";
    out << '\n';
  }
  return out.str();
}

std::string run_trace::to_chrome_json() const {
  auto events = nlohmann::json::array();
  std::map<std::string, int> pids;
  std::map<std::pair<int, std::string>, int> tids;
  int64_t t0 = entries.empty() ? 0 : entries.front().start_ns;
  for (const auto& e : entries)
    t0 = std::min(t0, e.start_ns);
  for (const auto& e : entries) {
    auto [pit, new_pid] = pids.emplace(e.node, static_cast<int>(pids.size()) + 1);
    if (new_pid)
      events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pit->second},
                        {"args", {{"name", "node " + e.node}}}});
    auto [tit, new_tid] = tids.emplace(std::make_pair(pit->second, e.device),
                                       static_cast<int>(tids.size()) + 1);
    if (new_tid)
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pit->second},
                        {"tid", tit->second}, {"args", {{"name", e.device}}}});
    events.push_back({{"name", e.op},
                      {"cat", e.kind},
                      {"ph", "X"},
                      {"ts", static_cast<double>(e.start_ns - t0) / 1000.0},
                      {"dur", static_cast<double>(std::max<int64_t>(e.end_ns - e.start_ns, 0)) / 1000.0},
                      {"pid", pit->second},
                      {"tid", tit->second},
                      {"args", {{"requested", e.requested}, {"device", e.device}, {"note", e.note},
                                {"bytes_in", e.bytes_in}, {"bytes_out", e.bytes_out}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

const trace_entry* run_trace::find(const std::string& op) const {
  for (const auto& e : entries)
    if (e.op == op)
      return &e;
  return nullptr;
}

} // namespace af
