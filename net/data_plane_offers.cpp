/// The data plane's moves off TCP, both ends: a client on this host offers
/// shared memory (net/shm_ring.hpp), a client on another host of a trusted
/// fabric offers UCX (net/ucx_link.hpp), after the node's first answer; the
/// node takes or declines the offer.
#include "net/data_plane.hpp"
#include "net/data_link.hpp"
#include "net/served_connection.hpp"
#include "net/testing_hooks.hpp"
#include "net/tls_io.hpp"

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

using namespace plane_io;

// -- the node's side -------------------------------------------------------------

namespace {

/// A client that sent more after its offer, before the answer: a client of
/// ours waits for it, and the move would leave those bytes behind. Told
/// why, then closed.
bool refuse_past_offer(served_connection& c, const char* what) {
  log::get()->warn("{} data plane: refused {}: it sent bytes after its offer of {}, before the "
                   "answer (not a client of ours)",
                   c.node_name, c.peer, what);
  send_error(c.io, af_error::invalid_argument,
             c.node_name + " data plane: bytes after an offer of " + what
               + ", before its answer (a client waits for the answer)");
  return false;
}

} // namespace

bool data_plane_server::serve_ucx_offer(served_connection& c, const wire::header& h) {
  auto& io = c.io;
  const auto& peer = c.peer;
  auto frame_ms = c.frame_ms;
  auto& ucx = c.ucx;
  auto& ucx_refused = c.ucx_refused;
  // A client on another host of a trusted fabric offers UCX: taken if
  // this node trusts the fabric too and has UCX; declined (the client
  // stays on TCP/TLS) otherwise, or if its address is not one UCX can
  // reach (logged: garbage here is a client's bug or a stranger).
  std::string theirs(h.payload_bytes, '\0');
  if (!theirs.empty()
      && c.ended(read_timed(io, theirs.data(), theirs.size(), frame_ms, frame_ms, false),
               "payload"))
    return false;
  if (c.bytes_past_offer())
    return refuse_past_offer(c, "UCX");
  const char* stays = c.tls ? "TLS" : "TCP";
  std::unique_ptr<ucx_channel> ch;
  if (c.shm || c.ucx) {
    log::get()->warn("{} data plane: {} offered UCX a second time; declined", node_name_, peer);
  } else if (!timeouts_.trusted_fabric) {
    log::get()->info("{} data plane: {} stays on {}: it offered UCX, but this node does not "
                     "trust the fabric (set [security] trusted_fabric = true on both ends "
                     "to allow unencrypted UCX)",
                     node_name_, peer, stays);
  } else if (auto bad = ucx_channel::check_offer(theirs); !bad.empty()) {
    // Checked before a worker is made (~14 ms of CPU each): a client
    // that sends garbage gets one refusal, then the connection closes.
    log::get()->warn("{} data plane: {} stays on {}: refused its offer of UCX: {}", node_name_,
                     peer, stays, bad);
    if (++ucx_refused > 1)
      return false;
  } else if (auto made = ucx_channel::create(); !made) {
    log::get()->info("{} data plane: {} stays on {}: {}", node_name_, peer, stays,
                     describe(made.error()));
  } else if (auto err = (*made)->connect(theirs)) {
    log::get()->warn("{} data plane: {} stays on {}: refused its offer of UCX: {}", node_name_,
                     peer, stays, describe(err));
    // An address UCX itself refused counts as one the check refused: the
    // next offer of this connection closes it (each costs a worker).
    if (++ucx_refused > 1)
      return false;
  } else {
    ch = std::move(*made);
  }
  wire::header reply;
  reply.kind = static_cast<uint8_t>(wire::kind::reply);
  reply.version = ch ? 1 : 0;
  reply.payload_bytes = ch ? ch->address().size() : 0;
  if (!send_frame(io, reply, nullptr, ch ? ch->address().data() : nullptr))
    return false;
  if (ch) {
    ucx = std::move(ch);
    c.move_to(ucx_bytes(*ucx));
    // Said once per connection: its frames now cross the fabric unencrypted.
    log::get()->info("{} data plane: {} moved to {} ([security] trusted_fabric: no TLS "
                     "from here on)",
                     node_name_, peer, ucx->transport());
  }
  return true;
}

