// A ps saves and restores its own table shards (messages/node.hpp's save and
// restore of a table_shard_request; actors/table_shards.hpp): 3 nodes each
// write the shard they hold, and 2 other nodes each restore their shard of
// another strategy from those files, value and slots bit-identical to the
// one-piece table. Each case says which bug it catches.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "actors/node.hpp"
#include "actors/system.hpp"
#include "actors/variable.hpp"
#include "actors/variable_directory.hpp"
#include "kernels/shard_routing.hpp"
#include "messages/error.hpp"
#include "train/table_checkpoint.hpp"
#include "temp_dir.hpp"

using namespace af;
using namespace std::chrono_literals;
using kernels::partition_strategy;

namespace {

constexpr int64_t rows = 11, dim = 3;

/// One node of the test and the variables its directory holds.
struct test_node {
  std::shared_ptr<variable_directory> dir = std::make_shared<variable_directory>();
  node_actor actor;
};

test_node start(caf::actor_system& sys, int32_t task) {
  test_node n;
  n.actor = sys.spawn(node_impl, std::string{"ps"}, task, node_options{}, n.dir, uint16_t{0},
                      aggregator_services{}, node_clock{});
  return n;
}

/// The global ids of shard k (mod: k, k + n, ...; div: its run).
std::vector<int64_t> ids_of(partition_strategy s, const std::vector<int64_t>& sizes, size_t k) {
  std::vector<int64_t> out;
  int64_t first = 0;
  for (size_t i = 0; i < k; ++i)
    first += sizes[i];
  for (int64_t r = 0; r < sizes[k]; ++r)
    out.push_back(s == partition_strategy::mod
                    ? r * static_cast<int64_t>(sizes.size()) + static_cast<int64_t>(k)
                    : first + r);
  return out;
}

/// Rows `ids` of the [rows, dim] table whose element (r, c) is r + c / 8 + `bias`.
tensor rows_of(const std::vector<int64_t>& ids, float bias) {
  std::vector<float> v;
  for (auto id : ids)
    for (int64_t c = 0; c < dim; ++c)
      v.push_back(static_cast<float>(id) + static_cast<float>(c) / 8 + bias);
  return tensor::from_values<float>({static_cast<int64_t>(ids.size()), dim}, v);
}

/// Makes variable `name` of `rows_here` rows on node `n` (task `task`).
std::shared_ptr<variable_cell> make_var(caf::scoped_actor& self, test_node& n, int32_t task,
                                        const std::string& name, int64_t rows_here) {
  variable_spec spec{name, dtype::float32, {rows_here, dim},
                     "/job:ps/replica:0/task:" + std::to_string(task) + "/device:CPU:0"};
  bool made = false;
  self->request(n.actor, 5s, get_var_atom::value, spec)
    .receive([&](variable_actor&) { made = true; },
             [&](caf::error& e) { FAIL_CHECK(describe(e)); });
  REQUIRE(made);
  auto cell = n.dir->get(name).cell;
  REQUIRE(cell);
  return cell;
}

table_shard_request request_of(const std::string& dir, const std::string& var,
                               partition_strategy s, std::vector<int64_t> sizes, size_t k) {
  table_shard_request r;
  r.dir = dir;
  r.variable = var;
  r.table = "emb";
  r.strategy = static_cast<uint8_t>(s);
  r.shard_rows = std::move(sizes);
  r.shard = k;
  r.slot_names = {"accumulator"};
  r.slot_starts = {0.1f};
  r.global_step = 5;
  r.run_id = "run-2";
  return r;
}

} // namespace

