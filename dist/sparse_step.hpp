#pragma once
/// One training step of a sparse model (train/sparse_model.hpp) on a
/// worker, against tables cut into shards over the ps tasks (issue 25): the
/// batch's ids deduplicated per table, routed to their shards
/// (kernels/shard_routing.hpp), each shard's rows gathered (the ps answer in
/// parallel), the model's forward and backward on those rows, and each ps
/// pushed its shards' row gradients (the shards' own row ids) and its dense
/// parameters' gradients in one sparse push (messages/aggregator.hpp). No
/// table ever travels whole. One thread does it all: each phase sends every
/// ps its requests, then reads their answers. The job (actorflow-train)
/// wires it; this file does one step.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "caf/expected.hpp"

#include "kernels/id_dedup.hpp"
#include "kernels/shard_routing.hpp"
#include "messages/aggregator.hpp"
#include "net/data_plane.hpp"
#include "train/sparse_model.hpp"

namespace af {

/// How a worker reaches one ps for a sparse step. Requests go out with
/// start_*() and their answers come from finish(), in the order the
/// requests went out, so that one thread has a request out to every ps at
/// once (as a hand-written client would: no thread per ps, no hand-off).
/// A link is used by one thread at a time.
class sparse_ps_link {
public:
  /// A request's answer: the rows (gather_rows) or value (read), the
  /// version (a push: the global step after it) and whether a sync push
  /// was dropped as late.
  struct answer {
    tensor value;
    uint64_t version = 0;
    bool dropped_late = false;
  };
  virtual ~sparse_ps_link() = default;
  /// The rows `ids` (int64 [n]) name of the shard variable `var`: [n, width].
  virtual caf::error start_gather_rows(const std::string& var, const tensor& ids) = 0;
  /// The value of the dense variable `var`.
  virtual caf::error start_read(const std::string& var) = 0;
  /// This step's sparse push to the ps's aggregator, as the worker of step `step`.
  virtual caf::error start_push(uint64_t step, const sparse_push_values& values) = 0;
  /// The answer to the oldest request started and not yet finished.
  virtual caf::expected<answer> finish() = 0;
  /// Waits, at most until `until`, until finish() would not wait for the
  /// ps (the oldest request's answer, or the connection's end, is in):
  /// true if so. A link that cannot tell says true at once.
  virtual bool await_answer(std::chrono::steady_clock::time_point) { return true; }
  /// Sends what start_*() may have held back to send together (a link that
  /// batches a phase's reads: data_plane_ps_link); finish() does it too.
  /// A phase calls it on every link before it reads any answer, so that the
  /// ps work at once. A failure comes from finish(), as any request's.
  virtual void flush() {}
  /// Bytes this link sent and received so far (0 if it does not count).
  virtual std::pair<uint64_t, uint64_t> bytes() const { return {0, 0}; }

  /// One request and its answer.
  caf::expected<tensor> gather_rows(const std::string& var, const tensor& ids);
  caf::expected<tensor> read(const std::string& var);
  /// The global step after the push, and whether it was dropped as late.
  caf::expected<std::pair<uint64_t, bool>> push(uint64_t step, const sparse_push_values& values);
};

/// A link over the ps's data plane (one data_channel): gather_rows, read
/// and push_sparse frames, pipelined (data_channel::send_*, next_reply).
/// The push numbers count from `last_seq` (the join's answer) on.
class data_plane_ps_link : public sparse_ps_link {
public:
  data_plane_ps_link(std::unique_ptr<data_channel> channel, std::string aggregator,
                     uint32_t worker, std::string token, uint64_t last_seq,
                     std::chrono::milliseconds wait)
    : channel_(std::move(channel)), aggregator_(std::move(aggregator)), worker_(worker),
      token_(std::move(token)), seq_(last_seq), wait_(wait) {}

