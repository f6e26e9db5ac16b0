// A sparse job's checkpoints, shard by shard on the ps (dist/sparse_checkpoint.hpp).
#include "dist/sparse_checkpoint.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "dist/job_setup.hpp"
#include "messages/error.hpp"
#include "train/table_checkpoint.hpp"

namespace af {

namespace {

namespace fs = std::filesystem;
using training_detail::to_error;

/// One shard's save or restore, and the ps that holds it.
struct shard_job {
  size_t ps = 0;
  table_shard_request req;
};

/// Every table's shards and every dense parameter (one shard of a table of
/// its own name) as requests to their ps.
std::vector<shard_job> shard_jobs(const sparse_checkpoint_job& j, const std::string& dir,
                                  uint64_t step, const std::string& run_id) {
  std::vector<shard_job> out;
  auto base = [&](const std::string& var, const std::string& table,
                  kernels::partition_strategy strategy, std::vector<int64_t> rows, size_t k) {
    table_shard_request r;
    r.dir = dir;
    r.variable = var;
    r.table = table;
    r.strategy = static_cast<uint8_t>(strategy);
    r.shard_rows = std::move(rows);
    r.shard = k;
    r.slot_names = j.slot_names;
    r.slot_starts = j.slot_starts;
    r.global_step = step;
    r.run_id = run_id;
    return r;
  };
  const auto& l = *j.layout;
  for (size_t t = 0; t < l.tables.size(); ++t) {
    const auto& lt = l.tables[t];
    for (size_t k = 0; k < lt.shard_vars.size(); ++k)
      out.push_back({lt.shard_ps[k], base(lt.shard_vars[k], j.table_names[t],
                                          lt.router.strategy(), lt.router.shard_rows(), k)});
  }
  for (size_t d = 0; d < l.dense_vars.size(); ++d)
    out.push_back({l.dense_ps[d], base(l.dense_vars[d], l.dense_vars[d],
                                       kernels::partition_strategy::mod,
                                       {j.dense_shapes[d].at(0)}, 0)});
  return out;
}

/// Sends every request at once (each ps works on its shards in parallel,
/// each shard on a thread of its own there) and waits for all answers; the
/// first error, naming the ps.
template <class Atom, class Result>
caf::error ask_every_ps(session& s, const std::vector<shard_job>& jobs,
                        std::chrono::milliseconds timeout, Atom atom) {
  caf::scoped_actor self{s.system()};
  using handle = decltype(self->request(std::declval<node_actor>(), timeout, atom,
                                        std::declval<table_shard_request>()));
  std::vector<handle> pending;
  std::vector<size_t> of;
  caf::error first;
  auto fail = [&](size_t ps, const caf::error& e) {
    if (!first)
      first = make_error(e.category() == error_category ? static_cast<af_error>(e.code())
                                                         : af_error::unreachable,
                         fmt::format("/job:ps/task:{}: {}", ps, describe(e)));
  };
  for (const auto& job : jobs) {
    auto node = s.node("ps", static_cast<int32_t>(job.ps));
    if (!node) {
      fail(job.ps, node.error());
      break;
    }
    pending.push_back(self->request(*node, timeout, atom, job.req));
    of.push_back(job.ps);
  }
  for (size_t i = 0; i < pending.size(); ++i)
    pending[i].receive([](Result&) {}, [&](caf::error& e) { fail(of[i], e); });
  return first;
}

/// Removes the tables-<step> directories no state file names any more
/// (train::save keeps the newest few and removes the others).
void prune_tables(const std::string& dir) {
  std::error_code ec;
  std::set<std::string> kept;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    auto name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && e.path().extension() == ".afck")
      kept.insert("tables-" + name.substr(5, name.size() - 5 - 5));
  }
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    auto name = e.path().filename().string();
    if (name.rfind("tables-", 0) == 0 && e.is_directory() && !kept.count(name))
      fs::remove_all(e.path(), ec); // best effort: an old checkpoint left is no harm
  }
}

caf::expected<train::checkpoint_key> key_of(const train::train_config& c) {
  if (c.checkpoint_key.empty())
    return train::checkpoint_key{};
  auto key = train::load_checkpoint_key(c.checkpoint_key);
  if (!key)
    return to_error(key.error());
  return std::move(*key);
}

} // namespace

std::string sparse_tables_dir(const std::string& checkpoint_dir, uint64_t step) {
  return (fs::path(checkpoint_dir) / ("tables-" + std::to_string(step))).string();
}

