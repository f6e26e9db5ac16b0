#!/bin/bash
# The chief (worker 0) of a sparse sync job killed with SIGKILL (or SIG=STOP: stopped and never
# continued) mid-job: every other task must exit, naming the chief, within init_timeout_ms.
# usage: tests/attack/chief_kill.sh BUILD_DIR WORKDIR
set -u
B=$(cd "${1:-build-cpu}" && pwd); W=${2:-/tmp/s4atk/chief}; SIG=${SIG:-KILL}
EXTRA="--set init_timeout_ms=5000 --set step_timeout_ms=3000 --set ps_recovery_timeout_ms=5000 ${EXTRA:-}" \
  EPOCHS=20 "$(dirname "$0")/start_job.sh" "$B" "$W"
cd "$W"; sleep 1
kill -$SIG $(cat w0.pid); t0=$(date +%s)
for p in w1 ps0 ps1 ps2; do timeout 120 tail --pid=$(cat $p.pid) -f /dev/null; wait $(cat $p.pid) 2>/dev/null; echo "$p exited after $(( $(date +%s) - t0 )) s"; done
[ "$SIG" = STOP ] && kill -KILL $(cat w0.pid)
for p in w1 ps0 ps1 ps2; do echo "== $p"; grep -v "^step\|aggregator '" $p.log | tail -2; done
