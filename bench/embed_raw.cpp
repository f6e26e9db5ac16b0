// The raw-TCP shard server and client of the sparse lines (embed_raw.hpp):
// as fast as plain blocking sockets allow, every buffer reused, one system
// call per message where the message is one buffer.
#include "bench/embed_raw.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <new>
#include <optional>
#include <sstream>

#include "bench/embed_raw_model.hpp"
#include "config/loopback.hpp"
#include "net/socket.hpp"

namespace af::bench {

// -- the client -----------------------------------------------------------------------

bool raw_embed_client::connect(const std::vector<uint16_t>& ports, int64_t rows, int64_t dim,
                               uint32_t group, uint64_t run) {
  rows_ = rows;
  dim_ = dim;
  for (auto port : ports) {
    int fd = dial_loopback(port);
    if (fd < 0)
      return false;
    sock::set_nodelay(fd);
    sock::set_buffers(fd, 8 << 20);
    sock::set_timeout(fd, SO_RCVTIMEO, std::chrono::milliseconds{stall_ms});
    fds_.push_back(fd);
    if (group > 0) {
      embed_header h{static_cast<uint32_t>(embed_op::hello), group, run};
      if (!send(fd, &h, sizeof(h)))
        return false;
    }
  }
  for (int fd : fds_) {
    embed_header h;
    if (group > 0 && !recv(fd, &h, sizeof(h)))
      return false;
  }
  req_.resize(ports.size());
  got_.resize(ports.size());
  return true;
}

void raw_embed_client::route(const std::vector<int64_t>& ids) {
  unique_.assign(ids.begin(), ids.end());
  std::sort(unique_.begin(), unique_.end());
  unique_.erase(std::unique(unique_.begin(), unique_.end()), unique_.end());
  unique_idx_.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    unique_idx_[i] = static_cast<uint32_t>(
      std::lower_bound(unique_.begin(), unique_.end(), ids[i]) - unique_.begin());
  const auto shards = static_cast<int64_t>(fds_.size());
  for (auto& r : req_)
    r.resize(sizeof(embed_header));
  place_.resize(unique_.size());
  for (size_t j = 0; j < unique_.size(); ++j) {
    auto& r = req_[static_cast<size_t>(unique_[j] % shards)];
    place_[j] = static_cast<uint32_t>((r.size() - sizeof(embed_header)) / sizeof(int64_t));
    int64_t row = unique_[j] / shards; // mod: id p is row p / n of shard p % n
    auto at = r.size();
    r.resize(at + sizeof(row));
    std::memcpy(r.data() + at, &row, sizeof(row));
  }
}

bool raw_embed_client::gather(uint64_t step) {
  for (size_t k = 0; k < fds_.size(); ++k) {
    auto& r = req_[k];
    embed_header h{static_cast<uint32_t>(embed_op::gather),
                   static_cast<uint32_t>((r.size() - sizeof(h)) / sizeof(int64_t)), step};
    std::memcpy(r.data(), &h, sizeof(h));
    if (!send(fds_[k], r.data(), r.size()))
      return false;
  }
  // The shards work at once; their answers wait in the sockets meanwhile.
  for (size_t k = 0; k < fds_.size(); ++k) {
    auto n = (req_[k].size() - sizeof(embed_header)) / sizeof(int64_t);
    got_[k].resize(n * static_cast<size_t>(dim_));
    if (!recv(fds_[k], got_[k].data(), got_[k].size() * sizeof(float)))
      return false;
  }
  return true;
}

void raw_embed_client::assemble(std::vector<float>& out) const {
  const auto dim = static_cast<size_t>(dim_);
  const auto shards = static_cast<int64_t>(fds_.size());
  out.resize(unique_idx_.size() * dim);
  for (size_t i = 0; i < unique_idx_.size(); ++i) {
    auto j = unique_idx_[i];
    const auto& rows = got_[static_cast<size_t>(unique_[j] % shards)];
    std::memcpy(out.data() + i * dim, rows.data() + place_[j] * dim, dim * sizeof(float));
  }
}

void raw_embed_client::assemble_unique(float* out) const {
  const auto dim = static_cast<size_t>(dim_);
  const auto shards = static_cast<int64_t>(fds_.size());
  for (size_t j = 0; j < unique_.size(); ++j)
    std::memcpy(out + j * dim, got_[static_cast<size_t>(unique_[j] % shards)].data() + place_[j] * dim,
                dim * sizeof(float));
}

void raw_embed_client::set_gradients(const float* by_unique) {
  const auto dim = static_cast<size_t>(dim_);
  const auto shards = static_cast<int64_t>(fds_.size());
  for (size_t j = 0; j < unique_.size(); ++j)
    std::memcpy(got_[static_cast<size_t>(unique_[j] % shards)].data() + place_[j] * dim,
                by_unique + j * dim, dim * sizeof(float));
}

bool raw_embed_client::push(float scale, bool sync, uint64_t step) {
  for (size_t k = 0; k < fds_.size(); ++k) {
    auto& r = req_[k];
    auto ids_bytes = r.size() - sizeof(embed_header);
    auto& g = got_[k];
    if (scale != 1.0f)
      for (auto& x : g)
        x *= scale; // the gradient of these rows: the rows scaled
    embed_header h{static_cast<uint32_t>(sync ? embed_op::push_sync : embed_op::push_async),
                   static_cast<uint32_t>(ids_bytes / sizeof(int64_t)), step};
    std::memcpy(r.data(), &h, sizeof(h));
    iovec iov[2] = {{r.data(), r.size()}, {g.data(), g.size() * sizeof(float)}};
    if (!sock::send_iov_all(fds_[k], iov, 2))
      return false;
    bytes += r.size() + g.size() * sizeof(float);
  }
  for (int fd : fds_) {
    embed_header ack;
    if (!recv(fd, &ack, sizeof(ack)) || ack.step != step)
      return false;
  }
  return true;
}

bool raw_embed_client::send(int fd, const void* p, size_t n) {
  bytes += n;
  return sock::send_all(fd, p, n);
}

bool raw_embed_client::recv(int fd, void* p, size_t n) {
  bytes += n;
  return sock::recv_all(fd, p, n);
}

raw_embed_client::~raw_embed_client() {
  for (int fd : fds_)
    close(fd);
}

// -- the shard server ---------------------------------------------------------------------

namespace {

/// One worker's connection to a shard: its run (hello's), and its push of
/// this step while the sync barrier waits for the others'.
struct shard_conn {
  int fd = -1;
  bool member = false;   ///< said hello: a worker of run `run`
  bool waiting = false;  ///< said hello, not answered yet (the start barrier)
  uint64_t run = 0;
  uint32_t group = 0;    ///< the workers of its run
  bool pending = false;  ///< a sync push of step `step` waits for the others'
  uint64_t step = 0;
  std::vector<int64_t> ids;
  std::vector<float> grads;
};

/// A shard's rows on 2 MiB pages where the kernel allows it (madvise before
/// the first touch), as actorflow's big tensors are (core/tensor.cpp): the
/// page size is the machine's choice, not the runtime's, so both sides of a
/// sparse line get the same one. (Row prefetching stays ours alone: that is code.)
struct page_advised_rows {
  std::unique_ptr<float, void (*)(void*)> rows{nullptr, &std::free};

