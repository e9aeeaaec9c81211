#!/usr/bin/env bash
# Boot one cxlfs test guest under QEMU and wait for it to power off.
#
#   qemu-configs/run-vm.sh [options] [-- extra QEMU arguments]
#
# Options:
#   --image DIR       directory made by build-guest-image.sh (default: what
#                     build-guest-image.sh prints; built if needed). Boots vmlinux
#                     (PVH entry) + initramfs.cpio.lz4 when present, else
#                     vmlinuz + initramfs.cpio.gz
#   --compat          boot vmlinuz + initramfs.cpio.gz even if the faster pair exists
#   --socket PATH     vhost-user-fs socket of the daemon (virtiofsd or cxlfsd);
#                     omit for a guest without a share
#   --tag TAG         virtio-fs tag (default: cxlfs)
#   --mountopts OPTS  guest mount -o options for the share, e.g. dax=always
#   --cache-size SIZE DAX window of the share (QEMU syntax, e.g. 64M); needs the
#                     patched QEMU of build-qemu.sh (QEMU=$(build-qemu.sh | tail -n1)).
#                     Must be the back-end's window (cxlfsd --dax-window, default
#                     1GiB): QEMU asks it (VHOST_USER_GET_SHMEM_CONFIG) and exits
#                     at start, naming both sizes, when they differ (status 125).
#                     `cxlfs run` passes both from the spec's vms.dax_window
#   --mem SIZE        guest RAM, QEMU syntax (default: 1G)
#   --cxl-memory SIZE memory mode: add a CPU-less NUMA node 1 of SIZE (N with a
#                     K, M, G or T suffix, a whole number of MiB), backed by the
#                     emulated CXL-SSD's memory region, shared (MAP_SHARED), at
#                     distance 50 from node 0 (which keeps --mem and all vCPUs).
#                     Needs exactly one of the next two. The file must be empty
#                     (QEMU sizes it) or at least SIZE long. The guest's init
#                     reports the node (CXLFS-CXL-NODE=1 size_kib=K) and lists
#                     it in /run/cxlfs/cxl-nodes
#   --cxl-memory-fd N an open file descriptor (> 2) of the region file, inherited
#                     by this script (from the daemon, or `exec 9<>FILE` in the
#                     caller's shell); QEMU opens it as mem-path=/proc/self/fd/N
#   --cxl-memory-path FILE
#                     the region file by path (tests without the daemon; QEMU
#                     creates it if missing)
#   --cxl-abits FILE  memory mode: node 1's accessed-bit area (a file, or
#                     /proc/self/fd/N of an inherited descriptor): the patched
#                     QEMU sets a page's bit when a vCPU's TLB entry for it is
#                     filled (TCG; qemu-configs/README.md, "Accessed bits")
#   --dax-abits FILE  the DAX window's accessed-bit area (needs --cache-size)
#   --cxl-latency NS  memory mode: node 1's access latency in the guest's ACPI
#                     HMAT (default: 250 = 170 for a CXL link + 80). Memory
#                     mode always describes both nodes in an HMAT (-machine
#                     hmat=on): node 0 at $CXLFS_DRAM_LATENCY_NS (default 100)
#                     and $CXLFS_DRAM_BANDWIDTH (default 20G, bytes/s), node 1
#                     at --cxl-latency and --cxl-bandwidth, so a kernel with
#                     memory tiering (6.7+: the image's backports kernel) puts
#                     node 1 in a lower tier than node 0. The guest's init
#                     reports the tiers: CXLFS-MEMORY-TIERS=<tier>:<nodes>,...
#   --cxl-bandwidth BW
#                     memory mode: node 1's access bandwidth in the HMAT, bytes
#                     per second with a K, M, G or T suffix (default: 8G)
#   --smp N           vCPUs (default: 2)
#   --name NAME       VM name: QEMU -name, guest hostname, exit file (default: vm0)
#   --serial FILE     serial console log (default: $TMPDIR/cxlfs-NAME.serial.log)
#   --cmd CMD         shell command to run in the guest (cwd /mnt); passed base64
#                     on the kernel command line (keep it short: the whole command
#                     line is limited to 2048 bytes; put long scripts in the share
#                     as .cxlfs/run.sh instead)
#   --append ARGS     extra kernel command-line arguments
#   --realtime-priority N
#                     run every vCPU thread under SCHED_FIFO at priority N
#                     (1..99; needs root or CAP_SYS_NICE), as libvirt's
#                     vcpusched does: a vCPU woken by a trap's reply then runs
#                     before the host's ordinary threads (QEMU's own included)
#                     instead of queueing behind them. Keep N below cxlfsd's
#                     --realtime-priority, whose threads answer the vCPU's
#                     faults on its own CPU. Set once the vCPU threads exist;
#                     the guest is stopped if that fails
#   --cpu MODEL       QEMU -cpu (default: host under KVM, qemu64 under TCG, where
#                     it runs syscall-heavy guest work about 2x faster than max)
#   --accel MODE      auto (default), kvm or tcg. auto uses KVM only when a test
#                     boot under KVM succeeded on this host (verdict cached)
#   --tcg-thread T    auto (default), single or multi: TCG's vCPU threading.
#                     auto is single for the image's bookworm-backports kernel
#                     (6.12), multi otherwise. Under multi-threaded TCG on this
#                     QEMU that kernel oopses at boot now and then (`Oops:
#                     int3` inside code it is live-patching: 2 boots in 200 in
#                     memory mode); single-threaded, 0 in 400 (the loop:
#                     qemu-configs/boot-loop.sh, docs in qemu-configs/README.md)
#   --timeout SECS    kill the guest after SECS (default: 600)
#   --socket-wait S   wait up to S seconds for --socket to appear (default: 10)
#   --follow          copy the serial log to stderr while the guest runs
#   --print           print the QEMU command line (one argument a line) and exit
#
# Environment:
#   QEMU              QEMU binary (default: qemu-system-x86_64), e.g. the patched
#                     one with a DAX window
#   CXLFS_CACHE_DIR   cache root (as in build-guest-image.sh); the KVM verdict is
#                     kept there as kvm-verdict-<hash>
#   CXLFS_KVM_PROBE_TIMEOUT  seconds for the KVM test boot (default: 30)
#   CXLFS_TCG_THREAD  the default of --tcg-thread
#
# Exit status: the guest command's status (the CXLFS-EXIT=<n> line on the
# serial console); 124 if the guest timed out; 125 if QEMU stopped without a
# CXLFS-EXIT line (QEMU error, kernel panic: see the serial log).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { printf 'run-vm: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 125; }

