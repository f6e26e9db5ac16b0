#!/bin/bash
# A sparse checkpoint's tables-<step> directory replaced by an older, consistent one (its files
# say step 100, ckpt-200.afck and `latest` say 200), and a torn shard file, a manifest of
# another table, a missing tables dir: each restore must be refused naming the file.
# usage: tests/attack/ckpt_wrong_step.sh BUILD_DIR WORKDIR
B=$(cd "${1:-build-cpu}" && pwd); W=${2:-/tmp/s4atk/wstep}; C=$(cd "$(dirname "$0")/../.." && pwd)/config/embeddings.toml
O="--set synthetic_examples=200000 --set checkpoint_dir=$W/ck --set checkpoint_steps=100 --set log_every=0"
rm -rf "$W"; mkdir -p "$W"; cd "$W"
run() { $B/actorflow-train --config $C $O "$@" 2>&1 | grep -v "aggregator '" | grep -i "restored\|error\|refused\|invalid\|not_found\|: .*:" | head -3 | cut -c1-400; }
$B/actorflow-train --config $C $O --set steps=200 > first.log 2>&1 || echo "first run failed"
cp -a ck ck.orig
echo "== tables-200 replaced by tables-100"; rm -rf ck/tables-200; cp -a ck.orig/tables-100 ck/tables-200
run --set steps=250
echo "== manifest of item_emb in place of user_emb's"; rm -rf ck; cp -a ck.orig ck; cp ck/tables-200/item_emb.manifest ck/tables-200/user_emb.manifest
run --set steps=250
echo "== a shard file torn"; rm -rf ck; cp -a ck.orig ck; truncate -s -5 ck/tables-200/user_emb.shard-1-of-3.aftab
run --set steps=250
echo "== tables-200 missing"; rm -rf ck; cp -a ck.orig ck; rm -rf ck/tables-200
run --set steps=250
echo "== shard 1 file replaced by shard 2's"; rm -rf ck; cp -a ck.orig ck; cp ck/tables-200/user_emb.shard-2-of-3.aftab ck/tables-200/user_emb.shard-1-of-3.aftab
run --set steps=250
