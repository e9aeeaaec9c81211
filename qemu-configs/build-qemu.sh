#!/usr/bin/env bash
# Build Debian's QEMU (bookworm: 7.2) with the cxlfs patches, in order, and
# print the path of the binary:
#   patches/qemu-7.2-vhost-user-fs-dax.patch      the DAX window: vhost-user-fs-pci
#       cache-size=, VHOST_USER_BACKEND_SHMEM_MAP / _UNMAP
#   patches/qemu-7.2-tcg-accessed-bits.patch      accessed bits from TCG's TLB
#       fills: memory backends' x-cxlfs-abits=, vhost-user-fs abits=
#   patches/qemu-7.2-vhost-user-shmem-config.patch  one window size: asks the
#       back-end (VHOST_USER_GET_SHMEM_CONFIG) and refuses a cache-size that
#       differs from its window
#
#   qemu-configs/build-qemu.sh [--force] [--key]
#
#   --force   rebuild the binary even if the cached one exists
#   --key     print the cache key and exit
#
# Only qemu-system-x86_64 is built (x86_64-softmmu, KVM + TCG, vhost-user,
# nothing else). The binary finds its firmware (SeaBIOS, the option ROMs
# used by -kernel) in Debian's /usr/share/qemu, /usr/share/seabios and
# /usr/lib/ipxe/qemu: that path is compiled in, so no -L is needed. The
# qemu-system-data and seabios packages are installed when missing.
#
# The binary's path is the LAST line of stdout; progress goes to stderr.
# Cache: $CXLFS_CACHE_DIR/qemu/<key>/qemu-system-x86_64, where the key is a
# hash of this script, lib.sh, the patches and the Debian source version of
# qemu; the patched source tree and its build directory stay in
# $CXLFS_CACHE_DIR/qemu-src/<version>/, so a changed patch rebuilds only the
# files it touches (the patches are applied in order, and reverted last first). A run with nothing changed does no apt work (about 10 ms).
#
# Host setup, done only when needed (root): a deb-src entry mirroring the
# existing bookworm deb entries (/etc/apt/sources.list.d/cxlfs-deb-src.sources),
# apt-get update, and the build dependencies (meson, ninja-build, pkg-config,
# libglib2.0-dev, libpixman-1-dev, libfdt-dev, flex, bison, python3-venv,
# dpkg-dev, gcc, xz-utils).
#
# Environment:
#   CXLFS_CACHE_DIR    cache root (default: $XDG_CACHE_HOME/cxlfs, else ~/.cache/cxlfs)
#   CXLFS_QEMU_PATCH   patches to apply, space-separated, in order (default: the
#                      three above, beside this script)
#   CXLFS_QEMU_JOBS    parallel compile jobs (default: 2). configure and ninja
#                      run under `nice -n 19 ionice -c3`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
self="$here/$(basename "${BASH_SOURCE[0]}")"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

parse_build_args "$@"

