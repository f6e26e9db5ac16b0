#!/usr/bin/env bash
# A sync job whose weight is partitioned over 3 ps hosts: a softmax regression
# of 3072 x 1024 floats (12.6 MB) with max_partitions = 3, ps on 198.18.0.1-3,
# workers on .4 and .5, a REPL client on .6. Checks: every process exits 0,
# the chief's `train done` says global_step=STEPS; while the job runs, the
# REPL's `vars` shows one piece of the weight (w.../part_K) on each of the
# three ps tasks, a different piece on each; and each ps host's link carried
# its third of the gradients: at least STEPS x 2 workers x 4 MB in and out.
#   tests/netbed/train_partitioned.sh BUILD_DIR [RATE]   (root; exit 77 = skipped)
# shellcheck source=tests/netbed/netbed.sh
source "$(dirname "$0")/netbed.sh"
nb_init "${1:?usage: train_partitioned.sh BUILD_DIR [RATE]}" actorflow-train actorflow-repl
rate=${2:-1gbit}
steps=40
piece_bytes=$((1024 * 1024 * 4)) # 3072 / 3 rows x 1024 columns x 4 bytes

nb_up 6 "$rate"
cfg=$NB_DIR/train.toml
nb_cluster_config "$cfg" 0,1,2 3,4
cat >>"$cfg" <<EOF

[train]
mode = "sync"
model = "softmax"
data = "synthetic"
synthetic_features = 3072
synthetic_classes = 1024
synthetic_examples = 256
batch_size = 4
steps = $steps
optimizer = "sgd"
learning_rate = 0.001
log_every = 10
eval_every = 0
max_partitions = 3
EOF
for k in 0 1 2; do
  nb_start "$k" "ps$k" "$NB_BIN/actorflow-train" --config "$cfg" --job ps --task "$k"
done
nb_start 3 worker0 "$NB_BIN/actorflow-train" --config "$cfg" --job worker --task 0
nb_start 4 worker1 "$NB_BIN/actorflow-train" --config "$cfg" --job worker --task 1

# Where the pieces are, asked of the running job by a client on its own host.
script=$NB_DIR/vars.af
printf 'vars /job:ps/task:0\nvars /job:ps/task:1\nvars /job:ps/task:2\n' >"$script"
nb_wait_log worker0 "^step 10/$steps " 120 "first progress line (step 10)"
nb_exec 5 timeout 30 "$NB_BIN/actorflow-repl" --config "$cfg" --job worker --task 0 --no-history \
  --script "$script" >"$NB_DIR/vars.log" 2>&1
rc=$?
((rc == 0)) || nb_fail "the REPL's vars exited $rc: $(tail -n 3 "$NB_DIR/vars.log")"
declare -A piece_on=()
for k in 0 1 2; do
  piece=$(grep -E "/job:ps/replica:0/task:$k/device:" "$NB_DIR/vars.log" | awk '{print $1}' |
          grep -E '/part_[0-9]+$' | tr '\n' ' ')
  [[ $piece =~ ^[^\ ]+\ $ ]] || nb_fail "ps $k holds pieces '$piece' (one /part_ piece expected): $(cat "$NB_DIR/vars.log")"
  piece_on[$k]=${piece% }
done
[[ ${piece_on[0]} != "${piece_on[1]}" && ${piece_on[1]} != "${piece_on[2]}" &&
   ${piece_on[0]} != "${piece_on[2]}" ]] || nb_fail "the ps tasks hold the same piece: ${piece_on[*]}"

for n in worker0 worker1 ps0 ps1 ps2; do
  nb_wait_exit "$n" 300
  rc=$?
  ((rc == 0)) || nb_fail "$n exited $rc: $(tail -n 2 "$NB_DIR/$n.log")"
done
grep -Eq "^train done: mode=sync workers=2 global_step=$steps " "$NB_DIR/worker0.log" ||
  nb_fail "the chief printed no 'train done: mode=sync workers=2 global_step=$steps': $(grep 'train done' "$NB_DIR/worker0.log")"
need=$((steps * 2 * piece_bytes))
links=
for k in 0 1 2; do
  rx=$(nb_rx_bytes "$k")
  tx=$(nb_tx_bytes "$k")
  ((rx >= need && tx >= need)) ||
    nb_fail "ps $k's link carried $rx bytes in and $tx out; its piece's gradients and values are at least $need each way"
  links+=" ps$k=${piece_on[$k]}:${rx}in/${tx}out"
done
echo "netbed train_partitioned: 3072x1024 softmax cut in 3, $steps sync steps, 3 ps + 2 workers at $rate:$links; $(grep '^train done' "$NB_DIR/worker0.log")"
