#pragma once
/// Threads a worker keeps for its per-ps work (dist/sparse_step.hpp): each
/// step asks every ps at once, and starting a thread per ps twice a step
/// (with its stack's mmap) cost more than the wake-up of one that waits.
/// No CAF.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace af {

class ps_threads {
public:
  /// Threads for `ps` parts of work, all but the last (the caller's thread
  /// runs that one). A thread that cannot start is std::system_error, and
  /// those already started are stopped and joined first.
  explicit ps_threads(size_t ps);
  ~ps_threads();
  ps_threads(const ps_threads&) = delete;
  ps_threads& operator=(const ps_threads&) = delete;

  size_t size() const { return ps_; }

  /// Runs work(p) for every p < n (n <= size(), else only size() parts)
  /// at once (p = n - 1 on this thread) and returns once every one has.
  /// An exception of this thread's part is thrown once every other part is
  /// done; the other parts must not throw (one that does is dropped, its
  /// part unfinished). Not reentrant: one run at a time.
  void run(size_t n, const std::function<void(size_t)>& work);

private:
  void serve(size_t p);
  void stop();

  size_t ps_ = 0;
  std::mutex mtx_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(size_t)>* work_ = nullptr;
  uint64_t round_ = 0;   ///< bumped by every run; a thread runs each round once
  size_t pending_ = 0;   ///< threads of the round not done yet
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

} // namespace af