default_patches="$here/patches/qemu-7.2-vhost-user-fs-dax.patch $here/patches/qemu-7.2-tcg-accessed-bits.patch"
default_patches+=" $here/patches/qemu-7.2-vhost-user-shmem-config.patch"
read -r -a patches <<<"${CXLFS_QEMU_PATCH:-$default_patches}"
jobs="${CXLFS_QEMU_JOBS:-2}"
((${#patches[@]})) || die "no patch to apply (CXLFS_QEMU_PATCH is empty)"
for p in "${patches[@]}"; do
    [[ -f "$p" ]] || die "no patch at $p"
done
# The patches as one file (applied in order; hashed for the key).
patch_file="$(mktemp -t cxlfs-qemu-patches.XXXXXX)"
trap 'rm -f "$patch_file"' EXIT
cat "${patches[@]}" >"$patch_file"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "CXLFS_QEMU_JOBS must be a positive number"
require_x86_64

# Never installed: the prefix only has to differ from /usr, so that QEMU does
# not relocate the firmware path below next to the binary.
configure_args=(--prefix=/opt/cxlfs-qemu
    --firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu
    --target-list=x86_64-softmmu --without-default-features
    --enable-kvm --enable-tcg --enable-vhost-user --enable-fdt=system
    --disable-docs --disable-werror --disable-install-blobs)
build_deps=(meson ninja-build pkg-config libglib2.0-dev libpixman-1-dev libfdt-dev
    flex bison python3-venv dpkg-dev gcc libc6-dev xz-utils patch)
runtime_deps=(qemu-system-data seabios)
nice_cmd=(nice -n 19 ionice -c3)

# ---------------------------------------------------------------- warm path
# The quick key (see lib.sh): the inputs plus the state of apt's source lists;
# the full key needs the Debian source version (apt-cache).
key_file_prefix=qemu-
quick_key() {
    {
        echo "format 1"
        script_hashes
        sha256sum <"$patch_file"
        stat -c '%n %s %Y' /var/lib/apt/lists/*_Sources* 2>/dev/null | sort
    } | sha256sum | cut -c1-16
}
if ((force == 0 && key_only == 0)); then
    k="$(remembered_key)"
    if [[ -n "$k" && -x "$cache_root/qemu/$k/qemu-system-x86_64" && -f "$cache_root/qemu/$k/.complete" ]]; then
        up_to_date "$cache_root/qemu/$k" "$cache_root/qemu/$k/qemu-system-x86_64"
    fi
fi

# ------------------------------------------------------------ apt sources

have_deb_src() {
    grep -qsE '^[[:space:]]*deb-src[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        || grep -qsiE '^[[:space:]]*Types:.*deb-src' /etc/apt/sources.list.d/*.sources
}

# Write deb-src entries for the bookworm suites of the existing deb entries
# (deb822 .sources files and one-line .list files alike), same mirrors.
add_deb_src() {
    need_root "add a deb-src entry to the apt sources"
    local out=/etc/apt/sources.list.d/cxlfs-deb-src.sources
    python3 - "$out" <<'EOF' || die "could not derive a deb-src entry from the apt sources"
import glob, re, sys

codename = "bookworm"
try:
    for line in open("/etc/os-release"):
        if line.startswith("VERSION_CODENAME="):
            codename = line.split("=", 1)[1].strip().strip('"') or codename
except OSError:
    pass

stanzas = []  # (uris, suites, components, signed_by)
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for block in re.split(r"\n\s*\n", open(path).read()):
        fields, key = {}, None
        for line in block.splitlines():
            if line.lstrip().startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, val = line.split(":", 1)
                key = key.strip().lower()
                fields[key] = val.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        stanzas.append((fields.get("uris", ""), fields.get("suites", ""),
                        fields.get("components", ""), fields.get("signed-by", "")))
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        m = re.match(r"\s*deb\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line.split("#", 1)[0])
        if not m:
            continue
        signed = re.search(r"signed-by=(\S+?)[\s\]]", m.group(1) or "")
        stanzas.append((m.group(2), m.group(3), m.group(4).strip(),
                        signed.group(1) if signed else ""))

out = []
for uris, suites, comps, signed in stanzas:
    suites = [s for s in suites.split() if s.split("-")[0].split("/")[0] == codename]
    if not uris or not suites or not comps:
        continue
    text = "Types: deb-src\nURIs: %s\nSuites: %s\nComponents: %s\n" % (uris, " ".join(suites), comps)
    if signed:
        text += "Signed-By: %s\n" % signed
    if text not in out:
        out.append(text)
if not out:
    sys.exit("no enabled deb entry for %s" % codename)
with open(sys.argv[1], "w") as f:
    f.write("# Added by cxlfs qemu-configs/build-qemu.sh (apt-get source qemu)\n")
    f.write("\n".join(out))
EOF
    log "added $out"
}

if ! have_deb_src; then
    add_deb_src
    apt_update_once
fi
# The version apt-get source would fetch (the highest candidate), with its
# epoch (to pin it: "1:7.2+dfsg-7+deb12u18") and without (file names).
source_version() {
    local uris versions v
    uris="$(apt-get source --print-uris -q qemu 2>/dev/null)" || return 0
    v="$(sed -n "s/^'[^']*' qemu_\([^ ]*\)\.dsc .*/\1/p" <<<"$uris")"
    [[ -n "$v" ]] || return 0
    versions="$(apt-cache showsrc --only-source qemu 2>/dev/null)" || return 0
    awk -v v="${v%%$'\n'*}" '/^Version:/ { w = $2; sub(/^[0-9]+:/, "", w); if (w == v) { print $2; exit } }' \
        <<<"$versions"
}
full_version="$(source_version)"
if [[ -z "$full_version" ]]; then
    apt_update_once
    full_version="$(source_version)"
fi
[[ -n "$full_version" ]] || die "apt-get source qemu finds nothing (are the deb-src lists there?)"
version="${full_version#*:}"

key="$( {
    echo "format 1"
    script_hashes
    sha256sum <"$patch_file"
    echo "qemu source $full_version"
} | sha256sum | cut -c1-16)"
if ((key_only)); then
    echo "$key"
    exit 0
fi

out="$cache_root/qemu/$key"
bin="$out/qemu-system-x86_64"
if [[ -f "$out/.complete" && -x "$bin" && $force -eq 0 ]]; then
    remember_key
    up_to_date "$out" "$bin"
fi

# ------------------------------------------------------------ packages
missing_pkgs() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
    done
}
mapfile -t need < <(missing_pkgs "${build_deps[@]}" "${runtime_deps[@]}")
if ((${#need[@]})); then
    apt_install "${need[@]}"
fi

# ------------------------------------------------------------ source tree
src_root="$cache_root/qemu-src/$version"
mkdir -p "$src_root"
exec 9>"$src_root/.lock"
flock 9    # one build per source tree at a time

src="$(find "$src_root" -mindepth 1 -maxdepth 1 -type d -name 'qemu-*' -print -quit)"
if [[ -z "$src" || ! -f "$src/.cxlfs-prepared" ]]; then
    [[ -n "$src" ]] && rm -rf "$src"
    log "apt-get source qemu=$full_version"
    (cd "$src_root" && "${nice_cmd[@]}" apt-get source -q -o APT::Sandbox::User=root "qemu=$full_version" >&2) \
        || die "apt-get source qemu=$full_version failed"
    src="$(find "$src_root" -mindepth 1 -maxdepth 1 -type d -name 'qemu-*' -print -quit)"
    [[ -n "$src" && -f "$src/configure" ]] || die "no source tree in $src_root"
    # Debian's source has no firmware blobs: do not unpack the edk2 images.
    sed -i 's/^\(    unpack_edk2_blobs = \)bzip2\.found()$/\1false/' "$src/meson.build"
    grep -q '^    unpack_edk2_blobs = false$' "$src/meson.build" \
        || die "could not disable the edk2 unpack step in $src/meson.build"
    touch "$src/.cxlfs-prepared"
fi

# Reverts the patches in $applied (each starts with a "From: " line), last
# first: one that changes lines an earlier one added only comes off first.
revert_applied() {
    local dir i parts rc=0
    dir="$(mktemp -d -t cxlfs-qemu-revert.XXXXXX)"
    awk -v d="$dir" '/^From: / { n++ } { print > sprintf("%s/%03d.patch", d, n) }' "$applied"
    parts=("$dir"/*.patch)
    for ((i = ${#parts[@]} - 1; i >= 0; i--)); do
        patch -d "$src" -p1 -R --batch --silent <"${parts[i]}" >&2 || { rc=1; break; }
    done
    rm -rf "$dir"
    return $rc
}

# Apply the patches; different ones applied before are reversed first.
applied="$src/.cxlfs-applied.patch"
if [[ ! -f "$applied" ]] || ! cmp -s "$applied" "$patch_file"; then
    if [[ -f "$applied" ]]; then
        log "reverting the previously applied patches"
        if ! revert_applied; then
            log "revert failed: fetching the source again"
            rm -rf "$src"
            exec "$self" "$@"
        fi
        rm -f "$applied"
    fi
    log "applying ${patches[*]##*/}"
    patch -d "$src" -p1 --forward --batch --silent <"$patch_file" >&2 \
        || die "${patches[*]##*/} do not apply to qemu $version (tree: $src)"
    cp "$patch_file" "$applied"
fi

# ------------------------------------------------------------ configure, build
configure_args+=("--with-pkgversion=Debian $full_version, cxlfs DAX window")
build="$src/build-cxlfs"
if [[ ! -f "$build/build.ninja" || "$(cat "$build/.cxlfs-configure" 2>/dev/null)" != "${configure_args[*]}" ]]; then
    rm -rf "$build"
    mkdir -p "$build"
    log "configure ${configure_args[*]}"
    (cd "$build" && "${nice_cmd[@]}" ../configure "${configure_args[@]}" >&2) \
        || die "configure failed (see above; log in $build/meson-logs/meson-log.txt)"
    echo "${configure_args[*]}" >"$build/.cxlfs-configure"
fi
log "ninja -j$jobs qemu-system-x86_64 (about 5 minutes from scratch on 2 cores)"
start=$(date +%s)
"${nice_cmd[@]}" ninja -C "$build" -j"$jobs" qemu-system-x86_64 >&2 || die "build failed"
log "built in $(($(date +%s) - start)) s"

# ------------------------------------------------------------ check, cache
"$build/qemu-system-x86_64" -device vhost-user-fs-pci,help 2>/dev/null | grep -q 'cache-size=' \
    || die "the built QEMU has no vhost-user-fs-pci cache-size property (patch not applied?)"
"$build/qemu-system-x86_64" -object memory-backend-memfd,help 2>/dev/null | grep -q 'x-cxlfs-abits=' \
    || die "the built QEMU has no memory backend x-cxlfs-abits property (patch not applied?)"
grep -aq 'VHOST_USER_GET_SHMEM_CONFIG' "$build/qemu-system-x86_64" \
    || die "the built QEMU does not ask the back-end for its window size (patch not applied?)"
mkdir -p "$out"
cp "$build/qemu-system-x86_64" "$bin.tmp"
mv -f "$bin.tmp" "$bin"
{
    echo "qemu source: $full_version"
    for p in "${patches[@]}"; do
        echo "patch: $(basename "$p") sha256 $(sha256sum <"$p" | cut -d' ' -f1)"
    done
    echo "configure: ${configure_args[*]}"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    "$bin" --version | head -n1
} >"$out/build-info.txt"
touch "$out/.complete"
remember_key
log "done: $bin"
echo "$bin"
