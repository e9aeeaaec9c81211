#!/usr/bin/env bash
# Build the cxlfs test-guest image from Debian packages: a stock Debian kernel
# (vmlinuz, and vmlinux: the same kernel uncompressed, for QEMU's PVH boot) and
# an initramfs (initramfs.cpio.gz, and the same archive as initramfs.cpio.lz4)
# holding busybox-static, fio and numactl with every shared library they link,
# the virtio / virtio-fs kernel modules, guest-init.sh as /init and cxlfs-hint
# (the cache-hint tool, ../hint/cxlfs-hint.c, built here with gcc -static)
# and the probes of probes/ (cxlfs-memlat, cxlfs-membw, cxlfs-numa, static too).
# manifest.txt lists the package versions, modules and libraries.
#
#   qemu-configs/build-guest-image.sh [--force] [--key] [--packages LIST] [--kernel K]
#
#   --force          rebuild even if the image for this content hash exists
#   --key            print the content hash (cache key) and exit
#   --packages LIST  extra Debian packages (comma separated), e.g.
#                    redis-server,redis-tools,stress-ng: every file of each goes
#                    into the image at its path (a package file replaces a busybox
#                    applet link, except /bin/sh, and no other file of the image),
#                    plus the shared-library closure of every ELF file in them.
#                    Their other dependencies are NOT installed, and maintainer
#                    scripts do not run (no users, no alternatives links). The build
#                    checks that each executable in their bin/sbin directories
#                    loads from the image's libraries (ld.so --list; nothing is run).
#                    Default: $CXLFS_EXTRA_PKGS
#   --kernel K       default: Debian 12's linux-image-amd64 (6.1); backports: the
#                    bookworm-backports kernel (6.12; weighted interleave needs
#                    >= 6.9), adding that apt source if missing; else a kernel
#                    package name. Default: $CXLFS_KERNEL_PKG, else default
#
# The image directory is printed as the LAST line of stdout; everything else
# (progress) goes to stderr. Nothing is installed into the host's root file
# system except the build tools below and, for a kernel whose fuse is a module,
# its linux-headers package (to rebuild fuse with ../guest-kernel-patches/):
# the image's files come from .deb files
# fetched with `apt-get download` and unpacked with `dpkg-deb -x`, so the image
# does not depend on what the host has installed.
#
# Environment:
#   CXLFS_CACHE_DIR        cache root (default: $XDG_CACHE_HOME/cxlfs, else
#                          ~/.cache/cxlfs). Images go to $CXLFS_CACHE_DIR/images/<hash>/,
#                          downloaded .debs to $CXLFS_CACHE_DIR/debs/.
#   CXLFS_KERNEL_PKG       as --kernel (a metapackage such as linux-image-amd64 gets
#                          its linux-image-<abi> dependency unpacked)
#   CXLFS_EXTRA_PKGS       as --packages (comma or space separated)
#   CXLFS_EXTRA_MODULES    extra kernel module names to load at boot (space separated)
#   CXLFS_EXTRA_PKGS_BIN   extra "package:/path/to/binary" items to copy with their
#                          libraries (space separated), e.g. "strace:/usr/bin/strace"
#
# The cache key is a SHA-256 over this script, lib.sh, guest-init.sh, the cxlfs-hint
# sources (../hint/cxlfs-hint.c, ../hint/include/cxlfs_hint.h), the probe sources,
# the guest kernel patch, the settings above (the package list sorted) and the candidate versions
# (apt-cache policy) of the kernel, busybox-static, fio, numactl, the extra
# packages and every package in their dependency closures. A rebuild happens
# only when one of these changes; each package list has its own image.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
init_script="$here/guest-init.sh"
hint_src="$here/../hint/cxlfs-hint.c"
hint_hdr="$here/../hint/include/cxlfs_hint.h"
probes=(cxlfs-memlat cxlfs-membw cxlfs-numa cxlfs-fsx cxlfs-posix)   # probes/<name>.c, static, in /usr/bin
# Applied to the guest kernel's fuse module, in this order (see
# patch_fuse_modules below).
fuse_patches=("$here/../guest-kernel-patches/fuse-dax-reclaim.patch"
    "$here/../guest-kernel-patches/fuse-dax-reclaim-on-demand.patch")
self="$here/$(basename "${BASH_SOURCE[0]}")"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

orig_args=("$@")
build_value_options="--packages --kernel"
parse_build_args "$@"

