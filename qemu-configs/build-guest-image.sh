#!/usr/bin/env bash
# Build the cxlfs test-guest image from Debian packages: a stock Debian kernel
# (vmlinuz, and vmlinux: the same kernel uncompressed, for QEMU's PVH boot) and
# an initramfs (initramfs.cpio.gz, and the same archive as initramfs.cpio.lz4)
# holding busybox-static, fio and numactl with every shared library they link,
# the virtio / virtio-fs kernel modules, guest-init.sh as /init and cxlfs-hint
# (the cache-hint tool, ../hint/cxlfs-hint.c, built here with gcc -static).
# manifest.txt lists the package versions, modules and libraries.
#
#   qemu-configs/build-guest-image.sh [--force] [--key]
#
#   --force   rebuild even if the image for this content hash exists
#   --key     print the content hash (cache key) and exit
#
# The image directory is printed as the LAST line of stdout; everything else
# (progress) goes to stderr. Nothing is installed into the host's root file
# system except the build tools below: the image's files come from .deb files
# fetched with `apt-get download` and unpacked with `dpkg-deb -x`, so the image
# does not depend on what the host has installed.
#
# Environment:
#   CXLFS_CACHE_DIR        cache root (default: $XDG_CACHE_HOME/cxlfs, else
#                          ~/.cache/cxlfs). Images go to $CXLFS_CACHE_DIR/images/<hash>/,
#                          downloaded .debs to $CXLFS_CACHE_DIR/debs/.
#   CXLFS_KERNEL_PKG       kernel package (default: linux-image-amd64; its
#                          linux-image-<abi> dependency is what gets unpacked)
#   CXLFS_EXTRA_MODULES    extra kernel module names to load at boot (space separated)
#   CXLFS_EXTRA_PKGS_BIN   extra "package:/path/to/binary" items to copy with their
#                          libraries (space separated), e.g. "strace:/usr/bin/strace"
#
# The cache key is a SHA-256 over this script, lib.sh, guest-init.sh, the cxlfs-hint
# sources (../hint/cxlfs-hint.c, ../hint/include/cxlfs_hint.h), the settings above
# and the candidate versions (apt-cache policy) of the kernel, busybox-static,
# fio, numactl and every package in their dependency closures. A rebuild happens
# only when one of these changes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
init_script="$here/guest-init.sh"
hint_src="$here/../hint/cxlfs-hint.c"
hint_hdr="$here/../hint/include/cxlfs_hint.h"
memlat_src="$here/probes/cxlfs-memlat.c"
self="$here/$(basename "${BASH_SOURCE[0]}")"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

orig_args=("$@")
parse_build_args "$@"

[[ -f "$init_script" ]] || die "missing $init_script"
[[ -f "$hint_src" && -f "$hint_hdr" ]] || die "missing the cxlfs-hint sources ($hint_src, $hint_hdr)"
[[ -f "$memlat_src" ]] || die "missing $memlat_src"
require_x86_64

kernel_meta="${CXLFS_KERNEL_PKG:-linux-image-amd64}"
extra_modules="${CXLFS_EXTRA_MODULES:-}"
extra_bins="${CXLFS_EXTRA_PKGS_BIN:-}"
# Modules the guest needs (missing ones are skipped: names vary between kernels).
modules=(virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci fuse virtiofs)
# shellcheck disable=SC2206 # word splitting intended
modules+=($extra_modules)