qemu="${QEMU:-qemu-system-x86_64}"
cache_root="${CXLFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cxlfs}"
image="" socket="" tag=cxlfs mountopts="" cache_size="" mem=1G smp=2 name=vm0 serial="" cmd=""
append="" accel=auto tcg_thread="${CXLFS_TCG_THREAD:-auto}" cpu="" timeout_s=600 socket_wait=10 follow=0 print_only=0
have_cmd=0 compat=0 cxl_mem="" cxl_fd="" cxl_path="" cxl_lat=250 cxl_bw=8G cxl_abits="" dax_abits=""
rt_prio=""
extra=()
while (($#)); do
    case "$1" in
        --image) image="$2"; shift 2 ;;
        --socket) socket="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        --mountopts) mountopts="$2"; shift 2 ;;
        --cache-size) cache_size="$2"; shift 2 ;;
        --mem) mem="$2"; shift 2 ;;
        --cxl-memory) cxl_mem="$2"; shift 2 ;;
        --cxl-memory-fd) cxl_fd="$2"; shift 2 ;;
        --cxl-memory-path) cxl_path="$2"; shift 2 ;;
        --cxl-abits) cxl_abits="$2"; shift 2 ;;
        --dax-abits) dax_abits="$2"; shift 2 ;;
        --cxl-latency) cxl_lat="$2"; shift 2 ;;
        --cxl-bandwidth) cxl_bw="$2"; shift 2 ;;
        --smp) smp="$2"; shift 2 ;;
        --name) name="$2"; shift 2 ;;
        --serial) serial="$2"; shift 2 ;;
        --cmd) cmd="$2"; have_cmd=1; shift 2 ;;
        --append) append="$2"; shift 2 ;;
        --realtime-priority) rt_prio="$2"; shift 2 ;;
        --accel) accel="$2"; shift 2 ;;
        --tcg-thread) tcg_thread="$2"; shift 2 ;;
        --cpu) cpu="$2"; shift 2 ;;
        --timeout) timeout_s="$2"; shift 2 ;;
        --socket-wait) socket_wait="$2"; shift 2 ;;
        --follow) follow=1; shift ;;
        --compat) compat=1; shift ;;
        --print) print_only=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown argument: $1 (try --help)" ;;
    esac