[[ -f "$init_script" ]] || die "missing $init_script"
[[ -f "$hint_src" && -f "$hint_hdr" ]] || die "missing the cxlfs-hint sources ($hint_src, $hint_hdr)"
for pr in "${probes[@]}"; do [[ -f "$here/probes/$pr.c" ]] || die "missing $here/probes/$pr.c"; done
for fp in "${fuse_patches[@]}"; do [[ -f "$fp" ]] || die "missing $fp"; done
require_x86_64

# Extra packages: sorted and unique, so that the same set is the same image.
pkg_re='^[a-z0-9][a-z0-9+.-]+$'
mapfile -t extra_pkgs < <(tr -s ', ' '\n' <<<"${build_opt[--packages]-${CXLFS_EXTRA_PKGS:-}}" | sed '/^$/d' | LC_ALL=C sort -u)
for p in "${extra_pkgs[@]}"; do [[ "$p" =~ $pkg_re ]] || die "not a Debian package name: '$p'"; done
kernel_choice="${build_opt[--kernel]-${CXLFS_KERNEL_PKG:-default}}"
case "$kernel_choice" in
    "" | default) kernel_choice=default kernel_meta=linux-image-amd64 ;;
    backports) kernel_meta=linux-image-amd64 ;;
    *) [[ "$kernel_choice" =~ $pkg_re ]] || die "--kernel: not a package name: '$kernel_choice'"
       kernel_meta="$kernel_choice" ;;
esac
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
        [qemu-system-x86_64]=qemu-system-x86 [gcc]=gcc [make]=make [patch]=patch [strip]=binutils)
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

# --------------------------------------------------- bookworm-backports
# The backports suite, added (same mirror and key as the main Debian source)
# only when --kernel backports asks for it; its pin priority (100) keeps every
# other candidate on stable.
bpo_suite=bookworm-backports
bpo_sources=/etc/apt/sources.list.d/cxlfs-bookworm-backports.sources
ensure_backports() {
    apt-cache policy 2>/dev/null | grep -q "n=$bpo_suite," && return 0
    if [[ ! -f "$bpo_sources" ]]; then
        need_root "add the $bpo_suite apt source ($bpo_sources)"
        local uri="" signed=""
        if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
            # The stanza whose Suites has plain "bookworm": its URIs and Signed-By.
            read -r uri signed < <(awk -v RS= '/(^|\n)Types:[^\n]*deb( |$|\n)/ && /(^|\n)Suites:[^\n]* bookworm( |$|\n)/ {
                    u = ""; k = ""; n = split($0, l, "\n")
                    for (i = 1; i <= n; i++) {
                        if (l[i] ~ /^URIs:/) { sub(/^URIs: */, "", l[i]); split(l[i], w, " "); u = w[1] }
                        if (l[i] ~ /^Signed-By:/) { sub(/^Signed-By: */, "", l[i]); k = l[i] }
                    }
                    print u, k; exit }' /etc/apt/sources.list.d/debian.sources) || true
        fi
        uri="${uri:-http://deb.debian.org/debian}"
        signed="${signed:-/usr/share/keyrings/debian-archive-keyring.gpg}"
        log "adding $bpo_sources ($uri $bpo_suite)"
        printf '# Added by cxlfs qemu-configs/build-guest-image.sh (--kernel backports)\nTypes: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
            "$uri" "$bpo_suite" "$signed" >"$bpo_sources"
    fi
    apt_updated=0
    apt_update_once
    apt-cache policy 2>/dev/null | grep -q "n=$bpo_suite," || die "apt has no $bpo_suite lists after apt-get update ($bpo_sources)"
}
[[ "$kernel_choice" != backports ]] || ensure_backports

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
        for pr in "${probes[@]}"; do sha256sum <"$here/probes/$pr.c"; done
        sha256sum <"$here/probes/cxlfs-probe.h"
        for fp in "${fuse_patches[@]}"; do sha256sum <"$fp"; done
        echo "kernel=$kernel_choice modules=${modules[*]} extra_bins=$extra_bins packages=${extra_pkgs[*]}"
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
for p in "${extra_pkgs[@]}"; do
    [[ -n "$(candidate "$p")" ]] || die "--packages: no candidate version for $p (apt-cache policy $p)"
done

# The metapackage depends on the versioned kernel package that holds the files.
if [[ "$kernel_choice" == backports ]]; then
    # linux-image-amd64's candidate stays the stable one: take the dependency
    # of its backports version (linux-image-6.12...-amd64 exists only there).
    bpo_ver="$(apt-cache madison "$kernel_meta" | awk -F'|' -v s="$bpo_suite/" 'index($3, s) {gsub(/ /, "", $2); print $2; exit}')"
    [[ -n "$bpo_ver" ]] || die "no $kernel_meta in $bpo_suite (apt-cache madison $kernel_meta)"
    kernel_pkg="$(apt-cache show "$kernel_meta=$bpo_ver" | sed -n 's/^Depends: //p' | head -n1 | tr ',' '\n' \
        | sed 's/(.*//; s/[[:space:]]//g' | grep -m1 '^linux-image-' || true)"
    [[ -n "$kernel_pkg" ]] || die "$kernel_meta=$bpo_ver depends on no linux-image-* package"
