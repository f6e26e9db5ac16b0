#pragma once
// A stand-in for Prometheus while a benchmark runs: a thread that GETs
// /metrics from each port every `every`, so that the cost of being watched
// (bench/metrics_benches.cpp) includes the scrapes, not only the counters.
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/loopback.hpp"

namespace af::bench {

class scraper {
public:
  scraper(std::vector<uint16_t> ports, std::chrono::milliseconds every)
    : ports_(std::move(ports)), every_(every) {
    if (!ports_.empty())
      thread_ = std::thread{[this] { run(); }};
  }
  ~scraper() { stop(); }
  scraper(const scraper&) = delete;
  scraper& operator=(const scraper&) = delete;

  void stop() {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable())
      thread_.join();
  }

  /// Scrapes that got a 200 with a body; failed ones (a task not up yet, or gone).
  uint64_t answered() const { return answered_.load(); }
  uint64_t failed() const { return failed_.load(); }

  /// GET /metrics from 127.0.0.1:`port`: true on a "200" answer.
  static bool scrape(uint16_t port) {
    int fd = connect_loopback(port);
    if (fd < 0)
      return false;
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    bool sent = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL)
                == static_cast<ssize_t>(request.size());
    std::string head;
    char buf[16384];
    ssize_t n = 0;
    while (sent && (n = ::recv(fd, buf, sizeof(buf), 0)) > 0)
      if (head.size() < 16)
        head.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return head.rfind("HTTP/1.1 200", 0) == 0 || head.rfind("HTTP/1.0 200", 0) == 0;
  }

private:
  void run() {
    std::unique_lock<std::mutex> lock{mtx_};
    while (!stopping_) {
      lock.unlock();
      for (auto port : ports_)
        (scrape(port) ? answered_ : failed_)++;
      lock.lock();
      cv_.wait_for(lock, every_, [this] { return stopping_; });
    }
  }

  std::vector<uint16_t> ports_;
  std::chrono::milliseconds every_;
  std::mutex mtx_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<uint64_t> answered_{0}, failed_{0};
  std::thread thread_;
};

} // namespace af::bench
