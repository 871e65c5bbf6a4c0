#!/usr/bin/env bash
# Builds the shim (softroce-shim) and the two replacement libraries that lead to it:
#
#   OUT/libsoftroce.so                 the shim: LD_PRELOAD it (unversioned exports, no version
#                                      nodes, SONAME libsoftroce.so)
#   OUT/replacement/libibverbs.so.1    a drop-in libibverbs for LD_LIBRARY_PATH users (dlopen +
#                                      dlsym, ctypes, RTLD_LOCAL extensions): no code of its own,
#                                      SONAME libibverbs.so.1, the IBVERBS_* version nodes *defined*
#                                      by shim/libibverbs.map (ld.so refuses a binary whose
#                                      required version is missing), and DT_NEEDED libsoftroce.so
#                                      found through DT_RUNPATH $ORIGIN/.. (verbs-abi.md §3.4).
#   OUT/replacement/librdmacm.so.1     the same for librdmacm (RDMACM_1.0..1.3 nodes from
#                                      shim/librdmacm.map, SONAME librdmacm.so.1).
#
# The replacements are thin on purpose: a process has one copy of the shim, and so one shim
# state, whichever of the three the loader meets first and however (LD_PRELOAD, LD_LIBRARY_PATH,
# dlopen RTLD_LOCAL, several at once). A symbol looked up through a replacement (a normal
# reference, or dlsym on its handle) is found in its dependency libsoftroce.so, and ld.so
# loads a SONAME once.
#
# Usage: scripts/shim-build.sh [OUT] [--release]   (OUT defaults to target/shim)
# The shim is built in its own cargo target dir, so this never waits on another cargo command's
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

# A replacement library: SONAME `$1`, version nodes from the map `$2`, no code, DT_NEEDED
# libsoftroce.so (the one beside replacement/, or whichever is loaded already).
build_replacement() {
    local soname="$1" map="$2"
    local empty="$out/replacement/empty.$$.c"
    : >"$empty"
    "${CC:-cc}" -shared -fPIC -o "$out/replacement/$soname.tmp.$$" "$empty" \
        -Wl,-soname,"$soname" -Wl,--version-script="$map" \
        -Wl,--no-as-needed -L"$out" -l:libsoftroce.so \
        -Wl,--enable-new-dtags -Wl,-rpath,'$ORIGIN/..'
    rm -f "$empty"
    mv "$out/replacement/$soname.tmp.$$" "$out/replacement/$soname"
}

build_replacement libibverbs.so.1 "$root/shim/libibverbs.map"
build_replacement librdmacm.so.1 "$root/shim/librdmacm.map"

echo "$out/libsoftroce.so"
echo "$out/replacement/libibverbs.so.1"
echo "$out/replacement/librdmacm.so.1"
