#include <catch2/catch.hpp>

#include "core/device_name.hpp"

using af::device_name;

namespace {

device_name parse(const std::string& s) {
  std::string why;
  auto d = device_name::parse(s, &why);
  if (!d)
    FAIL("parse(" << s << ") failed: " << why);
  return *d;
}

std::string parse_error(const std::string& s) {
  std::string why;
  auto d = device_name::parse(s, &why);
  CHECK_FALSE(d);
  return why;
}

} // namespace

TEST_CASE("device names parse in TF's full and short forms and print canonically", "[device]") {
  CHECK(parse("/job:ps/replica:0/task:1/device:CPU:0").to_string() == "/job:ps/replica:0/task:1/device:CPU:0");
  CHECK(parse("/job:ps/replica:0/task:1/device:CPU:0").fully_specified());
  CHECK(parse("/cpu:0").to_string() == "/device:CPU:0");
  CHECK(parse("/gpu:1").to_string() == "/device:GPU:1");
  CHECK(parse("/GPU:1") == parse("/device:gpu:1"));
  CHECK(parse("/job:ps/task:0").to_string() == "/job:ps/task:0");
  CHECK(parse("/job:worker/task:3/gpu:2").to_string() == "/job:worker/task:3/device:GPU:2");
  CHECK(parse("/device:GPU:*").to_string() == "/device:GPU:*");
  CHECK(parse("").to_string().empty());
  auto d = parse("/job:local/task:1/cpu:0");
  CHECK(*d.job == "local");
  CHECK(*d.task == 1);
  CHECK_FALSE(d.replica);
  CHECK(d.local_device() == "CPU:0");
}

TEST_CASE("bad device names are rejected with the reason", "[device]") {
  CHECK(parse_error("cpu:0").find("must start with '/'") != std::string::npos);
  CHECK(parse_error("/device:TPU:0").find("unknown device type 'TPU'") != std::string::npos);
  CHECK(parse_error("/job:ps/task:x").find("task index 'x'") != std::string::npos);
  CHECK(parse_error("/job:1ps").find("job name '1ps'") != std::string::npos);
  CHECK(parse_error("/job:ps//task:0").find("empty component") != std::string::npos);
  CHECK(parse_error("/job:ps/job:wk").find("job twice") != std::string::npos);
  CHECK(parse_error("/cpu:0/gpu:0").find("twice") != std::string::npos);
  CHECK(parse_error("/foo:1").find("unknown component 'foo'") != std::string::npos);
  CHECK(parse_error("/device:GPU").find("device:TYPE:N") != std::string::npos);
  CHECK(parse_error("/task:-1").find("task index '-1'") != std::string::npos);
}

TEST_CASE("nested device scopes merge the way nested tf.device blocks do", "[device]") {
  auto outer = parse("/job:ps/task:0");
  auto inner = parse("/gpu:1");
  CHECK(inner.merged_into(outer).to_string() == "/job:ps/task:0/device:GPU:1");
  // the inner scope wins where both speak
  CHECK(parse("/job:worker/cpu:0").merged_into(parse("/job:ps/task:2/gpu:0")).to_string()
        == "/job:worker/task:2/device:CPU:0");
  CHECK(device_name{}.merged_into(outer) == outer);
  CHECK(outer.merged_into(device_name{}) == outer);
}