  /// A gather or read is held back until flush() (or the next push, or
  /// finish()) sends every one held as one gather_many (docs/wire.md), or
  /// alone as gather_rows or read: a phase then costs one request and one
  /// answer per ps, not one per variable.
  caf::error start_gather_rows(const std::string& var, const tensor& ids) override;
  caf::error start_read(const std::string& var) override;
  caf::error start_push(uint64_t step, const sparse_push_values& values) override;
  caf::expected<answer> finish() override;
  bool await_answer(std::chrono::steady_clock::time_point until) override;
  void flush() override;
  /// The frames' bytes (header, name, payload) of every call so far, both ways.
  std::pair<uint64_t, uint64_t> bytes() const override { return {sent_, received_}; }

  /// `channel` in place of the old connection (the ps came back, or its
  /// connection broke: dist/sparse_recovery.hpp). With a `token`, the ps's
  /// aggregator is a new one that this worker joined: its pushes count
  /// from `last_seq` on. Without, it is the same aggregator, and a push
  /// that got no answer is sent again under its own number, so that an
  /// aggregator that took it answers without applying it twice.
  void reconnect(std::unique_ptr<data_channel> channel, std::string token = {},
                 uint64_t last_seq = 0);
  /// The token its aggregator answered a join again with (the same
  /// aggregator, which had taken this worker as left: the numbers go on).
  void set_token(std::string token) { token_ = std::move(token); }
  /// Its connection failed (I/O, or no answer in time): an error the ps
  /// answered leaves it whole.
  bool broken() const { return !channel_ || channel_->broken(); }

private:
  /// A read's (gather_rows, read) timeout `err`, named with the read's own
  /// wait (step_timeout_ms) and what to do.
  caf::error read_timed_out(const caf::error& err) const;
  /// Sends `asks` (at most wire::max_gather_parts) as one frame and notes
  /// it in batches_.
  void send_batch(const std::vector<data_channel::gather_ask>& asks);

