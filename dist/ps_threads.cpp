#include "dist/ps_threads.hpp"

#include <algorithm>
#include <exception>

namespace af {

ps_threads::ps_threads(size_t ps) : ps_(ps) {
  try {
    for (size_t p = 0; p + 1 < ps; ++p)
      threads_.emplace_back([this, p] { serve(p); });
  } catch (...) {
    stop(); // the ones that started
    throw;
  }
}

ps_threads::~ps_threads() {
  stop();
}

void ps_threads::stop() {
  {
    std::lock_guard<std::mutex> guard{mtx_};
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable())
      t.join();
  threads_.clear();
}

void ps_threads::serve(size_t p) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t)>* work = nullptr;
    {
      std::unique_lock<std::mutex> lock{mtx_};
      start_cv_.wait(lock, [&] { return stopping_ || round_ != seen; });
      if (stopping_)
        return;
      seen = round_;
      work = work_;
    }
    try {
      (*work)(p);
    } catch (...) {
      // A part must not throw (run's contract); if one does, the round
      // still ends rather than wait forever for this thread.
    }
    std::lock_guard<std::mutex> guard{mtx_};
    if (--pending_ == 0)
      done_cv_.notify_one();
  }
}

void ps_threads::run(size_t n, const std::function<void(size_t)>& work) {
  n = std::min(n, ps_);
  if (n == 0)
    return;
  // Parts 0 .. n - 2 on the threads of those numbers, n - 1 here; the
  // threads above them sit this round out.
  std::function<void(size_t)> part = [&](size_t p) {
    if (p + 1 < n)
      work(p);
  };
  {
    std::lock_guard<std::mutex> guard{mtx_};
    work_ = &part;
    pending_ = threads_.size();
    ++round_;
  }
  start_cv_.notify_all();
  // The threads read `part` and what `work` captured until they are done:
  // wait for them even if this thread's part throws, then pass it on.
  std::exception_ptr thrown;
  try {
    work(n - 1);
  } catch (...) {
    thrown = std::current_exception();
  }
  std::unique_lock<std::mutex> lock{mtx_};
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  work_ = nullptr;
  if (thrown)
    std::rethrow_exception(thrown);
}

} // namespace af
