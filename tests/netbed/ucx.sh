#!/usr/bin/env bash
# A sync training job on the test bed with [security] trusted_fabric = true
# (docs/wire.md "UCX"): the digits MLP, one actorflow-train per host (ps on
# 198.18.0.1, workers on .2 and .3), run twice: once with trusted_fabric, once
# without. The workers' data connections to the ps (pushes and pulls) are to
# another host, so with it they move to UCX without any test hook, and never
# to shared memory. Checks: both runs finish all steps with every process at
# 0, the ps logged connections that moved to UCX in the first run and none in
# the second. Prints both runs' wall times. Skipped (77) without root or
# without UCX in the build.
#   tests/netbed/ucx.sh BUILD_DIR [RATE]
# shellcheck source=tests/netbed/netbed.sh
source "$(dirname "$0")/netbed.sh"
nb_init "${1:?usage: ucx.sh BUILD_DIR [RATE]}" actorflow-train
rate=${2:-1gbit}
steps=300
grep -q "^UCP_LIBRARY:FILEPATH=/" "$1/CMakeCache.txt" 2>/dev/null &&
  ! grep -q "^ACTORFLOW_WITH_UCX:BOOL=OFF" "$1/CMakeCache.txt" || nb_skip "the build has no UCX"

nb_up 3 "$rate"
src=$(cd "$(dirname "$0")/../.." && pwd)
export ACTORFLOW_DATA_DIR=$src/data
# run NAME TRUSTED: one training job; its wall time in ms on stdout
run() {
  local name=$1 trusted=$2 cfg=$NB_DIR/$1.toml t0 t1 n
  nb_cluster_config "$cfg" 0 1,2
  printf 'trusted_fabric = %s\n' "$trusted" >>"$cfg" # under [security], the last table so far
  cat >>"$cfg" <<EOT

[train]
mode = "sync"
model = "mlp"
hidden = [128]
data = "digits"
batch_size = 32
steps = $steps
optimizer = "adam"
learning_rate = 0.003
log_every = 100
eval_every = 0
EOT
  t0=$(date +%s%N)
  nb_start 0 "$name-ps0" "$NB_BIN/actorflow-train" --config "$cfg" --job ps --task 0
  nb_start 1 "$name-worker0" "$NB_BIN/actorflow-train" --config "$cfg" --job worker --task 0
  nb_start 2 "$name-worker1" "$NB_BIN/actorflow-train" --config "$cfg" --job worker --task 1
  for n in worker0 worker1 ps0; do
    nb_wait_exit "$name-$n" 180
    rc=$?
    ((rc == 0)) || nb_fail "$name: $n exited $rc: $(tail -n 2 "$NB_DIR/$name-$n.log")"
  done
  t1=$(date +%s%N)
  grep -Eq "^train done: mode=sync workers=2 global_step=$steps " "$NB_DIR/$name-worker0.log" ||
    nb_fail "$name: the chief printed no 'train done: mode=sync workers=2 global_step=$steps'"
  grep -q "shared memory" "$NB_DIR/$name-ps0.log" && nb_fail "$name: a connection between hosts took shared memory"
  echo $(((t1 - t0) / 1000000))
}
ucx_ms=$(run ucx true) || exit 1
moved=$(grep -c "moved to ucx" "$NB_DIR/ucx-ps0.log")
((moved > 0)) || nb_fail "with trusted_fabric no data connection to the ps moved to UCX: $(grep -i "ucx\|stays on" "$NB_DIR/ucx-ps0.log" | tail -n 3)"
how=$(grep -o "moved to ucx ([a-z_0-9, ]*)" "$NB_DIR/ucx-ps0.log" | sort | uniq -c | tr -s ' ' | paste -sd ';')
tcp_ms=$(run tcp false) || exit 1
grep -q "moved to ucx" "$NB_DIR/tcp-ps0.log" && nb_fail "without trusted_fabric a data connection moved to UCX"
echo "netbed ucx: sync training (digits MLP, $steps steps, 2 workers) on 3 hosts at $rate: with trusted_fabric $moved data connections to the ps moved to UCX ($how), ${ucx_ms} ms; without, on TCP, ${tcp_ms} ms"
