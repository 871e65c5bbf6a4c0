#!/usr/bin/env bash
# Installs what the shim's tests run and compile against (Debian 12, rdma-core 44):
# ibv_devices/ibv_devinfo/ibv_*_pingpong (ibverbs-utils), <infiniband/verbs.h> (libibverbs-dev),
# cc, nm/readelf, and rdma-core's Python test-suite with pyverbs.
# scripts/test is expected to call this before `cargo test`.
set -euo pipefail
need=()
command -v ibv_devinfo >/dev/null || need+=(ibverbs-utils)
[[ -f /usr/include/infiniband/verbs.h ]] || need+=(libibverbs-dev)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v nm >/dev/null || need+=(binutils)
# rdma-core ships the Python test-suite (/usr/share/doc/rdma-core/tests) that pyverbs runs.
[[ -f /usr/share/doc/rdma-core/tests/run_tests.py ]] || need+=(rdma-core)
/usr/bin/python3 -c "import pyverbs" 2>/dev/null || need+=(python3-pyverbs)
if ((${#need[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need[@]}"
fi
