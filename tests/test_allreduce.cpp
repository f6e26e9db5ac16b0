// The rendezvous store (actors/kv_store.hpp) and the all-reduce ring
// (dist/allreduce.hpp): ranks are threads of this process, each with its
// own group, all meeting through one store actor over loopback.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "caf/all.hpp"

#include "dist/allreduce.hpp"
#include "dist/allreduce_shm.hpp"
#include "actors/kv_store.hpp"
#include "actors/system.hpp"
#include "messages/error.hpp"
#include "net/testing_hooks.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

bool contains(const caf::error& err, const std::string& text) {
  return describe(err).find(text) != std::string::npos;
}

struct store_fixture {
  store_fixture() : sys(cfg), store(spawn_kv_store(sys)), client(sys, store, 10s) {
    // nop
  }
  ~store_fixture() {
    caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
  }
  system_config cfg;
  caf::actor_system sys;
  kv_store_actor store;
  kv_client client;
};

/// Sets ACTORFLOW_DATA_SHM for its lifetime (before the ranks' threads
/// start), then puts back what was.
struct shm_switch {
  bool had = false;
  std::string was;
  explicit shm_switch(const char* value) {
    if (const char* v = std::getenv("ACTORFLOW_DATA_SHM")) {
      had = true;
      was = v;
    }
    if (value != nullptr)
      setenv("ACTORFLOW_DATA_SHM", value, 1);
    else
      unsetenv("ACTORFLOW_DATA_SHM");
  }
  ~shm_switch() {
    if (had)
      setenv("ACTORFLOW_DATA_SHM", was.c_str(), 1);
    else
      unsetenv("ACTORFLOW_DATA_SHM");
  }
};

/// A gradient whose elements span several orders of magnitude, so that
/// summing them in another order gives other bits.
std::vector<float> gradient_of(uint32_t rank, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank)
                                * std::pow(10.0, static_cast<int>((i + 3 * rank) % 7) - 3));
  return out;
}

/// Runs `body(rank, group)` on `size` threads, each joining `group` first;
/// the errors of create() or of the body, by rank.
std::vector<caf::error>
run_ranks(store_fixture& f, uint32_t size, const std::string& group,
          const std::function<caf::error(uint32_t, allreduce_group&)>& body,
          std::chrono::milliseconds timeout = 10s) {
  std::vector<caf::error> errors(size);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      auto g = allreduce_group::create(r, size, group, f.client, timeout);
      if (!g) {
        errors[r] = std::move(g.error());
        return;
      }
      errors[r] = body(r, **g);
    });
  for (auto& t : threads)
    t.join();
  return errors;
}

} // namespace

// -- the store ---------------------------------------------------------------------

TEST_CASE("a kv store answers a get of a key that has a value at once, and a put replaces it",
          "[allreduce]") {
  store_fixture f;
  REQUIRE_FALSE(f.client.put("g/addr/0", "127.0.0.1:1"));
  CHECK(f.client.get("g/addr/0", 0ms) == std::string{"127.0.0.1:1"});
  REQUIRE_FALSE(f.client.put("g/addr/0", "127.0.0.1:2"));
  CHECK(f.client.get("g/addr/0", 1s) == std::string{"127.0.0.1:2"});
  REQUIRE_FALSE(f.client.put("g/empty", ""));
  CHECK(f.client.get("g/empty", 0ms) == std::string{});
}

// Catches a get that answers "no value" instead of waiting, or a put that
// forgets the parked gets of its key.
TEST_CASE("a kv get that arrives before its key's put is answered by the put", "[allreduce]") {
  store_fixture f;
  caf::scoped_actor self{f.sys, true};
  // Both from one sender: the store sees the get before the put.
  auto get = self->request(f.store, 10s, kv_get_atom::value, std::string{"k"}, uint32_t{10000});
  auto other = self->request(f.store, 10s, kv_get_atom::value, std::string{"other"}, uint32_t{10000});
  auto put = self->request(f.store, 10s, kv_put_atom::value, std::string{"k"}, std::string{"v"});
  std::string got = "(none)";
  get.receive([&](std::string& v) { got = v; }, [&](caf::error& e) { FAIL(describe(e)); });
  CHECK(got == "v");
  put.receive([](caf::ok_atom) {}, [&](caf::error& e) { FAIL(describe(e)); });
  // The waiter for another key is still parked: its put answers it.
  REQUIRE_FALSE(f.client.put("other", "w"));
  other.receive([&](std::string& v) { got = v; }, [&](caf::error& e) { FAIL(describe(e)); });
  CHECK(got == "w");
}