  void allocate(size_t floats) {
    constexpr size_t huge = size_t{2} << 20;
    const size_t bytes = (floats * sizeof(float) + huge - 1) & ~(huge - 1);
    rows.reset(static_cast<float*>(std::aligned_alloc(huge, bytes)));
    if (!rows)
      throw std::bad_alloc{};
    madvise(rows.get(), bytes, MADV_HUGEPAGE); // a hint: without it, 4 KiB pages
  }
  float* data() const { return rows.get(); }
};

/// One shard of a table and the connections it serves.
struct shard_server {
  int64_t rows = 0, dim = 0;
  float lr = 0;
  page_advised_rows table;
  std::vector<shard_conn> conns;
  std::vector<float> out;

  bool check(const std::vector<int64_t>& ids) const {
    for (auto r : ids)
      if (r < 0 || r >= rows) {
        std::fprintf(stderr, "embed-shard: row %lld is not in [0, %lld)\n",
                     static_cast<long long>(r), static_cast<long long>(rows));
        return false;
      }
    return true;
  }

  void apply(const shard_conn& c, float scale) {
    const auto d = static_cast<size_t>(dim);
    for (size_t i = 0; i < c.ids.size(); ++i) {
      float* row = table.data() + static_cast<size_t>(c.ids[i]) * d;
      const float* g = c.grads.data() + i * d;
      for (size_t j = 0; j < d; ++j)
        row[j] -= scale * g[j];
    }
  }