else
    kernel_pkg="$(apt-cache depends "$kernel_meta" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')"
fi
if [[ -z "$kernel_pkg" ]]; then
    # Not a metapackage: use it directly.
    kernel_pkg="$kernel_meta"
fi
[[ -n "$(candidate "$kernel_pkg")" ]] || die "no candidate version for kernel package $kernel_pkg"

# Userland binaries that are always in the image (package:path), each with its
# shared-library closure; CXLFS_EXTRA_PKGS_BIN adds more of the same kind.
base_bins="fio:/usr/bin/fio numactl:/usr/bin/numactl"
top_pkgs=("$kernel_pkg" busybox-static "${extra_pkgs[@]}")
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
    for pr in "${probes[@]}"; do sha256sum <"$here/probes/$pr.c"; done
    sha256sum <"$here/probes/cxlfs-probe.h"
    for fp in "${fuse_patches[@]}"; do sha256sum <"$fp"; done
    echo "kernel=$kernel_pkg modules=${modules[*]} extra_bins=$extra_bins packages=${extra_pkgs[*]}"
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
unresolved_libs=()  # soname:needed-by, for the extra packages' files only
libs_soft=0         # 1: an unresolvable soname is recorded, not fatal
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
        if [[ -z "${soname_path[$so]:-}" ]]; then
            # (A plugin of an extra package may need a library from a package
            # that is not a direct dependency; its executables are checked below.)
            ((libs_soft)) || die "$so (needed by ${file#"$pool"/}) is in no dependency of $pkg"
            log "warning: $so (needed by ${file#"$pool"/}) is in no dependency of $pkg"
            unresolved_libs+=("$so:${file#"$pool"/}")
            continue
        fi
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
# Extra packages (--packages): all their files, then the libraries of their ELF files.
is_elf() { # file: starts with \177ELF (bash read: no fork per file)
    local LC_ALL=C m=""
    IFS= read -r -n 4 -d '' m <"$1" 2>/dev/null || true
    [[ "$m" == $'\177ELF' ]]
}
replaced_applets=()  # name:pkg
kept_files=()        # /path:pkg (the image's file stayed)
install_pkg_files() { # pkg
    local pkg="$1" rel dest
    while IFS= read -r -d '' rel; do
        dest="$root/$rel"
        [[ -L "$dest" || -e "$dest" ]] || continue
        # Busybox applet links give way to the real program (not sh: init's shell).
        if [[ -L "$dest" && "$(readlink "$dest")" == busybox && "${rel##*/}" != sh ]]; then
            rm -f "$dest"
            replaced_applets+=("${rel##*/}:$pkg")
        else
            kept_files+=("/$rel:$pkg")
        fi
    done < <(cd "$pool/$pkg" && find . -mindepth 1 ! -type d -printf '%P\0')
    # --keep-directory-symlink: /sbin, /usr/sbin and /lib are links here.
    tar -C "$pool/$pkg" -cf - . | tar -C "$root" -xf - --keep-directory-symlink --skip-old-files \
        --no-same-owner || die "cannot unpack $pkg into the image"
}
libs_soft=1
for p in "${extra_pkgs[@]}"; do
    fetch "$p" || die "package $p is not available"
    index_pkg "$p"
    install_pkg_files "$p"
    while IFS= read -r -d '' f; do
        if is_elf "$f"; then resolve_libs "$f" "$p"; fi
    done < <(find "$pool/$p" -type f -print0)
done
libs_soft=0

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
# The probes (static as well): latency, bandwidth, memory policy.
for pr in "${probes[@]}"; do
    gcc -static -O2 -Wall -Wextra -Werror -pthread -I"$here/probes" -o "$root/usr/bin/$pr" "$here/probes/$pr.c" -lm \
        || die "cannot build $pr (gcc -static; needs libc6-dev)"
    rc=0
    "$root/usr/bin/$pr" --bad-argument >/dev/null 2>&1 || rc=$?
    ((rc == 2)) || die "$pr: a bad argument should exit 2 (got $rc)"
