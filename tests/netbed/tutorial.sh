#!/usr/bin/env bash
# The tutorial's ps + 2 workers on the test bed: one actorflow-node per host
# (ps on 198.18.0.1, workers on .2 and .3), the tutorial's client on a fourth
# host. Checks: the ps ends at 10.0 (2 workers x 5 increments), the client's
# traffic really crossed the links (the ps host's link counted its bytes), and
# every node stops cleanly (exit 0) when told to.
#   tests/netbed/tutorial.sh BUILD_DIR [RATE]     (root; exit 77 = skipped)
# shellcheck source=tests/netbed/netbed.sh
source "$(dirname "$0")/netbed.sh"
nb_init "${1:?usage: tutorial.sh BUILD_DIR [RATE]}" actorflow-node actorflow-tutorial
rate=${2:-1gbit}

nb_up 4 "$rate"
cfg=$NB_DIR/cluster.toml
nb_cluster_config "$cfg" 0 1,2
nb_start 0 ps0 "$NB_BIN/actorflow-node" --config "$cfg" --job ps --task 0
nb_start 1 worker0 "$NB_BIN/actorflow-node" --config "$cfg" --job worker --task 0
nb_start 2 worker1 "$NB_BIN/actorflow-node" --config "$cfg" --job worker --task 1
for n in ps0 worker0 worker1; do
  nb_wait_log "$n" "^actorflow-node ready: " 30 "ready line"
done
grep -q "at ${NB_IP[0]}:3335 " "$NB_DIR/ps0.log" || nb_fail "the ps's ready line names no ${NB_IP[0]}:3335: $(grep ready "$NB_DIR/ps0.log")"

ps_rx0=$(nb_rx_bytes 0)
nb_start 3 client "$NB_BIN/actorflow-tutorial" ps-workers --config "$cfg" --pause-ms 0
nb_wait_exit client 120
rc=$?
((rc == 0)) || nb_fail "actorflow-tutorial ps-workers exited $rc: $(tail -n 3 "$NB_DIR/client.log")"
grep -Eq "^Final value of var on /job:ps/task:0: 10\.0$" "$NB_DIR/client.log" ||
  nb_fail "the client printed no 'Final value of var on /job:ps/task:0: 10.0': $(tail -n 3 "$NB_DIR/client.log")"
ps_rx=$(($(nb_rx_bytes 0) - ps_rx0))
# 10 increments and a read went to the ps host through its link
((ps_rx > 2000)) || nb_fail "the ps host's link carried $ps_rx bytes to it during the job: the traffic did not cross the bed"

for n in ps0 worker0 worker1; do
  kill -TERM "${NB_PID[$n]}"
done
for n in ps0 worker0 worker1; do
  nb_wait_exit "$n" 20
  rc=$?
  ((rc == 0)) || nb_fail "$n exited $rc after SIGTERM (0 expected): $(tail -n 1 "$NB_DIR/$n.log")"
done
echo "netbed tutorial: ps + 2 workers on 3 hosts at $rate: final value 10.0; $ps_rx bytes crossed the ps host's link; every node stopped with 0"
