# shellcheck shell=bash
# The multi-host test bed on one machine (docs/netbed.md): N network
# namespaces, each a "host" with its own address from 198.18.0.0/15 (RFC 2544's
# benchmark range, assigned only inside the namespaces, never routed off the
# machine), each joined by a veth pair to one bridge, each link shaped with tc
# (tbf, both directions) to a rate. One process per host runs inside its
# namespace.
#
# Sourced by the netbed scripts, never run:
#   source tests/netbed/netbed.sh
#   nb_init BIN_DIR          # root and netns checked (else exit 77: skipped), stale runs removed,
#                            # cleanup trapped on EXIT, INT, TERM
#   nb_up 3 200mbit          # hosts 0..2 at 198.18.0.1 .. 198.18.0.3; NB_IP[i]
#   nb_shape 1 400mbit       # one host's link at another rate
#   nb_shape 1 1gbit 32768   # ... with a 32 KiB bucket (and GSO packets of 16 KiB)
#   nb_start 0 ps0 CMD...    # CMD in host 0's namespace, output in $NB_DIR/ps0.log; NB_PID[ps0]
#   nb_wait_log ps0 REGEX SECONDS WHAT; nb_wait_exit ps0 SECONDS; nb_tx_bytes 0
#
# Names: every namespace, veth and bridge of a run carries the prefix
# afnb<pid of the script>, so parallel runs do not collide; a run whose
# script no longer lives (SIGKILL, a crash) is removed by the next run's
# nb_init, processes first.

NB_SKIP=77
NB_STATE=/run/actorflow-netbed
declare -a NB_IP=()
declare -A NB_PID=()
NB_HOSTS=0

nb_log() { printf 'netbed: %s\n' "$*" >&2; }

nb_fail() {
  printf 'netbed: FAILED: %s\n' "$*" >&2
  exit 1
}

nb_skip() {
  printf 'netbed: skipped: %s\n' "$*"
  exit "$NB_SKIP"
}

# The namespace, root-side veth and bridge names of run $1.
nb_ns() { printf 'afnb%s-h%s' "$1" "$2"; }
nb_veth() { printf 'afnb%sh%s' "$1" "$2"; }
nb_bridge() { printf 'afnb%sbr' "$1"; }

# The start time of process $1 (field 22 of /proc/PID/stat), empty if none.
nb_starttime() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  # shellcheck disable=SC2086
  set -- $stat
  printf '%s' "${20}"
}

# Removes everything of run $1: its processes (SIGKILL, they are test
# processes), its namespaces (their veth ends go with them), its bridge and
# leftover veths, its state file.
nb_remove_run() {
  local id=$1 ns pid link
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^afnb${id}-h[0-9]+$"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      kill -KILL "$pid" 2>/dev/null
    done
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^afnb${id}-h[0-9]+$"); do
    # a killed process can take a moment to leave its namespace; deleting the
    # name is enough either way (the namespace ends with its last process)
    ip netns del "$ns" 2>/dev/null
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
                grep -E "^afnb${id}(h[0-9]+|br)$"); do
    ip link del "$link" 2>/dev/null
  done
  # its scratch directory (configs, logs), named in its state file
  local dir
  dir=$(awk '{print $2}' "$NB_STATE/$id" 2>/dev/null)
  [[ $id != "$$" && $dir == /tmp/actorflow-netbed.* && -d $dir ]] && rm -rf "$dir"
  rm -f "$NB_STATE/$id"
}

