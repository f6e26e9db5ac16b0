// Who may push to an aggregator: its members (joins, departures, events),
// their tokens and push numbers.
#include "dist/aggregator_detail.hpp"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af::aggregator_detail {

namespace {

/// Bytes of a member's token.
constexpr size_t token_bytes = 16;

/// Where the message being handled came from, for a refusal's log line: a
/// sender on another CAF node is named by its node (what it says of itself
/// is not believed); a local one (the data plane's thread, which names the
/// connection's peer) by `claimed`.
std::string origin(self_pointer self, const std::string& claimed) {
  auto sender = self->current_sender();
  if (sender && sender->node() != self->node())
    return "CAF node " + caf::to_string(sender->node());
  return claimed.empty() ? std::string{"this process"} : claimed;
}

} // namespace

std::string worker_name(const aggregator_actor_state& st, uint32_t w) {
  if (w < st.members.size() && !st.members[w].stats.task.empty()) {
    const auto& m = st.members[w].stats;
    return fmt::format("worker {} ({}{}{})", w, m.task, m.address.empty() ? "" : " at ",
                       m.address);
  }
  return fmt::format("worker {}", w);
}

aggregator_member& member(aggregator_actor_state& st, uint32_t w) {
  if (w >= st.members.size()) {
    // size_t: w + 1 in 32 bits is 0 for index 2^32 - 1 (a resize to nothing,
    // then a write past the end); the handlers bound w first all the same.
    st.members.resize(static_cast<size_t>(w) + 1);
    for (size_t i = 0; i < st.members.size(); ++i)
      st.members[i].stats.worker = static_cast<uint32_t>(i);
  }
  return st.members[w];
}

std::string members_pushing(uint32_t n) {
  return fmt::format("{} member{} push{}", n, n == 1 ? "" : "s", n == 1 ? "es" : "");
}

void add_event(aggregator_actor_state& st, std::string what) {
  log::get()->info("aggregator '{}': {}", st.spec.name, what);
  st.stats.events.push_back(std::move(what));
  if (st.stats.events.size() > max_events)
    st.stats.events.erase(st.stats.events.begin());
  st.stats.events_total += 1;
}

void note_push(aggregator_actor_state& st, uint32_t worker, uint64_t step) {
  auto& m = member(st, worker);
  auto now = clock_type::now();
  if (m.stats.pushes == 0)
    m.first_push = now;
  m.last_push = now;
  m.idle_logged = false;
  m.stats.pushes += 1;
  m.stats.last_step = step;
  st.stats.pushes += 1;
}

caf::expected<std::string> new_token(const aggregator_actor_state& st) {
  std::string out(token_bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1)
    return make_error(af_error::internal,
                      fmt::format("aggregator '{}': OpenSSL's RAND_bytes gave no token for a "
                                  "joining worker",
                                  st.spec.name));
  return out;
}

bool holds_token(const aggregator_member& m, const std::string& token) {
  return !m.token.empty() && token.size() == m.token.size()
         && CRYPTO_memcmp(token.data(), m.token.data(), token.size()) == 0;
}

caf::error stranger(self_pointer self, uint32_t worker, const char* what,
                    const std::string& from) {
  auto& st = self->state;
  bool joined = worker < st.members.size() && !st.members[worker].token.empty();
  auto msg = fmt::format("aggregator '{}' refused a {} for {} from {}: {}", st.spec.name, what,
                         worker_name(st, worker), origin(self, from),
                         joined ? "it does not carry the token that worker joined with (only "
                                  "the member that joined under an index speaks for it)"
                                : "that worker has not joined (a worker joins, and is given its "
                                  "token, before it pushes)");
  st.stats.last_refusal = msg;
  st.strangers += 1;
  if ((st.strangers & (st.strangers - 1)) == 0)
    log::get()->warn("{} ({} refused so far)", msg, st.strangers);
  return make_error(af_error::invalid_argument, std::move(msg));
}

caf::error check_worker(self_pointer self, uint32_t worker, const push_credentials& who) {
  auto& st = self->state;
  if (worker > max_worker_index || worker >= st.members.size()
      || !holds_token(st.members[worker], who.token))
    return stranger(self, worker, "push", who.from);
  bool joined = worker < st.members.size() && st.members[worker].joined;
  if (worker >= st.spec.workers && !joined)
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}' has workers 0..{} and those that joined, got a "
                                  "push from worker {}: a worker that is not in the job's config "
                                  "joins first (actorflow-train --join)",
                                  st.spec.name, st.spec.workers - 1, worker));
  if (st.round.is_done(worker) && st.members[worker].left && st.members[worker].link_down)
    return make_error(af_error::left,
                      fmt::format("aggregator '{}' took {} as left at global step {}, when its "
                                  "link went down ({}); it joins again to push (a worker "
                                  "whose ps was stopped past connection_timeout_ms does so "
                                  "by itself)",
                                  st.spec.name, worker_name(st, worker),
                                  st.members[worker].left_at, st.members[worker].left_why));
  if (st.round.is_done(worker))
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}': {} said it was done (or left) and pushes "
                                  "again; join again to come back",
                                  st.spec.name, worker_name(st, worker)));
  return caf::none;
}

bool already_taken(aggregator_actor_state& st, uint32_t worker, uint64_t seq) {
  auto& m = member(st, worker);
  if (seq == 0 || seq > m.seq_taken) {
    m.retries = 0; // a new push: the next episode of retries is logged afresh
    return false;
  }
  // Logged at the 1st, 2nd, 4th, ... retry of a member: a loop of them
  // (a forged push number) does not flood the log.
  m.retries += 1;
  if ((m.retries & (m.retries - 1)) == 0)
    log::get()->info("aggregator '{}': {} sent its push {} again (it took pushes up to {}); "
                     "answered, not applied twice ({} such retries so far)",
                     st.spec.name, worker_name(st, worker), seq, m.seq_taken, m.retries);
  return true;
}

void depart(self_pointer self, uint32_t worker, const std::string& why, bool link_down) {
  auto& st = self->state;
  auto& m = member(st, worker);
  if (m.left || worker >= st.round.workers() || st.round.is_done(worker))
    return;
  m.left = true;
  m.link_down = link_down;
  m.left_at = st.global_step;
  m.left_why = why;
  st.round.mark_done(worker);
  add_event(st, fmt::format("{} left at global step {} ({}); {} on", worker_name(st, worker),
                            st.global_step, why, members_pushing(st.round.active())));
  reconsider(self);
}

} // namespace af::aggregator_detail