// Catches a store that never answers a waiter (a client hangs), or one whose
// sweep only honours the first deadline it was given.
TEST_CASE("a kv get of a key nobody puts fails at its own timeout, naming the key", "[allreduce]") {
  store_fixture f;
  auto none = f.client.get("g/addr/7", 0ms);
  REQUIRE_FALSE(none);
  CHECK(is(none.error(), af_error::timeout));
  CHECK(contains(none.error(), "'g/addr/7'"));
  caf::scoped_actor self{f.sys, true};
  // A long wait parked first must not hold back the short one behind it.
  auto slow = self->request(f.store, 20s, kv_get_atom::value, std::string{"slow"}, uint32_t{10000});
  auto start = std::chrono::steady_clock::now();
  auto quick = f.client.get("g/addr/1", 50ms);
  auto waited = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(quick);
  CHECK(is(quick.error(), af_error::timeout));
  CHECK(contains(quick.error(), "'g/addr/1'"));
  CHECK(contains(quick.error(), "50 ms"));
  CHECK(waited >= 50ms);
  CHECK(waited < 5s);
  REQUIRE_FALSE(f.client.put("slow", "x"));
  std::string got;
  slow.receive([&](std::string& v) { got = v; }, [&](caf::error& e) { FAIL(describe(e)); });
  CHECK(got == "x");
}

// Catches a store that grows without bound (a worker that publishes in a
// loop takes the chief's memory) or refuses replacing a key at the limit.
TEST_CASE("a kv store refuses keys and values over 64 KiB and more than 4096 keys", "[allreduce]") {
  store_fixture f;
  std::string big(kv_store_limits::max_value_bytes + 1, 'x');
  auto value = f.client.put("k", big);
  CHECK(is(value, af_error::resource_exhausted));
  CHECK(contains(value, "'k'"));
  CHECK(contains(value, "65536"));
  CHECK_FALSE(f.client.put("k", big.substr(1)));
  auto key = f.client.put(big, "v");
  CHECK(is(key, af_error::resource_exhausted));
  auto get = f.client.get(big, 0ms);
  REQUIRE_FALSE(get);
  CHECK(is(get.error(), af_error::resource_exhausted));
  for (size_t i = 1; i < kv_store_limits::max_keys; ++i)
    REQUIRE_FALSE(f.client.put("key/" + std::to_string(i), "v"));
  auto full = f.client.put("one/too/many", "v");
  CHECK(is(full, af_error::resource_exhausted));
  CHECK(contains(full, "4096"));
  CHECK(contains(full, "'one/too/many'"));
  CHECK_FALSE(f.client.put("key/1", "replaced"));
  CHECK(f.client.get("key/1", 0ms) == std::string{"replaced"});
}

// Catches waiters that outlive their requester: a worker that dies while
// waiting would hold a place among the store's waiters until its timeout.
TEST_CASE("a kv store drops the waiters of a requester that dies", "[allreduce]") {
  store_fixture f;
  {
    caf::scoped_actor doomed{f.sys, true};
    for (size_t i = 0; i < kv_store_limits::max_waiters; ++i)
      doomed->send(f.store, kv_get_atom::value, "never/" + std::to_string(i), uint32_t{600000});
    auto full = f.client.get("one/more", 60000ms);
    REQUIRE_FALSE(full);
    CHECK(is(full.error(), af_error::resource_exhausted));
  } // doomed terminates here
  // The store learns of the death from a down message: ask until it has.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  caf::error last;
  do {
    auto r = f.client.get("one/more", 1ms);
    REQUIRE_FALSE(r);
    last = r.error();
  } while (is(last, af_error::resource_exhausted) && std::chrono::steady_clock::now() < deadline);
  CHECK(is(last, af_error::timeout));
}

TEST_CASE("a kv client whose store is gone fails instead of hanging", "[allreduce]") {
  store_fixture f;
  caf::anon_send_exit(f.store, caf::exit_reason::user_shutdown);
  caf::scoped_actor self{f.sys, true};
  self->wait_for(f.store);
  auto err = f.client.put("k", "v");
  CHECK(is(err, af_error::peer_down));
  auto got = f.client.get("k", 60000ms);
  REQUIRE_FALSE(got);
  CHECK(is(got.error(), af_error::peer_down));
}

