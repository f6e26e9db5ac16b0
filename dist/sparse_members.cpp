// A sparse worker's memberships at the ps's aggregators
// (dist/sparse_job_detail.hpp): its join, and its join again after a live
// switch into sync (docs/sparse.md, "A live switch").
#include <algorithm>
#include <chrono>
#include <string>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "core/log.hpp"
#include "dist/sparse_job_detail.hpp"
#include "messages/atoms.hpp"
#include "messages/error.hpp"

namespace af::sparse_job_detail {

caf::expected<joined> join_aggregator(sparse_task& t, uint32_t k, const aggregator_actor& agg) {
  std::string address;
  if (auto addr = t.s.cluster().address("worker", static_cast<int32_t>(t.task)))
    address = addr->to_string();
  caf::scoped_actor self{t.s.system()};
  caf::error err;
  joined out;
  self
    ->request(agg, t.timeout, join_atom::value, t.task,
              "/job:worker/task:" + std::to_string(t.task), address,
              static_cast<uint32_t>(t.c.batch_size), caf::actor_cast<caf::actor>(*t.self))
    .receive(
      [&](uint64_t global_step, std::string& token, uint64_t seq) {
        out = {global_step, std::move(token), seq};
      },
      [&](caf::error& e) { err = std::move(e); });
  if (err)
    return make_error(af_error::unreachable,
                      fmt::format("joining the aggregator of /job:ps/task:{}: {}", k,
                                  describe(err)));
  return out;
}

namespace {

/// Joins every ps's aggregator again, as it runs now (a recovered ps's is a
/// new one), after a switch into sync: its rounds take this worker from its
/// next push on, on every ps from the same step's push. The same actor
/// joins, so the token, and the links, stay.
caf::error rejoin_all(sparse_task& t) {
  for (uint32_t k = 0; k < t.members.size(); ++k) {
    auto agg = t.recovering ? t.recovering->current(k).shard.actor : t.members[k].actor;
    auto j = join_aggregator(t, k, agg);
    if (!j) {
      // A ps that died meanwhile is waited for by the step (the recovery
      // joins its new aggregator, which puts no one on standby).
      if (t.recovering) {
        log::get()->warn("worker {}: joining /job:ps/task:{} again after its switch into sync: "
                         "{}; the step's recovery takes it",
                         t.task, k, describe(j.error()));
        continue;
      }
      return std::move(j.error());
    }
    t.links[k]->set_token(j->token);
    t.ps_steps[k] = std::max(t.ps_steps[k], j->global_step);
  }
  return caf::none;
}

} // namespace

caf::error take_switches(sparse_task& t) {
  if (!t.self)
    return caf::none;
  // An empty mailbox, the common case, is seen without a receive: a receive
  // with a zero timeout still waits on a condition variable (a futex call
  // that times out at once, and a wake-up of the mutex: two system calls a step).
  for (bool more = !(*t.self)->mailbox().empty(); more;) {
    more = false;
    (*t.self)->receive(
      [&](switch_atom, const std::string& aggregator, const std::string& mode, uint64_t step) {
        more = true;
        t.switches.told_of_switch(mode);
        t.cursor.told_of_switch(mode);
        log::get()->info("worker {}: aggregator '{}' switched to {} at global step {}{}", t.task,
                         aggregator, mode, step,
                         mode == "sync" ? ": joining every ps again before the next push" : "");
      },
      caf::after(std::chrono::seconds{0}) >> [] {});
  }
  if (!t.switches.rejoin)
    return caf::none;
  t.switches.rejoin = false;
  return rejoin_all(t);
}

} // namespace af::sparse_job_detail
