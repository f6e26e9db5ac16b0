// A ps saves and restores its own table shards (actors/table_shards.hpp).
#include "actors/table_shards.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "caf/all.hpp"

#include "actors/variable.hpp"
#include "messages/error.hpp"
#include "train/optimizer.hpp"
#include "train/table_checkpoint.hpp"

namespace af {

namespace {

/// `e`, saying which variable of this node it was about.
caf::error to_error(const graph_error& e, const table_shard_request& req) {
  return make_error(e.code, "table shard '" + req.variable + "': " + e.what);
}

/// The shard's layout as the request gives it, checked against the variable.
caf::expected<train::table_checkpoint_layout> layout_of(const table_shard_request& req,
                                                        const variable_spec& spec) {
  if (spec.type != dtype::float32 || spec.shape.empty() || req.shard >= req.shard_rows.size()
      || spec.shape[0] != req.shard_rows[req.shard] || req.strategy > 2)
    return make_error(af_error::shape_mismatch,
                      fmt::format("table checkpoint of '{}': the variable is {}{}, the request "
                                  "makes it shard {} of {} shards of {} rows (strategy {})",
                                  req.variable, dtype_name(spec.type), shape_string(spec.shape),
                                  req.shard, req.shard_rows.size(),
                                  req.shard < req.shard_rows.size() ? req.shard_rows[req.shard] : 0,
                                  req.strategy));
  // The slots of one optimizer, as its aggregator keeps them: a request
  // naming others (or the same one many times) would make the node allocate
  // a shard's worth per name, filled at its start value, to write or fill.
  bool known = false;
  for (const char* kind : {"sgd", "momentum", "adagrad", "adam"})
    known = known || req.slot_names == train::slot_names(kind);
  if (!known)
    return make_error(af_error::invalid_argument,
                      fmt::format("table checkpoint of '{}': the slots [{}] are not an "
                                  "optimizer's (none; momentum; accumulator; m, v)",
                                  req.variable, fmt::join(req.slot_names, ", ")));
  train::table_checkpoint_layout l;
  l.table = req.table;
  l.strategy = static_cast<kernels::partition_strategy>(req.strategy);
  l.shard_rows = req.shard_rows;
  l.row_shape.assign(spec.shape.begin() + 1, spec.shape.end());
  l.slots = req.slot_names;
  l.global_step = req.global_step;
  return l;
}

caf::expected<std::string> save_shard(variable_cell& cell, const table_shard_request& req) {
  auto layout = layout_of(req, cell.spec());
  if (!layout)
    return std::move(layout.error());
  // The value and slots as they are now, shared (no copy): an update while
  // they are written copies before it writes (copy on write).
  auto snap = cell.snapshot(req.slot_names, req.slot_starts);
  if (!snap)
    return std::move(snap.error());
  train::table_shard_view view{snap->first.data<float>(), {}};
  for (const auto& s : snap->second)
    view.slots.push_back(s.data<float>());
  auto path = train::write_table_shard(req.dir, *layout, req.shard, view);
  if (!path)
    return to_error(path.error(), req);
  return *path;
}

caf::expected<uint64_t> restore_shard(variable_cell& cell, const table_shard_request& req) {
  auto layout = layout_of(req, cell.spec());
  if (!layout)
    return std::move(layout.error());
  auto saved = train::read_table_manifest(req.dir, req.table, req.manifest_sha256);
  if (!saved)
    return to_error(saved.error(), req);
  // The shard files are all of the manifest's step (read_table_shard checks
  // each header against it); the manifest must be of the step the chief
  // restores (its signed state file's), else a tables-<step> directory
  // holding another checkpoint's files is restored as that step.
  if (saved->global_step != req.global_step)
    return make_error(af_error::invalid_argument,
                      fmt::format("table shard '{}': the table manifest of '{}' in '{}' is of "
                                  "global step {}, the checkpoint being restored of step {}: "
                                  "that directory holds another checkpoint's files; restore "
                                  "the right ones there, or move that checkpoint away",
                                  req.variable, req.table, req.dir, saved->global_step,
                                  req.global_step));
  tensor value{dtype::float32, cell.spec().shape};
  std::vector<tensor> slots;
  train::table_shard_target target;
  target.strategy = layout->strategy;
  target.shard_rows = req.shard_rows;
  target.k = req.shard;
  target.row_shape = layout->row_shape;
  target.slot_names = req.slot_names;
  target.slot_starts = req.slot_starts;
  target.value = value.mutable_data<float>();
  for (size_t i = 0; i < req.slot_names.size(); ++i) {
    slots.emplace_back(dtype::float32, cell.spec().shape);
    target.slots.push_back(slots.back().mutable_data<float>());
  }
  if (auto st = train::read_table_shard(req.dir, *saved, target); !st)
    return to_error(st.error(), req);
  if (auto err = cell.restore(std::move(value), req.slot_names, std::move(slots), req.run_id))
    return err;
  return cell.info().version;
}

table_shard_worker::behavior_type worker_impl(table_shard_worker::pointer self,
                                              std::shared_ptr<variable_cell> cell,
                                              variable_cell_actor actor) {
  return {
    [self, cell](save_atom, table_shard_request& req) -> caf::result<std::string> {
      self->quit();
      auto out = save_shard(*cell, req);
      if (!out)
        return std::move(out.error());
      return *out;
    },
    [self, cell, actor](restore_atom, table_shard_request& req) -> caf::result<uint64_t> {
      self->quit();
      auto out = restore_shard(*cell, req);
      if (!out)
        return std::move(out.error());
      if (actor)
        caf::anon_send(actor, released_atom::value);
      return *out;
    },
  };
}

} // namespace

table_shard_worker spawn_table_shard_worker(caf::actor_system& sys,
                                            std::shared_ptr<variable_cell> cell,
                                            variable_cell_actor actor) {
  return sys.spawn<caf::detached>(worker_impl, std::move(cell), std::move(actor));
}

} // namespace af