// -- the ring ----------------------------------------------------------------------

// Catches wrong segment arithmetic for counts the ranks do not divide (lost
// or doubled elements), a mean divided twice or not at all, and any
// rank-dependent summation order (ranks that end with different bits would
// apply different updates).
TEST_CASE("2 and 3 ranks all-reduce to the mean, with bit-identical results on every rank",
          "[allreduce]") {
  store_fixture f;
  for (uint32_t size : {2u, 3u}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{(1u << 20) + 3}}) {
      INFO(size << " ranks, " << n << " floats");
      std::vector<std::vector<float>> data(size);
      for (uint32_t r = 0; r < size; ++r)
        data[r] = gradient_of(r, n);
      // The exact mean, and the scale of float rounding in a sum of these.
      std::vector<double> expected(n, 0.0);
      std::vector<double> scale(n, 0.0);
      for (uint32_t r = 0; r < size; ++r)
        for (size_t i = 0; i < n; ++i) {
          expected[i] += data[r][i] / static_cast<double>(size);
          scale[i] += std::abs(data[r][i]) / static_cast<double>(size);
        }
      auto errors = run_ranks(f, size, "mean/" + std::to_string(size) + "/" + std::to_string(n),
                              [&](uint32_t r, allreduce_group& g) {
                                return g.allreduce_mean(data[r].data(), n);
                              });
      for (auto& err : errors)
        REQUIRE_FALSE(err);
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i)
        if (std::abs(data[0][i] - expected[i]) > 1e-6 * scale[i])
          ++wrong;
      CHECK(wrong == 0);
      for (uint32_t r = 1; r < size; ++r)
        CHECK(std::memcmp(data[r].data(), data[0].data(), n * sizeof(float)) == 0);
    }
  }
}

// Catches state left over between calls (the scratch buffer, the call
// counter) and a broadcast that does not reach every rank.
TEST_CASE("a group serves repeated sums, means and broadcasts from any root", "[allreduce]") {
  store_fixture f;
  const uint32_t size = 3;
  const size_t n = 1000;
  std::vector<std::vector<float>> results(size);
  auto errors = run_ranks(f, size, "repeat", [&](uint32_t r, allreduce_group& g) -> caf::error {
    CHECK(g.rank() == r);
    CHECK(g.size() == size);
    std::vector<float> v(n, static_cast<float>(r + 1));
    for (int round = 0; round < 3; ++round) {
      if (auto err = g.allreduce_sum(v.data(), n))
        return err;
    }
    // 1+2+3 = 6, then 18, then 54 everywhere.
    if (v != std::vector<float>(n, 54.0f))
      return make_error(af_error::internal, "rank " + std::to_string(r) + ": wrong sums");
    for (uint32_t root = 0; root < size; ++root) {
      std::vector<float> b(n, -1.0f);
      if (r == root)
        for (size_t i = 0; i < n; ++i)
          b[i] = static_cast<float>(root * 1000 + i);
      if (auto err = g.broadcast(b.data(), n, root))
        return err;
      for (size_t i = 0; i < n; ++i)
        if (b[i] != static_cast<float>(root * 1000 + i))
          return make_error(af_error::internal, "rank " + std::to_string(r)
                                                  + ": wrong broadcast from rank "
                                                  + std::to_string(root));
    }
    std::vector<float> m(n, static_cast<float>(3 * r));
    if (auto err = g.allreduce_mean(m.data(), n))
      return err;
    results[r] = m;
    return caf::none;
  });
  for (auto& err : errors) { // every rank's: the first to fail says why
    INFO(describe(err));
    CHECK_FALSE(err);
  }
  for (auto& m : results)
    CHECK(m == std::vector<float>(n, 3.0f));
}