# Runs whose script is gone: their ids.
nb_stale_ids() {
  local id ns link start
  {
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
      [[ $ns =~ ^afnb([0-9]+)-h[0-9]+$ ]] && echo "${BASH_REMATCH[1]}"
    done
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//'); do
      [[ $link =~ ^afnb([0-9]+)(h[0-9]+|br)$ ]] && echo "${BASH_REMATCH[1]}"
    done
    for f in "$NB_STATE"/*; do
      [[ -f $f ]] && basename "$f"
    done
  } | sort -u | while read -r id; do
    [[ $id == "$$" ]] && continue
    start=$(awk '{print $1}' "$NB_STATE/$id" 2>/dev/null)
    if ! kill -0 "$id" 2>/dev/null; then
      echo "$id"
    elif [[ -n $start && $(nb_starttime "$id") != "$start" ]]; then
      echo "$id" # the pid now belongs to another process
    fi
  done
}

nb_down() {
  local rc=$? name pid deadline i
  trap - EXIT INT TERM
  # the processes: SIGTERM (a node stops cleanly), SIGKILL after 5 s
  for name in "${!NB_PID[@]}"; do
    pid=${NB_PID[$name]}
    kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
  done
  deadline=$((SECONDS + 5))
  for name in "${!NB_PID[@]}"; do
    pid=${NB_PID[$name]}
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
      sleep 0.1 # polling a process's exit, bounded by the deadline
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if ((rc != 0 && rc != NB_SKIP)) && [[ -n ${NB_DIR:-} && -d $NB_DIR ]]; then
    for f in "$NB_DIR"/*.log; do
      [[ -f $f ]] || continue
      echo "---- last lines of $(basename "$f") ----" >&2
      tail -n 15 "$f" >&2
    done
  fi
  nb_remove_run "$$"
  for ((i = 0; i < NB_HOSTS; ++i)); do
    ip netns list 2>/dev/null | grep -q "^$(nb_ns $$ "$i")\b" &&
      echo "netbed: could not remove namespace $(nb_ns $$ "$i")" >&2
  done
  if [[ -n ${NB_DIR:-} && -d $NB_DIR && -z ${NB_KEEP:-} ]]; then
    rm -rf "$NB_DIR"
  elif [[ -n ${NB_DIR:-} ]]; then
    echo "netbed: logs kept in $NB_DIR" >&2
  fi
  exit "$rc"
}

# nb_init BIN_DIR [PROGRAM...]: checks what the bed needs (skips without
# root or netns), that BIN_DIR holds the programs, removes stale runs, traps
# the cleanup, makes $NB_DIR for configs and logs.
nb_init() {
  NB_BIN=${1:?nb_init BIN_DIR}
  shift
  if [[ $(id -u) -ne 0 ]]; then
    nb_skip "needs root to make network namespaces, veths and tc qdiscs (run as root, or sudo ctest -L netbed)"
  fi
  local tool
  for tool in ip tc; do
    command -v "$tool" >/dev/null || nb_skip "'$tool' not found (install iproute2)"
  done
  local probe="afnb$$-probe"
  if ! ip netns add "$probe" 2>/dev/null; then
    nb_skip "cannot make a network namespace here ('ip netns add' failed: no netns support, or a container without CAP_SYS_ADMIN)"
  fi
  ip netns del "$probe" 2>/dev/null
  [[ -d $NB_BIN ]] || nb_fail "$NB_BIN: no such build directory (pass the one holding actorflow-node)"
  local prog
  for prog in "$@"; do
    [[ -x $NB_BIN/$prog ]] || nb_fail "$NB_BIN/$prog not found: build the $prog target (ninja -C $NB_BIN $prog)"
  done
  mkdir -p "$NB_STATE"
  local id
  for id in $(nb_stale_ids); do
    nb_log "removing what a run that is gone left (afnb$id: namespaces, links, processes)"
    nb_remove_run "$id"
  done
  trap nb_down EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  NB_DIR=$(mktemp -d /tmp/actorflow-netbed.XXXXXX)
  echo "$(nb_starttime $$) $NB_DIR" >"$NB_STATE/$$"
}

# nb_shape HOST RATE [BUCKET]: the host's link at RATE (tc units: 1gbit,
# 200mbit) both ways: tbf on the host's eth0 (what it sends) and on the
# bridge-side veth (what it receives). The bucket holds 2 ms of the rate, at
# least 128 KiB (veths pass 64 KiB GSO packets; a smaller bucket drops them).
# With BUCKET (bytes, at least 4096) the bucket holds that, and the host's
# veths pass GSO packets of at most BUCKET / 2 (gso_max_size), so that they
# fit: a link then bursts at most BUCKET above its rate, for exchanges whose
# messages are not much larger than the default bucket (a sparse step's
# rows: 100-300 KB, which a 250 KB bucket lets through nearly free).
nb_shape() {
  local host=$1 rate=$2 bits burst gso=65536
  bits=$(nb_rate_bits "$rate") || nb_fail "rate '$rate': not a tc rate such as 1gbit or 200mbit"
  burst=$((bits / 8 / 500))
  ((burst < 65536 * 2)) && burst=$((65536 * 2))
  if [[ -n ${3:-} ]]; then
    if ! [[ $3 =~ ^[0-9]+$ ]] || (($3 < 4096)); then
      nb_fail "nb_shape: bucket '$3': a number of bytes, at least 4096"
    fi
    burst=$3
    gso=$((burst / 2))
  fi
  # the packets the host sends are cut to gso (its eth0's); the bridge side's
  # too, for what it would send itself (it only forwards)
  ip netns exec "$(nb_ns $$ "$host")" ip link set dev eth0 gso_max_size "$gso" ||
    nb_fail "cannot set host $host's gso_max_size to $gso"
  ip link set dev "$(nb_veth $$ "$host")" gso_max_size "$gso" ||
    nb_fail "cannot set $(nb_veth $$ "$host")'s gso_max_size to $gso"
  ip netns exec "$(nb_ns $$ "$host")" tc qdisc replace dev eth0 root tbf rate "$rate" \
    burst "$burst" latency 50ms ||
    nb_fail "tc tbf on host $host's eth0 failed (does this kernel have sch_tbf?)"
  tc qdisc replace dev "$(nb_veth $$ "$host")" root tbf rate "$rate" burst "$burst" latency 50ms ||
    nb_fail "tc tbf on host $host's bridge side failed"
}

# bits/s of a tc rate: 1gbit, 200mbit, 500kbit, 1000000bit.
nb_rate_bits() {
  local r=${1,,} n unit
  [[ $r =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || return 1
  n=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case $unit in
  bit) echo "$n" ;;
  kbit) echo $((n * 1000)) ;;
  mbit) echo $((n * 1000000)) ;;
  gbit) echo $((n * 1000000000)) ;;
  esac
}

# nb_up N RATE: N hosts, 198.18.0.1 .. 198.18.0.N/24, each link shaped to RATE.
nb_up() {
  local n=$1 rate=$2 i ns veth br
  ((n >= 1 && n <= 200)) || nb_fail "nb_up: $n hosts (1 to 200)"
  br=$(nb_bridge $$)
  ip link add "$br" type bridge || nb_fail "cannot make bridge $br"
  ip link set "$br" up
  for ((i = 0; i < n; ++i)); do
    ns=$(nb_ns $$ "$i")
    veth=$(nb_veth $$ "$i")
    ip netns add "$ns" || nb_fail "cannot make namespace $ns"
    NB_HOSTS=$((i + 1))
    ip link add "$veth" type veth peer name eth0 netns "$ns" || nb_fail "cannot make veth $veth"
    ip link set "$veth" master "$br" || nb_fail "cannot put $veth on $br"
    ip link set "$veth" up
    NB_IP[i]="198.18.0.$((i + 1))"
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr add "${NB_IP[i]}/24" dev eth0 || nb_fail "cannot address $ns"
    ip netns exec "$ns" ip link set eth0 up
    nb_shape "$i" "$rate"
  done
  # every host reaches every other (a bridge still learning, a filter on
  # bridged traffic: seen here rather than as a node's connect timeout)
  for ((i = 1; i < n; ++i)); do
    nb_wait_ping 0 "${NB_IP[i]}" 10
  done
}

# nb_wait_ping HOST IP SECONDS: HOST reaches IP within SECONDS (no ping
# here: a TCP connect to port 9, where nothing listens, is refused once the
# packets get through; a timeout means they do not).
nb_wait_ping() {
  local deadline=$((SECONDS + $3)) out
  while :; do
    out=$(ip netns exec "$(nb_ns $$ "$1")" timeout 2 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1)
    [[ $out == *"refused"* || $? -eq 0 ]] && return 0
    ((SECONDS < deadline)) || nb_fail "host $1 cannot reach $2 within $3 s (bridge $(nb_bridge $$)): $out"
    sleep 0.2 # polling reachability, bounded by the deadline
  done
}

# nb_exec HOST CMD...: CMD in the host's namespace, in the foreground.
nb_exec() {
  local host=$1
  shift
  ip netns exec "$(nb_ns $$ "$host")" "$@"
}

# nb_start HOST NAME CMD...: CMD in the background in the host's namespace,
# its output in $NB_DIR/NAME.log, its pid in NB_PID[NAME].
nb_start() {
  local host=$1 name=$2
  shift 2
  ip netns exec "$(nb_ns $$ "$host")" "$@" >"$NB_DIR/$name.log" 2>&1 &
  NB_PID[$name]=$!
}

# nb_wait_log NAME REGEX SECONDS WHAT: waits until NAME's log has a line
# matching REGEX (extended); fails naming WHAT if NAME exits first or time is up.
nb_wait_log() {
  local name=$1 re=$2 limit=$3 what=$4 deadline=$((SECONDS + $3))
  while ! grep -Eq -- "$re" "$NB_DIR/$name.log" 2>/dev/null; do
    if ! kill -0 "${NB_PID[$name]}" 2>/dev/null; then
      grep -Eq -- "$re" "$NB_DIR/$name.log" 2>/dev/null && return 0
      nb_fail "$name exited before $what: $(tail -n 1 "$NB_DIR/$name.log")"
    fi
    ((SECONDS < deadline)) || nb_fail "$name: no $what within $limit s: $(tail -n 1 "$NB_DIR/$name.log")"
    sleep 0.1 # polling a log file, bounded by the deadline
  done
}

# nb_wait_exit NAME SECONDS: waits for NAME to exit; echoes nothing, returns
# its exit code (fails the run if it is still running after SECONDS).
nb_wait_exit() {
  local name=$1 limit=$2 deadline=$((SECONDS + $2)) pid=${NB_PID[$1]} rc
  while kill -0 "$pid" 2>/dev/null; do
    ((SECONDS < deadline)) || nb_fail "$name (pid $pid) still running after $limit s: $(tail -n 1 "$NB_DIR/$name.log")"
    sleep 0.1 # polling a process's exit, bounded by the deadline
  done
  wait "$pid"
  rc=$?
  unset "NB_PID[$name]"
  return "$rc"
}

# nb_tx_bytes HOST: bytes the host has sent on its link (its eth0's tbf).
nb_tx_bytes() {
  nb_exec "$1" tc -s qdisc show dev eth0 | awk '/Sent/ {print $2; exit}'
}

# nb_rx_bytes HOST: bytes the host has received (the bridge side's tbf).
nb_rx_bytes() {
  tc -s qdisc show dev "$(nb_veth $$ "$1")" | awk '/Sent/ {print $2; exit}'
}

# nb_cluster_config FILE PS_HOSTS WORKER_HOSTS: a [cluster] of ps tasks on
# the hosts listed (comma-separated indices) and workers on theirs, plaintext
# on the bed's private addresses ([security] insecure = true: the bed is one
# machine's namespaces, never a shared network). Ports: ps $NB_PS_PORT (3335),
# workers $NB_WORKER_PORT (3333): a script that runs several jobs on the same
# hosts changes them between jobs.
NB_PS_PORT=3335
NB_WORKER_PORT=3333
# nb_addresses HOSTS PORT: '"ip:port", "ip:port"' for comma-separated HOSTS.
nb_addresses() {
  local h sep=
  for h in ${1//,/ }; do
    printf '%s"%s:%s"' "$sep" "${NB_IP[h]}" "$2"
    sep=', '
  done
}

nb_cluster_config() {
  local file=$1 ps=$2 workers=$3
  printf '[cluster]\nps = [%s]\nworker = [%s]\n\n[security]\ninsecure = true\n' \
    "$(nb_addresses "$ps" "$NB_PS_PORT")" "$(nb_addresses "$workers" "$NB_WORKER_PORT")" >"$file"
}
