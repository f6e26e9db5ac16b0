#!/bin/bash
# Starts a long sparse sync job, one process per task (3 ps + 2 workers of config/embeddings.toml),
# in WORKDIR; extra --set options in $EXTRA. usage: tests/attack/start_job.sh BUILD_DIR WORKDIR
B=$(cd "${1:-build-cpu}" && pwd); W=${2:-/tmp/s4atk/job}
C=$(cd "$(dirname "$0")/../.." && pwd)/config/embeddings.toml
rm -rf "$W"; mkdir -p "$W"; cd "$W"
O="--set epochs=${EPOCHS:-60} --set log_every=2000 ${EXTRA:-}"
for k in 0 1 2; do $B/actorflow-train --config $C --job ps --task $k $O > ps$k.log 2>&1 & echo $! > ps$k.pid; done
$B/actorflow-train --config $C --job worker --task 1 $O > w1.log 2>&1 & echo $! > w1.pid
$B/actorflow-train --config $C --job worker --task 0 $O > w0.log 2>&1 & echo $! > w0.pid
for i in $(seq 1 300); do grep -q "step " w0.log && break; sleep 0.1; done
grep -o "data plane port [0-9]*" ps1.log | awk '{print $4}' > ps1.dport
