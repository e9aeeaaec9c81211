# shellcheck shell=bash
# shellcheck disable=SC2034,SC2154 # globals shared with the sourcing script (self, key, force, ...)
# Shell helpers shared by build-guest-image.sh and build-qemu.sh; sourced, not
# run. The sourcing script sets `self` (its own path) first. Output
# convention of both: progress on stderr, the result path as the LAST line of
# stdout.
#
# Provides: log, die, usage (the script's header comment), parse_build_args
# (--force, --key, --help, and valued options), require_x86_64, need_root, apt_update_once,
# apt_install, cache_root ($CXLFS_CACHE_DIR), the two-level cache keys
# (remembered_key, remember_key, script_hashes) and up_to_date.

lib_sh="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
log_tag="$(basename "$self" .sh)"

log() { printf '%s: %s\n' "$log_tag" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The script's header comment: from line 2 to the `set -euo` line.
usage() { sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//' >&2; }

# Sets force and key_only from --force and --key; --help prints the usage.
# Options named in build_value_options (set by the sourcing script, space
# separated, e.g. "--packages --kernel") take a value (--opt V or --opt=V),
# stored in build_opt[--opt].
declare -A build_opt=()
parse_build_args() {
    force=0
    key_only=0
    local a o
    while (($#)); do
        a="$1"
        shift
        case "$a" in
            --force) force=1; continue ;;
            --key) key_only=1; continue ;;
            -h | --help) usage; exit 0 ;;
        esac
        for o in ${build_value_options:-}; do
            if [[ "$a" == "$o" ]]; then
                (($#)) || die "$o needs a value (try --help)"
                build_opt[$o]="$1"
                shift
                continue 2
            elif [[ "$a" == "$o="* ]]; then
                build_opt[$o]="${a#*=}"
                continue 2
            fi
        done
        die "unknown argument: $a (try --help)"
    done
}

require_x86_64() {
    [[ "$(uname -m)" == x86_64 ]] || die "only x86_64 hosts are supported (host is $(uname -m))"
}

cache_root="${CXLFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cxlfs}"

need_root() { [[ $(id -u) -eq 0 ]] || die "need root to $*"; }

export DEBIAN_FRONTEND=noninteractive

apt_updated=0
apt_update_once() {
    ((apt_updated)) && return 0
    apt_updated=1
    need_root "run apt-get update"
    log "apt-get update"
    apt-get update -q >&2 || die "apt-get update failed"
}

# apt_install PKG...: installs them (root), updating the package lists once
# if the first try fails (stale lists on a fresh machine).
apt_install() {
    need_root "install the host packages $* (or install them yourself)"
    log "installing host packages: $*"
    apt-get install -y -q --no-install-recommends "$@" >&2 \
        || { apt_update_once && apt-get install -y -q --no-install-recommends "$@" >&2; } \
        || die "apt-get install $* failed"
}

# Two-level cache keys. The full key (what a build depends on) takes apt-cache
# work; the quick key (the script's inputs plus the state of apt's lists,
# printed by the script's own quick_key function) names the full key of the
# last build made from the same state, so a warm run does no apt work. The
# names live in $cache_root/keys/$key_file_prefix<quick key>.
remembered_key() { cat "$cache_root/keys/${key_file_prefix:-}$(quick_key)" 2>/dev/null || true; }
remember_key() { mkdir -p "$cache_root/keys" && echo "$key" >"$cache_root/keys/${key_file_prefix:-}$(quick_key)"; }

# Key input lines for the build recipe itself: this file and the script.
script_hashes() {
    sha256sum <"$self"
    sha256sum <"$lib_sh"
}

# up_to_date DIR RESULT: ends the script with RESULT as the last stdout line.
up_to_date() {
    log "up to date: $1"
    echo "$2"
    exit 0
}