TEST_CASE("a group of one is a no-op and a broadcast from a rank outside the group is refused",
          "[allreduce]") {
  store_fixture f;
  auto g = allreduce_group::create(0, 1, "solo", f.client, 1s);
  REQUIRE(g);
  std::vector<float> v{1, 2, 3};
  CHECK_FALSE((*g)->allreduce_mean(v.data(), v.size()));
  CHECK_FALSE((*g)->broadcast(v.data(), v.size(), 0));
  CHECK(v == std::vector<float>{1, 2, 3});
  auto bad = (*g)->broadcast(v.data(), v.size(), 1);
  CHECK(is(bad, af_error::invalid_argument));
  CHECK(f.client.get("solo/addr/0", 0ms) == (*g)->address());
  auto out_of_range = allreduce_group::create(2, 2, "bad", f.client, 1s);
  REQUIRE_FALSE(out_of_range);
  CHECK(is(out_of_range.error(), af_error::invalid_argument));
}

// Catches a rendezvous that waits forever for a worker that never started,
// or whose error does not say which one it was.
TEST_CASE("create() fails after its timeout naming the rank that never joined", "[allreduce]") {
  store_fixture f;
  std::vector<caf::error> errors(2);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      // Rank 2 of 3 never comes: rank 1 waits for its address, rank 0 for its
      // connection.
      auto g = allreduce_group::create(r, 3, "missing", f.client, 300ms);
      errors[r] = g ? caf::error{} : g.error();
    });
  for (auto& t : threads)
    t.join();
  auto waited = std::chrono::steady_clock::now() - start;
  for (uint32_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << describe(errors[r]));
    REQUIRE(errors[r]);
    CHECK(is(errors[r], af_error::timeout));
    CHECK(contains(errors[r], "rank 2"));
    CHECK(contains(errors[r], "300 ms"));
  }
  CHECK(contains(errors[1], "'missing/addr/2'"));
  CHECK(waited < 5s);
}

// Catches a ring that hangs (or waits for its timeout) when a peer goes away,
// and a failure that does not travel on to the ranks not next to it, on
// shared memory (its doorbell socket closing) and on TCP.
TEST_CASE("a rank whose peer destroys its group mid-way fails at once, naming the peer",
          "[allreduce]") {
  store_fixture f;
  for (const char* shm : {static_cast<const char*>(nullptr), "off"})
  for (uint32_t size : {2u, 3u}) {
    shm_switch transport{shm};
    INFO(size << " ranks, " << (shm == nullptr ? "shared memory" : "TCP"));
    const uint32_t quitter = size - 1;
    const size_t n = (1u << 20) + 3;
    auto start = std::chrono::steady_clock::now();
    auto errors = run_ranks(
      f, size, std::string{"quit/"} + (shm == nullptr ? "shm/" : "tcp/") + std::to_string(size),
      [&](uint32_t r, allreduce_group& g) -> caf::error {
        std::vector<float> v(n, 1.0f);
        // One call that works, then the quitter leaves while the others
        // are in their second.
        if (auto err = g.allreduce_mean(v.data(), n))
          return err;
        if (r == quitter)
          return caf::none; // its group is destroyed on return
        auto err = g.allreduce_mean(v.data(), n);
        if (!err)
          return make_error(af_error::internal, "the second call succeeded without the quitter");
        auto again = g.allreduce_mean(v.data(), n);
        if (!is(again, af_error::aborted))
          return make_error(af_error::internal, "a broken group took another call: " + describe(again));
        return err;
      },
      30s);
    auto waited = std::chrono::steady_clock::now() - start;
    CHECK_FALSE(errors[quitter]);
    for (uint32_t r = 0; r < quitter; ++r) {
      INFO("rank " << r << ": " << describe(errors[r]));
      CHECK(is(errors[r], af_error::peer_down));
    }
    // The first rank to fail names the quitter; with 3 ranks the other may
    // name the rank that failed first (the failure travels on).
    auto named = "rank " + std::to_string(quitter) + " closed";
    if (size == 2)
      CHECK(contains(errors[0], named));
    else
      CHECK((contains(errors[0], named) || contains(errors[1], named)));
    CHECK(waited < 10s);
  }
}

// Catches a rank that sits in a call its peer never makes, with no bound.
TEST_CASE("a call that a peer never makes fails after the timeout, naming the peer", "[allreduce]") {
  store_fixture f;
  std::vector<float> v(10, 1.0f);
  std::promise<void> finished;
  auto finished_future = finished.get_future();
  auto errors = run_ranks(
    f, 2, "silent",
    [&](uint32_t r, allreduce_group& g) -> caf::error {
      if (r == 1) {
        finished_future.wait(); // joined, but makes no call
        return caf::none;
      }
      auto err = g.allreduce_mean(v.data(), v.size());
      finished.set_value();
      return err;
    },
    200ms);
  REQUIRE(errors[0]);
  CHECK(is(errors[0], af_error::timeout));
  CHECK(contains(errors[0], "waiting for rank 1"));
  CHECK(contains(errors[0], "200 ms"));
}

