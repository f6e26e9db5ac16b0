#!/usr/bin/env bash
# A sync training job on the test bed: the digits MLP (64-128-10, 9610
# floats), one actorflow-train per host: ps on 198.18.0.1, workers (the chief
# first) on .2 and .3. Checks: every process exits 0, the chief's `train done`
# says sync, 2 workers, global_step=STEPS, the loss it logged fell by half,
# the held-out accuracy is above 0.85, and the gradients and parameters
# crossed the ps host's link: at least STEPS x 2 workers x 38440 bytes each way.
#   tests/netbed/train_sync.sh BUILD_DIR [RATE]     (root; exit 77 = skipped)
# shellcheck source=tests/netbed/netbed.sh
source "$(dirname "$0")/netbed.sh"
nb_init "${1:?usage: train_sync.sh BUILD_DIR [RATE]}" actorflow-train
rate=${2:-1gbit}
steps=300
param_bytes=38440 # (64*128 + 128 + 128*10 + 10) floats

nb_up 3 "$rate"
cfg=$NB_DIR/train.toml
nb_cluster_config "$cfg" 0 1,2
cat >>"$cfg" <<EOF

[train]
mode = "sync"
model = "mlp"
hidden = [128]
data = "digits"
batch_size = 32
steps = $steps
optimizer = "adam"
learning_rate = 0.003
log_every = 25
eval_every = 0
EOF
src=$(cd "$(dirname "$0")/../.." && pwd)
export ACTORFLOW_DATA_DIR=$src/data
nb_start 0 ps0 "$NB_BIN/actorflow-train" --config "$cfg" --job ps --task 0
nb_start 1 worker0 "$NB_BIN/actorflow-train" --config "$cfg" --job worker --task 0
nb_start 2 worker1 "$NB_BIN/actorflow-train" --config "$cfg" --job worker --task 1
for n in worker0 worker1 ps0; do
  nb_wait_exit "$n" 180
  rc=$?
  ((rc == 0)) || nb_fail "$n exited $rc: $(tail -n 2 "$NB_DIR/$n.log")"
done
log=$NB_DIR/worker0.log
grep -Eq "^train done: mode=sync workers=2 global_step=$steps " "$log" ||
  nb_fail "the chief printed no 'train done: mode=sync workers=2 global_step=$steps': $(grep 'train done' "$log")"
first=$(awk '/^step [0-9]+\/[0-9]+ +loss / {print $4; exit}' "$log")
last=$(awk '/^step [0-9]+\/[0-9]+ +loss / {l = $4} END {print l}' "$log")
[[ -n $first && -n $last ]] || nb_fail "the chief logged no 'step N/M  loss X' lines"
awk -v f="$first" -v l="$last" 'BEGIN {exit !(l < f / 2)}' ||
  nb_fail "the loss did not fall by half: first logged $first, last $last"
acc=$(sed -nE 's/^held-out accuracy: ([0-9.]+) .*/\1/p' "$log")
awk -v a="$acc" 'BEGIN {exit !(a != "" && a > 0.85)}' ||
  nb_fail "held-out accuracy '$acc' (above 0.85 expected)"
rx=$(nb_rx_bytes 0)
tx=$(nb_tx_bytes 0)
need=$((steps * 2 * param_bytes))
((rx >= need && tx >= need)) ||
  nb_fail "the ps host's link carried $rx bytes in and $tx out; a sync job of $steps steps moves at least $need each way"
echo "netbed train_sync: digits MLP, 300 sync steps on 3 hosts at $rate: loss $first -> $last, held-out accuracy $acc, ps link $rx bytes in / $tx out, $(grep '^train done' "$log")"
