#pragma once
// Waiting for a condition in a test without using a sleep as the signal.

#include <chrono>
#include <thread>

namespace af {

/// Polls `cond` every 10 ms until it holds (true) or `timeout` passes (false).
template <class F>
bool eventually(F cond, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

} // namespace af
