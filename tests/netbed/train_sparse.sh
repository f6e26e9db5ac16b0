#!/usr/bin/env bash
# The sparse job (docs/sparse.md, "The sparse job") across hosts: the
# recommender's user and item tables cut by mod over 3 ps hosts (198.18.0.1-3),
# 2 sync workers on .4 and .5, one process per task. Small tables (300 users,
# 200 items, dim 4), a planted truth, 4 epochs (about 940 global steps).
# Checks: every process exits 0; the chief's `train done` says mode=sync
# workers=2 and the job's global step; its held-out AUC is within 0.002 of
# the one-process trainer's on the same data at the same global batch (sync
# with 2 workers of 256 is one process at 512, the same example order: the
# margin is for the order of float sums; a round that drops one worker's rows
# ends 0.005 lower), and within 0.03 of the planted truth's own; each ps
# host's link carried bytes both ways (its shards' rows out, their gradients
# in).
#   tests/netbed/train_sparse.sh BUILD_DIR [RATE]   (root; exit 77 = skipped)
# shellcheck source=tests/netbed/netbed.sh
source "$(dirname "$0")/netbed.sh"
nb_init "${1:?usage: train_sparse.sh BUILD_DIR [RATE]}" actorflow-train
rate=${2:-1gbit}
batch=256

nb_up 5 "$rate"
cfg=$NB_DIR/sparse.toml
nb_cluster_config "$cfg" 0,1,2 3,4
cat >>"$cfg" <<EOF

[train]
mode = "sync"
model = "recommender"
users = 300
items = 200
dim = 4
zipf = 0.8
partition_strategy = "mod"
data = "synthetic"
synthetic_examples = 150000
holdout = 0.2
batch_size = $batch
epochs = 4
optimizer = "adam"
learning_rate = 0.02
seed = 1
log_every = 100
EOF

# The reference: the same data and model in one process at the job's global
# batch (2 workers x 256). Run in host 0's namespace: it uses no network.
nb_exec 0 "$NB_BIN/actorflow-train" --config "$cfg" --local --set batch_size=$((2 * batch)) \
  >"$NB_DIR/local.log" 2>&1 || nb_fail "the one-process run failed: $(tail -n 3 "$NB_DIR/local.log")"
# held-out: auc=A log_loss=L examples=N (planted truth: auc=T log_loss=M)
auc_of() { sed -nE 's/^held-out: auc=([0-9.]+) .*/\1/p' "$1"; }
truth_of() { sed -nE 's/^held-out: .*\(planted truth: auc=([0-9.]+) .*/\1/p' "$1"; }
local_auc=$(auc_of "$NB_DIR/local.log")
[[ -n $local_auc ]] || nb_fail "the one-process run printed no held-out AUC: $(tail -n 2 "$NB_DIR/local.log")"
local_steps=$(sed -nE 's/^train done: mode=local workers=1 global_step=([0-9]+) .*/\1/p' "$NB_DIR/local.log")
[[ -n $local_steps ]] || nb_fail "the one-process run printed no 'train done': $(tail -n 1 "$NB_DIR/local.log")"

for k in 0 1 2; do
  nb_start "$k" "ps$k" "$NB_BIN/actorflow-train" --config "$cfg" --job ps --task "$k"
done
nb_start 3 worker0 "$NB_BIN/actorflow-train" --config "$cfg" --job worker --task 0
nb_start 4 worker1 "$NB_BIN/actorflow-train" --config "$cfg" --job worker --task 1
for n in worker0 worker1 ps0 ps1 ps2; do
  nb_wait_exit "$n" 300
  rc=$?
  ((rc == 0)) || nb_fail "$n exited $rc: $(tail -n 2 "$NB_DIR/$n.log")"
done

done_line=$(grep '^train done' "$NB_DIR/worker0.log")
[[ $done_line =~ ^train\ done:\ mode=sync\ workers=2\ global_step=$local_steps\  ]] ||
  nb_fail "the chief's 'train done' is not mode=sync workers=2 global_step=$local_steps (the one-process run's steps): '$done_line'"
auc=$(auc_of "$NB_DIR/worker0.log")
truth=$(truth_of "$NB_DIR/worker0.log")
[[ -n $auc && -n $truth ]] || nb_fail "the chief printed no held-out AUC and planted truth: $(grep held-out "$NB_DIR/worker0.log")"
awk -v a="$auc" -v l="$local_auc" 'BEGIN {exit !(a >= l - 0.002 && a <= l + 0.002)}' ||
  nb_fail "held-out AUC $auc is not within 0.002 of the one-process run's $local_auc"
awk -v a="$auc" -v t="$truth" 'BEGIN {exit !(a > t - 0.03)}' ||
  nb_fail "held-out AUC $auc is not within 0.03 of the planted truth's $truth"

links=
for k in 0 1 2; do
  rx=$(nb_rx_bytes "$k")
  tx=$(nb_tx_bytes "$k")
  # at least one touched row (5 floats) per global step, each way
  ((rx >= local_steps * 20 && tx >= local_steps * 20)) ||
    nb_fail "ps $k's link carried $rx bytes in and $tx out over $local_steps steps: its shards' rows did not cross it"
  links+=" ps$k:${rx}in/${tx}out"
done
echo "netbed train_sparse: recommender 300x5 + 200x5 tables cut by mod over 3 ps + 2 sync workers at $rate: auc=$auc (one process at batch $((2 * batch)): $local_auc; planted truth: $truth); links$links; $done_line"
