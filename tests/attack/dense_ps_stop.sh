#!/bin/bash
# A dense sync job (config/train.toml: 1 ps + 2 workers, one process per task) whose ps is
# stopped with SIGSTOP for DOWN seconds, past the nodes' connection_timeout_ms (shortened to
# 2000 ms here: TIMEOUT_MS=...), and continued; the job must finish.
# WHO=w1 stops worker 1 instead (it leaves the job, and joins again when continued).
# usage: [WHO=ps0|w0|w1] [DOWN=S] [MODE=sync|async] [EXTRA=...] tests/attack/dense_ps_stop.sh BUILD_DIR WORKDIR
set -u
B=${1:-build-cpu}; W=${2:-/tmp/s5atk/dense_stop}
B=$(cd "$B" && pwd); C=$(cd "$(dirname "$0")/../.." && pwd)/config/train.toml
rm -rf "$W"; mkdir -p "$W"; cd "$W"
{ cat "$C"; printf '\n[node]\nheartbeat_ms = 200\nconnection_timeout_ms = %s\n' "${TIMEOUT_MS:-2000}"; } > job.toml
O="--set mode=${MODE:-sync} --set steps=${STEPS:-6000} --set checkpoint_dir=$W/ck --set ps_recovery_timeout_ms=30000 --set step_timeout_ms=3000 ${EXTRA:-}"
$B/actorflow-train --config job.toml --job ps --task 0 $O > ps0.log 2>&1 & echo $! > ps0.pid
$B/actorflow-train --config job.toml --job worker --task 1 $O --step-delay-ms 2 > w1.log 2>&1 & echo $! > w1.pid
$B/actorflow-train --config job.toml --job worker --task 0 $O --step-delay-ms 2 > w0.log 2>&1 & echo $! > w0.pid
for i in $(seq 1 300); do grep -q "^step [0-9]*/" w0.log && break; sleep 0.1; done; sleep 1
kill -STOP $(cat ${WHO:-ps0}.pid); sleep ${DOWN:-5}; kill -CONT $(cat ${WHO:-ps0}.pid)
for p in w0 w1; do timeout 180 tail --pid=$(cat $p.pid) -f /dev/null; done
for p in w0 w1 ps0; do wait $(cat $p.pid) 2>/dev/null; echo "$p rc=$?"; done
grep -h "left\|gone\|train done\|error\|joined" *.log | head -20
