# Shared by scripts/stacks-test and scripts/bench's stack rows: "hosts" as network namespaces
# on one bridge, each with its own softroce daemon, and the unmodified stacks (UCX, libfabric,
# Open MPI) run through `softroce run` in them. Sourced; needs root in a network namespace of
# its own (run the callers as root under `unshare --net`, or on a machine of your own).
#
# Host k (1..N) is the namespace "sr<pid>h<k>" with a veth "eth0" (MTU $STACKS_MTU, 9000 by
# default) on bridge "sr<pid>br" of the calling namespace: 10.78.0.k/24 and fd78::k/64; the bridge has 10.78.0.254 and fd78::254 (the
# launcher side of mpirun). Its daemon serves device srxe0 on --netdev eth0 (so libfabric, which
# skips interfaces named lo, accepts it) with its control socket at $STACKS_DIR/h<k>.sock.
# Host 0 is the calling namespace with a daemon on the loopback default (one daemon cases).

STACKS_ROOT=${STACKS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
# (Removed by stacks_cleanup when made here.)
[[ -n ${STACKS_DIR:-} ]] || STACKS_OWN_DIR=1
STACKS_DIR=${STACKS_DIR:-$(mktemp -d /tmp/softroce-stacks.XXXXXX)}
STACKS_NS=sr$$
declare -A STACKS_PID=()  # host -> its daemon's pid
declare -A STACKS_ARGS=() # host -> its daemon's arguments
STACKS_HOSTS=0
# Set by the caller: SOFTROCE (the binary) and SOFTROCE_SHIM (libsoftroce.so).

stacks_ns() { echo "${STACKS_NS}h$1"; }

# Runs CMD in host K's namespace (host 0: here).
stacks_in() {
  local k=$1
  shift
  if [[ $k == 0 ]]; then "$@"; else ip netns exec "$(stacks_ns "$k")" "$@"; fi
}

# `softroce run` of CMD on host K against that host's daemon.
stacks_run() {
  local k=$1
  shift
  stacks_in "$k" "$SOFTROCE" run --socket "$STACKS_DIR/h$k.sock" -- "$@"
}

# Starts a daemon on host K with ARGS; waits until its socket serves.
stacks_daemon() {
  local k=$1
  shift
  STACKS_ARGS[$k]="$*"
  # Started as a plain command (not through a function, which would put a subshell between
  # $! and the daemon): `ip netns exec` execs the daemon, so $! is the daemon's pid.
  local netns=()
  [[ $k == 0 ]] || netns=(ip netns exec "$(stacks_ns "$k")")
  rm -f "$STACKS_DIR/h$k.sock"
  "${netns[@]}" "$SOFTROCE" daemon --socket "$STACKS_DIR/h$k.sock" "$@" \
    >>"$STACKS_DIR/daemon-h$k.log" 2>&1 </dev/null &
  STACKS_PID[$k]=$!
  for _ in $(seq 1 200); do
    [[ -S $STACKS_DIR/h$k.sock ]] && "$SOFTROCE" res show --socket "$STACKS_DIR/h$k.sock" \
      >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "daemon on host $k did not start:" >&2
  cat "$STACKS_DIR/daemon-h$k.log" >&2
  return 1
}

# Host 0: the loopback default device (127.0.0.1 and ::1) in the calling namespace.
stacks_loopback_host() {
  ip link set lo up
  stacks_daemon 0
}

# Hosts 1..N on a bridge, each with its daemon on its eth0.
stacks_hosts() {
  local n=$1 k br=${STACKS_NS}br
  # Jumbo frames, as RoCE networks are set up: a 9000-byte link carries 4096-byte RoCE packets
  # (path MTU 4096), a 1500-byte one only 1024.
  ip link add "$br" mtu "${STACKS_MTU:-9000}" type bridge
  ip addr add 10.78.0.254/24 dev "$br"
  ip addr add fd78::254/64 dev "$br" nodad
  ip link set "$br" up
  for k in $(seq 1 "$n"); do
    local ns
    ns=$(stacks_ns "$k")
    ip netns add "$ns"
    ip link add "${STACKS_NS}v$k" mtu "${STACKS_MTU:-9000}" type veth peer name eth0 mtu "${STACKS_MTU:-9000}" netns "$ns"
    ip link set "${STACKS_NS}v$k" master "$br" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "10.78.0.$k/24" dev eth0
    ip -n "$ns" addr add "fd78::$k/64" dev eth0 nodad
    ip -n "$ns" link set eth0 up
  done
  STACKS_HOSTS=$n
  for k in $(seq 1 "$n"); do stacks_daemon "$k" --netdev eth0 || return 1; done
}

# The GID index of host K's srxe0 whose GID contains PATTERN (as the shim shows sysfs).
stacks_gid_index() {
  local k=$1 pattern=$2 f
  for f in $(seq 0 15); do
    if stacks_run "$k" cat "/sys/class/infiniband/srxe0/ports/1/gids/$f" 2>/dev/null |
      grep -q "$pattern"; then
      echo "$f"
      return 0
    fi
  done
  return 1
}

# tx_bytes the daemon of host K sent over its socket in its last life, from its stop log line.
stacks_daemon_tx_bytes() {
  grep -o 'tx_bytes: [0-9]*' "$STACKS_DIR/daemon-h$1.log" | tail -1 | awk '{print $2}'
}

# Restarts host K's daemon with the arguments it had (fresh counters).
stacks_restart_daemon() {
  local k=$1
  stacks_stop_daemon "$k"
  # shellcheck disable=SC2086 # the stored arguments are words
  stacks_daemon "$k" ${STACKS_ARGS[$k]}
}

# Stops host K's daemon (so that its counters are logged), by the pid it was started with.
stacks_stop_daemon() {
  local pid=${STACKS_PID[$1]:-}
  [[ -n $pid ]] || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  unset "STACKS_PID[$1]"
}

stacks_cleanup() {
  local k
  for k in "${!STACKS_PID[@]}"; do stacks_stop_daemon "$k"; done
  for k in $(seq 1 "$STACKS_HOSTS"); do ip netns del "$(stacks_ns "$k")" 2>/dev/null; done
  ip link del "${STACKS_NS}br" 2>/dev/null
  STACKS_HOSTS=0
  if [[ -n ${STACKS_OWN_DIR:-} ]]; then rm -rf "$STACKS_DIR"; fi
}

# Open MPI's mpirun over hosts H1,H2,... (one rank each) launched into their namespaces; every rank's
# environment comes from `softroce run` on its host (its own daemon). ARGS after -- go to mpirun.
stacks_mpirun() {
  local hosts=$1
  shift
  local agent=$STACKS_DIR/mpi-agent
  # Open MPI's rsh launcher runs `AGENT HOST orted ...`: start orted in that host's namespace
  # under `softroce run`, so orted and the ranks it forks have that host's shim environment.
  # Each host gets a /tmp of its own for Open MPI's session directory: the hosts share this
  # machine's file system and host name, so without it the orteds of two hosts write the same
  # jf.N/hwloc.sm (a shared mapping whose pointers are each writer's own) and one of them
  # crashes in hwloc_shmem_topology_write, leaving mpirun waiting for it (about one run in 30).
  cat >"$agent" <<AGENT
#!/bin/bash
host=\$1; shift
k=\${host#h}
mkdir -p "$STACKS_DIR/tmp-h\$k"
export OMPI_MCA_orte_tmpdir_base="$STACKS_DIR/tmp-h\$k"
exec ip netns exec "$STACKS_NS\$host" "$SOFTROCE" run --socket "$STACKS_DIR/h\$k.sock" -- /bin/sh -c "\$*"
AGENT
  chmod +x "$agent"
  local list
  list=$(echo "$hosts" | tr ',' '\n' | sed 's/^/h/; s/$/:1/' | paste -sd,)
  # --bind-to none: each host's orted binds its rank to "its" core 0, so by default every
  # rank of this one machine lands on CPU 0 (a 1 MiB TCP ping-pong then ran at 87 MB/s
  # against 2,464 unbound); separate hosts would each have their own core 0.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout "${STACKS_MPI_TIMEOUT:-180}" mpirun.openmpi --host "$list" -np "$(echo "$hosts" | tr ',' '\n' | wc -l)" \
    --bind-to none --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include 10.78.0.0/24 --mca btl_tcp_if_include 10.78.0.0/24 \
    "$@"
}

# MPICH's mpiexec (hydra) over hosts H1,H2,... (one rank each), as stacks_mpirun: hydra's ssh
# launcher runs `AGENT -x HOST hydra_pmi_proxy ...` (its options first), and the proxies call
# back to the bridge's address (-localhost). ARGS go to mpiexec (-genv NAME VALUE, the program).
stacks_mpiexec_mpich() {
  local hosts=$1
  shift
  local agent=$STACKS_DIR/mpich-agent
  cat >"$agent" <<AGENT
#!/bin/bash
while [[ \$1 == -* ]]; do shift; done
host=\$1; shift
k=\${host#h}
exec ip netns exec "$STACKS_NS\$host" "$SOFTROCE" run --socket "$STACKS_DIR/h\$k.sock" -- /bin/sh -c "\$*"
AGENT
  chmod +x "$agent"
  local list
  list=$(echo "$hosts" | tr ',' '\n' | sed 's/^/h/' | paste -sd,)
  timeout "${STACKS_MPI_TIMEOUT:-180}" mpiexec.mpich -launcher ssh -launcher-exec "$agent" \
    -hosts "$list" -ppn 1 -n "$(echo "$hosts" | tr ',' '\n' | wc -l)" -localhost 10.78.0.254 "$@"
}