caf::expected<std::string> save_sparse_checkpoint(session& s, const sparse_checkpoint_job& j,
                                                  const train::train_config& c,
                                                  uint64_t global_step, uint64_t data_position) {
  auto key = key_of(c);
  if (!key)
    return std::move(key.error());
  auto dir = sparse_tables_dir(c.checkpoint_dir, global_step);
  std::error_code ec;
  fs::remove_all(dir, ec); // a save at this step that did not finish
  if (fs::create_directories(dir, ec); ec)
    return make_error(af_error::invalid_config,
                      fmt::format("checkpoint directory '{}': {}", dir, ec.message()));
  auto jobs = shard_jobs(j, dir, global_step, "");
  if (auto err = ask_every_ps<save_atom, std::string>(s, jobs, j.timeout, save_atom::value))
    return err;
  // The manifests, once every shard file is in place: each table's, then
  // each dense parameter's (a table of one shard).
  auto manifest = [&](const std::string& table, kernels::partition_strategy strategy,
                      std::vector<int64_t> rows, shape_type row_shape) -> caf::error {
    train::table_checkpoint_layout l;
    l.table = table;
    l.strategy = strategy;
    l.shard_rows = std::move(rows);
    l.row_shape = std::move(row_shape);
    l.slots = j.slot_names;
    l.global_step = global_step;
    if (auto m = train::write_table_manifest(dir, l, *key); !m)
      return to_error(m.error());
    return caf::none;
  };
  const auto& l = *j.layout;
  for (size_t t = 0; t < l.tables.size(); ++t)
    if (auto err = manifest(j.table_names[t], l.tables[t].router.strategy(),
                            l.tables[t].router.shard_rows(), j.table_rows[t]))
      return err;
  for (size_t d = 0; d < l.dense_vars.size(); ++d) {
    const auto& shape = j.dense_shapes[d];
    if (auto err = manifest(l.dense_vars[d], kernels::partition_strategy::mod, {shape.at(0)},
                            shape_type(shape.begin() + 1, shape.end())))
      return err;
  }
  // The state last: `latest` names it only once everything above is there.
  train::checkpoint ck;
  ck.global_step = global_step;
  ck.data_position = data_position;
  ck.config = train::to_toml(c);
  auto path = train::save(c.checkpoint_dir, ck, 3, *key);
  if (!path)
    return to_error(path.error());
  prune_tables(c.checkpoint_dir);
  return *path;
}

caf::expected<std::optional<train::checkpoint>>
latest_sparse_checkpoint(const train::train_config& c) {
  auto latest = train::latest(c.checkpoint_dir);
  if (!latest)
    return to_error(latest.error());
  if (latest->empty())
    return std::optional<train::checkpoint>{};
  auto key = key_of(c);
  if (!key)
    return std::move(key.error());
  auto ck = train::load(*latest, *key);
  if (!ck)
    return to_error(ck.error());
  if (!ck->variables.empty())
    return make_error(af_error::invalid_argument,
                      fmt::format("checkpoint '{}' holds variables ({} first): it is a dense "
                                  "job's, not a sparse job's (whose tables are in tables-<step>)",
                                  *latest, ck->variables.front().name));
  return std::make_optional(std::move(*ck));
}

caf::error restore_sparse_checkpoint(session& s, const sparse_checkpoint_job& j,
                                     const train::train_config& c, uint64_t step,
                                     const std::string& run_id, std::optional<size_t> only_ps) {
  auto key = key_of(c);
  if (!key)
    return std::move(key.error());
  auto dir = sparse_tables_dir(c.checkpoint_dir, step);
  auto jobs = shard_jobs(j, dir, step, run_id);
  if (only_ps)
    jobs.erase(std::remove_if(jobs.begin(), jobs.end(),
                              [&](const shard_job& job) { return job.ps != *only_ps; }),
               jobs.end());
  // Each table's manifest checked here (its HMAC under the key), and its
  // SHA-256 handed to the ps, which check the manifest they read against it.
  std::map<std::string, std::string> digests;
  for (auto& job : jobs) {
    auto& digest = digests[job.req.table];
    if (digest.empty()) {
      auto d = train::verify_table_manifest(dir, job.req.table, *key);
      if (!d)
        return to_error(d.error());
      digest = *d;
    }
    job.req.manifest_sha256 = digest;
  }
  return ask_every_ps<restore_atom, uint64_t>(s, jobs, j.timeout, restore_atom::value);
}

caf::expected<training_detail::restored_ps> restore_lost_ps(session& s,
                                                            const sparse_checkpoint_job& j,
                                                            const train::train_config& c,
                                                            size_t k) {
  training_detail::restored_ps out;
  std::vector<std::string> names;
  const auto& l = *j.layout;
  for (const auto& slot : l.ps_order.at(k))
    names.push_back(slot.table ? l.tables[slot.index].shard_vars[slot.shard]
                               : l.dense_vars[slot.index]);
  if (!c.checkpoint_dir.empty()) {
    auto latest = latest_sparse_checkpoint(c);
    if (!latest)
      return std::move(latest.error());
    if (*latest) {
      auto step = (**latest).global_step;
      if (auto err = restore_sparse_checkpoint(s, j, c, step, "", k))
        return err;
      out.from = sparse_tables_dir(c.checkpoint_dir, step);
      out.from_step = step;
    }
  }
  out.what = fmt::format("its shards {} (rows and optimizer slots)", fmt::join(names, ", "));
  return out;
}

} // namespace af