// Catches ranks in different calls mixing their bytes into wrong results.
TEST_CASE("ranks that make different calls both fail instead of mixing their data", "[allreduce]") {
  store_fixture f;
  auto errors = run_ranks(f, 2, "mismatch", [&](uint32_t r, allreduce_group& g) -> caf::error {
    std::vector<float> v(8, 1.0f);
    return r == 0 ? g.allreduce_mean(v.data(), 7) : g.allreduce_mean(v.data(), 8);
  });
  for (auto& err : errors) {
    INFO(describe(err));
    CHECK(is(err, af_error::invalid_argument));
    CHECK(contains(err, "same calls in the same order"));
  }
  CHECK(contains(errors[0], "rank 1's call #1 is allreduce_mean of 8 floats"));
}

// Catches a call whose 32-byte header goes in a send (and is taken in a
// receive) of its own: on an idle machine each system call, and the wake of
// a peer for 32 bytes, is a fixed cost of every call.
TEST_CASE("a call's header rides in one send and one receive with the first data", "[allreduce]") {
  store_fixture f;
  shm_switch off{"off"};
  std::vector<allreduce_group::call_stats> stats(2);
  auto errors = run_ranks(f, 2, "header-rides", [&](uint32_t r, allreduce_group& g) -> caf::error {
    std::vector<float> v(1000, static_cast<float>(r));
    for (int round = 0; round < 3; ++round)
      if (auto err = g.allreduce_mean(v.data(), v.size()))
        return err;
    stats[r] = g.last_call();
    return v == std::vector<float>(1000, 0.5f) ? caf::none
                                               : make_error(af_error::internal, "wrong mean");
  });
  for (uint32_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    REQUIRE_FALSE(errors[r]);
    // header + 500 floats, then the 500 averaged floats; in: the peer's
    // header with its 500 floats, then its 500 averaged ones
    CHECK(stats[r].sends == 2);
    CHECK(stats[r].receives == 2);
  }
}

// Catches sends and receives cut into 256 KiB slices: 4 MiB then took about
// 42 system calls a rank per call against the raw exchange's 7.
TEST_CASE("a 2-rank all-reduce of 4 MiB on TCP moves more than 256 KiB per send", "[allreduce]") {
  store_fixture f;
  shm_switch off{"off"};
  const size_t n = size_t{1} << 20;
  std::vector<allreduce_group::call_stats> stats(2);
  auto errors = run_ranks(f, 2, "no-slices", [&](uint32_t r, allreduce_group& g) -> caf::error {
    std::vector<float> v(n, static_cast<float>(r));
    for (int round = 0; round < 2; ++round)
      if (auto err = g.allreduce_mean(v.data(), n))
        return err;
    stats[r] = g.last_call();
    return caf::none;
  });
  for (uint32_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << stats[r].sends << " sends, " << stats[r].receives
                  << " receives, largest send " << stats[r].largest_send);
    REQUIRE_FALSE(errors[r]);
    // the header and the first 2 MiB go into an idle 8 MiB socket buffer
    CHECK(stats[r].largest_send > 256 * 1024);
  }
}

// -- shared memory -----------------------------------------------------------------