done
probe_ok() { # name args...: one JSON line of that probe on stdout
    local out
    out="$("$root/usr/bin/$1" "${@:2}")" || die "$1 ${*:2} failed"
    [[ "$out" == "{\"probe\":\"${1#cxlfs-}\","*"}" && "$out" != *$'\n'* ]] || die "$1 ${*:2} printed: $out"
}
"$root/usr/bin/cxlfs-memlat" 1 4096 1 | grep -q '^{"size_bytes":1048576,' || die "cxlfs-memlat (old form) does not run"
probe_ok cxlfs-memlat --size 1m --stride 64 --laps 1
probe_ok cxlfs-memlat --size 1m --stride 256 --laps 1 --pattern zipf:0.99
memlat_file="$(mktemp)"
probe_ok cxlfs-memlat --size 1m --stride 64 --laps 1 --file "$memlat_file"
[[ "$(stat -c %s "$memlat_file")" == 1048576 ]] || die "cxlfs-memlat --file did not size its file"
rm -f "$memlat_file"
out="$("$root/usr/bin/cxlfs-memlat" --size 1m --stride 256 --laps 1 --pattern zipf:1.2)"
[[ "$out" == *'"pattern":"zipf:1.2","pages":256,'* ]] || die "cxlfs-memlat --pattern zipf:1.2 printed: $out"
probe_ok cxlfs-membw --size 1m --threads 2 --passes 1
if [[ -d /sys/devices/system/node/node0 ]]; then
    "$root/usr/bin/cxlfs-numa" --preferred 0 -- "$root/bin/busybox" true || die "cxlfs-numa --preferred 0 does not run"
fi

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

