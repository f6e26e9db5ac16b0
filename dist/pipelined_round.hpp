#pragma once
/// A pipelined sync round (docs/performance.md "Pipelining the sync round"):
/// the members' pushes arrive in pieces, and each chunk of the model is
/// averaged and updated as soon as every member's copy of it is there, so
/// that its answer can stream back while later chunks still arrive.
///
/// The update is made off the variables: the optimizer reads each block of
/// the old value and slots where it lies and writes the new one into
/// buffers of the round's own, in one pass (train::apply_into: the same
/// operations as variable_cell::apply_gradient_by, so the same bits). The variables
/// change only at commit(), all of them at once (variable_cell::
/// install_update); an aborted round (a member that stopped mid-push, a
/// non-finite chunk) leaves every value and slot as it was. The answer's
/// bytes are the round's new values, which become the variables' own at
/// commit: no copy for the answer.
///
/// The mean sums the members in the order given to begin() (their worker
/// indices, ascending), then scales, with aggregation_round's own code: for
/// two members the same bits as the store-and-forward round, which sums in
/// arrival order (float addition commutes); for three or more, the same
/// bits as a store-and-forward round whose pushes arrived in worker order,
/// and the same bits whatever the order the pieces arrive in.
///
/// No lock of its own: the aggregator's lock is held for every call but the
/// reading of answer_pieces() of chunks already applied (their bytes do not
/// change after that), and the round is shared (shared_ptr) by the threads
/// that still write its answer.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <sys/uio.h>

#include "caf/error.hpp"

#include "actors/plane_push.hpp"
#include "actors/variable.hpp"
#include "dist/aggregation_round.hpp"
#include "train/optimizer.hpp"

namespace af {

class pipelined_round {
public:
  /// Floats per chunk: a chunk is applied, and streamed back, as a whole.
  static constexpr size_t default_chunk_floats = pipelined_chunk_floats; // 64 KiB

  /// One variable of the round: its cell, and where its floats lie in the
  /// flat push and answer.
  struct variable {
    variable_cell* cell = nullptr;
    std::string name;
    size_t offset = 0;
    size_t size = 0;
  };

  enum class phase { running, committed, aborted };

  /// Starts the round over `vars` (in flat order, together `total` floats)
  /// for `members` (worker indices, in the order the mean sums them), at
  /// global step `step`: snapshots every variable's value and slots and
  /// allocates the members' push buffers and the new values. An error (and
  /// nothing changed) if a variable is not ready (no value: uninitialized)
  /// or there is no memory.
  caf::error begin(std::vector<variable> vars, const train::optimizer_spec& opt,
                   const std::vector<std::string>& slot_names, uint64_t step,
                   std::vector<uint32_t> members, size_t chunk_floats = default_chunk_floats);

  /// begin() in two halves, for a push that must wait its turn (an async
  /// push behind another: dist/aggregator_pipelined_async.cpp). prepare()
  /// allocates the members' push buffers: pieces may arrive (arrived()),
  /// nothing is applied. start() snapshots every variable's value and slots
  /// at global step `step` and applies every chunk that arrived meanwhile.
  /// Errors as begin()'s; nothing changed.
  caf::error prepare(std::vector<variable> vars, const train::optimizer_spec& opt,
                     const std::vector<std::string>& slot_names, std::vector<uint32_t> members,
                     size_t chunk_floats = default_chunk_floats);
  caf::error start(uint64_t step);
  /// Whether start() (or begin()) took the variables' snapshot.
  bool started() const noexcept { return started_; }

  phase state() const noexcept { return phase_; }
  uint64_t step() const noexcept { return step_; }
  size_t total() const noexcept { return total_; }
  size_t chunk_floats() const noexcept { return chunk_; }
  size_t chunks() const noexcept { return total_ == 0 ? 0 : (total_ + chunk_ - 1) / chunk_; }
  /// Chunks averaged and updated so far (0 .. chunks()).
  size_t applied() const noexcept { return applied_; }
  /// Floats of the answer ready to send: every chunk applied.
  size_t ready_floats() const noexcept { return std::min(applied_ * chunk_, total_); }
  const std::vector<uint32_t>& members() const noexcept { return members_; }
  bool is_member(uint32_t worker) const;

  /// Where `worker`'s push is read into (total() floats); null if it is no member.
  float* buffer(uint32_t worker);

  /// `worker`'s push has arrived up to `floats` (a prefix: its pieces come
  /// in order); every chunk every member now has is averaged and applied
  /// (once started). The number of chunks applied.
  size_t arrived(uint32_t worker, size_t floats);

  /// Whether every member's push has fully arrived.
  bool all_arrived() const;

  /// Members whose push has not fully arrived, and how far each has: "worker
  /// 1 (40960 of 300001 floats)", for a message of whom the round waits for.
  std::string behind() const;

  /// `worker`'s push joined the round (its pieces will come).
  void joined(uint32_t worker);

  /// `worker` abstains from the round (its gradient was not finite, so its
  /// worker pushed no values): the round goes on without it, as the
  /// store-and-forward round counts an abstention, and chunks the others
  /// all have are applied. False (nothing changed) if it is no member, or
  /// its push joined already.
  bool abstain(uint32_t worker);

  /// The answer's floats [from, to) (within ready_floats()) as pieces of
  /// the new values, appended to `out`.
  void answer_pieces(size_t from, size_t to, std::vector<iovec>& out) const;

  /// Once every chunk is applied: installs the new values and slots into
  /// the cells, all or none (a cell assigned meanwhile refuses, and the
  /// round is aborted with that error).
  caf::error commit();

  /// Ends the round without changing any variable, for `why`.
  void abort(caf::error why);

  /// Why the round was aborted.
  const caf::error& abort_reason() const noexcept { return why_; }

  /// "variable 'w' element 17": where flat float `index` lies.
  std::string where(size_t index) const;

private:
  /// Averages and updates the flat floats [from, to).
  void apply_range(size_t from, size_t to);
  /// The members' pushes into sum_, by reference, in members_ order.
  void sum_members();
  /// Applies every chunk all members have (once started).
  void apply_ready();
  caf::error out_of_memory() const;

  struct var_state {
    variable v;
    variable_cell::update_base base; ///< the old value and slots
    tensor value;                    ///< the new value
    std::vector<tensor> slots;       ///< the new slots
  };

  std::vector<var_state> vars_;
  train::optimizer_spec opt_;
  train::step_constants consts_; ///< opt_'s at step_ (set by start())
  std::vector<std::string> slot_names_;
  uint64_t step_ = 0;
  size_t total_ = 0;
  size_t chunk_ = default_chunk_floats;
  std::vector<uint32_t> members_;
  std::vector<tensor> pushes_;      ///< per member, in members_ order
  std::vector<size_t> arrived_;     ///< per member: floats arrived
  std::vector<bool> joined_;        ///< per member: its push joined (joined())
  aggregation_round<int> sum_;      ///< the members' pushes, by reference, in order
  size_t applied_ = 0;
  bool started_ = false;
  phase phase_ = phase::running;
  caf::error why_;
};

} // namespace af
