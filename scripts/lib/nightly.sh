# Sourced by scripts/fuzz and scripts/sanitize: sets `toolchain` to the cargo arguments that
# select a toolchain accepting nightly flags (-Zsanitizer and cargo fuzz's): "+nightly" when
# rustup has (or can install) a nightly toolchain, otherwise the default toolchain with
# RUSTC_BOOTSTRAP=1 exported (a stable rustc then accepts -Z flags; its rust-std ships the
# sanitizer runtimes).
toolchain=()
pick_toolchain() {
  if ! command -v rustup >/dev/null 2>&1; then
    export RUSTC_BOOTSTRAP=1
    echo "$(basename "$0"): no rustup; the default toolchain with RUSTC_BOOTSTRAP=1" >&2
    return
  fi
  if ! rustup toolchain list | grep -q '^nightly'; then
    echo "$(basename "$0"): no nightly toolchain; installing it with rustup" >&2
    timeout 300 rustup toolchain install nightly --profile minimal >&2 || true
  fi
  if rustup toolchain list | grep -q '^nightly'; then
    toolchain=(+nightly)
  else
    echo "$(basename "$0"): nightly could not be installed; stable with RUSTC_BOOTSTRAP=1" >&2
    export RUSTC_BOOTSTRAP=1
    toolchain=(+stable)
  fi
}
