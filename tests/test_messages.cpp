#include <catch2/catch.hpp>

#include "caf/all.hpp"
#include "caf/binary_deserializer.hpp"
#include "caf/binary_serializer.hpp"

#include "actors/system.hpp"
#include "messages/error.hpp"
#include "messages/node.hpp"

using namespace af;

namespace {

struct fixture {
  system_config cfg;
  caf::actor_system sys{cfg};

  std::vector<char> save(caf::message msg) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    auto err = sink(msg);
    if (err)
      FAIL(describe(err));
    return buf;
  }

  /// Through a caf::message, as BASP sends it; fails the test if anything is lost.
  template <class T>
  T round_trip(T x) {
    auto back = load(save(caf::make_message(std::move(x))));
    if (back.size() != 1 || !back.template match_element<T>(0))
      FAIL("a " << typeid(T).name() << " did not survive serialization");
    return back.template get_as<T>(0);
  }

  caf::message load(const std::vector<char>& buf) {
    caf::message out;
    caf::binary_deserializer source{sys, buf};
    auto err = source(out);
    if (err)
      FAIL(describe(err));
    return out;
  }
};

} // namespace

TEST_CASE_METHOD(fixture, "every message type survives CAF serialization", "[messages]") {
  auto t32 = tensor::from_values<float>({2, 2}, {1, 2, 3, 4});
  auto t64 = tensor::from_values<double>({3}, {0.5, -1, 1e300});
  auto i32 = tensor::from_values<int32_t>({1}, {-7});
  auto i64 = tensor::from_values<int64_t>({2}, {1LL << 40, -3});
  for (const auto& t : {t32, t64, i32, i64, tensor{}})
    CHECK(round_trip(t) == t);
  variable_spec spec{"w", dtype::float64, {3, 1}, "/job:ps/replica:0/task:0/device:CPU:0"};
  auto s = round_trip(spec);
  CHECK((s.name == spec.name && s.type == spec.type && s.shape == spec.shape && s.device == spec.device));
  auto i = round_trip(variable_info{spec, true, 42});
  CHECK((i.spec.name == "w" && i.initialized && i.version == 42));
  CHECK(round_trip(std::vector<variable_info>{i, i}).size() == 2);
  auto init = initializer::normal(1, 2, 99);
  init.from = t32;
  auto in = round_trip(init);
  CHECK((in.kind == "normal" && in.a == 1 && in.b == 2 && in.seed == 99 && in.from == t32));
  op_input in_var{op_input::constant, 7, variable_actor{}, "x", t64, "10.0.0.1:4000"};
  auto o = round_trip(in_var);
  CHECK((o.kind == op_input::constant && o.op == 7 && o.value == t64 && !o.var && o.var_name == "x"
         && o.data_plane == "10.0.0.1:4000"));
  op_attrs attrs;
  attrs.transpose_b = true;
  attrs.all_axes = false;
  attrs.axis = -1;
  partition_op pop;
  pop.id = 3;
  pop.op = "matmul";
  pop.name = "mm_1";
  pop.attrs = attrs;
  pop.inputs = {in_var, op_input{op_input::remote, 2, variable_actor{}, "", tensor{}, ""}};
  pop.fetch = true;
  auto part = round_trip(partition{42, {pop, pop}});
  REQUIRE(part.ops.size() == 2);
  CHECK(part.graph == 42);
  const auto& rp = part.ops[1];
  CHECK((rp.id == 3 && rp.op == "matmul" && rp.name == "mm_1" && rp.fetch && rp.inputs.size() == 2));
  CHECK((rp.inputs[0].value == t64 && rp.inputs[1].kind == op_input::remote && rp.inputs[1].op == 2));
  CHECK((!rp.attrs.transpose_a && rp.attrs.transpose_b && !rp.attrs.all_axes && rp.attrs.axis == -1));
  auto fs = round_trip(std::vector<feed>{feed{5, i32}});
  CHECK((fs.size() == 1 && fs[0].op == 5 && fs[0].value == i32));
  step_result res{"/job:w/replica:0/task:1/device:GPU:0", {feed{1, i64}}, {op_timing{1, 5, 9, "cpu"}}};
  auto rs = round_trip(res);
  CHECK((rs.device == res.device && rs.fetched.size() == 1 && rs.fetched[0].value == i64));
  CHECK((rs.timings.size() == 1 && rs.timings[0].start_ns == 5 && rs.timings[0].note == "cpu"));
  auto n = round_trip(node_info{"ps", 3, {"CPU:0", "GPU:0"}, 1234});
  CHECK((n.job == "ps" && n.task == 3 && n.devices == std::vector<std::string>{"CPU:0", "GPU:0"}
         && n.pid == 1234));
  // errors of the project's category travel and render too
  auto err = round_trip(make_error(af_error::shape_mismatch, "assign 'w': [2,2] vs [3]"));
  CHECK(is(err, af_error::shape_mismatch));
  CHECK(describe(err) == "shape_mismatch: assign 'w': [2,2] vs [3]");
  CHECK(sys.render(err).find("[2,2] vs [3]") != std::string::npos);
}

TEST_CASE_METHOD(fixture, "a tensor crosses the wire as one blob of its bytes", "[messages]") {
  auto big = tensor::filled(dtype::float32, {4, 1024, 1024}, 0.25); // 16 MiB
  auto buf = save(caf::make_message(big));
  // a few bytes of header around the raw buffer, nothing per element
  CHECK(buf.size() >= big.nbytes());
  CHECK(buf.size() < big.nbytes() + 256);
  auto back = load(buf).get_as<tensor>(0);
  CHECK(back == big);
}

TEST_CASE_METHOD(fixture, "a corrupted tensor on the wire is rejected, not trusted", "[messages][errors]") {
  auto decode = [&](const std::vector<char>& buf) {
    tensor t;
    caf::binary_deserializer source{sys, buf};
    return source(t);
  };
  std::vector<char> good;
  {
    caf::binary_serializer sink{sys, good};
    auto t = tensor::filled(dtype::float32, {4}, 1);
    REQUIRE_FALSE(sink(t));
  }
  REQUIRE_FALSE(decode(good));
  auto truncated = good;
  truncated.resize(good.size() - 8);
  CHECK(decode(truncated));
  // a header that claims 5 elements in front of a 16-byte blob
  std::vector<char> lying;
  {
    caf::binary_serializer sink{sys, lying};
    uint8_t has_value = 1, type = 0;
    shape_type shape{5};
    std::vector<char> blob(16, 0);
    size_t blob_size = blob.size();
    REQUIRE_FALSE(sink(has_value, type, shape));
    REQUIRE_FALSE(sink.begin_sequence(blob_size));
    REQUIRE_FALSE(sink.apply_raw(blob.size(), blob.data()));
    REQUIRE_FALSE(sink.end_sequence());
  }
  auto err = decode(lying);
  REQUIRE(err);
  CHECK(describe(err).find("with 16 bytes, expected 20") != std::string::npos);
  std::vector<char> bad_type;
  {
    caf::binary_serializer sink{sys, bad_type};
    uint8_t has_value = 1, type = 77;
    shape_type shape{1};
    REQUIRE_FALSE(sink(has_value, type, shape));
  }
  CHECK(describe(decode(bad_type)).find("unknown dtype code 77") != std::string::npos);
}
