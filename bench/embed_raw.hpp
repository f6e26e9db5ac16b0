#pragma once
// The raw-TCP baselines of the sparse lines (embed_benches.hpp): a
// hand-written shard server holding one shard of an embedding table (mod
// strategy), and the client that does by hand what actorflow's partitioned
// lookup does in its graph: deduplicate the batch's ids, route each to its
// shard, send every shard its ids at once, receive the rows, assemble them in
// the batch's order; and for training, push each shard its rows' gradients.
//
// Wire format, per message: an embed_header, then its body:
//   gather      n row numbers (int64, in the shard)   -> n rows of dim float32
//   push_async  n row numbers, n rows of gradients    -> an embed_header (the ack),
//                                                        after the update
//   push_sync   the same, answered once every worker of the group pushed this
//               step and their mean was applied
//   hello       none; n = the workers of the run, step = the run's number -> an
//               embed_header once all n said hello (they start together; the
//               run's open connections that said hello are push_sync's barrier)
#include <unistd.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/raw_helpers.hpp"

namespace af::bench {

enum class embed_op : uint32_t { gather = 1, push_async = 2, push_sync = 3, hello = 4 };

struct embed_header {
  uint32_t op = 0;
  uint32_t n = 0;
  uint64_t step = 0;
};

/// The value of element `col` of row `id` of the raw shards' tables: exact
/// in float32, so that the raw lookup's rows are checked bit for bit.
inline float embed_value(int64_t id, int64_t col, int64_t dim) {
  return static_cast<float>((id * dim + col) % 65521);
}

/// `batch` ids in [0, rows), skewed towards small ids (id = rows * u^3: a
/// tenth of them among the first thousandth of the table), so that a batch
/// repeats some: what a Zipf-like feature gives.
inline void skewed_ids(std::mt19937_64& rng, int64_t rows, std::vector<int64_t>& out) {
  std::uniform_real_distribution<double> u{0, 1};
  for (auto& id : out) {
    double x = u(rng);
    id = std::min<int64_t>(rows - 1, static_cast<int64_t>(static_cast<double>(rows) * x * x * x));
  }
}

/// `batch` ids drawn uniformly from [0, rows): the training line's ids, the
/// same distribution as the sparse job's at zipf = 0, so that both sides of
/// train_embed_10m_2w touch as many distinct rows a step (almost all 512).
inline void uniform_ids(std::mt19937_64& rng, int64_t rows, std::vector<int64_t>& out) {
  std::uniform_int_distribution<int64_t> u{0, rows - 1};
  for (auto& id : out)
    id = u(rng);
}

/// One client's connections to the shards and its buffers (allocated once,
/// reused every lookup). Blocking sockets, TCP_NODELAY; every byte it moves is
/// counted in `bytes` (what its read and write calls returned).
class raw_embed_client {
public:
  /// Connects to the shard servers on `ports` (shard i on ports[i]) of a
  /// table of `rows` x `dim`; with `group` > 0 says hello as a worker of run
  /// `run` (of `group` workers) and waits until all of them did. False if a
  /// connection failed.
  bool connect(const std::vector<uint16_t>& ports, int64_t rows, int64_t dim, uint32_t group = 0,
               uint64_t run = 0);

  /// Deduplicates `ids` and routes the distinct ones to their shards.
  void route(const std::vector<int64_t>& ids);
  /// Sends every shard its ids at once, then receives each shard's rows.
  bool gather(uint64_t step);
  /// The looked-up rows in the batch's order into `out` ([ids, dim]).
  void assemble(std::vector<float>& out) const;
  /// The distinct ids' rows, one each in the order example_rows() refers
  /// to (after gather()), into `out` ([unique_count(), dim]).
  void assemble_unique(float* out) const;
  /// Example i's row among assemble_unique()'s: ids[i] of route()'s batch.
  const std::vector<uint32_t>& example_rows() const { return unique_idx_; }
  /// The gradients push() sends: one row per distinct id, in
  /// assemble_unique()'s order, instead of the rows scaled.
  void set_gradients(const float* by_unique);
  /// Pushes each shard `scale` times what its part holds as the rows'
  /// gradients (the rows gather() got: a trivial model; or set_gradients()'s,
  /// scale 1) and waits for every shard's ack.
  bool push(float scale, bool sync, uint64_t step);

  /// The distinct ids of the last route().
  size_t unique_count() const { return unique_.size(); }
  uint64_t bytes = 0;

  ~raw_embed_client();

private:
  bool send(int fd, const void* p, size_t n);
  bool recv(int fd, void* p, size_t n);

  std::vector<int> fds_;
  int64_t rows_ = 0, dim_ = 0;
  std::vector<int64_t> unique_;         ///< distinct ids, sorted
  std::vector<uint32_t> unique_idx_;    ///< ids[i] == unique_[unique_idx_[i]]
  std::vector<uint32_t> place_;         ///< unique j is row place_[j] of its shard's answer
  std::vector<std::vector<char>> req_;  ///< per shard: header + rows (+ gradients)
  std::vector<std::vector<float>> got_; ///< per shard: its rows' values
};

/// The helpers of the sparse lines (this binary re-executed with
/// helper_flag): `embed-shard` (listen-fd= shard= shards= rows= dim= lr=
/// [scale=: of embed_value]) serves until killed; `embed-worker` (rank= run=
/// ports=a,b,c rows= dim= batch= seed= mode=sync|async
/// ids=skewed|uniform|clicks warmup= window= [examples=: ids=clicks, the
/// sparse job's batches of seed seed=; model=fm: on them, its model step,
/// embed_raw_model.hpp]) trains and prints window_steps, window_seconds,
/// window_bytes, unique_mean (and with the model its last loss).
int embed_shard_main(const helper_args& a);
int embed_worker_main(const helper_args& a);

} // namespace af::bench