  /// The barriers of run `run`: once its whole group said hello, each gets
  /// its answer (the workers start together); once every worker of it still
  /// connected pushed its step (sync), the mean of the pushes is applied and
  /// each is answered. Runs are told apart so that one run's closing
  /// connections and the next one's hellos, seen in one poll, do not mix.
  bool release(uint64_t run) {
    size_t members = 0, waiting = 0, pending = 0;
    uint32_t group = 0;
    for (auto& c : conns)
      if (c.member && c.run == run) {
        ++members;
        waiting += c.waiting ? 1 : 0;
        pending += c.pending ? 1 : 0;
        group = c.group;
      }
    if (waiting > 0 && members >= group)
      for (auto& c : conns)
        if (c.member && c.run == run && c.waiting) {
          c.waiting = false;
          embed_header ack{static_cast<uint32_t>(embed_op::hello), group, run};
          if (!sock::send_all(c.fd, &ack, sizeof(ack)))
            return false;
        }
    if (pending == 0 || pending < members)
      return true;
    for (auto& c : conns)
      if (c.member && c.run == run && c.pending)
        apply(c, lr / static_cast<float>(pending));
    for (auto& c : conns)
      if (c.member && c.run == run && c.pending) {
        c.pending = false;
        embed_header ack{static_cast<uint32_t>(embed_op::push_sync), 0, c.step};
        if (!sock::send_all(c.fd, &ack, sizeof(ack)))
          return false;
      }
    return true;
  }

  /// Serves one message of `c`; false when the connection is done.
  bool serve(shard_conn& c) {
    embed_header h;
    if (!sock::recv_all(c.fd, &h, sizeof(h)))
      return false;
    auto op = static_cast<embed_op>(h.op);
    if (op == embed_op::hello) {
      c.member = c.waiting = true;
      c.run = h.step;
      c.group = h.n;
      return release(c.run);
    }
    c.ids.resize(h.n);
    if (!sock::recv_all(c.fd, c.ids.data(), h.n * sizeof(int64_t)) || !check(c.ids))
      return false;
    const auto d = static_cast<size_t>(dim);
    if (op == embed_op::gather) {
      out.resize(h.n * d);
      for (size_t i = 0; i < h.n; ++i)
        std::memcpy(out.data() + i * d, table.data() + static_cast<size_t>(c.ids[i]) * d,
                    d * sizeof(float));
      return sock::send_all(c.fd, out.data(), out.size() * sizeof(float));
    }
    c.grads.resize(h.n * d);
    if (!sock::recv_all(c.fd, c.grads.data(), c.grads.size() * sizeof(float)))
      return false;
    if (op == embed_op::push_async) {
      apply(c, lr);
      return sock::send_all(c.fd, &h, sizeof(h));
    }
    c.pending = true;
    c.step = h.step;
    return release(c.run);
  }

  /// Closes connection `i`; the rest of its run need not wait for it.
  bool drop(size_t i) {
    auto run = conns[i].run;
    bool member = conns[i].member;
    close(conns[i].fd);
    conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
    return !member || release(run);
  }
};

} // namespace

int embed_shard_main(const helper_args& a) {
  int lfd = static_cast<int>(a.num("listen-fd"));
  const auto shard = static_cast<int64_t>(a.num("shard"));
  const auto shards = static_cast<int64_t>(a.num("shards"));
  const auto total = static_cast<int64_t>(a.num("rows"));
  shard_server s;
  s.dim = static_cast<int64_t>(a.num("dim"));
  s.lr = static_cast<float>(a.kv.count("lr") ? a.real("lr") : 0.1);
  // scale=: the training line's rows, small as a model's (2^-20: still exact)
  const float scale = static_cast<float>(a.kv.count("scale") ? a.real("scale") : 1.0);
  s.rows = total / shards + (shard < total % shards ? 1 : 0);
  s.table.allocate(static_cast<size_t>(s.rows * s.dim));
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.dim; ++c)
      s.table.data()[static_cast<size_t>(r * s.dim + c)] = scale * embed_value(r * shards + shard, c, s.dim);
  std::printf("embed-shard %lld: %lld rows of %lld\n", static_cast<long long>(shard),
              static_cast<long long>(s.rows), static_cast<long long>(s.dim));
  std::fflush(stdout);
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign(1, pollfd{lfd, POLLIN, 0});
    for (auto& c : s.conns)
      fds.push_back({c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR)
        continue;
      return 1;
    }
    if (fds[0].revents & POLLIN) {
      int fd = accept(lfd, nullptr, nullptr);
      if (fd >= 0) {
        sock::set_nodelay(fd);
        s.conns.emplace_back();
        s.conns.back().fd = fd;
      }
    }
    // back to front: drop() erases, and fds[i + 1] is conns[i]
    for (size_t i = fds.size() - 1; i >= 1; --i) {
      if (fds[i].revents == 0)
        continue;
      if (!s.serve(s.conns[i - 1]) && !s.drop(i - 1))
        return 1;
    }
  }
}

