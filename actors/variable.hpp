#pragma once
/// The variable actor's implementation (interface: messages/variable.hpp) and
/// the one owner of a variable's state, variable_cell.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "caf/actor_addr.hpp"
#include "caf/error.hpp"
#include "caf/expected.hpp"
#include "caf/typed_response_promise.hpp"

#include "actors/parked.hpp"
#include "core/parallel_ranges.hpp"
#include "kernels/sparse.hpp"
#include "messages/variable.hpp"
#include "train/optimizer.hpp"

namespace af {

/// The bytes a value of `spec` takes; invalid_argument naming the variable if
/// a dimension is negative or the element count or byte size overflows. Call
/// it before anything is allocated for `spec`.
caf::expected<size_t> value_bytes(const variable_spec& spec);

/// One variable's state: its value, whether it has one, its version, the run
/// that initialized it, and optimizer slots kept beside the value (Adam's m
/// and v: same dtype and shape). Usable without an actor system.
///
/// Thread safety: every method takes the cell's mutex, so each call is one
/// atomic step on the state. Two kinds of callers share a cell: the variable
/// actor (one at a time, on its own thread) and the node's data-plane
/// connection threads (several at once, net/data_plane.hpp), which apply
/// ops here directly instead of sending the actor a message. Values come back
/// as tensors that share the variable's buffer; the next update writes a copy
/// (copy on write), so a returned value never changes under its holder. An
/// optimizer update (`apply(optimizer, grad)`, next) will be one more method
/// of this shape: value and slots updated under the same lock.
///
/// The cell holds no promises: waking up wait_init waiters is the actor's job
/// (a first value from the data plane is announced to it by released_atom).
class variable_cell {
public:
  explicit variable_cell(variable_spec spec);

  variable_cell(const variable_cell&) = delete;
  variable_cell& operator=(const variable_cell&) = delete;

  /// Fixed at construction; needs no lock.
  const variable_spec& spec() const noexcept { return spec_; }

  /// Elements of a value of spec() (0 if the shape is invalid).
  size_t value_elements() const noexcept {
    auto n = num_elements(spec_.shape);
    return n < 0 ? 0 : static_cast<size_t>(n);
  }

  /// What apply() did.
  struct applied {
    tensor value;             ///< read, or `want_value`: the value after the op; else empty
    uint64_t version = 0;     ///< the version after the op
    bool first_value = false; ///< this call gave the variable its first value (an assign)
    bool replayed = false;    ///< a retry: the first try's result, nothing applied now
  };

  /// One op. read: the value (uninitialized if none). assign: `operand` of
  /// the variable's dtype and shape becomes the value (its buffer is kept: no
  /// copy). assign_add / assign_sub: `operand` of the same shape, or a
  /// scalar, is added / subtracted in place; uninitialized if no value.
  /// Every error names the variable; a failed op changes nothing.
  ///
  /// `request_id` (0: none) makes an update exactly-once: an update whose id
  /// the cell applied before is not applied again but answered with the first
  /// try's result (`replayed` set). See the table below for its bound.
  caf::expected<applied> apply(var_op op, const tensor& operand, bool want_value,
                               uint64_t request_id = 0);

  /// A sparse update of the value's rows (tf.scatter_add / _sub / _update,
  /// kernels/sparse.hpp): duplicate ids accumulate for add and sub, the last
  /// one wins for update. Every id is checked before the first write: an id
  /// out of range is an error naming it and the variable, and the value is
  /// unchanged. Uninitialized if no value; `request_id` as for apply().
  caf::expected<applied> apply_scatter(kernels::scatter_op op, const tensor& indices,
                                       const tensor& updates, bool want_value,
                                       uint64_t request_id = 0);

  // -- the table of applied request ids -------------------------------------
  //
  // A client that saw no answer (a timeout, a broken connection) sends the
  // same update again with the same id. The cell remembers the ids of its
  // last `max_remembered` updates that carried one, with the version each
  // produced and, when the request wanted it, the value after it. An id
  // pushed out of the table (more than max_remembered later updates of this
  // variable came between the try and its retry) is applied again: the
  // guarantee is exactly-once within that window, at-least-once beyond it.
  // Values are kept only while they are small: each at most
  // `max_kept_value_bytes`, all of one variable's together at most
  // `max_kept_bytes` (the oldest lose theirs first). A retry that wanted a
  // value no longer kept gets the current value if nothing changed the
  // variable since, else af_error::aborted saying the update was applied
  // (at version V) and that its value must be read.

  static constexpr size_t max_remembered = 1024;
  static constexpr size_t max_kept_value_bytes = size_t{1} << 20;
  static constexpr size_t max_kept_bytes = size_t{4} << 20;

  /// Ids in the table now (tests).
  size_t remembered() const;

