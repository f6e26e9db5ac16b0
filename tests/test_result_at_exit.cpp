// actors/result_at_exit.hpp: an actor's result reaches the waiting thread
// only once the actor has ended and every watcher attached after it was
// told. Bug it catches: a result handed over before the actor quit (a
// worker process then hung at its end: docs/training.md).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "caf/all.hpp"

#include "actors/result_at_exit.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

struct delivery {
  std::promise<void> attached;  ///< the actor attached its result_at_exit
  std::promise<std::string> got; ///< what was delivered
  std::atomic<bool> watcher_told{false};
  bool told_before_delivery = false;
};

/// Sets its result to the string it gets (twice: the first counts), then quits.
caf::behavior reporter(caf::event_based_actor* self, std::shared_ptr<delivery> d) {
  auto result = result_at_exit<std::string>::attach(
    self,
    [d](std::string v) {
      d->told_before_delivery = d->watcher_told.load();
      d->got.set_value(std::move(v));
    },
    [](const caf::error& reason) { return "ended: " + caf::to_string(reason); });
  d->attached.set_value();
  return {
    [self, result](const std::string& v) {
      result->set(v);
      result->set("a second result");
      self->quit();
    },
  };
}

/// The actor, started detached, with a watcher attached after its own.
caf::actor start(caf::actor_system& sys, const std::shared_ptr<delivery>& d) {
  auto attached = d->attached.get_future();
  auto a = sys.spawn<caf::detached>(reporter, d);
  REQUIRE(attached.wait_for(10s) == std::future_status::ready); // the actor's start
  caf::actor_cast<caf::abstract_actor*>(a)->attach_functor([d] { d->watcher_told = true; });
  return a;
}

std::string delivered(const std::shared_ptr<delivery>& d) {
  auto got = d->got.get_future();
  REQUIRE(got.wait_for(10s) == std::future_status::ready); // the actor's end
  return got.get();
}

} // namespace

TEST_CASE("an actor's result is delivered after its later watchers were told of its end",
          "[result_at_exit]") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto d = std::make_shared<delivery>();
  auto a = start(sys, d);
  caf::anon_send(a, std::string{"the result"});
  CHECK(delivered(d) == "the result"); // the first set, not the second
  CHECK(d->told_before_delivery);
}

TEST_CASE("an actor that ends without a result delivers why it ended", "[result_at_exit]") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto d = std::make_shared<delivery>();
  auto a = start(sys, d);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  auto got = delivered(d);
  CHECK(got.rfind("ended: ", 0) == 0);
  CHECK(got.find("user_shutdown") != std::string::npos);
  CHECK(d->told_before_delivery);
}