# The extra packages' executables must load from the image alone: ld.so --list
# (no execution: many are daemons) resolves every library inside $root.
image_realpath() { # path in $root -> the regular file it names, links resolved inside $root
    local f="$1" t n
    for n in 1 2 3 4 5 6 7 8 9 10; do
        [[ -L "$f" ]] || break
        t="$(readlink "$f")"
        if [[ "$t" == /* ]]; then f="$root$t"; else f="$(dirname "$f")/$t"; fi
        : "$n"
    done
    [[ -f "$f" && ! -L "$f" ]] || return 1
    echo "$f"
}
exe_checks=()   # name:pkg:how
check_pkg_exes() { # pkg
    local pkg="$1" rel real out line interp
    while IFS= read -r -d '' rel; do
        real="$(image_realpath "$root/$rel")" \
            || die "/$rel of $pkg links to a file that is not in the image (add the package that has it to --packages)"
        if is_elf "$real"; then
            if ! readelf -lW "$real" 2>/dev/null | grep -q 'program interpreter'; then
                exe_checks+=("${rel##*/}:$pkg:static")
                continue
            fi
            out="$("$root/lib64/ld-linux-x86-64.so.2" --library-path "$root/usr/lib/x86_64-linux-gnu" --list "$real" 2>&1)" \
                || die "/$rel of $pkg does not load: $out"
            while IFS= read -r line; do
                [[ "$line" == *"=>"* ]] || continue
                [[ "$line" == *"=> $root/"* ]] || die "/$rel of $pkg: a library is not in the image: $line"
            done <<<"$out"
            exe_checks+=("${rel##*/}:$pkg:loads")
        else
            interp="$(head -n1 "$real" | sed -n 's/^#![[:space:]]*\([^[:space:]]*\).*/\1/p')"
            if [[ -n "$interp" ]] && image_realpath "$root$interp" >/dev/null; then
                exe_checks+=("${rel##*/}:$pkg:script")
            else
                log "warning: /$rel of $pkg will not run in the image (interpreter '${interp:-none}' missing)"
                exe_checks+=("${rel##*/}:$pkg:NOT-RUNNABLE(${interp:-no interpreter})")
            fi
        fi
    done < <(cd "$pool/$pkg" && find usr/bin usr/sbin bin sbin -mindepth 1 -maxdepth 1 ! -type d -print0 2>/dev/null)
}
for p in "${extra_pkgs[@]}"; do check_pkg_exes "$p"; done

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

# ------------------------------------------ the fuse module, patched
# The guest kernel's FUSE DAX range reclaim can fail for good on a range whose
# file was written through mmap (../guest-kernel-patches/fuse-dax-reclaim.patch
# says how): read()/write() then get EBUSY and faults wait forever once the
# window runs short; and in a window of fewer than 5 ranges its background
# reclaim takes back the ranges in use (fuse-dax-reclaim-on-demand.patch).
# Where fuse is a module, it and virtiofs are rebuilt from
# fs/fuse of the kernel's own source package (linux-source-X.Y, same version)
# with the patch, against the same version's headers (installed on the host
# with apt-get: linux-headers-<release>, which brings kbuild and the
# compiler). The rebuilt modules are unsigned: the guest kernel loads them
# and notes a taint. A kernel with fuse built in keeps its own.
fuse_patched="not applied"
patch_fuse_modules() {
    local ver="${fetched[$kernel_pkg]}" mm src deb hdr="/usr/src/linux-headers-$kver" bdir m
    mm="$(sed -E 's/^([0-9]+\.[0-9]+).*/\1/' <<<"$kver")"
    src="linux-source-$mm"
    if [[ ! -f "$hdr/Makefile" ]] || [[ "$(dpkg-query -W -f '${Version}' "linux-headers-$kver" 2>/dev/null)" != "$ver" ]]; then
        log "apt-get install linux-headers-$kver=$ver (to build the patched fuse module)"
        need_root "install linux-headers-$kver"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "linux-headers-$kver=$ver" >&2; then
            apt_update_once
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "linux-headers-$kver=$ver" >&2 \
                || die "cannot install linux-headers-$kver=$ver"
        fi
    fi
    if ! deb="$(cached_deb "$src" "$ver")"; then
        log "apt-get download $src=$ver (about 140 MB, once)"
        apt_dl "$src=$ver" || { apt_update_once; apt_dl "$src=$ver"; } || die "cannot download $src=$ver"
        deb="$(cached_deb "$src" "$ver")" || die "cannot find the .deb of $src=$ver in $debs"
    fi
    bdir="$work/fuse-src"
    mkdir -p "$bdir"
    dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/src/$src.tar.xz" \
        | tar -xJ -C "$bdir" --strip-components=1 "$src/fs/fuse" \
        || die "cannot unpack fs/fuse from $src=$ver"
    for fp in "${fuse_patches[@]}"; do
        patch -p1 -d "$bdir" --quiet <"$fp" || die "$fp does not apply to $src=$ver"
    done
    make -s -C "$hdr" M="$bdir/fs/fuse" modules >"$work/fuse-build.log" 2>&1 \
        || { tail -n 30 "$work/fuse-build.log" >&2; die "building the patched fuse module failed"; }
    for m in fuse virtiofs; do
        [[ -n "${mod_path[$m]:-}" ]] || continue
        strip --strip-debug -o "$root/lib/modules/$kver/${mod_path[$m]%.ko*}.ko" "$bdir/fs/fuse/$m.ko" \
            || die "cannot install the patched $m.ko"
    done
    fuse_patched="$(for fp in "${fuse_patches[@]}"; do basename "$fp"; done | paste -sd' ') ($src=$ver)"
}
if [[ -n "${mod_path[fuse]:-}" && " ${load_order[*]} " == *" fuse "* ]]; then
    patch_fuse_modules
    log "fuse and virtiofs modules rebuilt with $fuse_patched"
else
    fuse_patched="not applied: fuse is built into $kernel_pkg"
    log "fuse is built into $kernel_pkg: its DAX range reclaim stays unpatched (guest-kernel-patches/README.md)"
fi

install -m 0755 "$init_script" "$root/init"

# manifest
{
    echo "key=$key"
    echo "kernel_package=$kernel_pkg ${fetched[$kernel_pkg]}"
    echo "kernel_release=$kver"
    echo "modules=${load_order[*]}"
    echo "modules_skipped=${skipped_modules[*]}"
    echo "fuse_patch=$fuse_patched"
    echo "fio=$fio_version"
    echo "numactl=${fetched[numactl]} (numactl --show runs from the image's libraries)"
    echo "cxlfs-hint=$(sha256sum <"$hint_src" | cut -c1-16) (hint/cxlfs-hint.c)"
    for pr in "${probes[@]}"; do
        echo "$pr=$(sha256sum <"$here/probes/$pr.c" | cut -c1-16) (qemu-configs/probes/$pr.c)"
    done
    echo "kernel_choice=$kernel_choice"
    printf 'extra_packages='
    for p in "${extra_pkgs[@]}"; do printf '%s=%s ' "$p" "${fetched[$p]}"; done
    echo
    echo "extra_executables=${exe_checks[*]}"
    echo "applets_replaced=${replaced_applets[*]}"
    echo "files_kept=${kept_files[*]}"
    echo "libraries_unresolved=${unresolved_libs[*]}"
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
        # (offsets only: bash's read stops at the invalid UTF-8 of the match)
        while read -r off; do
            tail -c "+$((off + 1))" "$1" | "$tool" -dcq 2>/dev/null >"$2" || true
            if [[ "$(head -c 4 "$2" | od -An -c | tr -d ' ')" == '177ELF' ]]; then
                return 0
            fi
        done < <(LC_ALL=C grep -obUaP "${magic#*:}" "$1" | head -n 4 | cut -d: -f1)
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
