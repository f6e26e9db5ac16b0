#!/usr/bin/env bash
# Speed on the test bed (docs/netbed.md), printed as actorflow-bench does:
#   metric NAME ours=... baseline=... unit=... ratio=...
#
#   netbed_train_sync_1m_2w      sync steps/s of the 1 M-float linear regression (actorflow-bench's
#                                train_sync_1m_2w job), ps + 2 workers on 3 hosts, against the link
#                                limit: the ps link's rate / the bytes a step moves through it (2
#                                gradients in, then 2 parameter sets out: the release waits for
#                                every push, so the two phases cannot overlap)
#   netbed_train_sync_1m_2w_pipelined
#                                the same with [train] pipeline_sync (docs/wire.md "A pipelined
#                                sync round"), against the same store-and-forward limit: its own
#                                limit is twice that (both directions of the ps link at once)
#   netbed_train_sync_1m_2w_auto the same with [train] pipeline_sync = "auto" (the aggregator times
#                                both kinds of round and keeps the faster: docs/training.md "A
#                                pipelined sync round"), 4 x the steps so that its 46 timing
#                                rounds weigh little, against the same store-and-forward limit
#   netbed_train_sync_1m_2w_fast_ps
#                                pipelined against store-and-forward, the same run, where the
#                                workers' links are the limit (the ps link at 3 x RATE): each
#                                worker's link carries its gradient in and its parameters out,
#                                at once only when pipelined
#   netbed_train_async_1m_2w     async steps/s (every push a global step) of the same job, against
#                                the link limit: the ps link's rate / the model's bytes (each push
#                                moves one gradient in and one parameter set out, and two workers'
#                                pushes can use the two directions at once even store-and-forward)
#   netbed_train_async_1m_2w_pipelined
#                                the same with [train] pipeline_async (docs/training.md "Pipelined
#                                async pushes"), against the same limit
#   netbed_train_sync_3m_2w_3ps  sync steps/s of a 3072 x 1024 softmax (3.1 M floats, 12.6 MB) cut
#                                in 3 over 3 ps hosts, against the same job whole on 1 ps host;
#                                every link at RATE
#   netbed_train_sync_3m_2w_3ps_fast_workers
#                                the same, the workers' links at 3 x RATE, so that the ps links
#                                are the limit in both runs
#   netbed_train_sync_3m_6w_3ps  the same model with 6 workers, every link at RATE: the ps links
#                                are the limit in both runs (each worker's link carries the model
#                                once each way, each of 3 ps links 6/3 = 2 times), so up to 3x
#   netbed_train_embed_3ps_vs_1ps
#                                sync steps/s of the sparse job (docs/sparse.md): a 2 M x 64
#                                float32 table (512 MB; NB_EMBED_USERS rows) and 2 workers of 512
#                                uniform ids a step, the table cut by mod over 3 ps hosts, against
#                                the same job with the whole table on 1 ps host; every link at RATE
#                                with a 32 KiB bucket (NB_EMBED_BUCKET), NB_STEPS_EMBED (2000) steps
#   netbed_train_embed_3ps_vs_1ps_fast_workers
#                                the same, the workers' links at 3 x RATE, so that the ps links
#                                are the limit in both runs
#
#   tests/netbed/bench.sh BUILD_DIR [RATE] [REPS]     (root; defaults: 1gbit, 3)
# Each repetition runs baseline and ours back to back; the figure is the median.
# shellcheck source=tests/netbed/netbed.sh
source "$(dirname "$0")/netbed.sh"
nb_init "${1:?usage: bench.sh BUILD_DIR [RATE] [REPS]}" actorflow-train
rate=${2:-1gbit}
reps=${3:-3}
only=${NB_ONLY:-} # a comma-separated subset of the metric names
bits=$(nb_rate_bits "$rate") || nb_fail "rate '$rate': not a tc rate such as 1gbit or 200mbit"
fast_rate="$((bits * 3))bit"
steps_1m=${NB_STEPS_1M:-30}
steps_3m=${NB_STEPS_3M:-20}
steps_embed=${NB_STEPS_EMBED:-2000}
# 2 M rows (512 MB): its initialization on 1 ps (110-160 MB/s here, far less
# under load) stays within the 10 s the chief's session gives the one request
# that runs a variable's initializer; 4 M took over 10 s at a load average of 8
embed_users=${NB_EMBED_USERS:-2000000}
embed_bucket=${NB_EMBED_BUCKET:-32768}

