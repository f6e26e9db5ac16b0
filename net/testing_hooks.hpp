#pragma once
/// Where tests reach into the wire (issue 23, item 5). The library reads no
/// test environment variable, has no test config key and no *_for_testing
/// function: it only asks wire_test_hooks() here, which is null in every
/// program. The one definition of the hooks is the test-support code's
/// (tests/wire_test_hooks.cpp), compiled into the test binaries alone; the
/// library refers to it weakly, so that in a program the reference resolves
/// to null and nothing (no environment, no config, no flag) can turn a hook
/// on. A test binary sets the hooks in code; its own startup may read the
/// environment to do so (tests/CMakeLists.txt's run over UCX).

#include <cstdint>
#include <functional>
#include <string>

#include "caf/error.hpp"

namespace af {

class ucx_channel;

/// What a test may change in the wire's behaviour. Everything off by default.
struct wire_hooks {
  /// This process trusts the fabric as if its `[security]` said
  /// trusted_fabric = true: the nodes it starts take UCX (node.cpp), its data
  /// planes' limits start trusting (data_plane_limits::trusted_fabric), and
  /// its channels offer UCX (process_trusted_fabric()).
  bool trusted_fabric = false;

  /// When set: called instead of the client's UCX connect to the node's
  /// worker after the node took an offer (`mine`: the client's channel,
  /// `node_address`: the address the node answered with). A test fails the
  /// connect or sends it to a decoy address with it.
  std::function<caf::error(ucx_channel& mine, const std::string& node_address)> ucx_client_connect;

  /// When set: called by a UCX channel's read each time it takes `bytes` of
  /// the stream (from any thread at once: it must be thread-safe). A test
  /// makes a reader slow with it, so that a reply takes longer than a bound
  /// whatever the machine's speed.
  std::function<void(uint64_t bytes)> ucx_bytes_taken;

  /// When set: asked by an all-reduce rank (dist/allreduce_rendezvous.cpp)
  /// before it sets up one end of a shared-memory link: its `group`, its
  /// `rank`, and `end`: "create" (the segment it offers its right
  /// neighbour) or "open" (the one its left neighbour offered). An error
  /// fails that set-up as a full /dev/shm or a segment it cannot map would,
  /// so that a test makes shared memory fail on one rank's side alone.
  /// Called from the ranks' threads at once: it must be thread-safe.
  std::function<caf::error(const std::string& group, uint32_t rank, const char* end)>
    allreduce_shm_setup;
};

/// The hooks object, defined only by the test-support code (weak here: absent
/// from a program, where its address is null).
extern wire_hooks wire_hooks_of_tests __attribute__((weak));

/// The test binary's hooks, or null: always null in a program.
inline wire_hooks* wire_test_hooks() {
  return &wire_hooks_of_tests;
}

/// Whether a test hook makes this process trust the fabric (never in a program).
inline bool test_hooks_trust_fabric() {
  auto* hooks = wire_test_hooks();
  return hooks != nullptr && hooks->trusted_fabric;
}

} // namespace af
