#include "actors/answer_if_down.hpp"

#include <memory>

#include "caf/abstract_actor.hpp"
#include "caf/attachable.hpp"
#include "caf/error.hpp"
#include "caf/mailbox_element.hpp"
#include "caf/sec.hpp"

namespace af {

namespace {

/// Distinct from the subtypes CAF matches its own attachables by (0 to 3).
constexpr size_t token_type = 0x61666164;

class bouncer final : public caf::attachable {
public:
  bouncer(caf::strong_actor_ptr requester, caf::message_id response)
    : requester_(std::move(requester)), response_(response) {
  }

  void actor_exited(const caf::error&, caf::execution_unit* host) override {
    requester_->enqueue(caf::make_mailbox_element(nullptr, response_, {},
                                                  caf::make_error(caf::sec::request_receiver_down)),
                        host);
  }

  bool matches(const token& what) override {
    return what.subtype == token_type && what.ptr == this;
  }

private:
  caf::strong_actor_ptr requester_;
  caf::message_id response_;
};

} // namespace

answer_if_down::answer_if_down(caf::strong_actor_ptr receiver, caf::strong_actor_ptr requester,
                               caf::message_id response) {
  // A local receiver's mailbox answers what it holds when it ends (CAF
  // bounces it): a second answer would only be left unread.
  if (!receiver || !requester || receiver->node() == requester->node())
    return;
  auto b = std::make_unique<bouncer>(std::move(requester), response);
  token_ = b.get();
  receiver_ = std::move(receiver);
  // On a receiver already down, attach() calls actor_exited at once.
  receiver_->get()->attach(std::move(b));
}

answer_if_down::~answer_if_down() {
  if (receiver_)
    receiver_->get()->detach(caf::attachable::token{token_type, token_});
}

} // namespace af