# ---------------------------------------------------------------- host tools
ensure_host_tools() {
    local -A want=([cpio]=cpio [gzip]=gzip [lz4]=lz4 [xz]=xz-utils [depmod]=kmod [readelf]=binutils
        [apt-get]=apt [dpkg-deb]=dpkg [sha256sum]=coreutils [ldconfig]=libc-bin
        [qemu-system-x86_64]=qemu-system-x86 [gcc]=gcc)
    local -a need=()
    local t
    for t in "${!want[@]}"; do
        command -v "$t" >/dev/null 2>&1 || PATH="$PATH:/sbin:/usr/sbin" command -v "$t" >/dev/null 2>&1 \
            || need+=("${want[$t]}")
    done
    # cxlfs-hint is linked statically: it needs libc.a.
    [[ -f /usr/lib/x86_64-linux-gnu/libc.a ]] || need+=(libc6-dev)
    ((${#need[@]})) || return 0
    apt_install "${need[@]}"
}
PATH="$PATH:/sbin:/usr/sbin"
ensure_host_tools

# ------------------------------------------------------- package versions
declare -A ver_of=()     # pkg -> candidate version, filled in one apt-cache call
candidate() { # pkg -> candidate version ("" if none)
    if [[ -z "${ver_of[$1]+x}" ]]; then
        ver_of[$1]="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2; exit}' | sed 's/(none)//')"
    fi
    echo "${ver_of[$1]}"
}

# Quick key (see lib.sh): the inputs plus the state of apt's package lists.
quick_key() {
    {
        echo "format 1"
        script_hashes
        sha256sum <"$init_script"
        sha256sum <"$hint_src"
        sha256sum <"$hint_hdr"
        sha256sum <"$memlat_src"
        echo "kernel=$kernel_meta modules=${modules[*]} extra_bins=$extra_bins"
        stat -c '%n %s %Y' /var/lib/apt/lists/*_Packages* 2>/dev/null | sort
    } | sha256sum | cut -c1-16
}
if ((force == 0 && key_only == 0)); then
    k="$(remembered_key)"
    if [[ -n "$k" && -f "$cache_root/images/$k/.complete" ]]; then
        up_to_date "$cache_root/images/$k" "$cache_root/images/$k"
    fi
fi

[[ -n "$(candidate busybox-static)" && -n "$(candidate fio)" && -n "$(candidate numactl)" ]] \
    || { apt_update_once; ver_of=(); }
for p in fio numactl; do
    [[ -n "$(candidate "$p")" ]] || die "no candidate for $p: is a Debian 12 main mirror in the apt sources?"
done

# The metapackage depends on the versioned kernel package that holds the files.
kernel_pkg="$(apt-cache depends "$kernel_meta" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')"
if [[ -z "$kernel_pkg" ]]; then
    # Not a metapackage: use it directly.
    kernel_pkg="$kernel_meta"
fi
[[ -n "$(candidate "$kernel_pkg")" ]] || die "no candidate version for kernel package $kernel_pkg"

# Userland binaries that are always in the image (package:path), each with its
# shared-library closure; CXLFS_EXTRA_PKGS_BIN adds more of the same kind.
base_bins="fio:/usr/bin/fio numactl:/usr/bin/numactl"
top_pkgs=("$kernel_pkg" busybox-static)
for item in $base_bins $extra_bins; do top_pkgs+=("${item%%:*}"); done

closure() {
    apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances "$@" 2>/dev/null | grep -E '^[a-z0-9]' | sort -u
}
mapfile -t closure_pkgs < <(closure "${top_pkgs[@]}")
versions="$(apt-cache policy "${closure_pkgs[@]}" | awk '/^[^ ]/ {sub(":$", "", $1); p=$1} /Candidate:/ {print p, $2}' | sort)"
while read -r p v; do
    [[ "$v" == "(none)" ]] && v=""
    ver_of[$p]="$v"
done <<<"$versions"

key="$( {
    echo "format 1"
    script_hashes
    sha256sum <"$init_script"
    sha256sum <"$hint_src"
    sha256sum <"$hint_hdr"
    sha256sum <"$memlat_src"
    echo "kernel=$kernel_pkg modules=${modules[*]} extra_bins=$extra_bins"
    echo "$versions"
} | sha256sum | cut -c1-16)"

if ((key_only)); then
    echo "$key"
    exit 0
fi

img="$cache_root/images/$key"
debs="$cache_root/debs"
if [[ -f "$img/.complete" && $force -eq 0 ]]; then
    remember_key
    up_to_date "$img" "$img"
fi

mkdir -p "$cache_root/images" "$debs"
work="$(mktemp -d "$cache_root/images/.build-$key.XXXXXX")"
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
pool="$work/pool"       # unpacked .debs, one directory per package
root="$work/root"       # the initramfs tree
mkdir -p "$pool" "$root"

# ------------------------------------------------------------- fetching
declare -A fetched=()    # pkg -> version
declare -A deb_of=()     # pkg -> .deb file
apt_dl() { # pkg=ver..., into $debs
    (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "$@" >&2)
}
cached_deb() { # pkg ver -> path of the cached .deb, if any
    local f
    for f in "$debs/${1}_${2//:/%3a}_"{amd64,all}.deb; do
        if [[ -f "$f" ]]; then echo "$f"; return 0; fi
    done
    return 1
}
fetch() { # pkg...: download (one apt-get call, cached) and unpack into $pool/<pkg>;
          # packages with no candidate (virtual ones) are skipped, returns 1 if any
    local pkg ver rc=0
    local -a todo=() dl=()
    for pkg in "$@"; do
        [[ -n "${fetched[$pkg]:-}" ]] && continue
        ver="$(candidate "$pkg")"
        if [[ -z "$ver" ]]; then rc=1; continue; fi
        todo+=("$pkg")
        cached_deb "$pkg" "$ver" >/dev/null || dl+=("$pkg=$ver")
    done
    if ((${#dl[@]})); then
        log "apt-get download ${dl[*]}"
        if ! apt_dl "${dl[@]}"; then
            # Stale package lists (a version left the mirror): update them and
            # start over, so that the cache key matches what gets built.
            [[ -z "${CXLFS_IMAGE_RETRIED:-}" ]] || die "apt-get download ${dl[*]} failed"
            apt_update_once
            log "package lists updated; starting over"
            rm -rf "$work"
            CXLFS_IMAGE_RETRIED=1 exec "$self" "${orig_args[@]}"
        fi
    fi
    for pkg in "${todo[@]}"; do
        ver="$(candidate "$pkg")"
        deb_of[$pkg]="$(cached_deb "$pkg" "$ver")" || die "cannot find the .deb of $pkg=$ver in $debs"
        mkdir -p "$pool/$pkg"
        dpkg-deb -x "${deb_of[$pkg]}" "$pool/$pkg"
        fetched[$pkg]="$ver"
    done
    return "$rc"
}

deps_of() { # pkg -> its Depends/Pre-Depends, one a line: per group the first
            # alternative that has a candidate version (names only)
    local deb="${deb_of[$1]}" group alt
    local -a alts
    while IFS= read -r group; do
        IFS='|' read -r -a alts <<<"$group"
        for alt in "${alts[@]}"; do
            alt="${alt%%(*}"
            alt="${alt%%:*}"
            alt="${alt//[[:space:]]/}"
            [[ -n "$alt" && -n "$(candidate "$alt")" ]] || continue
            echo "$alt"
            break
        done
    done < <({ dpkg-deb -f "$deb" Pre-Depends; dpkg-deb -f "$deb" Depends; } | tr ',' '\n')
}

pool_realpath() { # file in $pool/<pkg>/... -> the regular file it names, resolved inside that package
    local f="$1" t n pkgroot
    pkgroot="${f#"$pool"/}"
    pkgroot="$pool/${pkgroot%%/*}"
    for n in 1 2 3 4 5 6 7 8 9 10; do
        [[ -L "$f" ]] || break
        t="$(readlink "$f")"
        if [[ "$t" == /* ]]; then f="$pkgroot$t"; else f="$(dirname "$f")/$t"; fi
        : "$n"
    done
    [[ -f "$f" && ! -L "$f" ]] || return 1
    echo "$f"
}

# ------------------------------------------------- shared-library closure
# An ELF object that comes from package P finds its DT_NEEDED libraries in P or
# in P's direct Depends (Debian's shlibs guarantee that). Fetch those lazily.
declare -A soname_path=()  # soname -> file in $pool
declare -A soname_pkg=()   # soname -> package
declare -A deps_done=()
declare -A lib_done=()
index_pkg() {
    local pkg="$1" f
    while IFS= read -r -d '' f; do
        local base="${f##*/}"
        [[ -n "${soname_path[$base]:-}" ]] && continue
        soname_path[$base]="$f"
        soname_pkg[$base]="$pkg"
    done < <(find "$pool/$pkg" \( -path '*/lib/x86_64-linux-gnu/*' -o -path '*/lib64/*' \
        -o -path '*/usr/lib/x86_64-linux-gnu/*' \) -name '*.so*' \( -type f -o -type l \) -print0)
}

needed_of() { readelf -dW "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

copied_libs=()
resolve_libs() { # file pkg
    local file="$1" pkg="$2" so d
    local -a ds
    while IFS= read -r so; do
        [[ -n "$so" ]] || continue
        [[ -n "${lib_done[$so]:-}" ]] && continue
        if [[ -z "${soname_path[$so]:-}" && -z "${deps_done[$pkg]:-}" ]]; then
            deps_done[$pkg]=1
            mapfile -t ds < <(deps_of "$pkg")
            fetch "${ds[@]}" || true
            for d in "${ds[@]}"; do
                [[ -n "${fetched[$d]:-}" ]] && index_pkg "$d"
            done
        fi
        [[ -n "${soname_path[$so]:-}" ]] || die "$so (needed by ${file#"$pool"/}) is in no dependency of $pkg"
        lib_done[$so]=1
        local src
        src="$(pool_realpath "${soname_path[$so]}")" || die "cannot resolve $so (${soname_path[$so]})"
        install -m 0755 "$src" "$root/usr/lib/x86_64-linux-gnu/$so"
        copied_libs+=("$so:${soname_pkg[$so]}")
        resolve_libs "$src" "${soname_pkg[$so]}"
    done < <(needed_of "$file")
}

# ------------------------------------------------------------------ build
log "building image $key in $work"
mkdir -p "$root"/{bin,dev,etc/cxlfs,mnt,proc,run,sys,tmp,usr/bin,usr/lib/x86_64-linux-gnu,lib64}
ln -s bin "$root/sbin"
ln -s ../bin "$root/usr/sbin"
ln -s usr/lib "$root/lib"

# busybox
fetch busybox-static || die "busybox-static is not available"
install -m 0755 "$pool/busybox-static/bin/busybox" "$root/bin/busybox"
while IFS= read -r applet; do
    [[ -n "$applet" && "$applet" != busybox ]] || continue
    ln -sf busybox "$root/bin/$applet"
done < <("$root/bin/busybox" --list)

# fio, numactl (+ extras) and their libraries
fetch libc6 || die "libc6 is not available"
index_pkg libc6
for item in $base_bins $extra_bins; do
    p="${item%%:*}" b="${item#*:}"
    fetch "$p" || die "package $p is not available"
    index_pkg "$p"
    [[ -f "$pool/$p$b" ]] || die "$b is not in package $p"
    install -m 0755 "$pool/$p$b" "$root/usr/bin/${b##*/}"
    resolve_libs "$pool/$p$b" "$p"
done
# The dynamic loader (PT_INTERP of fio is /lib64/ld-linux-x86-64.so.2).
ld_so="$(pool_realpath "$pool/libc6/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" || true)"
[[ -f "$ld_so" ]] || ld_so="$(find "$pool/libc6" -name 'ld-linux-x86-64.so.2' -type f | head -n1)"
[[ -f "$ld_so" ]] || die "no ld-linux-x86-64.so.2 in libc6"
install -m 0755 "$ld_so" "$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
ln -sf ../usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$root/lib64/ld-linux-x86-64.so.2"
echo /usr/lib/x86_64-linux-gnu >"$root/etc/ld.so.conf"
ldconfig -r "$root" -X 2>/dev/null || die "ldconfig -r failed"
printf 'root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"

# cxlfs-hint: static, so it needs nothing from the image.
gcc -static -O2 -Wall -Wextra -Werror -I"$(dirname "$hint_hdr")" -o "$root/usr/bin/cxlfs-hint" "$hint_src" \
    || die "cannot build cxlfs-hint (gcc -static; needs libc6-dev)"
hint_rc=0
"$root/usr/bin/cxlfs-hint" 2>/dev/null || hint_rc=$?
((hint_rc == 2)) || die "cxlfs-hint does not run (usage should exit 2, got $hint_rc)"
# cxlfs-memlat: the dependent-load latency probe (static as well).
gcc -static -O2 -Wall -Wextra -Werror -o "$root/usr/bin/cxlfs-memlat" "$memlat_src" \
    || die "cannot build cxlfs-memlat (gcc -static; needs libc6-dev)"
"$root/usr/bin/cxlfs-memlat" 1 4096 1 >/dev/null || die "cxlfs-memlat does not run"

# Check on the host that fio and numactl run from the image's own libraries only.
image_run() { # binary args...: run an image binary through the image's ld.so and libraries
    "$root/lib64/ld-linux-x86-64.so.2" --library-path "$root/usr/lib/x86_64-linux-gnu" "$root/usr/bin/$1" "${@:2}"
}
if ! out="$(image_run fio --version 2>&1)"; then
    die "fio does not run from the image's libraries: $out"
fi
fio_version="$out"
if ! out="$(image_run numactl --show 2>&1)"; then
    die "numactl does not run from the image's libraries: $out"
fi

# kernel + modules
fetch "$kernel_pkg" || die "kernel package $kernel_pkg is not available"
kpool="$pool/$kernel_pkg"
kver="$(find "$kpool/lib/modules" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | head -n1)"
[[ -n "$kver" ]] || die "no /lib/modules/<version> in $kernel_pkg"
vmlinuz="$kpool/boot/vmlinuz-$kver"
[[ -f "$vmlinuz" ]] || die "no /boot/vmlinuz-$kver in $kernel_pkg"
depmod -b "$kpool" "$kver" || die "depmod failed"
mdir="$kpool/lib/modules/$kver"
declare -A mod_path=() mod_deps=() mod_state=()
while IFS= read -r line; do
    m="${line%%:*}"
    name="${m##*/}"
    name="${name%%.ko*}"
    name="${name//-/_}"
    mod_path[$name]="$m"
    mod_deps[$name]="${line#*:}"
done <"$mdir/modules.dep"
is_builtin() { grep -qE "/${1//_/[-_]}\.ko\$" "$mdir/modules.builtin" 2>/dev/null; }
load_order=()
visit() { # module name -> appends it after its dependencies
    local n="$1" d dn
    [[ "${mod_state[$n]:-}" == "done" ]] && return 0
    [[ "${mod_state[$n]:-}" == busy ]] && die "module dependency cycle at $n"
    mod_state[$n]=busy
    for d in ${mod_deps[$n]}; do
        dn="${d##*/}"; dn="${dn%%.ko*}"; dn="${dn//-/_}"
        visit "$dn"
    done
    mod_state[$n]="done"
    load_order+=("$n")
}
skipped_modules=()
for m in "${modules[@]}"; do
    m="${m//-/_}"
    if [[ -n "${mod_path[$m]:-}" ]]; then
        visit "$m"
    elif is_builtin "$m"; then
        skipped_modules+=("$m(built-in)")
    else
        skipped_modules+=("$m(absent)")
    fi
done
: >"$root/etc/cxlfs/modules"
for n in "${load_order[@]}"; do
    rel="${mod_path[$n]}"
    mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
    case "$rel" in
        *.ko) cp "$mdir/$rel" "$root/lib/modules/$kver/$rel" ;;
        *.ko.xz) xz -dc "$mdir/$rel" >"$root/lib/modules/$kver/${rel%.xz}"; rel="${rel%.xz}" ;;
        *.ko.zst) zstd -qdc "$mdir/$rel" >"$root/lib/modules/$kver/${rel%.zst}"; rel="${rel%.zst}" ;;
        *.ko.gz) gzip -dc "$mdir/$rel" >"$root/lib/modules/$kver/${rel%.gz}"; rel="${rel%.gz}" ;;
        *) die "unknown module format: $rel" ;;
    esac
    echo "/lib/modules/$kver/$rel" >>"$root/etc/cxlfs/modules"
