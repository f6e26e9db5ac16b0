// The data-plane server without the runtime: a fake plane_handler (no
// variable actors, no actor system) shows that the wire stands alone
// (net/plane_handler.hpp), and that each frame kind reaches its call. Built
// into actorflow-net-tests, which links actorflow_net alone: a dependency of
// the wire on the runtime (actors/, dist/) fails to link there.
#include <catch2/catch.hpp>

#include <chrono>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "net/plane_handler.hpp"
#include "value_of.hpp"
#include "core/wire_format.hpp"

using namespace af;
using af::testing::value_of;
using namespace std::chrono_literals;

namespace {

/// Echoes a variable op's operand (version 1000 + the request's), answers a
/// pull with step 77 and three floats, refuses edges and the variable
/// "refuse-me"; records what reached which call.
class fake_handler : public plane_handler {
public:
  struct seen {
    std::string call;
    std::string name;
    std::string peer;
    std::string transport;
  };

  bool variable_op(plane_request& req) override {
    note("variable_op", req);
    const auto& h = req.header();
    if (req.name() == "refuse-me")
      return req.refuse(af_error::not_found, "the fake has no 'refuse-me'");
    tensor operand;
    if (h.has_tensor) {
      operand.reset(static_cast<dtype>(h.dtype), wire::shape_of(h));
      if (!req.read_payload(operand.mutable_bytes()))
        return false;
    }
    wire::header reply;
    reply.version = 1000 + h.version;
    if (!operand.empty())
      wire::describe_tensor(operand, reply);
    return req.reply(reply, operand.empty() ? nullptr : operand.bytes());
  }

  bool aggregate(plane_request& req) override {
    note("aggregate", req);
    auto params = tensor::from_values<float>({3}, {1.5f, 2.5f, 3.5f});
    wire::header reply;
    reply.version = 77;
    wire::describe_tensor(params, reply);
    return req.reply(reply, params.bytes());
  }

  bool edge(plane_request& req) override {
    note("edge", req);
    return req.refuse(af_error::invalid_argument, "the fake takes no edges");
  }

  std::vector<seen> calls() {
    std::lock_guard<std::mutex> guard{mtx_};
    return calls_;
  }

private:
  void note(const char* call, const plane_request& req) {
    std::lock_guard<std::mutex> guard{mtx_};
    calls_.push_back({call, req.name(), req.peer(), req.transport()});
  }

  std::mutex mtx_;
  std::vector<seen> calls_;
};

} // namespace

TEST_CASE("the data-plane server hands each request frame to its plane_handler, one call per "
          "kind, and carries the handler's answers",
          "[wire][plane]") {
  auto handler = std::make_shared<fake_handler>();
  auto srv = value_of(data_plane_server::start(handler, "127.0.0.1", 0, "fake node"));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "fake node", 5s));

  // A variable op: the operand read into the handler's buffer, the reply
  // carried from the handler's buffer.
  auto t = tensor::from_values<float>({2, 2}, {1, 2, 3, 4});
  auto r = value_of(ch->call(var_op::assign, "w", &t, true, 5));
  CHECK(r.first == t);
  CHECK(r.second == 1005);

  // A refusal: its payload skipped, the connection goes on.
  auto refused = ch->call(var_op::assign, "refuse-me", &t, false);
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), af_error::not_found));
  CHECK(describe(refused.error()).find("the fake has no 'refuse-me'") != std::string::npos);
  CHECK_FALSE(ch->broken());
  CHECK(value_of(ch->call(var_op::read, "w", nullptr, true)).second == 1000);

  // A pull: to aggregate(), its name as sent.
  auto pulled = value_of(ch->aggregate(wire::kind::pull, "agg", 3, 9, {}, 5s));
  CHECK(pulled.first == 77);
  CHECK(pulled.second == tensor::from_values<float>({3}, {1.5f, 2.5f, 3.5f}));

  // An edge: to edge(); its refusal reaches the sender.
  std::string device = "/job:t/replica:0/task:1/device:CPU:0";
  auto sent = ch->send_edge(device, 1, std::string(16, 'k'), 2, 3, 0, t);
  CHECK(is(sent, af_error::invalid_argument));
  CHECK(describe(sent).find("the fake takes no edges") != std::string::npos);
  CHECK_FALSE(ch->broken());

  auto calls = handler->calls();
  REQUIRE(calls.size() == 5);
  CHECK(calls[0].call == "variable_op");
  CHECK(calls[0].name == "w");
  CHECK(calls[0].peer.rfind("127.0.0.1:", 0) == 0);
  CHECK(calls[1].call == "variable_op");
  CHECK(calls[1].name == "refuse-me");
  CHECK(calls[2].call == "variable_op");
  CHECK(calls[3].call == "aggregate");
  CHECK(calls[3].name == "agg");
  CHECK(calls[4].call == "edge");
  CHECK(calls[4].name.substr(sizeof(wire::edge_prefix)) == device);
  // The offers (shared memory after the first answer, where this host
  // allows it) are the wire's own: no call of the handler, and its
  // requests then say the transport the channel moved to.
  CHECK(calls[4].transport == ch->transport());
  srv->stop();
}