namespace {

/// What every rank of a group ended with after a mean, a sum and a
/// broadcast of gradient_of(rank, n), and how its links went.
struct ring_results {
  std::vector<std::vector<float>> mean, sum, bcast;
  // One byte per rank, not std::vector<bool>: each rank's thread writes its
  // own, and vector<bool>'s packed bits in one word lost some of them.
  std::vector<uint8_t> shm_out, shm_in;
  std::vector<std::string> transport;
};

ring_results run_calls(store_fixture& f, uint32_t size, size_t n, const std::string& group,
                       std::chrono::milliseconds timeout = 10s) {
  ring_results out;
  out.mean.resize(size);
  out.sum.resize(size);
  out.bcast.resize(size);
  out.shm_out.resize(size);
  out.shm_in.resize(size);
  out.transport.resize(size);
  auto errors = run_ranks(f, size, group, [&](uint32_t r, allreduce_group& g) -> caf::error {
    out.shm_out[r] = g.shm_to_right();
    out.shm_in[r] = g.shm_from_left();
    out.transport[r] = g.transport();
    out.mean[r] = gradient_of(r, n);
    if (auto err = g.allreduce_mean(out.mean[r].data(), n))
      return err;
    out.sum[r] = gradient_of(r + 7, n);
    if (auto err = g.allreduce_sum(out.sum[r].data(), n))
      return err;
    out.bcast[r] = gradient_of(r + 11, n);
    return g.broadcast(out.bcast[r].data(), n, size - 1);
  }, timeout);
  for (auto& err : errors) {
    INFO((err ? describe(err) : std::string{}));
    REQUIRE_FALSE(err);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Names of all-reduce segments this process left in /dev/shm.
size_t segments_left() {
  size_t count = 0;
  std::string prefix = std::string{shm_link::name_prefix + 1} + std::to_string(::getpid()) + "-";
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0)
      ++count;
  return count;
}

} // namespace

// Catches a shared-memory ring that is not used on one host, or that adds,
// divides or copies otherwise than the TCP ring (other bits).
TEST_CASE("a ring on one host takes shared memory and gives the TCP ring's results, bit for bit",
          "[allreduce][shm]") {
  store_fixture f;
  for (uint32_t size : {2u, 3u}) {
    // 3,000,001 floats: a call writes more than a link's 8 MiB ring holds,
    // so the writers wait for room and the rings wrap within the call.
    for (size_t n : {size_t{1}, size_t{7}, size_t{(1u << 20) + 3}, size_t{3000001}}) {
      INFO(size << " ranks, " << n << " floats");
      auto tag = std::to_string(size) + "/" + std::to_string(n);
      ring_results tcp, shm;
      {
        shm_switch off{"off"};
        tcp = run_calls(f, size, n, "bits-tcp/" + tag);
      }
      {
        shm_switch on{nullptr};
        shm = run_calls(f, size, n, "bits-shm/" + tag);
      }
      for (uint32_t r = 0; r < size; ++r) {
        INFO("rank " << r << ": " << shm.transport[r]);
        CHECK_FALSE(tcp.shm_out[r]);
        CHECK_FALSE(tcp.shm_in[r]);
        CHECK(shm.shm_out[r]);
        CHECK(shm.shm_in[r]);
        CHECK(same_bits(shm.mean[r], tcp.mean[r]));
        CHECK(same_bits(shm.sum[r], tcp.sum[r]));
        CHECK(same_bits(shm.bcast[r], tcp.bcast[r]));
        // and every rank the same as rank 0 (the ring's own determinism)
        CHECK(same_bits(shm.mean[r], shm.mean[0]));
        CHECK(same_bits(shm.bcast[r], gradient_of(size - 1 + 11, n)));
      }
      // The names went as soon as the neighbours had mapped their segments.
      CHECK(segments_left() == 0);
    }
  }
}

// Catches a ring that takes shared memory although the data plane's switch
// says not to, or does not say why it stayed on TCP.
TEST_CASE("with ACTORFLOW_DATA_SHM=off a ring on one host stays on TCP and says why",
          "[allreduce][shm]") {
  store_fixture f;
  shm_switch off{"off"};
  auto res = run_calls(f, 3, 1000, "shm-off");
  for (uint32_t r = 0; r < 3; ++r) {
    INFO(res.transport[r]);
    CHECK_FALSE(res.shm_out[r]);
    CHECK_FALSE(res.shm_in[r]);
    CHECK(res.transport[r].find("TCP (ACTORFLOW_DATA_SHM=off here) to rank") != std::string::npos);
    CHECK(same_bits(res.mean[r], res.mean[0]));
  }
  CHECK(segments_left() == 0);
}

namespace {

/// Fails the shared-memory set-up of `rank`'s end `end` ("create" or "open")
/// of every group while it lives (net/testing_hooks.hpp), as a full
/// /dev/shm or a segment that rank cannot map would.
struct shm_setup_fails {
  shm_setup_fails(uint32_t rank, std::string end) {
    REQUIRE(wire_test_hooks() != nullptr); // this binary has them (tests/wire_test_hooks.cpp)
    wire_test_hooks()->allreduce_shm_setup = [rank, end](const std::string&, uint32_t r,
                                                         const char* e) -> caf::error {
      if (r != rank || end != e)
        return caf::none;
      return make_error(af_error::resource_exhausted,
                        "the test hook failed rank " + std::to_string(r) + "'s " + e);
    };
  }
  ~shm_setup_fails() { wire_test_hooks()->allreduce_shm_setup = nullptr; }
  shm_setup_fails(const shm_setup_fails&) = delete;
  shm_setup_fails& operator=(const shm_setup_fails&) = delete;
};

/// The same calls with every link on TCP: the bits the others must give.
ring_results tcp_reference(store_fixture& f, uint32_t ranks, size_t n, const std::string& group) {
  shm_switch off{"off"};
  return run_calls(f, ranks, n, group, 5s);
}

} // namespace

// Catches two ranks whose links took different transports: one direction in
// shared memory, the other on TCP, on the one connection they share. The
// shared-memory link's bells then land inside the TCP link's data (3,000,001
// floats overfill the 8 MiB ring, so a writer waits for room and is rung):
// wrong bits, a call header that does not match, or a hang until the
// group's timeout. Both must fall back to TCP both ways and say so.
TEST_CASE("two ranks whose shared memory fails on one side only both take TCP both ways and say "
          "why",
          "[allreduce][shm]") {
  store_fixture f;
  const size_t n = 3000001;
  auto tcp = tcp_reference(f, 2, n, "fallback-tcp");
  shm_switch on{nullptr};
  for (uint32_t rank : {0u, 1u})
    for (const char* end : {"create", "open"}) {
      INFO("rank " << rank << "'s " << end << " fails");
      auto group = std::string{"fallback/"} + end + "/" + std::to_string(rank);
      ring_results res;
      {
        shm_setup_fails fails{rank, end};
        res = run_calls(f, 2, n, group, 5s);
      }
      for (uint32_t r = 0; r < 2; ++r) {
        INFO("rank " << r << ": " << res.transport[r]);
        CHECK_FALSE(res.shm_out[r]);
        CHECK_FALSE(res.shm_in[r]);
        CHECK(res.transport[r].rfind("TCP to and from rank " + std::to_string(1 - r)
                                       + ": shared memory fell back to TCP, as the link ",
                                     0)
              == 0);
        CHECK(same_bits(res.mean[r], tcp.mean[r]));
        CHECK(same_bits(res.sum[r], tcp.sum[r]));
        CHECK(same_bits(res.bcast[r], tcp.bcast[r]));
      }
      // The rank whose set-up failed names the hook's reason; the other, its answer.
      CHECK(res.transport[rank].find("the test hook failed rank " + std::to_string(rank) + "'s "
                                     + end)
            != std::string::npos);
      CHECK(segments_left() == 0);
    }
}

// Catches a ring of three whose links cannot differ: each link has its own
// connection, so one link on TCP leaves the others in shared memory, and the
// results are the TCP ring's bits.
TEST_CASE("in a ring of three, a link whose shared memory fails on one side stays on TCP alone",
          "[allreduce][shm]") {
  store_fixture f;
  const size_t n = 3000001;
  auto tcp = tcp_reference(f, 3, n, "fallback3-tcp");
  shm_switch on{nullptr};
  // rank 1's create fails: the link 1 -> 2; rank 0's open fails: the link 2 -> 0.
  for (auto [rank, end, writer] : {std::tuple{1u, "create", 1u}, std::tuple{0u, "open", 2u}}) {
    INFO("rank " << rank << "'s " << end << " fails");
    ring_results res;
    {
      shm_setup_fails fails{rank, end};
      res = run_calls(f, 3, n, std::string{"fallback3/"} + end, 5s);
    }
    for (uint32_t r = 0; r < 3; ++r) {
      INFO("rank " << r << ": " << res.transport[r]);
      CHECK(res.shm_out[r] == (r != writer));
      CHECK(res.shm_in[r] == (r != (writer + 1) % 3));
      CHECK(same_bits(res.mean[r], tcp.mean[r]));
      CHECK(same_bits(res.sum[r], tcp.sum[r]));
      CHECK(same_bits(res.bcast[r], tcp.bcast[r]));
    }
    CHECK(segments_left() == 0);
  }
}