  /// Sets the value from `init` and records `run_id` as the run that
  /// initialized it; clears the slots (an optimizer starts them again, as
  /// TF's initializer resets slot variables). With `only_if_uninitialized`
  /// and a value already set, changes nothing (the run id stays that of the
  /// run that did set it). Returns the version.
  caf::expected<uint64_t> initialize(const initializer& init, bool only_if_uninitialized,
                                     const std::string& run_id);

  /// A snapshot; `waiters` is 0 (the actor, which holds them, fills it in).
  variable_info info() const;

  /// info().initialized, without copying the spec (an update checks it).
  bool initialized() const;

  /// The slot `name`, if an optimizer created it.
  std::optional<tensor> slot(const std::string& name) const;

  /// slot(name) has a value, without copying it.
  bool has_slot(const std::string& name) const;

  /// Creates or replaces the slot `name`; it must have the variable's dtype
  /// and shape.
  caf::error set_slot(const std::string& name, tensor value);

  // -- training (dist/aggregator.hpp): updates where the variable lives -----

  /// One optimizer update of the value with `n` floats of gradient at global
  /// step `step`: value and slots change together under the lock. The slots
  /// of `opt.kind` are created (zeros) on first use. The variable must be a
  /// float32 with a value and `n` its element count, else an error naming it.
  caf::error apply_gradient(const train::optimizer_spec& opt, const float* grad, size_t n,
                            uint64_t step);

  /// One sparse optimizer update (TF's sparse apply ops, after
  /// _deduplicate_indexed_slices; LazyAdamOptimizer for adam): `ids` (int32
  /// or int64, any rank) name rows of the value and `rows` (float32, shape
  /// ids.shape + the value's shape[1:]) are their gradients, as
  /// sparse_gradients() (graph/graph.hpp) gives them. Duplicate ids are
  /// summed first (in ids' order), then each distinct row is updated once by
  /// train::apply_rows, value and slots together under the lock; a row no id
  /// names, and its slots, do not change (lazy momentum and Adam; Adam's bias
  /// correction counts the global step `step`). Every id is checked before
  /// anything is created or written: an id out of range is invalid_argument
  /// naming it and the variable, and value and slots stay as they were.
  caf::error apply_sparse_gradient(const train::optimizer_spec& opt, const tensor& ids,
                                   const tensor& rows, uint64_t step);

  /// The rows `ids` (int32 or int64 [n]) name of a table's value: a fresh
  /// tensor [n] + the value's shape[1:], and the version it was read at
  /// (TF's embedding_lookup on the variable's own device: only the touched
  /// rows leave it). Every id is checked before anything is read: an id out
  /// of [0, rows) is invalid_argument naming it, the variable and its device
  /// (the node); uninitialized if the variable has no value.
  caf::expected<std::pair<tensor, uint64_t>> gather_rows(const tensor& ids) const;

  /// gather_rows written to `dst` (`dst_bytes` of room: exactly the rows')
  /// instead of a fresh tensor (a gather_many reply's part), with the same
  /// checks and errors; the version the rows were read at.
  caf::expected<uint64_t> gather_rows_into(const tensor& ids, std::byte* dst,
                                           size_t dst_bytes) const;

  /// Produces floats [offset, offset + n) of a gradient into `out` (n is at
  /// most apply_block).
  using gradient_fill = std::function<void(size_t offset, size_t n, float* out)>;

  /// Floats of gradient apply_gradient_by produces and applies at a time:
  /// 16 KiB, so that the block is still in the core's cache when applied.
  static constexpr size_t apply_block = 4096;

  /// Floats from which a spread update is split across the cores, per
  /// range (core/parallel_ranges.hpp): 512 KiB, so a 1 M-float variable's
  /// update runs on two threads or more and a small one's never pays a
  /// wake-up.
  static constexpr size_t split_floats = elementwise_split_floats;

  /// apply_gradient of the `n` floats `fill` produces block by block, each
  /// applied as soon as it is made: a gradient computed from others (a sync
  /// round's mean) never goes through memory as a whole. The same values as
  /// apply_gradient of the whole, bit for bit (the optimizers are elementwise).
  /// `updated(offset, n, values)`, if given, sees each block's new values
  /// right after its update, while they are in cache (the sync round copies
  /// them into the flat parameters it answers with). With `spread` (a sync
  /// round's update, which every member waits for) a variable of
  /// split_floats x 2 floats or more is updated on several threads at once
  /// (core/parallel_ranges.hpp), `fill` and `updated` called on each for its
  /// own blocks: they must only read shared state and write their blocks.
  /// Not in async, where the workers compute meanwhile: there a helper's
  /// core is a worker's (on 2 vCPUs async ran slower split).
  using block_updated = std::function<void(size_t offset, size_t n, const float* values)>;
  caf::error apply_gradient_by(const train::optimizer_spec& opt, const gradient_fill& fill,
                               size_t n, uint64_t step, const block_updated& updated = nullptr,
                               bool spread = false);

  /// Sets the value from `n` floats (parameter averaging), keeping the slots.
  caf::error assign_floats(const float* data, size_t n);

  /// Copies the value's `n` floats to `dst` (a flat parameter buffer).
  caf::error copy_floats(float* dst, size_t n) const;