want() { [[ -z $only || ,$only, == *",$1,"* ]]; }

# hosts 0-2: ps tasks, 3-4 (3-8 for the 6-worker metric): workers
if want netbed_train_sync_3m_6w_3ps; then
  nb_up 9 "$rate"
else
  nb_up 5 "$rate"
fi
workers=3,4 # the worker hosts of the next jobs
export OPENBLAS_NUM_THREADS=1

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

run=0
# run_job NAME PS_HOSTS KEY=VALUE...: one job of ps on PS_HOSTS (comma-separated)
# and workers on $workers; sets STEPS_PER_S and the bytes each host's link
# carried (PS_RX[h], PS_TX[h], by host: the ps hosts' and the workers').
# A run that timed out initializing its tables is run again, once.
run_job() {
  run_job_once 1 "$@" && return
  run_job_once 2 "$@"
}

run_job_once() {
  local attempt=$1 name=$2 ps=$3 k n rc
  shift 3
  run=$((run + 1))
  # shellcheck disable=SC2034 # read by nb_cluster_config
  NB_PS_PORT=$((4000 + 2 * run))
  # shellcheck disable=SC2034
  NB_WORKER_PORT=$((4001 + 2 * run))
  local cfg=$NB_DIR/$name-$run.toml
  nb_cluster_config "$cfg" "$ps" "$workers"
  printf '\n[train]\n' >>"$cfg"
  for kv in "$@"; do
    printf '%s\n' "$kv" >>"$cfg"
  done
  # [node] keys of every process of the job (a ps holding a shard over the
  # default 2 GiB per variable)
  [[ -n ${NODE_KEYS:-} ]] && printf '\n[node]\n%s\n' "$NODE_KEYS" >>"$cfg"
  declare -gA RX0=() TX0=()
  for k in ${ps//,/ } ${workers//,/ }; do
    RX0[$k]=$(nb_rx_bytes "$k")
    TX0[$k]=$(nb_tx_bytes "$k")
  done
  local names=()
  k=0
  for h in ${ps//,/ }; do
    nb_start "$h" "$name-$run-ps$k" "$NB_BIN/actorflow-train" --config "$cfg" --job ps --task "$k"
    names+=("$name-$run-ps$k")
    k=$((k + 1))
  done
  k=0
  for h in ${workers//,/ }; do
    nb_start "$h" "$name-$run-worker$k" "$NB_BIN/actorflow-train" --config "$cfg" --job worker --task "$k"
    names+=("$name-$run-worker$k")
    k=$((k + 1))
  done
  JOB_FAILED=
  for n in "${names[@]}"; do
    nb_wait_exit "$n" 600
    rc=$?
    ((rc == 0)) || [[ -n $JOB_FAILED ]] || JOB_FAILED="$n exited $rc: $(tail -n 2 "$NB_DIR/$n.log")"
  done
  if [[ -n $JOB_FAILED ]]; then
    # A shard's initializer runs within the one request the chief's session
    # bounds by 10 s: a large shard on a loaded machine can take longer. Such
    # a run is run again, once; any other failure fails the bench.
    if ((attempt == 1)) && grep -q "initialization of .* got no answer within" "$NB_DIR/$name-$run-worker0.log"; then
      echo "# $name: run $run timed out initializing its tables (load: $(uptime | sed 's/.*load average: //')); running it again"
      return 1
    fi
    nb_fail "$JOB_FAILED"
  fi
  STEPS_PER_S=$(sed -nE 's/^train done: .* steps_per_s=([0-9.]+)( .*)?$/\1/p' "$NB_DIR/$name-$run-worker0.log")
  [[ -n $STEPS_PER_S ]] || nb_fail "$name: the chief printed no steps_per_s: $(tail -n 1 "$NB_DIR/$name-$run-worker0.log")"
  declare -gA PS_RX=() PS_TX=() # by host: the ps hosts' and the workers'
  for k in ${ps//,/ } ${workers//,/ }; do
    PS_RX[$k]=$(($(nb_rx_bytes "$k") - RX0[$k]))
    PS_TX[$k]=$(($(nb_tx_bytes "$k") - TX0[$k]))
  done
}

report() {
  local name=$1 unit=$2 ours base
  shift 2
  ours=$(median "${OURS[@]}")
  base=$(median "${BASE[@]}")
  echo "# $name reps: ours ${OURS[*]}; baseline ${BASE[*]}"
  awk -v n="$name" -v o="$ours" -v b="$base" -v u="$unit" \
    'BEGIN {printf "metric %s ours=%.3f baseline=%.3f unit=%s ratio=%.3f\n", n, o, b, u, o / b}'
}

echo "# netbed: $(lscpu | grep 'Model name' | sed 's/  */ /g'); $(nproc) CPUs; load: $(uptime | sed 's/.*load average: //')"
echo "# links shaped to $rate (tbf, each direction) unless said otherwise"

if want netbed_train_sync_1m_2w; then
  keys=(mode='"sync"' model='"linear"' data='"synthetic_linear"' synthetic_features=1048576
        synthetic_examples=16 batch_size=1 "steps=$steps_1m" learning_rate=1e-7 log_every=0 eval_every=0)
  model_bytes=$((1048576 * 4 + 4)) # w and b
  # 2 gradients in, then 2 parameter sets out, through the ps's link
  limit=$(awk -v r="$bits" -v m="$model_bytes" 'BEGIN {printf "%.4f", r / 8 / (4 * m)}')
  OURS=() BASE=()
  for ((i = 0; i < reps; ++i)); do
    run_job sync1m 0 "${keys[@]}"
    OURS+=("$STEPS_PER_S")
    BASE+=("$limit")
    echo "# sync1m rep $i: $STEPS_PER_S steps/s; the ps link carried $((PS_RX[0] / steps_1m)) bytes in and $((PS_TX[0] / steps_1m)) out per step (payload $((2 * model_bytes)) each way)"
  done
  report netbed_train_sync_1m_2w steps/s
fi

if want netbed_train_sync_1m_2w_pipelined; then
  # The same job with [train] pipeline_sync: gradients in and parameters out
  # overlap on the ps's link (full duplex), so its limit is twice the
  # store-and-forward one; the baseline stays the store-and-forward limit.
  keys=(mode='"sync"' model='"linear"' data='"synthetic_linear"' synthetic_features=1048576
        synthetic_examples=16 batch_size=1 "steps=$steps_1m" learning_rate=1e-7 log_every=0 eval_every=0
        pipeline_sync=true)
  model_bytes=$((1048576 * 4 + 4))
  limit=$(awk -v r="$bits" -v m="$model_bytes" 'BEGIN {printf "%.4f", r / 8 / (4 * m)}')
  OURS=() BASE=()
  for ((i = 0; i < reps; ++i)); do
    run_job sync1mp 0 "${keys[@]}"
    OURS+=("$STEPS_PER_S")
    BASE+=("$limit")
    echo "# sync1m pipelined rep $i: $STEPS_PER_S steps/s (the pipelined link limit: $(awk -v l="$limit" 'BEGIN {printf "%.2f", 2 * l}'))"
  done
  report netbed_train_sync_1m_2w_pipelined steps/s
fi

if want netbed_train_sync_1m_2w_auto; then
  # pipeline_sync = "auto": where the ps's link is the limit it should keep
  # pipelined rounds (the ps logs its choice); the baseline stays the
  # store-and-forward limit.
  keys=(mode='"sync"' model='"linear"' data='"synthetic_linear"' synthetic_features=1048576
        synthetic_examples=16 batch_size=1 "steps=$((4 * steps_1m))" learning_rate=1e-7 log_every=0
        eval_every=0 pipeline_sync='"auto"')
  model_bytes=$((1048576 * 4 + 4))
  limit=$(awk -v r="$bits" -v m="$model_bytes" 'BEGIN {printf "%.4f", r / 8 / (4 * m)}')
  OURS=() BASE=()
  for ((i = 0; i < reps; ++i)); do
    run_job sync1mauto 0 "${keys[@]}"
    OURS+=("$STEPS_PER_S")
    BASE+=("$limit")
    chose=$(grep -ho 'chose [a-z-]* rounds: median period [0-9.]* ms pipelined, [0-9.]* ms store-and-forward' "$NB_DIR/sync1mauto-$run-ps0.log" 2>/dev/null | tail -n 1)
    echo "# sync1m auto rep $i: $STEPS_PER_S steps/s; the ps ${chose:-logged no choice}"
  done
  report netbed_train_sync_1m_2w_auto steps/s
fi

if want netbed_train_sync_1m_2w_fast_ps; then
  # The workers' links, not the ps's, the limit: the ps link at 3 x RATE.
  # Store-and-forward, a worker's link carries its gradient in, then its
  # parameters out (its limit: RATE / 8 / (2 x the model)); pipelined, both
  # directions at once (twice that). The baseline is store-and-forward's
  # steps/s in the same run, both printed.
  keys=(mode='"sync"' model='"linear"' data='"synthetic_linear"' synthetic_features=1048576
        synthetic_examples=16 batch_size=1 "steps=$steps_1m" learning_rate=1e-7 log_every=0 eval_every=0)
  model_bytes=$((1048576 * 4 + 4))
  limit=$(awk -v r="$bits" -v m="$model_bytes" 'BEGIN {printf "%.2f", r / 8 / (2 * m)}')
  nb_shape 0 "$fast_rate"
  OURS=() BASE=()
  for ((i = 0; i < reps; ++i)); do
    run_job sync1m-fastps 0 "${keys[@]}"
    BASE+=("$STEPS_PER_S")
    run_job sync1mp-fastps 0 "${keys[@]}" pipeline_sync=true
    OURS+=("$STEPS_PER_S")
    echo "# sync1m, the ps link at $fast_rate, rep $i: store-and-forward ${BASE[-1]}, pipelined ${OURS[-1]} steps/s (the workers' links' limits: $limit and $(awk -v l="$limit" 'BEGIN {printf "%.2f", 2 * l}'))"
  done
  nb_shape 0 "$rate"
  report netbed_train_sync_1m_2w_fast_ps steps/s
fi

for piped in false true; do
  name=netbed_train_async_1m_2w
  [[ $piped == true ]] && name=${name}_pipelined
  want "$name" || continue
  keys=(mode='"async"' model='"linear"' data='"synthetic_linear"' synthetic_features=1048576
        synthetic_examples=16 batch_size=1 "steps=$((2 * steps_1m))" learning_rate=1e-7 log_every=0
        eval_every=0 "pipeline_async=$piped")
  model_bytes=$((1048576 * 4 + 4))
  limit=$(awk -v r="$bits" -v m="$model_bytes" 'BEGIN {printf "%.4f", r / 8 / m}')
  OURS=() BASE=()
  for ((i = 0; i < reps; ++i)); do
    run_job "async1m-$piped" 0 "${keys[@]}"
    OURS+=("$STEPS_PER_S")
    BASE+=("$limit")
    echo "# async1m pipeline_async=$piped rep $i: $STEPS_PER_S steps/s; the ps link carried $((PS_RX[0] / (2 * steps_1m))) bytes in and $((PS_TX[0] / (2 * steps_1m))) out per step (payload $model_bytes each way)"
  done
  report "$name" steps/s
done

keys3=(mode='"sync"' model='"softmax"' data='"synthetic"' synthetic_features=3072 synthetic_classes=1024
       synthetic_examples=256 batch_size=4 "steps=$steps_3m" optimizer='"sgd"' learning_rate=0.001
       log_every=0 eval_every=0)
bytes3=$(((3072 * 1024 + 1024) * 4))

bench_3ps() {
  local name=$1
  OURS=() BASE=()
  for ((i = 0; i < reps; ++i)); do
    run_job whole 0 "${keys3[@]}" max_partitions=1
    BASE+=("$STEPS_PER_S")
    echo "# $name rep $i: 1 ps host: $STEPS_PER_S steps/s, its link $((PS_RX[0] / steps_3m)) bytes in / $((PS_TX[0] / steps_3m)) out per step"
    run_job cut 0,1,2 "${keys3[@]}" max_partitions=3
    OURS+=("$STEPS_PER_S")
    echo "# $name rep $i: 3 ps hosts: $STEPS_PER_S steps/s, their links per step in/out: $((PS_RX[0] / steps_3m))/$((PS_TX[0] / steps_3m)) $((PS_RX[1] / steps_3m))/$((PS_TX[1] / steps_3m)) $((PS_RX[2] / steps_3m))/$((PS_TX[2] / steps_3m))"
  done
  report "$name" steps/s
}

if want netbed_train_sync_3m_2w_3ps; then
  # link limits: 1 ps: 2 x 12.6 MB in, then out, through its link; 3 ps: each
  # ps link a third of that, but each worker's link carries 12.6 MB out, then in
  awk -v r="$bits" -v m="$bytes3" 'BEGIN {printf "# link limits at equal rates: 1 ps %.3f steps/s; 3 ps %.3f (the workers links; ratio at most 2)\n", r / 8 / (4 * m), r / 8 / (2 * m)}'
  bench_3ps netbed_train_sync_3m_2w_3ps
fi

if want netbed_train_sync_3m_2w_3ps_fast_workers; then
  nb_shape 3 "$fast_rate"
  nb_shape 4 "$fast_rate"
  awk -v r="$bits" -v m="$bytes3" 'BEGIN {printf "# workers links at 3x: link limits: 1 ps %.3f steps/s; 3 ps %.3f (ratio at most 3)\n", r / 8 / (4 * m), 3 * r / 8 / (4 * m)}'
  bench_3ps netbed_train_sync_3m_2w_3ps_fast_workers
  nb_shape 3 "$rate"
  nb_shape 4 "$rate"
fi

if want netbed_train_sync_3m_6w_3ps; then
  # link limits: 1 ps: 6 x 12.6 MB in, then out, through its link; 3 ps: each
  # ps link 2 x 12.6 MB each way (each worker's link only 1 x)
  awk -v r="$bits" -v m="$bytes3" 'BEGIN {printf "# 6 workers: link limits at equal rates: 1 ps %.3f steps/s; 3 ps %.3f (ratio at most 3)\n", r / 8 / (12 * m), r / 8 / (4 * m)}'
  workers=3,4,5,6,7,8
  bench_3ps netbed_train_sync_3m_6w_3ps
  workers=3,4
fi

# per_step BYTES: BYTES over the sparse figure's steps
per_step() { echo $(($1 / steps_embed)); }
# link_bytes HOST...: "in/out" per step of each host's link, from the last run_job
link_bytes() {
  local h out=()
  for h in "$@"; do
    out+=("$(per_step "${PS_RX[$h]}")/$(per_step "${PS_TX[$h]}")")
  done
  echo "${out[*]}"
}

# The table is the recommender's user table, users x (dim + 1 = 64) floats,
# beside an item table of 3 rows; uniform ids (zipf = 0), so a worker's 512
# ids are about 512 distinct rows: 131 KB of rows from the ps, then 131 KB of
# their gradients to it (and 4 KB of ids each way) per worker step. A 2 %
# holdout keeps the chief's held-out scoring (not timed) short.
keys_embed=(mode='"sync"' model='"recommender"' "users=$embed_users" items=3 dim=63 zipf=0
            partition_strategy='"mod"' data='"synthetic"' synthetic_examples=262144 holdout=0.02
            batch_size=512 "steps=$steps_embed" optimizer='"sgd"' learning_rate=0.1 seed=1
            log_every=500 max_data_bytes=12000000000)
row_bytes=$((64 * 4))

# bench_embed NAME WORKER_RATE: the table over 1 ps host, then over 3, REPS
# times; the ps links at $rate, the workers' at WORKER_RATE.
bench_embed() {
  local name=$1 wrate=$2 h i one_in one_out w_in w_out ps3=0 b
  # the whole table on 1 ps is one variable: over the default 2 GiB at 10 M rows
  NODE_KEYS="max_variable_bytes = $((embed_users * row_bytes + (1 << 20)))"
  # A step's messages (100-300 KB a link each way) are about the default
  # bucket's size (2 ms of the rate, 250 KB at 1gbit), which lets a link that
  # idled through a step's other phase send them nearly at once: a small
  # bucket (and GSO packets that fit it) keeps every link at its rate.
  for h in 0 1 2; do
    nb_shape "$h" "$rate" "$embed_bucket"
  done
  for h in 3 4; do
    nb_shape "$h" "$wrate" "$embed_bucket"
  done
  echo "# $name: $embed_users x 64 float32 table ($((embed_users * row_bytes)) bytes), 2 sync workers of 512 uniform ids, $steps_embed steps a run; ps links at $rate, workers' at $wrate, buckets of $embed_bucket bytes"
  OURS=() BASE=()
  for ((i = 0; i < reps; ++i)); do
    run_job embed1 0 "${keys_embed[@]}"
    BASE+=("$STEPS_PER_S")
    one_in=$(per_step "${PS_RX[0]}")
    one_out=$(per_step "${PS_TX[0]}")
    echo "# $name rep $i: 1 ps host: $STEPS_PER_S steps/s; bytes per step in/out: its link $(link_bytes 0), the workers' $(link_bytes 3 4)"
    run_job embed3 0,1,2 "${keys_embed[@]}"
    OURS+=("$STEPS_PER_S")
    echo "# $name rep $i: 3 ps hosts: $STEPS_PER_S steps/s; bytes per step in/out: their links $(link_bytes 0 1 2), the workers' $(link_bytes 3 4)"
    w_in=$(per_step "${PS_RX[3]}")
    w_out=$(per_step "${PS_TX[3]}")
    for h in 0 1 2; do
      b=$(($(per_step "${PS_RX[$h]}") + $(per_step "${PS_TX[$h]}") / 2))
      ((b > ps3)) && ps3=$b
    done
  done
  # The link limits of these bytes, compute taken as nil. A sync step: every
  # worker gathers its rows, computes, pushes its gradients, waits for the
  # release. 1 ps: its link sends the workers' rows one after the other (a
  # FIFO), so the first worker's push comes in beside the second's rows: the
  # step takes half the rows out plus every push in. 3 ps: a worker's link
  # takes its rows in, then its push out, one after the other; a ps link
  # carries a third of the 1 ps link's bytes, as that one does.
  awk -v r="$(nb_rate_bits "$rate")" -v wr="$(nb_rate_bits "$wrate")" -v i="$one_in" -v o="$one_out" \
    -v wi="$w_in" -v wo="$w_out" -v p="$ps3" 'BEGIN {
      one = r / 8 / (o / 2 + i); wk = wr / 8 / (wi + wo); ps = r / 8 / p
      three = wk < ps ? wk : ps
      printf "# link limits of these bytes: 1 ps %.0f steps/s (its link: half the rows out, then every push in); 3 ps %.0f (a worker'"'"'s link %.0f, a ps link %.0f); ratio %.2f\n",
        one, three, wk, ps, three / one }'
  report "$name" steps/s
  NODE_KEYS=
  for h in 0 1 2 3 4; do
    nb_shape "$h" "$rate"
  done
}

if want netbed_train_embed_3ps_vs_1ps; then
  bench_embed netbed_train_embed_3ps_vs_1ps "$rate"
fi

if want netbed_train_embed_3ps_vs_1ps_fast_workers; then
  bench_embed netbed_train_embed_3ps_vs_1ps_fast_workers "$fast_rate"
fi
