#!/usr/bin/env bash
# Makes sure the Rust toolchain the workspace needs is present on a fresh machine.
# Machines of this project's kind come with rustup's stable toolchain; Debian's
# own rustc (1.63 on bookworm) is too old for the pinned crates, so it is not a fallback.
set -euo pipefail
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found; install Rust >= 1.80 with rustup (https://rustup.rs)" >&2
  exit 1
fi
for component in clippy rustfmt; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
      rustup component add "$component"
    else
      echo "error: cargo $component missing and rustup unavailable" >&2
      exit 1
    fi
  fi
done
# A C compiler: the hint crate's test compiles hint/include/cxlfs_hint.h and
# checks every field against the Rust struct (under CI=true it fails without one).
if ! command -v cc >/dev/null 2>&1 && [[ -z "${CC:-}" ]]; then
  echo "ensure-toolchain: installing gcc (for the C header check)" >&2
  sudo=()
  ((EUID == 0)) || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get install -y --no-install-recommends gcc libc6-dev >&2 \
    || { "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y --no-install-recommends gcc libc6-dev >&2; }
  command -v cc >/dev/null 2>&1 || { echo "error: cc still missing after apt-get install gcc" >&2; exit 1; }
fi