done

install -m 0755 "$init_script" "$root/init"

# manifest
{
    echo "key=$key"
    echo "kernel_package=$kernel_pkg ${fetched[$kernel_pkg]}"
    echo "kernel_release=$kver"
    echo "modules=${load_order[*]}"
    echo "modules_skipped=${skipped_modules[*]}"
    echo "fio=$fio_version"
    echo "numactl=${fetched[numactl]} (numactl --show runs from the image's libraries)"
    echo "cxlfs-hint=$(sha256sum <"$hint_src" | cut -c1-16) (hint/cxlfs-hint.c)"
    echo "cxlfs-memlat=$(sha256sum <"$memlat_src" | cut -c1-16) (qemu-configs/probes/cxlfs-memlat.c)"
    echo "packages:"
    for p in $(printf '%s\n' "${!fetched[@]}" | sort); do echo "  $p ${fetched[$p]}"; done
    echo "libraries:"
    printf '  %s\n' "${copied_libs[@]}" | sort
} >"$work/manifest.txt"

# initramfs: reproducible newc archive, gzip (compatible) and lz4 (about twice
# as fast to unpack under TCG)
out="$work/out"
mkdir -p "$out"
find "$root" -exec touch -h -d @0 {} +
(cd "$root" && find . -mindepth 1 -print0 | LC_ALL=C sort -z \
    | cpio --null --create --format=newc --reproducible --quiet --owner=0:0) >"$work/initramfs.cpio"
