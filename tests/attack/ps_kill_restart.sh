#!/bin/bash
# A sparse sync job of 3 ps + 2 workers (one process per task); ps 1 is killed with SIGKILL
# mid-job (or stopped with SIGSTOP when SIG=STOP) and started again; the job must finish.
# usage: [PS=K] [DOWN=S] [DELAY=S] [EXTRA=...] tests/attack/ps_kill_restart.sh BUILD_DIR WORKDIR [SIG]
set -u
B=${1:-build-cpu}; W=${2:-/tmp/s4atk/kill}; SIG=${3:-KILL}
B=$(cd "$B" && pwd); C=$(cd "$(dirname "$0")/../.." && pwd)/config/embeddings.toml
rm -rf "$W"; mkdir -p "$W"; cd "$W"
O="--set epochs=8 --set checkpoint_dir=$W/ck --set checkpoint_steps=2000 --set ps_recovery_timeout_ms=20000 ${EXTRA:-}"
for k in 0 1 2; do $B/actorflow-train --config $C --job ps --task $k $O > ps$k.log 2>&1 & echo $! > ps$k.pid; done
$B/actorflow-train --config $C --job worker --task 1 $O > w1.log 2>&1 & echo $! > w1.pid
$B/actorflow-train --config $C --job worker --task 0 $O > w0.log 2>&1 & echo $! > w0.pid
# wait for the first checkpoint, then hit ps 1
for i in $(seq 1 300); do grep -q "checkpoint: global step" w0.log && break; sleep 0.1; done
sleep ${DELAY:-0.5}
kill -$SIG $(cat ps${PS:-1}.pid); echo "$(date +%T.%3N) kill -$SIG ps${PS:-1}" > signals.log
if [ "$SIG" = KILL ]; then
  sleep ${DOWN:-1}
  $B/actorflow-train --config $C --job ps --task ${PS:-1} $O > ps1b.log 2>&1 & echo $! > ps1b.pid
else
  sleep ${DOWN:-1}; kill -CONT $(cat ps${PS:-1}.pid); echo "$(date +%T.%3N) kill -CONT ps${PS:-1}" >> signals.log
fi
for p in w0 w1; do timeout 120 tail --pid=$(cat $p.pid) -f /dev/null; done
for p in w0 w1 ps0 ps2 ps1b ps1; do [ -f $p.pid ] && { wait $(cat $p.pid) 2>/dev/null; echo "$p rc=$?"; }; done
grep -h "recovered\|gone\|train done\|error\|did not" *.log | head -20
