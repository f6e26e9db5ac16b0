#include <catch2/catch.hpp>

#include "caf/all.hpp"
#include "caf/binary_deserializer.hpp"
#include "caf/binary_serializer.hpp"

#include "actors/system.hpp"
#include "messages/aggregator.hpp"
#include "messages/error.hpp"
#include "messages/node.hpp"

using namespace af;

namespace {

// Fakes of the typed interfaces: only their handles are needed here, to see
// a live handle come back from serialization as the same actor.
variable_actor::behavior_type fake_variable() {
  return {
    [](var_op_atom, var_op, tensor value, bool) -> caf::result<tensor, uint64_t> {
      return {std::move(value), uint64_t{0}};
    },
    [](var_op_atom, var_op, tensor value, bool, uint64_t) -> caf::result<tensor, uint64_t> {
      return {std::move(value), uint64_t{0}};
    },
    [](scatter_atom, std::string, tensor, tensor updates, bool, uint64_t)
      -> caf::result<tensor, uint64_t> { return {std::move(updates), uint64_t{0}}; },
    [](gather_atom, tensor ids) -> caf::result<tensor, uint64_t> {
      return {std::move(ids), uint64_t{0}};
    },
    [](init_atom, initializer, bool, std::string) -> caf::result<uint64_t> { return uint64_t{0}; },
    [](info_atom) -> caf::result<variable_info> { return variable_info{}; },
    [](wait_init_atom, std::string, uint32_t) -> caf::result<uint64_t> { return uint64_t{0}; },
  };
}

executor_actor::behavior_type fake_executor() {
  return {
    [](register_atom, partition) -> caf::result<caf::ok_atom> { return caf::ok_atom::value; },
    [](run_step_atom, uint64_t, uint64_t, std::vector<feed>) -> caf::result<step_result> {
      return step_result{};
    },
    [](edge_atom, uint64_t, uint64_t, int32_t, tensor, int64_t, std::string, std::string) {
      // nop
    },
    [](abort_atom, uint64_t, uint64_t) {
      // nop
    },
    [](forget_atom, uint64_t) {
      // nop
    },
    [](info_atom) -> caf::result<uint64_t, uint64_t> { return {uint64_t{0}, uint64_t{0}}; },
    [](sweep_atom) {
      // nop
    },
  };
}

node_actor::behavior_type fake_node() {
  return {
    [](caf::ping_atom) -> caf::result<node_info> { return node_info{}; },
    [](get_var_atom, variable_spec) -> caf::result<variable_actor> { return variable_actor{}; },
    [](lookup_atom, std::string) -> caf::result<variable_actor> { return variable_actor{}; },
    [](list_atom) -> caf::result<std::vector<variable_info>> {
      return std::vector<variable_info>{};
    },
    [](executor_atom, std::string) -> caf::result<executor_actor> { return executor_actor{}; },
    [](shutdown_atom) -> caf::result<caf::ok_atom> { return caf::ok_atom::value; },
    [](aggregator_atom, aggregator_spec) -> caf::result<aggregator_actor> {
      return aggregator_actor{};
    },
    [](kv_store_atom) -> caf::result<kv_store_actor> { return kv_store_actor{}; },
    [](save_atom, table_shard_request) -> caf::result<std::string> { return std::string{}; },
    [](restore_atom, table_shard_request) -> caf::result<uint64_t> { return uint64_t{0}; },
  };
}

/// Stops a fake when the test leaves its scope, however it leaves it: the
/// actor system's destructor waits for every actor.
struct stop_at_exit {
  caf::actor actor;
  template <class Handle>
  explicit stop_at_exit(const Handle& h) : actor(caf::actor_cast<caf::actor>(h)) {}
  ~stop_at_exit() { caf::anon_send_exit(actor, caf::exit_reason::user_shutdown); }
};

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

TEST_CASE_METHOD(fixture, "every field of every message type survives CAF serialization",
                 "[messages]") {
  // Every field below has a value other than its default, so a field that an
  // inspect() forgets, or reads back in another order, shows as a mismatch.
  auto t32 = tensor::from_values<float>({2, 2}, {1, 2, 3, 4});
  auto t64 = tensor::from_values<double>({3}, {0.5, -1, 1e300});
  auto i32 = tensor::from_values<int32_t>({1}, {-7});
  auto i64 = tensor::from_values<int64_t>({2}, {1LL << 40, -3});
  for (const auto& t : {t32, t64, i32, i64, tensor{}, tensor::scalar(2.5f)})
    CHECK(round_trip(t) == t);
  for (auto op : {var_op::read, var_op::assign, var_op::assign_add, var_op::assign_sub})
    CHECK(round_trip(op) == op);

  SECTION("variables") {
    variable_spec spec{"w", dtype::float64, {3, 1}, "/job:ps/replica:0/task:0/device:CPU:0"};
    auto s = round_trip(spec);
    CHECK(s.name == spec.name);
    CHECK(s.type == spec.type);
    CHECK(s.shape == spec.shape);
    CHECK(s.device == spec.device);
    variable_info info{spec, true, 42, "run-00000000deadbeef", 3};
    auto i = round_trip(info);
    CHECK(i.spec.name == "w");
    CHECK(i.spec.type == dtype::float64);
    CHECK(i.spec.shape == shape_type{3, 1});
    CHECK(i.spec.device == spec.device);
    CHECK(i.initialized);
    CHECK(i.version == 42);
    CHECK(i.run_id == "run-00000000deadbeef");
    CHECK(i.waiters == 3);
    auto many = round_trip(std::vector<variable_info>{info, variable_info{spec, false, 7, "", 0}});
    REQUIRE(many.size() == 2);
    CHECK((many[0].run_id == info.run_id && many[0].waiters == 3));
    CHECK((!many[1].initialized && many[1].version == 7 && many[1].run_id.empty()
           && many[1].waiters == 0));
    auto init = initializer::normal(1, 2, 99);
    init.value = 0.25;
    init.from = t32;
    auto in = round_trip(init);
    CHECK(in.kind == "normal");
    CHECK(in.value == 0.25);
    CHECK(in.a == 1);
    CHECK(in.b == 2);
    CHECK(in.seed == 99);
    CHECK(in.from == t32);
  }

  SECTION("partitions, steps and their results") {
    auto var = sys.spawn(fake_variable);
    auto exec = sys.spawn(fake_executor);
    stop_at_exit stop_var{var}, stop_exec{exec};
    auto consumer = caf::actor_cast<caf::actor>(exec);
    op_input in_var{op_input::variable, 7, var, "w", t64, "10.0.0.1:4000", "10.0.0.1:3335"};
    auto o = round_trip(in_var);
    CHECK(o.kind == op_input::variable);
    CHECK(o.op == 7);
    CHECK(o.var == var); // the live handle comes back as the same actor
    CHECK(o.var_name == "w");
    CHECK(o.value == t64);
    CHECK(o.data_plane == "10.0.0.1:4000");
    CHECK(o.var_node == "10.0.0.1:3335");
    // without a variable the handle stays empty
    auto r = round_trip(op_input{op_input::remote, 2, variable_actor{}, "", tensor{}, "", ""});
    CHECK((r.kind == op_input::remote && r.op == 2 && !r.var));
    op_attrs attrs;
    attrs.transpose_a = true;
    attrs.transpose_b = true;
    attrs.all_axes = false;
    attrs.axis = -1;
    attrs.keep_dims = true;
    partition_op pop;
    pop.id = 3;
    pop.op = "matmul";
    pop.name = "mm_1";
    pop.attrs = attrs;
    pop.inputs = {in_var, op_input{op_input::remote, 2, variable_actor{}, "", tensor{}, "", ""}};
    pop.consumers = {consumer};
    pop.fetch = true;
    pop.want_value = false;
    auto rp = round_trip(pop);
    CHECK(rp.id == 3);
    CHECK(rp.op == "matmul");
    CHECK(rp.name == "mm_1");
    CHECK((rp.attrs.transpose_a && rp.attrs.transpose_b && !rp.attrs.all_axes
           && rp.attrs.axis == -1 && rp.attrs.keep_dims));
    REQUIRE(rp.inputs.size() == 2);
    CHECK((rp.inputs[0].var == var && rp.inputs[0].value == t64 && rp.inputs[0].var_node == "10.0.0.1:3335"));
    CHECK((rp.inputs[1].kind == op_input::remote && rp.inputs[1].op == 2));
    REQUIRE(rp.consumers.size() == 1);
    CHECK(rp.consumers[0] == consumer);
    CHECK(rp.fetch);
    CHECK_FALSE(rp.want_value);
    partition part;
    part.graph = 42;
    part.ops = {pop, pop};
    part.peers = {consumer};
    part.peer_devices = {"/job:local/replica:0/task:1/device:CPU:0"};
    part.step_timeout_ms = 1234;
    part.variable_timeout_ms = 567;
    part.edge_token = std::string("\x00\x01secret-token\xff\xfe", 16);
    auto rpart = round_trip(part);
    CHECK(rpart.graph == 42);
    CHECK(rpart.edge_token == part.edge_token);
    CHECK(rpart.ops.size() == 2);
    CHECK((rpart.ops[1].name == "mm_1" && rpart.ops[1].consumers == pop.consumers));
    CHECK(rpart.peers == part.peers);
    CHECK(rpart.peer_devices == part.peer_devices);
    CHECK(rpart.step_timeout_ms == 1234);
    CHECK(rpart.variable_timeout_ms == 567);
    auto fs = round_trip(std::vector<feed>{feed{5, i32}, feed{6, t32}});
    REQUIRE(fs.size() == 2);
    CHECK((fs[0].op == 5 && fs[0].value == i32 && fs[1].op == 6 && fs[1].value == t32));
    op_timing timing{1, 5, 9, "soft placement", 48, 16};
    auto rt = round_trip(timing);
    CHECK((rt.op == 1 && rt.start_ns == 5 && rt.end_ns == 9 && rt.note == "soft placement"
           && rt.bytes_in == 48 && rt.bytes_out == 16));
    transfer_timing moved{1, 4, 8, -20, 35, 120, "data plane from 10.0.0.1:4000"};
    auto rm = round_trip(moved);
    CHECK(rm.kind == 1);
    CHECK(rm.op == 4);
    CHECK(rm.consumer == 8);
    CHECK(rm.start_ns == -20);
    CHECK(rm.end_ns == 35);
    CHECK(rm.bytes == 120);
    CHECK(rm.path == "data plane from 10.0.0.1:4000");
    step_result res{"/job:w/replica:0/task:1/device:GPU:0", {feed{1, i64}}, {timing}, {moved, moved}};
    auto rs = round_trip(res);
    CHECK(rs.device == res.device);
    REQUIRE(rs.fetched.size() == 1);
    CHECK((rs.fetched[0].op == 1 && rs.fetched[0].value == i64));
    REQUIRE(rs.timings.size() == 1);
    CHECK((rs.timings[0].note == "soft placement" && rs.timings[0].bytes_out == 16));
    REQUIRE(rs.transfers.size() == 2);
    CHECK((rs.transfers[1].path == moved.path && rs.transfers[1].bytes == 120
           && rs.transfers[1].consumer == 8));
    // the handles as messages of their own
    CHECK(round_trip(var) == var);
    CHECK(round_trip(exec) == exec);
  }

  SECTION("nodes and errors") {
    node_info info{"ps", 3, {"CPU:0", "GPU:0"}, 1234, 4001, 0xfeedface12345678ULL, -987654321,
                   {"GPU:1: out of memory"}};
    auto n = round_trip(info);
    CHECK(n.job == "ps");
    CHECK(n.task == 3);
    CHECK(n.devices == std::vector<std::string>{"CPU:0", "GPU:0"});
    CHECK(n.pid == 1234);
    CHECK(n.data_port == 4001);
    CHECK(n.incarnation == 0xfeedface12345678ULL);
    CHECK(n.clock_ns == -987654321);
    CHECK(n.device_errors == std::vector<std::string>{"GPU:1: out of memory"});
    auto node = sys.spawn(fake_node);
    stop_at_exit stop_node{node};
    CHECK(round_trip(node) == node);
    // errors of the project's category travel and render too
    auto err = round_trip(make_error(af_error::shape_mismatch, "assign 'w': [2,2] vs [3]"));
    CHECK(is(err, af_error::shape_mismatch));
    CHECK(describe(err) == "shape_mismatch: assign 'w': [2,2] vs [3]");
    CHECK(sys.render(err).find("[2,2] vs [3]") != std::string::npos);
  }

  SECTION("a table shard's save or restore") {
    // Catches: the manifest's SHA-256 the chief checked not reaching a ps in
    // another process (then it reads whatever manifest is there unchecked).
    table_shard_request req;
    req.dir = "/ck/tables-10";
    req.variable = "emb/part_1";
    req.table = "emb";
    req.strategy = 2;
    req.shard_rows = {3, 4};
    req.shard = 1;
    req.slot_names = {"m", "v"};
    req.slot_starts = {0.5f, 0.25f};
    req.global_step = 10;
    req.run_id = "run-7";
    req.manifest_sha256 = std::string(64, 'e');
    auto r = round_trip(req);
    CHECK(r.dir == req.dir);
    CHECK(r.variable == req.variable);
    CHECK(r.table == req.table);
    CHECK(r.strategy == req.strategy);
    CHECK(r.shard_rows == req.shard_rows);
    CHECK(r.shard == req.shard);
    CHECK(r.slot_names == req.slot_names);
    CHECK(r.slot_starts == req.slot_starts);
    CHECK(r.global_step == req.global_step);
    CHECK(r.run_id == req.run_id);
    CHECK(r.manifest_sha256 == req.manifest_sha256);
  }

  SECTION("training: who a push speaks for, and what an aggregator saves") {
    push_credentials who{std::string("\x00\x01token\xff-16-bytes", 16), 0x1234567890ULL,
                         "data-plane peer 10.0.0.7:51234"};
    auto w = round_trip(who);
    CHECK(w.token == who.token);
    CHECK(w.seq == who.seq);
    CHECK(w.from == who.from);
    aggregator_state st;
    st.global_step = 77;
    st.names = {"w"};
    st.values = {t32};
    st.slots = {{t32}};
    st.seq_workers = {0, 3};
    st.seq_taken = {41, 18446744073709551615ULL};
    auto a = round_trip(st);
    CHECK(a.global_step == 77);
    CHECK(a.seq_workers == st.seq_workers);
    CHECK(a.seq_taken == st.seq_taken);
    worker_stats ws;
    ws.error = "worker 1 at local step 3: pushed step 3 twice";
    ws.guarded = 5;
    auto b = round_trip(ws);
    CHECK(b.error == ws.error);
    CHECK(b.guarded == 5);
    aggregator_spec spec;
    spec.grad_norm_guard = 12.5;
    CHECK(round_trip(spec).grad_norm_guard == 12.5);
  }

  // The four aggregator types, every field of each (and of the optimizer
  // and schedule an aggregator_spec carries): a field that its inspect()
  // forgets comes back as its default, a mismatch here.
  SECTION("aggregators: spec, worker stats, stats and saved state, every field") {
    aggregator_spec spec;
    spec.name = "train/ps1";
    spec.mode = "ssp";
    spec.variables = {"w", "b"};
    spec.workers = 5;
    spec.optimizer.kind = "adam";
    spec.optimizer.lr = 0.003;
    spec.optimizer.momentum = 0.5;
    spec.optimizer.beta1 = 0.8;
    spec.optimizer.beta2 = 0.99;
    spec.optimizer.epsilon = 1e-6;
    spec.optimizer.schedule.kind = "cosine";
    spec.optimizer.schedule.decay_steps = 77;
    spec.optimizer.schedule.decay_rate = 0.25;
    spec.optimizer.schedule.total_steps = 9000;
    spec.optimizer.schedule.min_lr = 1e-5;
    spec.step_timeout_ms = 4321;
    spec.replicas_to_aggregate = 3;
    spec.step_deadline_ms = 1500;
    spec.min_replicas = 2;
    spec.staleness = 11;
    spec.grad_norm_guard = 6.5;
    auto sp = round_trip(spec);
    CHECK(sp.name == "train/ps1");
    CHECK(sp.mode == "ssp");
    CHECK(sp.variables == std::vector<std::string>{"w", "b"});
    CHECK(sp.workers == 5);
    CHECK(sp.optimizer.kind == "adam");
    CHECK(sp.optimizer.lr == 0.003);
    CHECK(sp.optimizer.momentum == 0.5);
    CHECK(sp.optimizer.beta1 == 0.8);
    CHECK(sp.optimizer.beta2 == 0.99);
    CHECK(sp.optimizer.epsilon == 1e-6);
    CHECK(sp.optimizer.schedule.kind == "cosine");
    CHECK(sp.optimizer.schedule.decay_steps == 77);
    CHECK(sp.optimizer.schedule.decay_rate == 0.25);
    CHECK(sp.optimizer.schedule.total_steps == 9000);
    CHECK(sp.optimizer.schedule.min_lr == 1e-5);
    CHECK(sp.step_timeout_ms == 4321);
    CHECK(sp.replicas_to_aggregate == 3);
    CHECK(sp.step_deadline_ms == 1500);
    CHECK(sp.min_replicas == 2);
    CHECK(sp.staleness == 11);
    CHECK(sp.grad_norm_guard == 6.5);

    worker_stats ws;
    ws.worker = 2;
    ws.task = "/job:worker/task:2";
    ws.address = "10.0.0.9:3333";
    ws.status = "held";
    ws.batch_size = 64;
    ws.pushes = 101;
    ws.applied = 99;
    ws.late = 1;
    ws.refused = 2;
    ws.stale = 30;
    ws.max_staleness = 4;
    ws.waited_ms = 777;
    ws.clock = 55;
    ws.last_step = 100;
    ws.examples_per_s = 1234.5;
    ws.idle_s = 0.75;
    ws.error = "worker 2: boom";
    ws.guarded = 6;
    auto check_worker = [](const worker_stats& w) {
      CHECK(w.worker == 2);
      CHECK(w.task == "/job:worker/task:2");
      CHECK(w.address == "10.0.0.9:3333");
      CHECK(w.status == "held");
      CHECK(w.batch_size == 64);
      CHECK(w.pushes == 101);
      CHECK(w.applied == 99);
      CHECK(w.late == 1);
      CHECK(w.refused == 2);
      CHECK(w.stale == 30);
      CHECK(w.max_staleness == 4);
      CHECK(w.waited_ms == 777);
      CHECK(w.clock == 55);
      CHECK(w.last_step == 100);
      CHECK(w.examples_per_s == 1234.5);
      CHECK(w.idle_s == 0.75);
      CHECK(w.error == "worker 2: boom");
      CHECK(w.guarded == 6);
    };
    check_worker(round_trip(ws));

    aggregator_stats stats;
    stats.mode = "async";
    stats.global_step = 1000;
    stats.applied = 990;
    stats.pushes = 1010;
    stats.dropped_stale = 7;
    stats.refused = 3;
    stats.last_refusal = "gradient of 'w' is not finite";
    stats.staleness = {900, 80, 10};
    stats.workers_done = 1;
    stats.active = 4;
    stats.closed_at_deadline = 12;
    stats.switches = 2;
    stats.workers = {ws, worker_stats{}};
    stats.events = {"worker 2 joined", "mode sync -> async"};
    stats.events_total = 40;
    auto st = round_trip(stats);
    CHECK(st.mode == "async");
    CHECK(st.global_step == 1000);
    CHECK(st.applied == 990);
    CHECK(st.pushes == 1010);
    CHECK(st.dropped_stale == 7);
    CHECK(st.refused == 3);
    CHECK(st.last_refusal == "gradient of 'w' is not finite");
    CHECK(st.staleness == std::vector<uint64_t>{900, 80, 10});
    CHECK(st.workers_done == 1);
    CHECK(st.active == 4);
    CHECK(st.closed_at_deadline == 12);
    CHECK(st.switches == 2);
    REQUIRE(st.workers.size() == 2);
    check_worker(st.workers[0]);
    CHECK(st.workers[1].status.empty());
    CHECK(st.events == std::vector<std::string>{"worker 2 joined", "mode sync -> async"});
    CHECK(st.events_total == 40);

    aggregator_state saved;
    saved.global_step = 88;
    saved.names = {"w", "b"};
    saved.values = {t32, t64};
    saved.slots = {{t32, i32}, {}};
    saved.seq_workers = {0, 4};
    saved.seq_taken = {5, 6};
    auto sv = round_trip(saved);
    CHECK(sv.global_step == 88);
    CHECK(sv.names == std::vector<std::string>{"w", "b"});
    REQUIRE(sv.values.size() == 2);
    CHECK(sv.values[0] == t32);
    CHECK(sv.values[1] == t64);
    REQUIRE(sv.slots.size() == 2);
    REQUIRE(sv.slots[0].size() == 2);
    CHECK(sv.slots[0][0] == t32);
    CHECK(sv.slots[0][1] == i32);
    CHECK(sv.slots[1].empty());
    CHECK(sv.seq_workers == std::vector<uint32_t>{0, 4});
    CHECK(sv.seq_taken == std::vector<uint64_t>{5, 6});
  }
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
