// The raw shared-memory baseline of train_sync_1m_2w_shm (bench_train.hpp):
// the 1 M workload's ps and workers as one would write them by hand for
// processes of one host. One segment (made by the bench, named by shm=)
// holds a control page and, per worker, a pair of regions: its gradient
// (written by the worker, read by the ps) and its parameters (written by
// the ps, read by the worker). Each side computes straight into and out of
// the segment: a step copies the parameters once per worker (the ps's w
// into the worker's region) and nothing else: a stronger baseline than our
// ring, which copies into and out of its segment. Waits look for 20 us,
// yielding the CPU, then raise a "waiting" flag and sleep on a futex; the
// other side wakes it only when it sees the flag. (Our ring also stops
// spinning where spins keep failing: net/shm_ring.hpp.)
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cblas.h>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include "bench/raw_helpers.hpp"
#include "train/data.hpp"

namespace af::bench {

namespace {

/// A word two processes wait on and signal, with the waiter's flag.
struct alignas(64) shared_word {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> waiting{0};
};

/// The control page at the segment's start.
struct control {
  shared_word ps_bell;             ///< bumped by a worker that published a gradient
  shared_word grad_seq[2];         ///< gradients a worker published
  shared_word param_seq[2];        ///< parameters the ps published to a worker
  std::atomic<uint32_t> stop{0};   ///< the ps ended the run (with the last param_seq)
};
static_assert(sizeof(control) <= 4096, "the control page");

constexpr size_t page = 4096;
constexpr auto spin = std::chrono::microseconds{20};

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, timeout, nullptr, 0);
}

/// After changing `w.value`: wakes its waiter, if it said it waits.
void signal(shared_word& w) {
  if (w.waiting.load())
    futex(&w.value, FUTEX_WAKE, 1, nullptr);
}

/// Waits until `w.value` is no longer `seen` (spin, then futex); false after
/// stall_ms without a change.
bool wait_change(shared_word& w, uint32_t seen) {
  auto now = clock_type::now();
  for (auto until = now + spin; clock_type::now() < until;) {
    if (w.value.load() != seen)
      return true;
    sched_yield();
  }
  auto give_up = now + std::chrono::milliseconds{stall_ms};
  while (w.value.load() == seen) {
    if (clock_type::now() > give_up)
      return false;
    w.waiting.store(1);
    timespec ts{0, 100 * 1000 * 1000}; // a bound, not the wake-up: the flag is
    if (w.value.load() == seen)
      futex(&w.value, FUTEX_WAIT, seen, &ts);
    w.waiting.store(0);
  }
  return true;
}

/// The segment named `name`, mapped whole.
char* map_segment(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0)
    return nullptr;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

} // namespace

size_t raw_shm_segment_bytes(size_t floats, size_t workers) {
  size_t region = (floats * sizeof(float) + page - 1) / page * page;
  return page + workers * 2 * region;
}

/// The ps: sync store-and-forward (every worker's whole gradient, the mean
/// applied, then the parameters to each) over the timed window; prints
/// window_steps and window_seconds as the TCP ps does.
int raw_shm_ps_main(const helper_args& a) {
  const size_t floats = a.num("floats"), workers = 2;
  const size_t bytes = floats * sizeof(float);
  const size_t region = (bytes + page - 1) / page * page;
  const auto lr = static_cast<float>(a.real("lr"));
  char* base = map_segment(a.str("shm"), raw_shm_segment_bytes(floats, workers));
  if (!base)
    return std::fprintf(stderr, "raw shm ps: cannot map %s\n", a.str("shm").c_str()), 1;
  auto* ctl = reinterpret_cast<control*>(base);
  auto grad = [&](size_t w) { return reinterpret_cast<const float*>(base + page + 2 * w * region); };
  auto params = [&](size_t w) { return reinterpret_cast<float*>(base + page + (2 * w + 1) * region); };
  raw_window window;
  window.warmup_s = a.real("warmup");
  window.window_s = a.real("window");
  std::vector<float> w(floats, 0.0f);
  const float scale = lr / static_cast<float>(workers);
  for (uint32_t step = 0;; ++step) {
    // every worker's gradient of this step
    for (;;) {
      uint32_t bell = ctl->ps_bell.value.load();
      bool all = true;
      for (size_t k = 0; k < workers; ++k)
        all &= ctl->grad_seq[k].value.load() > step;
      if (all)
        break;
      if (!wait_change(ctl->ps_bell, bell))
        return std::fprintf(stderr, "raw shm ps: no gradient for %d ms\n", stall_ms), 1;
    }
    for (size_t k = 0; k < workers; ++k)
      cblas_saxpy(static_cast<int>(floats), -scale, grad(k), 1, w.data(), 1);
    window.tick(step + 1, true);
    if (window.ending) {
      ctl->stop.store(1);
      for (size_t k = 0; k < workers; ++k) {
        ctl->param_seq[k].value.store(step + 1);
        signal(ctl->param_seq[k]);
      }
      break;
    }
    for (size_t k = 0; k < workers; ++k) {
      std::memcpy(params(k), w.data(), bytes);
      ctl->param_seq[k].value.store(step + 1);
      signal(ctl->param_seq[k]);
    }
  }
  std::printf("window_steps %lu\nwindow_seconds %.6f\n",
              static_cast<unsigned long>(window.steps1 - window.steps0),
              std::chrono::duration<double>(window.t1 - window.t0).count());
  return 0;
}

/// A worker: its example as the TCP raw worker's; per step the gradient
/// straight into its region, then it waits for its parameters and reads
/// them in place. Prints its steps and its last loss.
int raw_shm_worker_main(const helper_args& a) {
  const auto rank = static_cast<uint32_t>(a.num("rank"));
  const size_t floats = a.num("floats"), workers = 2, features = floats - 1;
  const size_t region = (floats * sizeof(float) + page - 1) / page * page;
  char* base = map_segment(a.str("shm"), raw_shm_segment_bytes(floats, workers));
  if (!base || rank >= workers)
    return std::fprintf(stderr, "raw shm worker %u: cannot map %s\n", rank,
                        a.str("shm").c_str()), 1;
  auto* ctl = reinterpret_cast<control*>(base);
  auto* g = reinterpret_cast<float*>(base + page + 2 * rank * region);
  const auto* w = reinterpret_cast<const float*>(base + page + (2 * rank + 1) * region);
  auto data = train::per_worker_linear(rank + 1, features, a.num("seed"));
  const float* x = data.x.data() + size_t{rank} * features;
  const float y = data.targets[rank];
  uint32_t steps = 0;
  double loss = 0;
  for (;; ++steps) {
    // the parameters start at 0 in a fresh segment, as the ps's
    float err = cblas_sdot(static_cast<int>(features), x, 1, w, 1) + w[features] - y;
    loss = static_cast<double>(err) * err;
    const float scale = 2 * err;
    for (size_t k = 0; k < features; ++k)
      g[k] = scale * x[k];
    g[features] = scale;
    ctl->grad_seq[rank].value.store(steps + 1);
    ctl->ps_bell.value.fetch_add(1);
    signal(ctl->ps_bell);
    if (!wait_change(ctl->param_seq[rank], steps))
      return std::fprintf(stderr, "raw shm worker %u: no parameters for %d ms\n", rank,
                          stall_ms), 1;
    if (ctl->stop.load())
      break;
  }
  std::printf("steps %u\nloss %.9g\n", steps + 1, loss);
  return 0;
}

} // namespace af::bench
