#pragma once
/// A sparse job's worker through the death of a ps (docs/sparse.md "A ps
/// that dies"): its links to that ps wait for it to come back through the
/// dense job's ps recovery (dist/ps_recovery.hpp: bounded by
/// ps_recovery_timeout_ms; the chief re-creates the ps's variables and
/// aggregator and restores its shards from the latest checkpoint, the
/// others wait for its word), join its new aggregator once for the worker,
/// open their connections again and repeat the request that failed. The
/// other ps are not touched. A ps stopped long enough for its CAF links to
/// break (SIGSTOP past the nodes' connection_timeout_ms) comes back as the
/// same process, but its aggregator took this worker as left and refuses
/// its pushes (af_error::left): the worker joins it again, and again if a
/// late down of the old link makes it leave once more. Internal to dist/.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "caf/expected.hpp"

#include "dist/sparse_step.hpp"
#include "dist/worker.hpp"

namespace af {

/// The ps of one sparse worker as they run now, shared by its links: which
/// process and aggregator each ps is, and how often it was recovered.
class sparse_recovery {
public:
  /// recover_ps_of's function (dist/ps_recovery.hpp).
  using recover_fn =
    std::function<caf::expected<recovered_shard>(size_t, uint64_t, const std::string&, bool)>;
  /// Joins ps `k`'s aggregator `agg` (a new one) as this worker: its token
  /// and the number of the last push it took from it.
  using join_fn =
    std::function<caf::expected<std::pair<std::string, uint64_t>>(size_t k, const aggregator_actor&)>;
  /// Opens a data-plane connection to `shard`'s node.
  using connect_fn =
    std::function<caf::expected<std::unique_ptr<data_channel>>(const param_shard& shard)>;
  /// Looks up ps `k`'s aggregator anew (the handle of a link that broke
  /// reaches nothing), creating none.
  using find_fn = std::function<caf::expected<aggregator_actor>(size_t k)>;

  /// `shards`: each ps as this worker joined it. Without `find`, a worker
  /// refused as left is not joined again (rejoin fails).
  sparse_recovery(recover_fn recover, join_fn join, connect_fn connect,
                  std::vector<param_shard> shards, find_fn find = {});

  /// Ps `k` as it runs now, and the membership this worker holds there.
  struct endpoint {
    param_shard shard;
    std::string token;         ///< empty: the aggregator this worker joined first
    uint64_t last_seq = 0;
    uint64_t generation = 0;   ///< 0 as joined; each recovery or join again adds one
    uint64_t restored_step = 0; ///< the step it was restored at (the last recovery)
    uint64_t moves = 0;   ///< new aggregators joined (new processes): the numbers start over
    uint64_t rejoins = 0; ///< the same aggregator joined again: a new token, the numbers go on
  };

  /// Ps `k` failed a request of a link that knew it at `seen` (`why`): the
  /// first link to ask waits for it (recover_fn) and, if it is a new
  /// process, joins its new aggregator; a link that asks after that gets
  /// the ps as it runs now at once. An error: it did not come back in time,
  /// or the chief is gone (the worker fails with it, and every later call
  /// at once).
  caf::expected<endpoint> recover(size_t k, uint64_t seen, const caf::error& why);
  /// recover() with `why` said in words (another worker's recovery of the
  /// same ps that drives this one: an in-graph client's replicas).
  caf::expected<endpoint> recover(size_t k, uint64_t seen, const std::string& why);

  /// Ps `k`'s aggregator refused a push of a link that knew it at `seen`
  /// as from a worker that left (`why`: af_error::left, its link broke):
  /// the first link to ask joins it again, looked up anew (a new token; the
  /// push numbers go on, so a push it took is not applied twice); a link
  /// that asks after that gets the ps as it runs now at once.
  caf::expected<endpoint> rejoin(size_t k, uint64_t seen, const caf::error& why);

  /// Ps `k` as it runs now.
  endpoint current(size_t k);
  /// Why the first recovery that failed did (none if none did): what ends
  /// the worker, whatever else its step saw meanwhile (a sync round on
  /// another ps that expired waiting for a worker held by the same ps).
  caf::error failure();
  /// Its generation (changes with every recovery), without a lock.
  uint64_t generation(size_t k) const { return gens_[k]->load(std::memory_order_acquire); }