  /// The float32 value of `n` elements into `into`, shared (no copy: the
  /// next update writes a copy while `into` holds it); `into`'s shape keeps
  /// its storage (no allocation once it has held the value). As copy_floats,
  /// an error if there is no such value.
  caf::error share_value(tensor& into, size_t n) const;

  /// The value and the slots named `slots` (where a slot has not been made
  /// yet: filled with `initial[k]`, train::slot_initial_value, else zeros),
  /// for a checkpoint.
  caf::expected<std::pair<tensor, std::vector<tensor>>>
  snapshot(const std::vector<std::string>& slots, const std::vector<float>& initial = {}) const;

  /// What an update made off the cell starts from (a pipelined sync round,
  /// dist/pipelined_round.hpp): the value and the slots `slots` (shared, no
  /// copy; a slot not made yet: filled with `initial[k]`), and the version
  /// they are of. Errors as apply_gradient's for a value that is not `n`
  /// initialized floats.
  struct update_base {
    tensor value;
    std::vector<tensor> slots;
    uint64_t version = 0;
  };
  caf::expected<update_base> begin_update(const std::vector<std::string>& slots,
                                          const std::vector<float>& initial, size_t n) const;

  /// Installs an update made off the cell from `base_version`: the value and
  /// the slots `slot_names` become `value` and `slots` together, and the
  /// version moves by one, as apply_gradient's would. If the cell changed
  /// since `base_version` (an assign meanwhile), nothing changes and the
  /// error (aborted) says so.
  caf::error install_update(uint64_t base_version, tensor value,
                            const std::vector<std::string>& slot_names, std::vector<tensor> slots);

  /// Sets value and slots from a checkpoint (bumps the version, marks it
  /// initialized by `run_id`).
  caf::error restore(tensor value, const std::vector<std::string>& slot_names,
                     std::vector<tensor> slots, const std::string& run_id);

private:
  caf::error check_floats(size_t n, const char* what) const; // mtx_ held
  /// gather_rows' checks of `ids` (no lock: the shape is fixed); the rows' shape.
  caf::error check_gather(const tensor& ids, shape_type& out_shape) const;
  /// Pointers to the slots of `opt.kind` (slot_names order), made at
  /// train::slot_initial_value on first use (mtx_ held; may throw bad_alloc).
  void use_slots(const train::optimizer_spec& opt, float* (&out)[2]);
  /// The update of apply_gradient(_by): `source(offset, len, buf)` gives the
  /// gradient's floats [offset, offset + len), in `buf` or elsewhere.
  template <class Source>
  caf::error apply_blocks(const train::optimizer_spec& opt, Source&& source, size_t n,
                          uint64_t step, const block_updated& updated, bool spread);
  /// The first try's result if the update `request_id` was applied before
  /// (mtx_ held), else nullopt; `what()` names the update in an error (made
  /// only then: a retry is rare, an update is not).
  std::optional<caf::expected<applied>> replay(uint64_t request_id, bool want_value,
                                               const std::function<std::string()>& what) const;
  /// Records the result of the update `id` (mtx_ held); evicts the oldest.
  void remember(uint64_t id, const applied& result, bool want_value);
  struct remembered_update {
    uint64_t version = 0;
    tensor value;            ///< the value after it, if wanted and still kept
    bool wanted = false;     ///< the first try asked for the value
  };
  const variable_spec spec_;
  mutable std::mutex mtx_;
  tensor value_;
  bool initialized_ = false;
  uint64_t version_ = 0;
  std::string run_id_;
  std::map<std::string, tensor> slots_;
  std::unordered_map<uint64_t, remembered_update> done_; ///< by request id
  std::deque<uint64_t> done_order_;                      ///< oldest first
  std::deque<uint64_t> kept_order_;                      ///< ids whose value is kept, oldest first
  size_t kept_bytes_ = 0;
};

/// The variable actor's full interface: the protocol of messages/variable.hpp
/// plus two messages it sends itself or gets from its node's data plane.
///   (released)  the data plane gave the variable its first value: wake waiters
///   (sweep)     timer: drop waiters past their timeout
using variable_cell_actor =
  variable_actor::extend<caf::reacts_to<released_atom>, caf::reacts_to<sweep_atom>>;

/// The actor holds only the promises of wait_init requests; the state is the
/// cell's. A waiter for run R is released by an initialize of run R; one for
/// "" by any first value (an assign too).
struct variable_actor_state {
  std::shared_ptr<variable_cell> cell;
  /// wait_init requests, keyed by the run id they wait for.
  parked_requests<uint64_t, std::string> waiters;

  static constexpr const char* name = "variable";
};

/// The behavior; a node spawns one per variable, monitors it and stops it
/// when the node ends.
variable_cell_actor::behavior_type
variable_impl(variable_cell_actor::stateful_pointer<variable_actor_state> self,
              std::shared_ptr<variable_cell> cell);

} // namespace af
