#pragma once
// A worker's membership of an aggregator, for tests that push to one
// directly (messages/aggregator.hpp: only the member that joined under an
// index pushes for it, with the token its join was answered with).

#include <chrono>
#include <cstdint>
#include <string>

#include "caf/all.hpp"

#include "messages/aggregator.hpp"
#include "messages/error.hpp"

namespace af::test {

/// Joins `worker` to `agg` with no actor; its token, or "" (and `why` set)
/// if the join was refused.
template <class Self>
std::string join_for_token(Self& self, const aggregator_actor& agg, uint32_t worker,
                           std::string* why = nullptr) {
  std::string token;
  self
    ->request(agg, std::chrono::seconds(10), join_atom::value, worker,
              "/job:worker/task:" + std::to_string(worker), std::string{"127.0.0.1:1"},
              uint32_t{1}, caf::actor{})
    .receive([&](uint64_t, std::string& t, uint64_t) { token = std::move(t); },
             [&](caf::error& e) {
               if (why)
                 *why = describe(e);
             });
  return token;
}

} // namespace af::test