TEST_CASE("3 ps each save the table shard they hold and 2 other ps each restore theirs by "
          "another strategy, value and slots bit-identical to the one-piece table",
          "[table_checkpoint][node]") {
  // Catches: a node that saves another variable than the one named, a
  // restore that fills the new shard with the old shard's rows (not its
  // own of the table), slots lost on the way, a reply that never comes (the
  // worker's answer not delivered to the requester).
  testing::temp_dir dir;
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys, true};
  auto old_sizes = kernels::balanced_shard_rows(rows, 3);
  for (int32_t k = 0; k < 3; ++k) {
    auto n = start(sys, k);
    auto name = "emb/part_" + std::to_string(k);
    auto cell = make_var(self, n, k, name, old_sizes[static_cast<size_t>(k)]);
    auto ids = ids_of(partition_strategy::mod, old_sizes, static_cast<size_t>(k));
    REQUIRE_FALSE(cell->restore(rows_of(ids, 0), {"accumulator"}, {rows_of(ids, 100)}, "run-1"));
    std::string path;
    self->request(n.actor, 30s, save_atom::value,
                  request_of(dir.path, name, partition_strategy::mod, old_sizes,
                             static_cast<size_t>(k)))
      .receive([&](std::string& p) { path = p; },
               [&](caf::error& e) { FAIL_CHECK(describe(e)); });
    CHECK(path == train::table_shard_path(dir.path, "emb", static_cast<size_t>(k), 3));
    caf::anon_send_exit(n.actor, caf::exit_reason::user_shutdown);
  }
  train::table_checkpoint_layout layout;
  layout.table = "emb";
  layout.strategy = partition_strategy::mod;
  layout.shard_rows = old_sizes;
  layout.row_shape = {dim};
  layout.slots = {"accumulator"};
  layout.global_step = 5;
  REQUIRE(train::write_table_manifest(dir.path, layout));

  auto new_sizes = kernels::balanced_shard_rows(rows, 2);
  for (int32_t k = 0; k < 2; ++k) {
    auto n = start(sys, k);
    auto name = "emb/part_" + std::to_string(k);
    auto cell = make_var(self, n, k, name, new_sizes[static_cast<size_t>(k)]);
    uint64_t version = 0;
    self->request(n.actor, 30s, restore_atom::value,
                  request_of(dir.path, name, partition_strategy::div, new_sizes,
                             static_cast<size_t>(k)))
      .receive([&](uint64_t v) { version = v; },
               [&](caf::error& e) { FAIL_CHECK(describe(e)); });
    CHECK(version > 0);
    auto ids = ids_of(partition_strategy::div, new_sizes, static_cast<size_t>(k));
    auto snap = cell->snapshot({"accumulator"});
    REQUIRE(snap);
    CHECK(snap->first == rows_of(ids, 0));
    CHECK(snap->second.at(0) == rows_of(ids, 100));
    CHECK(cell->info().run_id == "run-2");
    // a variable the node does not hold: not_found, naming it
    std::string why;
    self->request(n.actor, 30s, restore_atom::value,
                  request_of(dir.path, "nope", partition_strategy::div, new_sizes, 0))
      .receive([&](uint64_t) {}, [&](caf::error& e) { why = describe(e); });
    CHECK(why.find("no variable 'nope'") != std::string::npos);
    // a layout that is not the variable's: refused, naming it
    why.clear();
    self->request(n.actor, 30s, restore_atom::value,
                  request_of(dir.path, name, partition_strategy::div, new_sizes,
                             static_cast<size_t>(1 - k)))
      .receive([&](uint64_t) {}, [&](caf::error& e) { why = describe(e); });
    CHECK(why.find("'" + name + "'") != std::string::npos);
    // slots no optimizer has (a shard's worth allocated per name): refused
    why.clear();
    auto many = request_of(dir.path, name, partition_strategy::div, new_sizes,
                           static_cast<size_t>(k));
    many.slot_names.assign(1000, "x");
    self->request(n.actor, 30s, save_atom::value, many)
      .receive([&](std::string&) {}, [&](caf::error& e) { why = describe(e); });
    CHECK_THAT(why, Catch::Contains("are not an optimizer's"));
    // files of another step than the checkpoint restored (a tables-<step>
    // directory holding an older checkpoint's): refused, naming both steps
    why.clear();
    auto other = request_of(dir.path, name, partition_strategy::div, new_sizes,
                            static_cast<size_t>(k));
    other.global_step = 6;
    self->request(n.actor, 30s, restore_atom::value, other)
      .receive([&](uint64_t) {}, [&](caf::error& e) { why = describe(e); });
    CHECK_THAT(why, Catch::Contains("of global step 5") && Catch::Contains("of step 6"));
    // a manifest other than the one the chief checked (its SHA-256 in the
    // request, as restore_sparse_checkpoint sends it): refused, naming it
    why.clear();
    auto checked = request_of(dir.path, name, partition_strategy::div, new_sizes,
                              static_cast<size_t>(k));
    checked.manifest_sha256 = std::string(64, '0');
    self->request(n.actor, 30s, restore_atom::value, checked)
      .receive([&](uint64_t) {}, [&](caf::error& e) { why = describe(e); });
    CHECK_THAT(why, Catch::Contains("'" + train::table_manifest_path(dir.path, "emb") + "'")
                      && Catch::Contains("is not the one the chief checked"));
    auto digest = train::verify_table_manifest(dir.path, "emb", "");
    REQUIRE(digest);
    checked.manifest_sha256 = *digest;
    why.clear();
    self->request(n.actor, 30s, restore_atom::value, checked)
      .receive([&](uint64_t) {}, [&](caf::error& e) { why = describe(e); });
    CHECK(why.empty());
    caf::anon_send_exit(n.actor, caf::exit_reason::user_shutdown);
  }
}
