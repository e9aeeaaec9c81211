#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the `slurm` e2e test and for
# trying `cxlfs run --slurm` by hand. Idempotent: does nothing when the node
# already answers idle (or busy with our jobs).
#
# * installs Debian's slurm-wlm and munge with apt-get when missing;
# * writes /etc/slurm/slurm.conf for this machine (unless one not written
#   by this script is there): NodeName = `hostname -s`, CPUs = nproc,
#   RealMemory = MemTotal minus 1 GiB of headroom, one Default partition
#   `debug`, select/cons_tres (cores only, memory not tracked), proctrack/linuxproc and task/none (no cgroup
#   needed), no slurmdbd (accounting_storage/none; finished jobs are kept in
#   slurmctld for MinJobAge = 1 h, where `scontrol show job` reads their
#   state; jobcomp/filetxt keeps a line per finished job);
# * makes a munge key if there is none and starts munged, slurmctld and slurmd
#   directly (no systemd: PID 1 here is not systemd);
# * waits (up to 60 s) until `sinfo` shows the node idle.
#
# Prints the node name on its last line. Logs: /var/log/slurm/.
set -euo pipefail

log() { echo "start-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

node="$(hostname -s)"
conf=/etc/slurm/slurm.conf
marker="# written by cxlfs tests/slurm/start-cluster.sh"

node_state() { sinfo -h -N -n "$node" -o '%T' 2>/dev/null | head -n1 || true; }

if command -v sinfo >/dev/null && [[ "$(node_state)" =~ ^(idle|mixed|allocated) ]]; then
    log "node $node already $(node_state)"
    echo "$node"
    exit 0
fi

[[ $(id -u) == 0 ]] || die "must run as root (it installs packages and starts daemons)"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
    log "installing slurm-wlm and munge (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >&2 \
        || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >&2; } \
        || die "apt-get install slurm-wlm munge failed"
fi

if [[ -e $conf ]] && ! grep -qF "$marker" "$conf"; then
    log "$conf exists and is not ours: using it as it is"
else
    cpus="$(nproc)"
    mem_mib=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
    (( mem_mib > 512 )) || mem_mib=512
    mkdir -p /etc/slurm
    cat >"$conf.tmp" <<CONF
$marker
ClusterName=cxlfs
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
MinJobAge=3600
KillWait=30
ReturnToService=2
MpiDefault=none
NodeName=$node CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
    mv "$conf.tmp" "$conf"
    log "wrote $conf ($node: $cpus CPUs, $mem_mib MiB)"
fi

mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 0755 /run/munge

if [[ ! -s /etc/munge/munge.key ]]; then
    log "making a munge key"
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key

if ! pgrep -x munged >/dev/null; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged
fi
for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
munge -n </dev/null | unmunge >/dev/null || die "munge does not work (see /var/log/munge/munged.log)"

if ! pgrep -x slurmctld >/dev/null; then
    log "starting slurmctld"
    /usr/sbin/slurmctld
fi
if ! pgrep -x slurmd >/dev/null; then
    log "starting slurmd"
    /usr/sbin/slurmd
fi

for _ in $(seq 120); do
    state="$(node_state)"
    case "$state" in
        idle | mixed | allocated) log "node $node is $state"; echo "$node"; exit 0 ;;
        down* | drain* | fail*) scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
done
die "node $node not idle after 60 s (sinfo: '$(node_state)'); see /var/log/slurm/"