bool data_plane_server::serve_shm_offer(served_connection& c, const wire::header& h,
                                        const std::string& name) {
  auto& io = c.io;
  const auto& peer = c.peer;
  auto& shm = c.shm;
  // A client on this host offers shared memory: taken if this node
  // allows it and the connection is plaintext on TCP still; declined
  // (the client stays on TCP) otherwise, or if the segment is not one
  // this process can map (another host, another user).
  if (c.bytes_past_offer())
    return refuse_past_offer(c, "shared memory");
  bool took = false;
  // (More than a segment may be is refused by open(); counted as the
  // most, so the sum cannot overflow.)
  auto offered = static_cast<int64_t>(std::min<uint64_t>(h.version, shm_channel::max_segment_bytes + 1));
  bool may = !shm && !c.ucx && !c.tls && timeouts_.shared_memory;
  // A peer on another host has no segment here; one it names would be a
  // segment of a client of this host (its name is in /dev/shm for a moment),
  // whose rings it could then take over or tear down.
  if (may && !shm_channel::same_host(io.fd)) {
    may = false;
    log::get()->warn("{} data plane: {} stays on TCP: it offered shared memory from another host",
                     node_name_, peer);
  }
  if (may && shm_mapped_.fetch_add(offered) + offered > timeouts_.max_shm_bytes) {
    shm_mapped_.fetch_sub(offered);
    log::get()->warn("{} data plane: {} stays on TCP: its {} bytes of shared memory would "
                     "take the node past its {} bytes for all clients (max_shm_bytes)",
                     node_name_, peer, offered, timeouts_.max_shm_bytes);
  } else if (may) {
    auto ch = shm_channel::open(name, h.version);
    if (ch) {
      shm = std::move(*ch);
      c.shm_share.bytes = offered;
      took = true;
    } else {
      shm_mapped_.fetch_sub(offered);
      log::get()->info("{} data plane: {} stays on TCP: {}", node_name_, peer,
                       describe(ch.error()));
    }
  }
  wire::header reply;
  reply.kind = static_cast<uint8_t>(wire::kind::reply);
  reply.version = took ? 1 : 0;
  if (!send_frame(io, reply, nullptr, nullptr))
    return false;
  if (took) {
    c.move_to(shm_bytes(*shm));
    log::get()->debug("{} data plane: {} is on shared memory", node_name_, peer);
  }
  return true;
}

// -- the client's side -----------------------------------------------------------

caf::error data_channel::upgrade_if_due(std::chrono::steady_clock::time_point deadline) {
  bool quiet = std::chrono::steady_clock::now() - last_reply_ >= std::chrono::milliseconds{100};
  auto err = make_offer(deadline);
  // The node may have closed a quiet connection (its idle timeout) just as
  // the offer went out, after reopen_if_closed_by_peer saw no EOF yet. No op
  // was sent: a fresh connection carries it (and offers after its first
  // answer), as a read is sent again after such a close.
  if (err && quiet && fd_ < 0 && is(err, af_error::peer_down) && reconnect())
    return {};
  return err;
}

caf::error data_channel::make_offer(std::chrono::steady_clock::time_point deadline) {
  if (shm_due_ && fd_ >= 0 && ucx_possible_ && !ucx_)
    return offer_ucx(deadline);
  if (!shm_due_ || fd_ < 0 || shm_)
    return {};
  shm_due_ = false;
  shm_possible_ = false; // offered once per connection
  // Answer slots as large as the largest answer so far (a worker's first
  // pull is its parameters: each step's answer is that large), so that the
  // answers can be used in place; none for small answers or huge ones.
  uint64_t slot = 0;
  if (largest_answer_ >= shm_channel::min_slot_answer && largest_answer_ <= shm_channel::max_slot_bytes)
    slot = (largest_answer_ + 4095) / 4096 * 4096;
  auto seg = shm_channel::create(shm_channel::default_ring_bytes, slot);
  if (!seg) {
    log::get()->info("the data connection to {} stays on TCP: {}", peer_, describe(seg.error()));
    return {};
  }
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::shm_offer);
  h.name_len = static_cast<uint32_t>((*seg)->name().size());
  h.version = (*seg)->segment_bytes();
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  const link tcp{fd_, bytes_};
  if (!send_frame(tcp, h, &(*seg)->name(), nullptr, &bound))
    return fail("an offer of shared memory", errno, timeout_, true);
  wire::header r;
  // A Ctrl-C while a stopped node does not answer the offer (a call's
  // first op on a fresh connection) ends the wait within 20 ms, not at
  // the deadline (seconds), as the call's own reply does.
  if (cancel_)
    if (auto err = await_readable("an offer of shared memory", deadline))
      return err;
  if (!read_all(tcp, &r, sizeof(r), nullptr, &deadline))
    return fail("an offer of shared memory", errno);
  (*seg)->unlink(); // the node has mapped it (or never will): nothing left in /dev/shm
  auto problem = wire::validate(r);
  if (problem.empty() && (r.kind != static_cast<uint8_t>(wire::kind::reply) || r.status != 0
                          || r.payload_bytes != 0 || r.version > 1))
    problem = "not the answer to an offer of shared memory";
  if (!problem.empty()) {
    drop();
    return make_error(af_error::internal, peer_ + " sent a bad data-plane frame: " + problem);
  }
  if (r.version == 1) {
    shm_ = std::move(*seg);
    move_to(shm_bytes(*shm_));
  }
  return {};
}