done
[[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || die "--name must be [A-Za-z0-9_.-]+ (got '$name')"
[[ "$tag" =~ ^[A-Za-z0-9_.-]+$ ]] || die "--tag must be [A-Za-z0-9_.-]+ (got '$tag')"
[[ "$mountopts" != *[[:space:]]* ]] || die "--mountopts may not contain spaces"
[[ "$timeout_s" =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"
[[ -z "$rt_prio" || "$rt_prio" =~ ^[1-9][0-9]?$ ]] || die "--realtime-priority must be 1..99 (got '$rt_prio')"

# QEMU size (N with a K/M/G/T suffix, any case) -> MiB, integer arithmetic; fails
# for anything else or for a size that is not a whole number of MiB.
size_mib() {
    local n u
    [[ "$1" =~ ^([0-9]+)([KkMmGgTt])$ ]] || return 1
    n=$((10#${BASH_REMATCH[1]})) u="${BASH_REMATCH[2]^^}"
    case "$u" in
        K) ((n % 1024 == 0)) || return 1; echo $((n / 1024)) ;;
        M) echo "$n" ;;
        G) echo $((n * 1024)) ;;
        T) echo $((n * 1024 * 1024)) ;;
    esac
}
cxl_backing=""
if [[ -n "$cxl_mem" ]]; then
    cxl_mib="$(size_mib "$cxl_mem")" || cxl_mib=0
    ((cxl_mib > 0)) || die "--cxl-memory must be a size like 64M or 2G, a whole number of MiB (got '$cxl_mem')"
    mem_mib="$(size_mib "$mem")" \
        || die "--mem must be a size like 1G or 1024M (with a unit) when --cxl-memory is used (got '$mem')"
    [[ "$smp" =~ ^[1-9][0-9]*$ ]] || die "--smp must be a plain vCPU count when --cxl-memory is used (got '$smp')"
    if [[ -n "$cxl_fd" && -z "$cxl_path" ]]; then
        [[ "$cxl_fd" =~ ^[0-9]+$ ]] || die "--cxl-memory-fd must be a file descriptor number (got '$cxl_fd')"
        cxl_fd=$((10#$cxl_fd))
        ((cxl_fd > 2)) || die "--cxl-memory-fd $cxl_fd: 0, 1 and 2 are stdin, stdout and stderr"
        cxl_backing="/proc/self/fd/$cxl_fd"
    elif [[ -n "$cxl_path" && -z "$cxl_fd" ]]; then
        cxl_backing="$cxl_path"
    else
        die "--cxl-memory needs exactly one of --cxl-memory-fd N and --cxl-memory-path FILE"
    fi
elif [[ -n "$cxl_fd$cxl_path$cxl_abits" ]]; then
    die "--cxl-memory-fd / --cxl-memory-path / --cxl-abits need --cxl-memory SIZE"
fi
[[ -z "$dax_abits" || -n "$cache_size" ]] || die "--dax-abits needs --cache-size"
[[ -n "$serial" ]] || serial="${TMPDIR:-/tmp}/cxlfs-$name.serial.log"
command -v "$qemu" >/dev/null 2>&1 || die "QEMU binary '$qemu' not found (apt-get install qemu-system-x86, or set QEMU=)"
command -v base64 >/dev/null 2>&1 || die "base64 not found (coreutils)"

if [[ -z "$image" ]]; then
    image="$("$here/build-guest-image.sh" | tail -n1)" || die "building the guest image failed"
fi
[[ -f "$image/vmlinuz" && -f "$image/initramfs.cpio.gz" ]] \
    || die "$image has no vmlinuz + initramfs.cpio.gz (run qemu-configs/build-guest-image.sh)"
kernel="$image/vmlinuz" initrd="$image/initramfs.cpio.gz"
if ((compat == 0)); then
    [[ -f "$image/vmlinux" ]] && kernel="$image/vmlinux"
    [[ -f "$image/initramfs.cpio.lz4" ]] && initrd="$image/initramfs.cpio.lz4"
fi

# ------------------------------------------------------------ KVM or TCG
kvm_usable() {
    [[ -c /dev/kvm && -r /dev/kvm && -w /dev/kvm ]] || return 1
    local id verdict_file probe_log probe_to
    id="$( { uname -r; command -v "$qemu"; "$qemu" --version | head -n1; sha256sum <"$image/vmlinuz"; } \
        | sha256sum | cut -c1-16)"
    verdict_file="$cache_root/kvm-verdict-$id"
    if [[ -f "$verdict_file" ]]; then
        [[ "$(cat "$verdict_file")" == yes ]]
        return
    fi
    mkdir -p "$cache_root"
    probe_log="$(mktemp)"
    probe_to="${CXLFS_KVM_PROBE_TIMEOUT:-30}"
    log "probing whether KVM can boot a guest here (once; up to ${probe_to}s)"
    # (a subshell, so that bash's "Aborted" notice of a crashing QEMU stays quiet)
    (timeout -k 5 "$probe_to" "$qemu" -accel kvm -cpu host -machine q35 -m 512M -smp 1 \
        -nodefaults -display none -monitor none -serial "file:$probe_log" -no-reboot \
        -kernel "$kernel" -initrd "$initrd" \
        -append "console=ttyS0 panic=-1 quiet cxlfs.tag=none cxlfs.vm=kvmprobe cxlfs.cmd_b64=$(printf true | base64 -w0)" \
        </dev/null >/dev/null 2>&1) 2>/dev/null || true
    if grep -aq 'CXLFS-EXIT=0' "$probe_log"; then
        echo yes >"$verdict_file"
        log "KVM works: using -accel kvm"
    else
        echo no >"$verdict_file"
        log "KVM cannot boot a guest here: using TCG (verdict cached in $verdict_file)"
    fi
    rm -f "$probe_log"
    [[ "$(cat "$verdict_file")" == yes ]]
}
case "$accel" in
    auto) if kvm_usable; then accel=kvm; else accel=tcg; fi ;;
    kvm | tcg) ;;
    *) die "--accel must be auto, kvm or tcg" ;;
esac
[[ "$tcg_thread" =~ ^(auto|single|multi)$ ]] || die "--tcg-thread must be auto, single or multi (got '$tcg_thread')"
accel_desc="$accel"
if [[ "$accel" == kvm ]]; then
    accel_args=(-accel kvm -cpu "${cpu:-host}")
else
    if [[ "$tcg_thread" == auto ]]; then
        # The image builder writes the kernel's package and version.
        if grep -q '^kernel_package=.*~bpo' "$image/manifest.txt" 2>/dev/null; then
            tcg_thread=single
        else
            tcg_thread=multi
        fi
    fi
    accel_args=(-accel "tcg,thread=$tcg_thread" -cpu "${cpu:-qemu64}")
    accel_desc="tcg (thread=$tcg_thread)"
fi

# One vCPU under TCG still gets maxcpus=2. QEMU translates a guest's memory
# barriers (mfence, lock-prefixed ops) into host barriers only when more than
# one vCPU may exist; with maxcpus=1 they vanish, and the virtqueue handshake
# with the vhost-user back-end (another process on another host CPU: the guest
# stores avail.idx, then reads avail_event) can reorder on the host and lose
# a kick. Seen as a guest umount stuck in virtio_fs_drain_queue with FORGETs
# on the avail ring that the daemon was never told about (DESIGN.md).
smp_arg="$smp" max_cpus="$smp"
if [[ "$accel" == tcg && "$smp" == 1 ]]; then
    smp_arg="1,maxcpus=2" max_cpus=2
fi

# ---------------------------------------------------------- command line
# no_timer_check: a TCG guest booting beside many others on a loaded host
# can miss the kernel's IO-APIC timer check and panic ("IO-APIC + timer
# doesn't work!"; one of 16 guests booting at once here).
kargs="console=ttyS0 panic=-1 quiet mitigations=off no_timer_check cxlfs.vm=$name"
# A TCG guest boots with tsc=reliable. Under TCG every vCPU's TSC is the
# host's tick counter plus one offset, so they cannot drift apart; but the
# kernel on qemu64 (an AMD model without constant_tsc) checks them against
# each other, can fail that check under emulation ("Marking TSC unstable
# due to TSCs unsynchronized") and then times with the HPET: every
# clock_gettime becomes an emulated MMIO read of about 2.3 us, and a timed
# load of memory costs 2-3 us instead of hundreds of ns (DESIGN.md, "One
# clock for TCG guests"). One vCPU counts too: maxcpus=2 (above) makes two
# possible CPUs.
[[ "$accel" == tcg ]] && kargs+=" tsc=reliable"
if [[ -n "$socket" ]]; then kargs+=" cxlfs.tag=$tag"; else kargs+=" cxlfs.tag=none"; fi
[[ -n "$mountopts" ]] && kargs+=" cxlfs.mountopts=$mountopts"
((have_cmd)) && kargs+=" cxlfs.cmd_b64=$(printf '%s\n' "$cmd" | base64 -w0)"
[[ -n "$append" ]] && kargs+=" $append"
((${#kargs} < 2048)) || die "kernel command line is ${#kargs} bytes (limit 2047): put the command in the share as .cxlfs/run.sh"

machine=q35
if [[ -z "$cxl_mem" ]]; then
    mem_args=(-m "$mem" -object "memory-backend-memfd,id=mem,size=$mem,share=on" -numa "node,memdev=mem")
else
    # Memory mode: node 0 = the RAM and every vCPU; node 1 = the CXL-SSD region,
    # no vCPUs, distance 50 (QEMU fills in 1->0 = 50 and the local 10s). -m must
    # be the sum of the nodes. Commas in mem-path are doubled (QEMU's escaping).
    # The HMAT says what each node costs from node 0's CPUs (node 1's initiator);
    # a kernel with memory tiering derives the tiers from it.
    dram_lat="${CXLFS_DRAM_LATENCY_NS:-100}" dram_bw="${CXLFS_DRAM_BANDWIDTH:-20G}"
    for v in "$dram_lat" "$cxl_lat"; do
        [[ "$v" =~ ^[1-9][0-9]*$ ]] || die "HMAT latencies are whole nanoseconds (got '$v')"
    done
    for v in "$dram_bw" "$cxl_bw"; do
        [[ "$v" =~ ^[1-9][0-9]*[KMGT]?$ ]] || die "HMAT bandwidths are bytes/s like 8G (got '$v')"
    done
    lb="hmat-lb,initiator=0,hierarchy=memory"
    cxl_obj="memory-backend-file,id=cxlmem,mem-path=${cxl_backing//,/,,},size=$cxl_mem,share=on"
    [[ -z "$cxl_abits" ]] || cxl_obj+=",x-cxlfs-abits=${cxl_abits//,/,,}"
    mem_args=(-m "$((mem_mib + cxl_mib))M"
        -object "memory-backend-memfd,id=mem,size=$mem,share=on"
        -numa "node,nodeid=0,cpus=0-$((max_cpus - 1)),memdev=mem"
        -object "$cxl_obj"
        -numa "node,nodeid=1,memdev=cxlmem,initiator=0"
        -numa "dist,src=0,dst=1,val=50"
        -numa "$lb,target=0,data-type=access-latency,latency=$dram_lat"
        -numa "$lb,target=0,data-type=access-bandwidth,bandwidth=$dram_bw"
        -numa "$lb,target=1,data-type=access-latency,latency=$cxl_lat"
        -numa "$lb,target=1,data-type=access-bandwidth,bandwidth=$cxl_bw")
    machine="q35,hmat=on"
    # All of node 1 above 4 GiB (when node 0 fits below): the guest kernel's
    # low-memory allocations (swiotlb, DMA32, the initrd QEMU loads at the
    # top of low RAM) then stay on node 0, as on a host whose CXL memory sits
    # above its DRAM. Without this a 2 GiB node took ~78 k traps at boot.
    if ((mem_mib <= 2048)); then
        machine="$machine,max-ram-below-4g=${mem_mib}M"
    fi
fi
# debug-threads: the vCPU threads are named "CPU N/TCG" or "CPU N/KVM" (what
# --realtime-priority looks for, and what perf and ftrace then show).
args=("$qemu" -name "$name,debug-threads=on" -machine "$machine" "${accel_args[@]}" -smp "$smp_arg" "${mem_args[@]}"
    -kernel "$kernel" -initrd "$initrd" -append "$kargs"
    -nodefaults -nographic -monitor none -serial "file:$serial" -no-reboot)
# A QMP socket beside the vhost-user socket (NAME.qmp; not in a results
# folder): what a stuck guest's virtqueues hold (x-query-virtio-queue-element
# shows avail.idx and used.idx) is read there. Not
# x-query-virtio-vhost-queue-status: it sends GET_VRING_BASE, which stops the
# back-end's rings. QEMU removes the socket when it exits.
if [[ -n "$socket" ]]; then
    qmp="$(dirname "$socket")/$name.qmp"
    if ((${#qmp} < 100)) && [[ ! -e "$qmp" ]]; then
        args+=(-qmp "unix:$qmp,server=on,wait=off")
    fi
fi
if [[ -n "$socket" ]]; then
    fs_dev="vhost-user-fs-pci,chardev=char0,tag=$tag,queue-size=1024"
    [[ -z "$cache_size" ]] || fs_dev+=",cache-size=$cache_size"
    [[ -z "$dax_abits" ]] || fs_dev+=",abits=${dax_abits//,/,,}"
    args+=(-chardev "socket,id=char0,path=$socket" -device "$fs_dev")
fi
args+=("${extra[@]}")

if ((print_only)); then
    printf '%s\n' "${args[@]}"
    exit 0
fi

if [[ -n "$cxl_fd" ]]; then
    # (/proc/self is this bash: [[ ]] forks nothing.) QEMU inherits the fd through
    # timeout; it reopens the file by /proc/self/fd/N, so the fd's mode does not matter.
    [[ -e "/proc/self/fd/$cxl_fd" ]] \
        || die "--cxl-memory-fd $cxl_fd is not an open file descriptor here (open it in the caller, e.g. exec $cxl_fd<>FILE)"
    [[ -f "/proc/self/fd/$cxl_fd" ]] \
        || die "--cxl-memory-fd $cxl_fd is not a regular file ($(readlink "/proc/self/fd/$cxl_fd" || true))"
fi

if [[ -n "$socket" ]]; then
    for ((i = 0; i < socket_wait * 10; i++)); do
        [[ -S "$socket" ]] && break
        sleep 0.1
    done
    [[ -S "$socket" ]] || die "no vhost-user socket at $socket after ${socket_wait}s (is the daemon running?)"
fi

if [[ -n "$rt_prio" ]]; then
    chrt -f "$rt_prio" true 2>/dev/null \
        || die "--realtime-priority $rt_prio: cannot run under SCHED_FIFO here (needs root or CAP_SYS_NICE)"
fi

# The vCPU threads of the QEMU this shell (pid $1) starts through timeout,
# under SCHED_FIFO at $2, once all $3 of them exist (at most 60 s). Run in
# the background beside QEMU; on failure it says why and stops the guest.
vcpus_realtime() {
    local shell="$1" prio="$2" want="$3" tmo="" qemu_pid="" t comm tids=()
    local deadline=$((SECONDS + 60))
    while ((SECONDS < deadline)); do
        sleep 0.05
        [[ -n "$tmo" ]] || tmo="$(pgrep -P "$shell" -x timeout | head -n1)" || true
        [[ -n "$tmo" ]] || continue
        [[ -n "$qemu_pid" ]] || qemu_pid="$(pgrep -P "$tmo" | head -n1)" || true
        [[ -n "$qemu_pid" ]] || continue
        tids=()
        for t in /proc/"$qemu_pid"/task/*; do
            comm="$(cat "$t/comm" 2>/dev/null)" || continue
            [[ "$comm" =~ ^CPU\ [0-9]+/(TCG|KVM)$ ]] && tids+=("${t##*/}")
        done
        ((${#tids[@]} >= want)) || continue
        for t in "${tids[@]}"; do
            if ! chrt -f -p "$prio" "$t" >/dev/null; then
                log "$name: cannot put vCPU thread $t under SCHED_FIFO $prio; stopping the guest"
                kill "$tmo"
                return 1
            fi
        done
        log "$name: ${#tids[@]} vCPU thread(s) under SCHED_FIFO $prio"
        return 0
    done
    log "$name: found ${#tids[@]} of $want vCPU thread(s) in 60 s for SCHED_FIFO $prio; stopping the guest"
    [[ -z "$tmo" ]] || kill "$tmo"
    return 1
}

mkdir -p "$(dirname "$serial")"
: >"$serial"
follower=""
if ((follow)); then
    tail -n +1 -f "$serial" >&2 &
    follower=$!
fi
log "$name: $accel_desc, $smp vCPU, $mem${cxl_mem:+ + CXL node 1 $cxl_mem ($cxl_backing)}, serial $serial${socket:+, socket $socket}"
start=$(date +%s.%N)
rt_helper=""
if [[ -n "$rt_prio" ]]; then
    rt_want="${smp%%,*}"
    [[ "$rt_want" =~ ^[1-9][0-9]*$ ]] || rt_want=1
    vcpus_realtime "$$" "$rt_prio" "$rt_want" &
    rt_helper=$!
fi
set +e
timeout -k 10 "$timeout_s" "${args[@]}" </dev/null
qrc=$?
set -e
if [[ -n "$rt_helper" ]]; then
    kill "$rt_helper" 2>/dev/null || true
    wait "$rt_helper" 2>/dev/null || true
fi
end=$(date +%s.%N)
if [[ -n "$follower" ]]; then
    sleep 0.2
    kill "$follower" 2>/dev/null || true
    wait "$follower" 2>/dev/null || true
fi
elapsed="$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')"

exit_line="$(grep -a 'CXLFS-EXIT=' "$serial" | tail -n1 | tr -d '\r' || true)"
if [[ "$exit_line" =~ CXLFS-EXIT=([0-9]+) ]]; then
    code="${BASH_REMATCH[1]}"
    log "$name: guest exit $code after ${elapsed}s"
    exit "$code"
fi
if ((qrc == 124 || qrc == 137)); then
    log "$name: timed out after ${timeout_s}s (serial log: $serial)"
    exit 124
fi
log "$name: QEMU exited $qrc after ${elapsed}s without a CXLFS-EXIT line (serial log: $serial)"
tail -n 20 "$serial" | tr -d '\r' >&2 || true
exit 125
