#!/bin/bash
# ps 1 of a sparse sync job killed, restarted, and killed again KILL2_AFTER seconds after its
# restart (during or right after its restore), then restarted again: the job must finish.
# usage: [KILL2_AFTER=S] tests/attack/ps_kill_twice.sh BUILD_DIR WORKDIR
B=$(cd "${1:-build-cpu}" && pwd); W=${2:-/tmp/s4atk/twice}; C=$(cd "$(dirname "$0")/../.." && pwd)/config/embeddings.toml
rm -rf "$W.ck"
EXTRA="--set checkpoint_dir=$W.ck --set checkpoint_steps=2000 --set ps_recovery_timeout_ms=20000" EPOCHS=8 \
  "$(dirname "$0")/start_job.sh" "$B" "$W"
cd "$W"
O="--set epochs=8 --set log_every=2000 --set checkpoint_dir=$W.ck --set checkpoint_steps=2000 --set ps_recovery_timeout_ms=20000"
for i in $(seq 1 300); do grep -q "checkpoint: global step" w0.log && break; sleep 0.1; done
kill -KILL $(cat ps1.pid); sleep 0.5
$B/actorflow-train --config $C --job ps --task 1 $O > ps1b.log 2>&1 & echo $! > ps1b.pid
sleep ${KILL2_AFTER:-0.3}; kill -KILL $(cat ps1b.pid); sleep 0.5
$B/actorflow-train --config $C --job ps --task 1 $O > ps1c.log 2>&1 & echo $! > ps1c.pid
for p in w0 w1; do timeout 150 tail --pid=$(cat $p.pid) -f /dev/null; done
for p in w0 w1 ps0 ps2 ps1c; do kill -0 $(cat $p.pid) 2>/dev/null && echo "$p still running"; done
grep -h "recovered\|train done\|aborted\|failed\|did not" w0.log w1.log | cut -c1-300
