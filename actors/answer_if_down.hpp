#pragma once
/// A blocking request's guard against a receiver that goes down while the
/// request is out. CAF 0.17 fails no request in flight when the CAF link to
/// its receiver breaks (its node died, or was stopped past
/// connection_timeout_ms): the request is lost, and its sender waits the
/// whole timeout. While the guard lives, the receiver's going down answers
/// the request at once with request_receiver_down, as CAF answers one sent
/// where it has no route.
///
/// Only a remote receiver (a proxy) is watched: a local one answers what
/// its mailbox holds when it ends. An answer that comes as well (the real
/// one was on its way as the link broke) stays unread in the requester's
/// mailbox: no later request's receive takes it (response ids are never
/// reused), so a requester that lives long keeps one such message per
/// break. A receiver that hands the request on to another actor and then
/// goes down would be taken as not answering; no caller here asks one.

#include "caf/actor_control_block.hpp"
#include "caf/message_id.hpp"

namespace af {

class answer_if_down {
public:
  /// Watches `receiver` for the request that `requester` sent it, whose
  /// response has the id `response` (the request's handle's id()). A
  /// receiver already down answers at once.
  answer_if_down(caf::strong_actor_ptr receiver, caf::strong_actor_ptr requester,
                 caf::message_id response);
  ~answer_if_down();
  answer_if_down(const answer_if_down&) = delete;
  answer_if_down& operator=(const answer_if_down&) = delete;

private:
  caf::strong_actor_ptr receiver_;
  const void* token_ = nullptr;
};

} // namespace af
