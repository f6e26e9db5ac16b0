#include "core/log.hpp"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace af::log {

namespace {

std::mutex& mtx() {
  static std::mutex instance;
  return instance;
}

std::shared_ptr<spdlog::logger>& current() {
  static std::shared_ptr<spdlog::logger> instance;
  return instance;
}

std::shared_ptr<spdlog::logger> make(const std::string& who) {
  auto logger = std::make_shared<spdlog::logger>(
    "actorflow", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  std::string escaped; // '%' starts a pattern flag
  for (char c : who)
    escaped += c == '%' ? std::string{"%%"} : std::string{c};
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] [" + escaped + "] %v");
  const char* env = std::getenv("ACTORFLOW_LOG");
  auto level = parse_level(env == nullptr ? "" : env);
  logger->set_level(level.value_or(spdlog::level::info));
  static std::once_flag warned; // init() may run more than once
  if (!level)
    std::call_once(warned, [&] {
      logger->warn("ACTORFLOW_LOG='{}' is not a level (trace, debug, info, warn, error, off); "
                   "logging at info",
                   env);
    });
  return logger;
}

} // namespace

std::optional<spdlog::level::level_enum> parse_level(std::string_view text) {
  if (text.empty() || text == "info")
    return spdlog::level::info;
  if (text == "trace")
    return spdlog::level::trace;
  if (text == "debug")
    return spdlog::level::debug;
  if (text == "warn" || text == "warning")
    return spdlog::level::warn;
  if (text == "error")
    return spdlog::level::err;
  if (text == "off")
    return spdlog::level::off;
  return std::nullopt;
}

void init(std::string who) {
  auto logger = make(who);
  std::lock_guard<std::mutex> guard{mtx()};
  current() = std::move(logger);
}

std::shared_ptr<spdlog::logger> get() {
  std::lock_guard<std::mutex> guard{mtx()};
  if (!current())
    current() = make("actorflow");
  return current();
}

} // namespace af::log
