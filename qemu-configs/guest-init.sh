#!/bin/sh
# cxlfs guest init: packed as /init in the initramfs by build-guest-image.sh.
#
# Kernel command line (read from /proc/cmdline; dotted names never reach init's
# environment):
#   cxlfs.tag=TAG          virtio-fs tag to mount at /mnt (default: cxlfs;
#                          "none" skips the mount)
#   cxlfs.mountopts=OPTS   mount -o options, e.g. dax=always (default: none)
#   cxlfs.vm=NAME          VM name, used for the exit file (default: guest)
#   cxlfs.cmd_b64=B64      base64 of a shell command to run (sh -c)
#   cxlfs.shell=1          no command found: start a shell on the console
#                          instead of powering off
# Without cxlfs.cmd_b64 the script /mnt/.cxlfs/run.sh runs if the share has one.
# With neither, the guest just boots, reports and powers off (plain boot test).
#
# Machine-readable console lines (each on its own line):
#   CXLFS-CXL-NODE=<n> size_kib=<k>   (one per CPU-less NUMA node with memory,
#                                      e.g. run-vm.sh --cxl-memory; before the others)
#   CXLFS-MOUNT=ok|none|fail   CXLFS-RUN=cmdline|share|none   CXLFS-EXIT=<code>
# /run/cxlfs/cxl-nodes holds the numbers of those nodes on one line, space
# separated, ascending; with no such node the file does not exist.
# The exit code also goes to /mnt/.cxlfs/exit-<vm> when the share is mounted.
# Exit codes made up by init itself: 250 = the share is there but will not mount,
# 251 = cxlfs.cmd_b64 does not decode.

PATH=/bin:/sbin:/usr/bin:/usr/sbin
export PATH

/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /tmp /mnt /run
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
exec </dev/console >/dev/console 2>&1

say() { echo "$*"; }

# Loopback up: servers in the guest (redis-server, ...) and their clients talk over it.
ifconfig lo 127.0.0.1 up 2>/dev/null || ip link set lo up 2>/dev/null

# Loopback: servers and their clients in one guest (redis-server and
# redis-benchmark) talk over 127.0.0.1.
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up 2>/dev/null

# CPU-less NUMA nodes with memory: the emulated CXL-SSD memory (memory mode).
cxl_nodes=
for n in $(for d in /sys/devices/system/node/node[0-9]*; do echo "${d##*/node}"; done | sort -n); do
    d=/sys/devices/system/node/node$n
    [ -d "$d" ] || continue
    [ -z "$(cat "$d/cpulist" 2>/dev/null)" ] || continue
    kib=$(awk '$3 == "MemTotal:" {print $4; exit}' "$d/meminfo" 2>/dev/null)
    [ "${kib:-0}" -gt 0 ] 2>/dev/null || continue
    say "CXLFS-CXL-NODE=$n size_kib=$kib"
    cxl_nodes="$cxl_nodes${cxl_nodes:+ }$n"
done
if [ -n "$cxl_nodes" ]; then
    mkdir -p /run/cxlfs
    echo "$cxl_nodes" >/run/cxlfs/cxl-nodes
fi
# Memory tiers (Linux 6.1+; with an HMAT, 6.7+ puts a slower node in a
# lower tier): CXLFS-MEMORY-TIERS=<tier>:<nodelist>;... in tier order
# (a larger number is a slower tier), also in /run/cxlfs/memory-tiers.
tiers=
for t in $(ls -d /sys/devices/virtual/memory_tiering/memory_tier* 2>/dev/null | sed 's/.*memory_tier//' | sort -n); do
    nodes=$(cat "/sys/devices/virtual/memory_tiering/memory_tier$t/nodelist" 2>/dev/null)
    [ -n "$nodes" ] && tiers="$tiers${tiers:+;}$t:$nodes"
done
if [ -n "$cxl_nodes" ] && [ -n "$tiers" ]; then
    say "CXLFS-MEMORY-TIERS=$tiers"
    echo "$tiers" >/run/cxlfs/memory-tiers