  /// A connection to ps `k` as it runs now.
  caf::expected<std::unique_ptr<data_channel>> connect(const param_shard& shard) {
    return connect_(shard);
  }

  /// The global step the worker is at: the step a recovery pushes to.
  std::atomic<uint64_t> step{0};
  /// How long a push refused as left is joined again and sent again (from
  /// the first refusal; the job's ps_recovery_timeout_ms): a join that is
  /// itself taken as left (a late down of the old link) is followed by
  /// another, until then.
  std::chrono::milliseconds rejoin_window{30000};
  /// Joins again after a refusal as left (rejoin).
  std::atomic<uint64_t> rejoined{0};
  /// ps processes this worker waited for and went on with.
  std::atomic<uint64_t> recoveries{0};

private:
  recover_fn recover_;
  join_fn join_;
  connect_fn connect_;
  find_fn find_;
  std::vector<std::unique_ptr<std::mutex>> mtx_;
  std::vector<std::unique_ptr<std::atomic<uint64_t>>> gens_;
  std::vector<endpoint> now_; ///< under mtx_[k]
  std::mutex failure_mtx_;
  caf::error failure_;
};

/// A link to ps `k` over `inner` that lives through the ps's death: when
/// an answer fails because the ps is gone (its connection broke: peer_down,
/// unreachable; or it did not answer in time: timeout, a stopped ps), the
/// ps goes through `r`, and every request still out on the link is sent
/// again, in order, on a new connection; three times at most. A push sent
/// again to the same aggregator keeps its number; to a new one it goes at
/// the least of its step and the restored step (a later one would be ahead
/// of it).
class recovering_ps_link : public sparse_ps_link {
public:
  /// `inner` (the worker's own, which counts the bytes) must outlive it.
  recovering_ps_link(data_plane_ps_link& inner, size_t k, sparse_recovery& r)
    : inner_(&inner), k_(k), r_(r) {}

  caf::error start_gather_rows(const std::string& var, const tensor& ids) override;
  caf::error start_read(const std::string& var) override;
  caf::error start_push(uint64_t step, const sparse_push_values& values) override;
  caf::expected<answer> finish() override;
  bool await_answer(std::chrono::steady_clock::time_point until) override {
    return out_.empty() || out_.front().unsent || inner_->await_answer(until);
  }
  void flush() override { inner_->flush(); }
  std::pair<uint64_t, uint64_t> bytes() const override { return inner_->bytes(); }

private:
  /// A request out, kept until answered (its tensors share their buffers).
  struct request {
    enum { gather, read, push } kind = gather;
    std::string var;
    tensor ids;
    uint64_t step = 0;
    sparse_push_values values;
    caf::error unsent; ///< why it did not go out (none: it did)
  };
  /// Sends `r` on the inner link now; a failure that may be the ps's death
  /// is kept in r.unsent (the answer recovers), any other is returned.
  caf::error send(request& r);
  caf::error start(request r);
  /// A new connection to the ps as it runs now (its generation moved).
  caf::error catch_up();
  /// The front push was refused as from a worker that left (`why`): joins
  /// again (sparse_recovery::rejoin) and sends every request out again on
  /// a new connection, until rejoin_window after the first such refusal.
  caf::error rejoin(caf::error why);

  data_plane_ps_link* inner_;
  size_t k_;
  sparse_recovery& r_;
  std::deque<request> out_;
  uint64_t generation_ = 0;
  uint64_t moves_ = 0;       ///< endpoint::moves caught up with (its numbers are that aggregator's)
  uint64_t rejoins_ = 0;     ///< endpoint::rejoins caught up with (its token is that join's)
  uint64_t restored_ = 0;    ///< the step of the last recovery it caught up with
  bool moved_ = false;       ///< its aggregator is a new one since the last push
  /// Joins again since the last push answered, and until when they go on.
  uint64_t refused_left_ = 0;
  std::chrono::steady_clock::time_point rejoin_deadline_;
};

/// True for an error that says the ps may be gone (a recovery decides):
/// its connection closed or could not be opened, or (`broken`: the
/// connection failed, not an answer of the ps such as an aggregator's
/// step timeout) it did not answer in time.
bool ps_may_be_gone(const caf::error& err, bool broken);

} // namespace af
