#include "dist/chief_start.hpp"

#include <algorithm>
#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "actors/blocking_ask.hpp"
#include "core/log.hpp"
#include "messages/error.hpp"
#include "train/partition.hpp"

namespace af {

caf::expected<aggregator_state> restored_state(const train::checkpoint& ck, const std::string& dir,
                                               const std::vector<train::parameter>& params,
                                               const std::vector<train::piece>& pieces,
                                               const train::optimizer_spec& optimizer,
                                               const std::string& aggregator) {
  aggregator_state state;
  state.global_step = ck.global_step;
  // The pushes of `aggregator` the checkpoint holds (none if the job ran
  // on other ps tasks then: a retry is then no push of this aggregator's).
  if (auto it = ck.push_seqs.find(aggregator); it != ck.push_seqs.end())
    for (const auto& [worker, seq] : it->second) {
      state.seq_workers.push_back(worker);
      state.seq_taken.push_back(seq);
    }
  auto names = train::slot_names(optimizer.kind);
  std::vector<float> starts;
  for (size_t k = 0; k < names.size(); ++k)
    starts.push_back(train::slot_initial_value(optimizer, k));
  for (const auto& p : pieces) {
    auto v = train::piece_of_checkpoint(p, params[p.param].name, ck, names, dir, starts);
    if (!v)
      return make_error(v.error().code, v.error().what);
    state.names.push_back(p.name);
    state.values.push_back(std::move(v->value));
    std::vector<tensor> slots;
    for (const auto& sn : names)
      slots.push_back(std::move(v->slots[sn]));
    state.slots.push_back(std::move(slots));
  }
  return state;
}

namespace {

/// Waits (bounded by init_timeout_ms) until the aggregator of every live
/// shard no longer counts the chief's earlier incarnation as a member: a
/// chief restarted before its ps saw the old one die (a host that went
/// away without closing its connections is seen within the node's
/// connection_timeout_ms) would be refused as a second worker 0, and a
/// chief that fails stops the ps tasks. A worker 0 that never joined (it
/// died before it trained) is no member to wait for.
caf::error wait_for_old_chief_gone(session& s, const train::train_config& c,
                                   const std::vector<param_shard>& shards,
                                   const std::vector<bool>& live) {
  std::chrono::milliseconds timeout{c.step_timeout_ms};
  std::chrono::milliseconds patience{c.init_timeout_ms};
  auto deadline = std::chrono::steady_clock::now() + patience;
  for (size_t k = 0; k < shards.size(); ++k) {
    if (!live[k])
      continue;
    for (bool said = false;;) {
      auto stats = ask<aggregator_stats>(s, shards[k].actor, timeout, stats_atom::value);
      if (!stats)
        return std::move(stats.error());
      auto old = std::find_if(stats->workers.begin(), stats->workers.end(),
                              [](const worker_stats& w) { return w.worker == 0; });
      if (old == stats->workers.end() || old->task.empty()
          || (old->status != "member" && old->status != "held"))
        break;
      if (std::chrono::steady_clock::now() >= deadline)
        return make_error(af_error::already_exists,
                          fmt::format("{} still counts worker 0 ({} at {}, last push {:.1f} s ago) "
                                      "as a member after {} ms (init_timeout_ms): is another chief "
                                      "of this job running? Stop it, or wait until the ps "
                                      "reports it left (actorflow-train --status), and start "
                                      "this one again",
                                      shards[k].task, old->task, old->address, old->idle_s,
                                      patience.count()));
      if (!said)
        log::get()->warn("chief: {} still counts the chief's earlier process ({}) as a member; "
                         "waiting up to {} ms (init_timeout_ms) for it to see that one gone",
                         shards[k].task, old->address, patience.count());
      said = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return caf::none;
}

} // namespace

caf::expected<chief_start>
start_job_on_ps(session& s, const train::train_config& c,
                const std::vector<train::parameter>& params,
                const std::vector<param_shard>& shards,
                const std::vector<std::vector<output>>& shard_vars, uint32_t workers,
                const std::optional<train::checkpoint>& restored,
                const std::string& restored_path, const caf::error& unreadable, ps_found& found) {
  std::chrono::milliseconds timeout{c.step_timeout_ms};
  // Which ps tasks ran the job already: an earlier incarnation of the chief
  // initialized or restored their variables, and they went on with the
  // other workers after it died. Their state is the job's: restoring them
  // from the checkpoint would roll every live worker back (its next push
  // refused as a step the ps no longer has).
  std::vector<bool> live(shards.size(), false);
  std::vector<std::string> live_names, lost_names;
  uint64_t live_step = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    auto missing = s.uninitialized(shard_vars[k]);
    if (!missing)
      return std::move(missing.error());
    live[k] = missing->empty();
    if (!live[k]) {
      lost_names.push_back(shards[k].task);
      continue;
    }
    // Known from here on, even if the chief fails below: the job is not
    // this chief's to stop (programs/train_main.cpp).
    found = ps_found::running;
    auto stats = ask<aggregator_stats>(s, shards[k].actor, timeout, stats_atom::value);
    if (!stats)
      return std::move(stats.error());
    live_step = std::max(live_step, stats->global_step);
    live_names.push_back(fmt::format("{} at global step {}", shards[k].task, stats->global_step));
  }
  bool taken = !live_names.empty();
  if (!taken)
    found = ps_found::new_job;
  std::string kept = fmt::format("{}", fmt::join(live_names, ", "));
  if (unreadable) {
    // The checkpoint is the state of a ps that has none: a job that is not
    // running needs it, and so does a ps that died with the chief. Live ps
    // are left as they are either way.
    if (!taken)
      return unreadable;
    if (!lost_names.empty())
      return make_error(unreadable.category() == error_category
                          ? static_cast<af_error>(unreadable.code())
                          : af_error::invalid_argument,
                        fmt::format("{} lost its state and the job's latest checkpoint cannot be "
                                    "read: {}; the running job ({}) is left as it is: make the "
                                    "checkpoint readable (or remove it from `latest`) and start "
                                    "the chief again",
                                    fmt::join(lost_names, ", "), describe(unreadable), kept));
    log::get()->warn("chief: the job's latest checkpoint cannot be read ({}); the running job "
                     "({}) does not need it: taking it as it is, and the next checkpoint "
                     "replaces it",
                     describe(unreadable), kept);
  }
  if (!taken) {
    // A job that starts, or resumes with every ps new: the checkpoint's
    // state everywhere, else the initializers.
    if (restored) {
      log::get()->info("worker 0: restoring {} (global step {})", restored_path,
                       restored->global_step);
      for (const auto& shard : shards) {
        auto state = restored_state(*restored, c.checkpoint_dir, params, shard.pieces,
                                    c.optimizer, shard.aggregator);
        if (!state)
          return std::move(state.error());
        auto r = ask<uint64_t>(s, shard.actor, timeout, restore_atom::value, std::move(*state));
        if (!r)
          return std::move(r.error());
      }
    } else {
      std::vector<output> all;
      for (const auto& v : shard_vars)
        all.insert(all.end(), v.begin(), v.end());
      if (auto err = s.initialize(all))
        return err;
    }
  } else {
    if (auto err = wait_for_old_chief_gone(s, c, shards, live))
      return err;
    // The live ps as they are; those that lost their state (a ps that died
    // with the chief) from the checkpoint, else their initial values, at the
    // live ones' step, as chief_recover_ps does for a ps that dies alone.
    for (size_t k = 0; k < shards.size(); ++k) {
      if (live[k])
        continue;
      aggregator_state state;
      if (restored) {
        auto st = restored_state(*restored, c.checkpoint_dir, params, shards[k].pieces,
                                 c.optimizer, shards[k].aggregator);
        if (!st)
          return std::move(st.error());
        state = std::move(*st);
      } else {
        if (auto err = s.initialize(shard_vars[k]))
          return err;
        auto st = ask<aggregator_state>(s, shards[k].actor, timeout, save_atom::value);
        if (!st)
          return std::move(st.error());
        state = std::move(*st);
      }
      state.global_step = live_step;
      auto r = ask<uint64_t>(s, shards[k].actor, timeout, restore_atom::value, std::move(state));
      if (!r)
        return std::move(r.error());
    }
  }
  // Where the job stands: the global step of ps 0's aggregator.
  auto stats = ask<aggregator_stats>(s, shards[0].actor, timeout, stats_atom::value);
  if (!stats)
    return std::move(stats.error());
  chief_start out;
  out.taken = taken;
  out.step = taken || !restored ? stats->global_step : restored->global_step;
  if (!taken) {
    // The data position the checkpoint holds (the other workers resume
    // there too), else the one the global step implies.
    out.position = restored ? restored->data_position
                            : data_position(c.mode, workers, 0, 0, out.step, out.step);
    return out;
  }
  // The live job's data position: the checkpoint's moved on by the steps
  // the job took since (the other workers' own positions moved the same
  // way), else the one the global step implies.
  uint64_t from_step = restored ? std::min(restored->global_step, out.step) : 0;
  uint64_t from_position = restored ? restored->data_position : 0;
  out.position = data_position(c.mode, workers, from_step, from_position, out.step - from_step,
                               out.step);
  std::string also = lost_names.empty()
                       ? std::string{}
                       : fmt::format("; restored {} (no state) from {} at global step {}",
                                     fmt::join(lost_names, ", "),
                                     restored ? restored_path : std::string{"its initial values"},
                                     live_step);
  log::get()->warn("chief: the job is running ({}): joining it as it is, not restoring {}{}",
                   kept,
                   restored ? fmt::format("{} (global step {})", restored_path,
                                          restored->global_step)
                            : std::string{"anything"},
                   also);
  std::printf("chief: took the running job at global_step=%llu data_position=%llu "
              "checkpoint_step=%s\n",
              static_cast<unsigned long long>(out.step),
              static_cast<unsigned long long>(out.position),
              restored ? std::to_string(restored->global_step).c_str() : "none");
  std::fflush(stdout);
  return out;
}

} // namespace af
