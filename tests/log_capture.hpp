#pragma once
/// The log lines the process's logger writes while a log_capture lives, for
/// tests that check what a node said (a refusal named with its peer).

#include <algorithm>
#include <memory>
#include <string>

#include <spdlog/sinks/ringbuffer_sink.h>

#include "core/log.hpp"

namespace af::test {

struct log_capture {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink =
    std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  log_capture() { log::get()->sinks().push_back(sink); }
  ~log_capture() {
    auto& sinks = log::get()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  }
  log_capture(const log_capture&) = delete;
  log_capture& operator=(const log_capture&) = delete;
  /// Whether one line holds both `a` and `b`.
  bool has(const std::string& a, const std::string& b) const {
    for (auto& line : sink->last_formatted())
      if (line.find(a) != std::string::npos && line.find(b) != std::string::npos)
        return true;
    return false;
  }
};

} // namespace af::test