fi

tag=cxlfs
mountopts=
vm=guest
cmd_b64=
want_shell=0
set -f
# shellcheck disable=SC2013 # the command line is words, not lines
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        cxlfs.tag=*) tag="${arg#cxlfs.tag=}" ;;
        cxlfs.mountopts=*) mountopts="${arg#cxlfs.mountopts=}" ;;
        cxlfs.vm=*) vm="${arg#cxlfs.vm=}" ;;
        cxlfs.cmd_b64=*) cmd_b64="${arg#cxlfs.cmd_b64=}" ;;
        cxlfs.shell=1) want_shell=1 ;;
    esac
done
set +f
hostname "$vm" 2>/dev/null

# Modules, in dependency order (written by build-guest-image.sh).
if [ -f /etc/cxlfs/modules ]; then
    while read -r ko; do
        [ -n "$ko" ] || continue
        insmod "$ko" || say "cxlfs-init: insmod $ko failed"
    done </etc/cxlfs/modules
fi

# Is there a virtio-fs device (virtio id 26 = 0x001a)?
have_fs=0
for d in /sys/bus/virtio/devices/*; do
    [ -f "$d/device" ] || continue
    [ "$(cat "$d/device")" = "0x001a" ] && have_fs=1
done

status=0
mounted=0
if [ "$tag" = none ] || [ "$have_fs" = 0 ]; then
    say "CXLFS-MOUNT=none"
else
    if mount -t virtiofs ${mountopts:+-o "$mountopts"} "$tag" /mnt; then
        mounted=1
        say "CXLFS-MOUNT=ok"
    else
        say "CXLFS-MOUNT=fail"
        status=250
    fi
fi

CXLFS_VM="$vm"
CXLFS_MNT=/mnt
HOME=/tmp
export CXLFS_VM CXLFS_MNT HOME

run_from=none
if [ "$status" = 0 ]; then
    if [ -n "$cmd_b64" ]; then
        if echo "$cmd_b64" | base64 -d >/tmp/cxlfs-cmd.sh 2>/dev/null; then
            run_from=cmdline
        else
            say "cxlfs-init: cxlfs.cmd_b64 does not decode"
            status=251
        fi
    elif [ "$mounted" = 1 ] && [ -f /mnt/.cxlfs/run.sh ]; then
        cp /mnt/.cxlfs/run.sh /tmp/cxlfs-cmd.sh
        run_from=share
    fi
fi
say "CXLFS-RUN=$run_from"

if [ "$run_from" != none ]; then
    if [ "$mounted" = 1 ]; then cd /mnt || cd /; else cd /; fi
    sh /tmp/cxlfs-cmd.sh
    status=$?
    cd / || true
elif [ "$want_shell" = 1 ] && [ "$status" = 0 ]; then
    say "cxlfs-init: no command; starting a shell (exit it to power off)"
    setsid cttyhack sh
fi

sync
# Exit file first, console line second: the console line is what the host waits
# for, so the file is complete by the time the host sees it.
if [ "$mounted" = 1 ]; then
    mkdir -p /mnt/.cxlfs && echo "$status" >"/mnt/.cxlfs/exit-$vm"
    sync
    # A umount that does not return is a daemon that stopped answering: after
    # 60 s put the blocked tasks' stacks on the console, so the host sees where.
    # (The mount leaves /proc/mounts before the superblock is shut down, so
    # a marker file says when umount has returned.)
    (
        sleep 60
        if [ ! -e /tmp/cxlfs-umounted ]; then
            dmesg -n 8 2>/dev/null
            say "cxlfs-init: umount /mnt blocked for 60 s; blocked tasks follow"
            echo w >/proc/sysrq-trigger
        fi
    ) &
    umount /mnt || umount -l /mnt
    : >/tmp/cxlfs-umounted
fi
say "CXLFS-EXIT=$status"
poweroff -f
# Still here: make the kernel stop the machine (panic=-1 with -no-reboot).
echo o >/proc/sysrq-trigger
exit "$status"
