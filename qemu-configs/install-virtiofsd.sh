#!/usr/bin/env bash
# Install the stock virtiofsd (crates.io) idempotently and print its path.
#
#   qemu-configs/install-virtiofsd.sh            # prints /work/.tools/virtiofsd/bin/virtiofsd
#
# Environment:
#   VIRTIOFSD_ROOT     install root (default: <repo>/../.tools/virtiofsd, i.e. /work/.tools/virtiofsd)
#   VIRTIOFSD_VERSION  crate version to install (default: 1.14.0)
#   CARGO              cargo binary (default: cargo)
# Host packages (libseccomp-dev, libcap-ng-dev, pkg-config) are installed with
# apt-get when missing. All progress goes to stderr; stdout is only the path.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
root="${VIRTIOFSD_ROOT:-$(cd "$repo/.." && pwd)/.tools/virtiofsd}"
version="${VIRTIOFSD_VERSION:-1.14.0}"
cargo="${CARGO:-cargo}"
bin="$root/bin/virtiofsd"

log() { printf 'install-virtiofsd: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -qF "$version"; then
    printf '%s\n' "$bin"
    exit 0
fi

need=()
for pc in libseccomp libcap-ng; do
    pkg-config --exists "$pc" 2>/dev/null || need+=("${pc}-dev")
done
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
if ((${#need[@]})); then
    log "installing host packages: ${need[*]}"
    [[ $(id -u) -eq 0 ]] || die "need root to apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${need[@]}" >&2 \
        || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${need[@]}" >&2; } \
        || die "apt-get install ${need[*]} failed"
fi

command -v "$cargo" >/dev/null 2>&1 || die "cargo not found (set CARGO=)"
log "cargo install virtiofsd $version into $root (a few minutes)"
mkdir -p "$root"
"$cargo" install virtiofsd --version "=$version" --locked --root "$root" >&2 \
    || die "cargo install virtiofsd failed"
[[ -x "$bin" ]] || die "virtiofsd not found at $bin after install"
printf '%s\n' "$bin"
