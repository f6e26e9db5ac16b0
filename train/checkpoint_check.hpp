#pragma once
/// What a checkpoint must be for this job to restore it, no CAF: load()
/// reads any well-formed file (the REPL's too); check_checkpoint() judges
/// its contents against the job's model and config before a value reaches
/// a variable, so that a file from another model, a corrupt or forged one
/// (the checksum does not stop a forger) is refused naming the file and the
/// field, instead of training on NaN or ending at once at step 2^64 - 1.

#include <cstdint>
#include <string>
#include <vector>

#include "graph/outcome.hpp"
#include "train/checkpoint.hpp"
#include "train/model.hpp"

namespace af::train {

struct checkpoint_expectations {
  std::vector<parameter> params;        ///< the model's, each once (float32)
  std::string optimizer_kind;           ///< whose slots the job uses
  /// The most a checkpoint's global step and data position may be: the
  /// job's steps plus one push per worker (async overshoots by up to
  /// workers - 1; docs/training.md).
  uint64_t max_step = 0;
};

/// The largest push number (checkpoint::push_seqs) a checkpoint may hold:
/// far beyond any job, far below where a worker's count would wrap.
constexpr uint64_t max_push_number = uint64_t{1} << 62;

/// The most global step and data position of a job of `total_steps` steps
/// and `workers` workers may be (checkpoint_expectations::max_step).
uint64_t max_checkpoint_step(uint64_t total_steps, uint32_t workers);

/// Ok if `ck` (read from `path`) fits: global_step and data_position at
/// most max_step; every parameter of the model once, as float32 of its
/// shape, and no other variable; every slot one that an optimizer keeps
/// (sgd none, momentum "momentum", adagrad "accumulator", adam "m" and
/// "v"), of its variable's shape, float32; every value and slot element
/// finite (the job's Adam "v" also >= 0, its Adagrad "accumulator" > 0);
/// every push number at most max_push_number. Else an error naming the
/// file, the field (the variable, the slot, the element's index and value)
/// and what to do.
graph_status check_checkpoint(const checkpoint& ck, const std::string& path,
                              const checkpoint_expectations& want);

/// "" if the checkpoint's optimizer slots are the ones `optimizer_kind`
/// keeps, else a sentence for a warning: which start at their initial
/// values, zeros but Adagrad's accumulator (the job changed its optimizer:
/// restored all the same) and which are not used.
std::string slot_mismatch(const checkpoint& ck, const std::string& optimizer_kind);

/// "" if every float value and slot of `ck` is finite, else a sentence naming
/// the first that is not (its variable, slot and element): for refusing to
/// write a checkpoint that no job could restore.
std::string first_non_finite_value(const checkpoint& ck);

} // namespace af::train
