// The spin before a sleep (net/adaptive_spin.hpp) of the rings' waits and a
// served TCP connection's wait for its next frame.
#include <catch2/catch.hpp>

#include <chrono>

#include "net/adaptive_spin.hpp"

using namespace af;
using namespace std::chrono_literals;

// Bugs it catches: a spin that goes on after its waits kept failing (a
// thread that burns a CPU its peer needs on every wait), one that never
// tries again (a ping-pong that slowed once would sleep for good), and one
// that spins with a zero spin.
TEST_CASE("a spin stops after failing in a row and probes now and then until one success resumes it",
          "[spin]") {
  adaptive_spin s;
  int looks = 0;
  auto never = [&] {
    ++looks;
    return false;
  };
  CHECK_FALSE(s.spin(0us, never));
  CHECK(looks == 0);
  for (uint32_t i = 0; i < adaptive_spin::misses_to_stop; ++i) {
    looks = 0;
    CHECK_FALSE(s.spin(5us, never));
    CHECK(looks >= 1); // it looked
  }
  // Failing in a row: the next waits sleep at once, but for one probe in
  // probe_every.
  int probes = 0;
  for (uint32_t i = 0; i < 2 * adaptive_spin::probe_every; ++i) {
    looks = 0;
    CHECK_FALSE(s.spin(5us, never));
    probes += looks > 0 ? 1 : 0;
  }
  CHECK(probes == 2);
  // A probe that succeeds resumes spinning for every wait.
  bool resumed = false;
  for (uint32_t i = 0; i < adaptive_spin::probe_every && !resumed; ++i)
    resumed = s.spin(5us, [] { return true; });
  REQUIRE(resumed);
  looks = 0;
  CHECK_FALSE(s.spin(5us, never));
  CHECK(looks >= 1);
  // Ready at the first look: true, one look.
  looks = 0;
  CHECK(s.spin(5us, [&] {
    ++looks;
    return true;
  }));
  CHECK(looks == 1);
}
