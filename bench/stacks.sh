#!/usr/bin/env bash
# scripts/bench stacks: UCX, Open MPI and MPICH over softroce beside the same stack over TCP, measured
# in the same run on the same machine. Prints a Markdown section.
#   UCX (ucx_perftest, one daemon on the loopback default): tag_bw 64 KiB, tag_lat 8 B,
#     ucp_put_bw 64 KiB with UCX_TLS=rc through `softroce run`, against UCX_TLS=tcp on lo.
#   Open MPI (tests/stacks/mpi_pingpong.c, 1 MiB ping-pong, two namespace hosts, ranks unbound as
#     stacks_mpirun runs them: both bound to CPU 0 by default, the TCP row ran 28 x slower): pml ucx with
#     UCX_TLS=rc over two daemons, against pml ob1 + btl tcp between the same two namespaces.
#   MPICH (the same program, ch4:ucx, launched by hydra): UCX_TLS=rc against UCX_TLS=tcp.
# Usage: bench/stacks.sh BUILD_DIR   (BUILD_DIR holds libsoftroce.so and softroce, release)
# Runs in a network namespace of its own (it re-executes itself under `unshare --net`).
set -uo pipefail
if [[ -z ${STACKS_NETNS:-} ]]; then
  exec unshare --net env STACKS_NETNS=1 bash -c 'ip link set lo up && exec "$0" "$@"' "$0" "$@"
fi
cd "$(dirname "$0")/.."
build=$1
export SOFTROCE=$build/softroce SOFTROCE_SHIM=$build/libsoftroce.so
source tests/stacks/lib.sh
trap stacks_cleanup EXIT
mpicc.openmpi -O2 -o "$build/mpi_pingpong" tests/stacks/mpi_pingpong.c
mpicc.mpich -O2 -o "$build/mpi_pingpong.mpich" tests/stacks/mpi_pingpong.c

# ucx_perftest TEST SIZE ITERS softroce|tcp -> "typical-latency-us avg-MB/s" of the client's
# Final line (columns: iterations, typical, avg, overall latency; avg, overall MB/s; msg rates).
ucx() {
  local test=$1 size=$2 n=$3 how=$4 run=()
  if [[ $how == softroce ]]; then
    run=("$SOFTROCE" run --socket "$STACKS_DIR/h0.sock" --)
    export UCX_TLS=rc
  else
    export UCX_TLS=tcp UCX_NET_DEVICES=lo
  fi
  timeout 120 "${run[@]}" ucx_perftest -t "$test" -s "$size" -n "$n" >"$STACKS_DIR/srv.log" 2>&1 &
  local spid=$!
  sleep 0.5
  timeout 120 "${run[@]}" ucx_perftest -t "$test" -s "$size" -n "$n" 127.0.0.1 2>&1 |
    awk '/^Final:/ {print $3, $6}'
  wait "$spid"
  unset UCX_TLS UCX_NET_DEVICES
}

row() { # label test size iters unit(lat|bw)
  local a b
  a=$(ucx "$2" "$3" "$4" softroce)
  b=$(ucx "$2" "$3" "$4" tcp)
  local sa=${a#* } sb=${b#* } la=${a% *} lb=${b% *}
  if [[ $5 == lat ]]; then
    echo "| $1 | ${la:-FAILED} µs | ${lb:-FAILED} µs | $(awk -v x="$la" -v y="$lb" 'BEGIN { if (x > 0) printf "%.2f", y / x; else print "-" }') | $(awk -v x="$la" -v y="$lb" 'BEGIN { print (x > 0 && x <= y) ? "**yes**" : "no" }') |"
  else
    echo "| $1 | ${sa:-FAILED} MB/s | ${sb:-FAILED} MB/s | $(awk -v x="$sa" -v y="$sb" 'BEGIN { if (y > 0) printf "%.2f", x / y; else print "-" }') | $(awk -v x="$sa" -v y="$sb" 'BEGIN { print (y > 0 && x >= y) ? "**yes**" : "no" }') |"
  fi
}

stacks_loopback_host >/dev/null
echo "## The stacks: UCX, Open MPI and MPICH over softroce beside the same stack over TCP"
echo
echo "Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) (2 CPUs; the pollers of an RDMA"
echo "stack need a CPU each, TCP sleeps in the kernel: a loaded machine costs softroce more)."
echo
echo "| benchmark | softroce (UCX_TLS=rc / pml ucx) | TCP (UCX_TLS=tcp / ob1+tcp) | ratio (≥ 1: softroce faster) | softroce at least as fast? |"
echo "|---|---|---|---|---|"
row "UCX tag_bw 64 KiB, one host" tag_bw 65536 2000 bw
row "UCX tag_lat 8 B, one host (typical)" tag_lat 8 20000 lat
row "UCX ucp_put_bw 64 KiB, one host" ucp_put_bw 65536 2000 bw

stacks_hosts 2 >/dev/null
mbps() { sed -n 's/.*us per round trip, \([0-9.]*\) MB\/s/\1/p'; }
mpi_row() { # label softroce-MB/s tcp-MB/s
  echo "| $1 | ${2:-FAILED} MB/s | ${3:-FAILED} MB/s | $(awk -v x="$2" -v y="$3" 'BEGIN { if (y > 0) printf "%.2f", x / y; else print "-" }') | $(awk -v x="$2" -v y="$3" 'BEGIN { print (y > 0 && x >= y) ? "**yes**" : "no" }') |"
}
mpi() { stacks_mpirun 1,2 "$@" "$build/mpi_pingpong" 100 2>&1 | mbps; }
mpich() { stacks_mpiexec_mpich 1,2 "$@" "$build/mpi_pingpong.mpich" 100 2>&1 | mbps; }
mpi_row "Open MPI 1 MiB ping-pong, two hosts (namespaces, one daemon each)" \
  "$(mpi -x UCX_TLS=rc --mca pml ucx)" "$(mpi --mca pml ob1 --mca btl tcp,self)"
mpi_row "MPICH (ch4:ucx) 1 MiB ping-pong, two hosts (UCX_TLS=rc against tcp)" \
  "$(mpich -genv UCX_TLS rc)" "$(mpich -genv UCX_TLS tcp -genv UCX_NET_DEVICES eth0)"
echo
echo "Run: \`scripts/bench stacks\` (bench/stacks.sh). UCX rows: ucx_perftest -n 2000 (bandwidth) /"
echo "20,000 (latency), client's Final line; MPI (Open MPI, MPICH): tests/stacks/mpi_pingpong.c, 100 timed round trips"
echo "of 1 MiB after the 1 B..4 MiB check, bandwidth = 2 x 1 MiB x rounds / time."
echo
