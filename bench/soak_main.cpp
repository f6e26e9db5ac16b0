// actorflow-soak: sync training through periodic kill -9 of a random worker
// or ps (issue 11 §3; docs/training.md "The soak"). The runner is
// bench/soak.cpp; actorflow-train must be beside this binary.
#include <filesystem>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

#include "bench/cli_checks.hpp"
#include "bench/soak.hpp"
#include "programs/last_resort.hpp"

namespace {

int main_body(int argc, char** argv) {
  CLI::App app{"actorflow-soak: sync training, 2 ps + 2 workers on loopback, a random task killed "
               "with kill -9 every S seconds and brought back (docs/training.md \"The soak\")"};
  af::bench::soak_options opts;
  app.add_option("--seconds", opts.seconds, "how long the job trains under faults")
    ->required()
    ->check(af::bench::positive_seconds());
  app.add_option("--interval", opts.interval, "seconds between two faults")
    ->capture_default_str()
    ->check(af::bench::positive_seconds());
  app.add_option("--checkpoint", opts.checkpoint, "the job checkpoints every K steps")
    ->capture_default_str()
    ->check(af::bench::positive_whole("steps", 1e18));
  constexpr auto max_seed = std::numeric_limits<decltype(opts.seed)>::max();
  app.add_option("--seed", opts.seed, "seed of the choice of the task to kill")
    ->capture_default_str()
    ->check(af::bench::number_check(
      {0, false, max_seed, true, "a whole number from 0 to " + std::to_string(max_seed)}));
  CLI11_PARSE(app, argc, argv);
  auto bin = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "actorflow-train";
  return af::bench::run_soak(opts, bin.string());
}

} // namespace

int main(int argc, char** argv) {
  return af::last_resort("actorflow-soak", [&] { return main_body(argc, argv); });
}