  /// A request started and not finished: a push, or a read (gather_rows
  /// or read) held in asks_ or sent.
  enum class kind : uint8_t { push, part };
  uint64_t sent_ = 0, received_ = 0;
  bool unanswered_ = false; ///< the last push got no answer (its number is seq_)
  bool resend_ = false;     ///< the next push goes under seq_ again
  std::deque<kind> kinds_;  ///< per request started, in order
  std::vector<data_channel::gather_ask> asks_; ///< reads held back for flush()
  /// A frame of reads flush() sent, or failed to send (`unsent`: each of
  /// its reads answers with it, in its turn).
  struct batch {
    size_t reads = 0;
    caf::error unsent;
  };
  std::deque<batch> batches_; ///< per frame of reads flushed, in order
  /// Answers of reads whose frame has been read (or failed) and that no
  /// finish() has given yet, in order.
  std::deque<caf::expected<answer>> ready_;
  std::unique_ptr<data_channel> channel_;
  std::string aggregator_;
  uint32_t worker_;
  std::string token_;
  uint64_t seq_;
  std::chrono::milliseconds wait_;
};

/// Where a sparse model's parameters live.
struct sparse_layout {
  struct table {
    kernels::shard_router router;       ///< the table's cut (its total rows: the table's)
    std::vector<std::string> shard_vars; ///< per shard: its variable, "<name>/part_<k>"
    std::vector<size_t> shard_ps;        ///< per shard: its ps (an index into the links)
  };
  std::vector<table> tables;             ///< the model's tables(), in order
  std::vector<std::string> dense_vars;   ///< the model's dense_parameters(), in order
  std::vector<size_t> dense_ps;          ///< per dense parameter: its ps
  /// One variable of a ps's aggregator: a shard of a table, or a dense parameter.
  struct slot {
    bool table = false;
    size_t index = 0; ///< the table, or the dense parameter
    size_t shard = 0; ///< a table's: its shard
  };
  /// Per ps: its aggregator's variables in its spec's order (the order of a
  /// sparse push's dense values and tables).
  std::vector<std::vector<slot>> ps_order;
};

/// One shard's part of a step: the rows of its own it must send (the
/// shard's row ids, each once) and where each goes among the table's
/// unique ids.
struct shard_part {
  std::vector<int64_t> rows;
  std::vector<int32_t> places;
};

/// A batch's rows as read from the shards (run_sparse_step's first half).
struct sparse_fetch {
  std::vector<std::vector<int32_t>> index; ///< per table, per example: its row in `rows`
  std::vector<int64_t> unique;             ///< per table: its distinct ids
  std::vector<std::vector<shard_part>> parts; ///< per table, per shard
  std::vector<tensor> rows;                ///< per table: [unique, width], first-seen order
  std::vector<tensor> dense;               ///< the dense parameters' values
  kernels::id_dedup seen;                  ///< the dedup's buffers, kept for the next batch
};

/// Deduplicates and routes `batch`'s ids (every id checked before any
/// request: one outside its table is invalid_argument naming it, its
/// position and the table) and reads their rows and the dense parameters
/// from every ps at once: every request out, then every answer read.
caf::expected<sparse_fetch> fetch_sparse_rows(const std::vector<train::table_spec>& specs,
                                              const sparse_layout& layout,
                                              const std::vector<sparse_ps_link*>& links,
                                              const train::sparse_batch& batch);

/// The same into `f`, whose buffers (of a previous batch) are reused: a
/// worker's steps allocate no index, part or dedup buffer once warm.
caf::error fetch_sparse_rows(const std::vector<train::table_spec>& specs,
                             const sparse_layout& layout, const std::vector<sparse_ps_link*>& links,
                             const train::sparse_batch& batch, sparse_fetch& f);

/// The model's predictions for `batch` with the tables as the ps hold them
/// now (forward only: nothing is pushed).
caf::expected<std::vector<float>> predict_sparse_remote(train::sparse_model& model,
                                                        const sparse_layout& layout,
                                                        const std::vector<sparse_ps_link*>& links,
                                                        const train::sparse_batch& batch);

/// What one sparse step did.
struct sparse_step_report {
  train::sparse_step_result result;   ///< the model's (loss, predictions, gradients)
  std::vector<int64_t> unique;        ///< per table: the distinct ids the step touched
  std::vector<uint64_t> global_steps; ///< per ps: its global step after the push
  std::vector<bool> dropped_late;     ///< per ps: its push was dropped as late (sync)
};

/// One step of `model` on `batch` at step `step` over `links` (one per ps,
/// as `layout` numbers them). An id outside its table is invalid_argument
/// naming it, its position and the table, before any request goes out; a
/// ps's error is returned naming the ps (the first one, by ps index).
caf::expected<sparse_step_report> run_sparse_step(train::sparse_model& model,
                                                  const sparse_layout& layout,
                                                  const std::vector<sparse_ps_link*>& links,
                                                  const train::sparse_batch& batch,
                                                  uint64_t step);

/// The same with `scratch` for the fetch's buffers, kept by a worker's step
/// loop from one step to the next (fetch_sparse_rows). With `ps_steps` (one
/// per ps), ps p's push carries ps_steps[p] instead of `step`: after a live
/// switch the ps tasks' steps may differ for good (async counts pushes,
/// sync rounds), and the least of them would be late on the others.
caf::expected<sparse_step_report> run_sparse_step(train::sparse_model& model,
                                                  const sparse_layout& layout,
                                                  const std::vector<sparse_ps_link*>& links,
                                                  const train::sparse_batch& batch, uint64_t step,
                                                  sparse_fetch& scratch,
                                                  const std::vector<uint64_t>* ps_steps = nullptr);

/// Calls `take(p)` once for each link `p` with `want[p]`, whichever has its
/// answer in first (sparse_ps_link::await_answer): the first still out is
/// waited on 20 ms at a time, and after each such wait the others are
/// looked at. Answers that are in together go in order; a lone link is
/// finished without a wait. A step's pushes are read so: a ps that died
/// (its connection's end is in) goes through its recovery at once, while
/// another ps's sync round may wait for a worker that waits for that very
/// recovery.
void finish_as_answered(const std::vector<sparse_ps_link*>& links, const std::vector<uint8_t>& want,
                        const std::function<void(size_t)>& take);

} // namespace af
