// The data plane's frames and its server's answers to bad input.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <pthread.h>

#include <fstream>

#include "scenarios.hpp"
#include "messages/wire.hpp"

using namespace af;
using namespace af::testing;

TEST_CASE("data-plane headers are validated before anything is trusted", "[wire]") {
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::assign);
  REQUIRE(wire::describe_tensor(tensor::filled(dtype::float32, {2, 3}, 1), h));
  CHECK(h.payload_bytes == 24);
  CHECK(wire::validate(h).empty());
  CHECK(wire::shape_of(h) == shape_type{2, 3});
  auto bad = [&](auto mutate) {
    auto copy = h;
    mutate(copy);
    return wire::validate(copy);
  };
  CHECK(bad([](wire::header& x) { x.magic = 1; }).find("bad magic") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.kind = 99; }).find("unknown frame kind 99") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.dtype = 9; }).find("unknown dtype code 9") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.rank = 9; }).find("rank 9") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.dims[0] = -2; }).find("negative dimension") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.payload_bytes = 23; }).find("payload of 23 bytes") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.name_len = 1 << 20; }).find("variable name of") != std::string::npos);
  CHECK(bad([](wire::header& x) {
          x.rank = 4;
          for (int i = 0; i < 4; ++i)
            x.dims[i] = int64_t{1} << 20; // 2^80 elements: must not wrap around
        }).find("more than 2^40") != std::string::npos);
  CHECK_FALSE(wire::describe_tensor(tensor{dtype::float32, shape_type(9, 1)}, h));
}

TEST_CASE("a node answers garbage on its data port with an error and keeps serving", "[wire][errors]") {
  processes_under_test c{{{"ps", 1}, {"worker", 1}}};
  auto s = c.connect("worker", 0);
  auto d = value_of(s.device("/job:ps/task:0"));
  auto v = value_of(s.variable("var", {}, initializer::constant(5)));
  require_ok(s.initialize({v}));
  auto info = value_of(s.ping("ps", 0));
  REQUIRE(info.data_port != 0);
  // a raw connection that sends a forged header
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(info.data_port);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  wire::header forged;
  forged.kind = static_cast<uint8_t>(wire::kind::assign);
  forged.has_tensor = 1;
  forged.rank = 1;
  forged.dims[0] = 4;
  forged.payload_bytes = 1000; // does not match float32[4]
  REQUIRE(write(fd, &forged, sizeof(forged)) == static_cast<ssize_t>(sizeof(forged)));
  wire::header reply;
  REQUIRE(recv(fd, &reply, sizeof(reply), MSG_WAITALL) == static_cast<ssize_t>(sizeof(reply)));
  CHECK(reply.kind == static_cast<uint8_t>(wire::kind::reply));
  CHECK(reply.status == static_cast<uint8_t>(af_error::invalid_argument));
  std::string text(reply.payload_bytes, '\0');
  REQUIRE(recv(fd, text.data(), text.size(), MSG_WAITALL) == static_cast<ssize_t>(text.size()));
  CHECK(text.find("payload of 1000 bytes") != std::string::npos);
  char byte;
  CHECK(recv(fd, &byte, 1, 0) == 0); // and it hung up
  close(fd);
  // the node, and the variable, are fine
  CHECK(value_of(s.run(v)).at(0) == 5);
  // a variable nobody initialized, read over the data plane, is named in the error
  auto other = c.connect("worker", 0);
  auto od = value_of(other.device("/job:ps/task:0"));
  auto ghost = value_of(other.variable("ghost", {}));
  auto read = other.run(ghost);
  REQUIRE_FALSE(read);
  CHECK(is(read.error(), af_error::uninitialized));
  CHECK(describe(read.error()).find("'ghost'") != std::string::npos);
}

TEST_CASE("a node does not keep a thread (and its stack) for every client that came and went",
          "[wire]") {
  // An exited thread that nobody joined keeps its stack mapped: count the
  // read-write mappings the size of a default thread stack (malloc arenas,
  // which contention can add, are another size).
  auto thread_stacks = [] {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    size_t stack = 0;
    pthread_attr_getstacksize(&attr, &stack);
    pthread_attr_destroy(&attr);
    std::ifstream in{"/proc/self/maps"};
    std::string line;
    long count = 0;
    while (std::getline(in, line)) {
      auto dash = line.find('-'), space = line.find(' ');
      auto lo = std::stoull(line.substr(0, dash), nullptr, 16);
      auto hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      if (line.compare(space + 1, 4, "rw-p") == 0 && hi - lo <= stack && hi - lo + 65536 >= stack)
        ++count;
    }
    return count;
  };
  embedded_under_test c{{{"local", 2}}};
  {
    auto s = c.connect("local", 0);
    auto d = value_of(s.device("/job:local/task:1"));
    require_ok(s.initialize({value_of(s.variable("v", {}, initializer::constant(1)))}));
  }
  long after_first = -1;
  for (int i = 0; i < 30; ++i) {
    auto s = c.connect("local", 0); // its reads go over task 1's data plane
    auto d = value_of(s.device("/job:local/task:1"));
    auto v = value_of(s.variable("v", {}));
    CHECK(value_of(s.run(v)).at(0) == 1);
    if (i == 0)
      after_first = thread_stacks();
  }
  // glibc caches a few stacks of joined threads; 30 leaked ones would show
  CHECK(thread_stacks() < after_first + 10);
}
