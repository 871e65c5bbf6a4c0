#!/usr/bin/env bash
# Builds the two forms of the shim from the same crate (softroce-shim):
#
#   OUT/libsoftroce.so                 the LD_PRELOAD library (unversioned exports, no version nodes)
#   OUT/replacement/libibverbs.so.1    a drop-in libibverbs for LD_LIBRARY_PATH users (dlopen +
#                                      dlsym, ctypes): same code, SONAME libibverbs.so.1, with the
#                                      IBVERBS_* version nodes *defined* by shim/libibverbs.map while
#                                      the symbols stay unversioned (verbs-abi.md §3.4).
#   OUT/replacement/librdmacm.so.1     the same for librdmacm (RDMACM_1.0..1.3 nodes defined by
#                                      shim/librdmacm.map, SONAME librdmacm.so.1).
#
# Usage: scripts/shim-build.sh [OUT] [--release]   (OUT defaults to target/shim)
# Each form is built in its own cargo target dir, so this never waits on another cargo command's
# lock on target/ (the e2e tests call it from inside `cargo test`).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target/shim}"
profile=debug
cargo_profile=()
if [[ "${2:-}" == "--release" ]]; then
    profile=release
    cargo_profile=(--release)
fi
cargo="${CARGO:-cargo}"
mkdir -p "$out/replacement"

"$cargo" build -q -p softroce-shim --lib "${cargo_profile[@]}" \
    --manifest-path "$root/Cargo.toml" --target-dir "$out/build-preload"
cp "$out/build-preload/$profile/libsoftroce.so" "$out/libsoftroce.so.tmp.$$"
mv "$out/libsoftroce.so.tmp.$$" "$out/libsoftroce.so"

# A replacement library: the same code again, SONAME `$1`, version nodes from the map `$2`,
# built in its own target dir `$3` (sharing one would make cargo rebuild the crate on every
# run, as the link arguments alternate).
build_replacement() {
    local soname="$1" map="$2" target_dir="$out/$3"
    "$cargo" rustc -q -p softroce-shim --lib --crate-type cdylib "${cargo_profile[@]}" \
        --manifest-path "$root/Cargo.toml" --target-dir "$target_dir" -- \
        -C "link-arg=-Wl,--version-script=$map" \
        -C "link-arg=-Wl,-soname,$soname"
    cp "$target_dir/$profile/libsoftroce.so" "$out/replacement/$soname.tmp.$$"
    mv "$out/replacement/$soname.tmp.$$" "$out/replacement/$soname"
}

build_replacement libibverbs.so.1 "$root/shim/libibverbs.map" build-replacement
build_replacement librdmacm.so.1 "$root/shim/librdmacm.map" build-replacement-rdmacm

echo "$out/libsoftroce.so"
echo "$out/replacement/libibverbs.so.1"
echo "$out/replacement/librdmacm.so.1"