// -- the worker ---------------------------------------------------------------------------

int embed_worker_main(const helper_args& a) {
  std::vector<uint16_t> ports;
  std::istringstream in{a.str("ports")};
  for (std::string p; std::getline(in, p, ',');)
    ports.push_back(static_cast<uint16_t>(std::stoul(p)));
  const auto rows = static_cast<int64_t>(a.num("rows"));
  const bool sync = a.str("mode") == "sync";
  const bool uniform = a.str("ids") == "uniform";
  const double warmup_s = a.real("warmup"), window_s = a.real("window");
  raw_embed_client c;
  if (!c.connect(ports, rows, static_cast<int64_t>(a.num("dim")), 2, a.num("run"))) {
    std::fprintf(stderr, "embed-worker: cannot reach the shards\n");
    return 1;
  }
  std::mt19937_64 rng{a.num("seed") * 1000 + a.num("rank")};
  std::vector<int64_t> ids(a.num("batch"));
  // ids=clicks: the sparse job's batches (embed_raw_model.hpp); model=fm
  // (its batches too) its model step, else the rows scaled are the gradient.
  std::optional<raw_fm_trainer> fm;
  std::optional<click_batches> clicks;
  const bool want_fm = a.kv.count("model") && a.str("model") == "fm";
  if (want_fm || a.str("ids") == "clicks") {
    click_batches::spec s;
    s.users = rows;
    s.width = static_cast<int64_t>(a.num("dim"));
    s.examples = a.num("examples");
    s.seed = a.num("seed");
    s.batch = ids.size();
    s.rank = static_cast<uint32_t>(a.num("rank"));
    s.workers = 2;
    if (want_fm) {
      raw_fm_trainer::spec f;
      f.data = s;
      if (!(fm = raw_fm_trainer::make(f)))
        return 1;
    } else if (!(clicks = click_batches::make(s))) {
      return 1;
    }
  }
  uint64_t step = 0, steps0 = 0, bytes0 = 0, unique_sum = 0;
  using secs = std::chrono::duration<double>;
  clock_type::time_point first{}, t0{};
  for (;; ++step) {
    if (fm)
      ids = fm->batch_ids(step);
    else if (clicks)
      ids = clicks->users(step);
    else if (uniform)
      uniform_ids(rng, rows, ids);
    else
      skewed_ids(rng, rows, ids);
    c.route(ids);
    unique_sum += c.unique_count();
    bool ok = c.gather(step);
    if (ok && fm) {
      c.assemble_unique(fm->rows_for(c.unique_count()));
      const float* grads = fm->step(c.example_rows());
      ok = grads != nullptr;
      if (ok)
        c.set_gradients(grads);
    }
    if (!ok || !c.push(fm ? 1.0f : 0.01f, sync, step)) {
      std::fprintf(stderr, "embed-worker: step %llu failed\n", static_cast<unsigned long long>(step));
      return 1;
    }
    auto now = clock_type::now();
    if (step == 0)
      first = now;
    else if (t0 == clock_type::time_point{} && secs(now - first).count() >= warmup_s)
      t0 = now, steps0 = step + 1, bytes0 = c.bytes;
    else if (t0 != clock_type::time_point{} && secs(now - t0).count() >= window_s) {
      std::printf("window_steps %llu\nwindow_seconds %.6f\nwindow_bytes %llu\nunique_mean %.2f\n",
                  static_cast<unsigned long long>(step + 1 - steps0), secs(now - t0).count(),
                  static_cast<unsigned long long>(c.bytes - bytes0),
                  static_cast<double>(unique_sum) / static_cast<double>(step + 1));
      if (fm)
        std::printf("loss %.6f\n", fm->last_loss);
      return 0;
    }
  }
}

} // namespace af::bench
