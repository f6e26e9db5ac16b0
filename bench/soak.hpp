#pragma once
/// The soak (issue 11 §3; docs/training.md "The soak"): sync training on
/// loopback through periodic kill -9 of a random worker or ps, run by
/// actorflow-soak (bench/soak_main.cpp).

#include <cstdint>
#include <string>

namespace af::bench {

struct soak_options {
  double seconds = 0;      ///< how long the job trains under faults
  double interval = 15;    ///< seconds between two faults
  uint64_t checkpoint = 50; ///< the job checkpoints every K steps
  unsigned seed = 1;       ///< seed of the choice of the task to kill
};

/// A sync job of 2 ps and 2 workers (the digits MLP) on loopback,
/// checkpoint every K steps; every S seconds one of worker 1, ps 0 and ps 1
/// (at random, seeded) is killed with SIGKILL and restarted (a worker with
/// --join, once the chief has seen it leave; a ps at once: the chief
/// restores it). The chief is not killed: the job stops without it by
/// design. Prints each fault and, at the end, the steps done, the faults,
/// the updates lost (per ps recovery: the steps between the checkpoint it
/// was restored from and the step it was restored at, as the chief reports
/// them; a killed worker loses only its gradient in flight, which a sync
/// step closes without) and the chief's and every current process's RSS at
/// its start (after 5 s of training) and at the end. `bin`: actorflow-train.
/// 0 if the job kept going and no recovery lost more than one checkpoint
/// interval.
int run_soak(const soak_options& opts, const std::string& bin);

} // namespace af::bench