caf::error data_channel::offer_ucx(std::chrono::steady_clock::time_point deadline) {
  shm_due_ = false;
  ucx_possible_ = false; // offered once per connection
  const char* stays = stream_ != nullptr ? "TLS" : "TCP";
  auto mine = ucx_channel::create();
  if (!mine) {
    log::get()->info("the data connection to {} stays on {}: {}", peer_, stays,
                     describe(mine.error()));
    return {};
  }
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::ucx_offer);
  h.payload_bytes = (*mine)->address().size();
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  const link tcp{fd_, bytes_};
  if (!send_frame(tcp, h, nullptr, (*mine)->address().data(), &bound))
    return fail("an offer of UCX", errno, timeout_, true);
  wire::header r;
  if (!read_all(tcp, &r, sizeof(r), nullptr, &deadline))
    return fail("an offer of UCX", errno);
  auto problem = wire::validate(r);
  if (problem.empty()
      && (r.kind != static_cast<uint8_t>(wire::kind::reply) || r.status != 0 || r.version > 1
          || r.has_tensor || (r.version == 1) != (r.payload_bytes > 0)
          || r.payload_bytes > ucx_channel::max_address_bytes))
    problem = "not the answer to an offer of UCX";
  if (!problem.empty()) {
    drop();
    return make_error(af_error::internal, peer_ + " sent a bad data-plane frame: " + problem);
  }
  if (r.version == 0) {
    log::get()->info("the data connection to {} stays on {}: the node declined UCX (does it set "
                     "[security] trusted_fabric = true? its log says why)",
                     peer_, stays);
    return {};
  }
  std::string theirs(r.payload_bytes, '\0');
  if (!read_all(tcp, theirs.data(), theirs.size(), nullptr, &deadline))
    return fail("an offer of UCX", errno);
  // A test binary may stand in for the connect (net/testing_hooks.hpp).
  auto* hooks = wire_test_hooks();
  auto err = hooks != nullptr && hooks->ucx_client_connect ? hooks->ucx_client_connect(**mine, theirs)
                                                           : (*mine)->connect(theirs);
  if (err) {
    // The node is on UCX now, this end cannot follow: a fresh connection on
    // TCP/TLS carries the op, and this channel offers UCX no more (a path
    // UCX cannot take stays so; said once).
    ucx_failed_ = true;
    remember_ucx_failure(host_ + ":" + std::to_string(port_));
    drop();
    log::get()->warn("the data connection to {} goes on {}: the node took this process's offer of "
                     "UCX, but its worker address is not one UCX can reach from here ({}); "
                     "ACTORFLOW_DATA_UCX=off skips the offer, UCX_NET_DEVICES pins UCX to the "
                     "fabric's interfaces",
                     peer_, stays, describe(err));
    if (reconnect())
      return {};
    return make_error(af_error::unreachable,
                      peer_ + " took this process's offer of UCX, but its answer is not a worker "
                        "address UCX can reach (" + describe(err)
                        + "), and the connection on " + stays + " could not be opened again");
  }
  ucx_ = std::move(*mine);
  move_to(ucx_bytes(*ucx_));
  ucx_carried_ = false;
  return {};
}

caf::error data_channel::settle(std::chrono::milliseconds wait) {
  if (fd_ < 0 || shm_ || ucx_ || !(shm_possible_ || ucx_possible_))
    return {};
  shm_due_ = true; // as after a first answer: offer before the next request
  restore_timeouts(); // the offer's answer waits the channel's timeout, not a call's
  return upgrade_if_due(std::chrono::steady_clock::now()
                        + (wait.count() > 0 ? wait : timeout_));
}

} // namespace af
