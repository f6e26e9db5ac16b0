#!/bin/bash
# Absurd [train] values for the sparse job (embedded cluster of config/embeddings.toml's shape):
# each must be refused naming its key, or run; never crash, hang or allocate without bound.
# usage: tests/attack/config_absurd.sh BUILD_DIR
B=$(cd "${1:-build-cpu}" && pwd); C=$(cd "$(dirname "$0")/../.." && pwd)/config/embeddings.toml
S="--set synthetic_examples=20000 --set epochs=1 --set log_every=0"
while read -r args; do
  out=$(cd /tmp && ulimit -v 8000000; timeout 60 $B/actorflow-train --config $C $S $args 2>&1 | grep -v "aggregator '\|restored\|^step" | tail -2)
  echo "rc=$? [$args] ${out//$'\n'/ | }" | cut -c1-400
done <<'CASES'
--set users=1000000000000
--set users=0
--set users=-5
--set users=2
--set users=1 --set items=1
--set dim=0
--set dim=100000000
--set dim=-1
--set batch_size=0
--set batch_size=100000000
--set partition_strategy=contiguous
--set partition_strategy=DIV
--set partition_strategy=
--set zipf=-1
--set zipf=nan
--set holdout=1
--set holdout=0
--set synthetic_examples=0
--set learning_rate=1e30
--set optimizer=adagrad --set initial_accumulator=0
--set mode=average
--set mode=ssp
--set steps=0
--set data=csv:/dev/zero
--set data=csv:/nonexistent
--local --set users=2 --set items=1
--in-graph --set users=2
CASES
