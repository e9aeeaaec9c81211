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
