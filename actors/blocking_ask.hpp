#pragma once
/// A blocking request from a session's actor system, for the code that runs
/// a training task on its own thread (dist/training.cpp,
/// dist/chief_start.cpp). A receiver that goes down while it is out answers
/// it at once (answer_if_down), not at its timeout.

#include <chrono>
#include <utility>

#include "caf/all.hpp"

#include "actors/answer_if_down.hpp"
#include "actors/session.hpp"
#include "messages/error.hpp"

namespace af {

template <class Result, class Handle, class... Ts>
caf::expected<Result> ask(session& s, const Handle& h, std::chrono::milliseconds timeout, Ts&&... xs) {
  caf::scoped_actor self{s.system()};
  caf::expected<Result> out{make_error(af_error::internal, "no answer")};
  auto request = self->request(h, timeout, std::forward<Ts>(xs)...);
  answer_if_down guard{caf::actor_cast<caf::strong_actor_ptr>(h),
                       caf::strong_actor_ptr{self->ctrl()}, request.id()};
  request.receive([&](Result& r) { out = std::move(r); },
                  [&](caf::error& e) { out = std::move(e); });
  return out;
}

} // namespace af