gzip -6 -n -c "$work/initramfs.cpio" >"$out/initramfs.cpio.gz" &
gz_pid=$!
lz4 -q -l -9 "$work/initramfs.cpio" "$out/initramfs.cpio.lz4" || die "lz4 failed"
wait "$gz_pid" || die "gzip failed"
cp "$vmlinuz" "$out/vmlinuz"

# vmlinux: the uncompressed kernel, booted by QEMU through its PVH entry point.
# That skips the in-guest decompression of the bzImage (2-3 s under TCG).
extract_vmlinux() { # bzImage out
    local magic tool off
    for magic in 'xz:\xfd7zXZ\x00' 'zstd:\x28\xb5\x2f\xfd' 'gzip:\x1f\x8b\x08'; do
        tool="${magic%%:*}"
        command -v "$tool" >/dev/null 2>&1 || continue
        while IFS=: read -r off _; do
            tail -c "+$((off + 1))" "$1" | "$tool" -dcq 2>/dev/null >"$2" || true
            if [[ "$(head -c 4 "$2" | od -An -c | tr -d ' ')" == '177ELF' ]]; then
                return 0
            fi
        done < <(LC_ALL=C grep -obUaP "${magic#*:}" "$1" | head -n 4)
    done
    rm -f "$2"
    return 1
}
if extract_vmlinux "$vmlinuz" "$out/vmlinux"; then
    if ! readelf -n "$out/vmlinux" 2>/dev/null | grep -q 'Xen.*(0x00000012)'; then
        log "vmlinux has no PVH entry point: QEMU will boot vmlinuz"
        rm -f "$out/vmlinux"
    fi
else
    log "could not extract vmlinux from vmlinuz: QEMU will boot vmlinuz"
fi
cp "$work/manifest.txt" "$out/manifest.txt"
touch "$out/.complete"

if [[ -f "$img/.complete" && $force -eq 0 ]]; then
    log "another build finished $img meanwhile: keeping that one"
else
    rm -rf "$img"
    mv -T "$out" "$img" || die "cannot move the image into $img"
fi
log "kernel $kver; modules: ${load_order[*]}; skipped: ${skipped_modules[*]:-none}"
log "initramfs $(du -h "$img/initramfs.cpio.gz" | cut -f1); $(wc -l <"$img/manifest.txt") manifest lines"
remember_key
echo "$img"
