#!/usr/bin/env bash
# A single-node Slurm on this machine, for the cluster integration test
# (tests/integration/test_slurm_cluster.py, docs/cluster-slurm-test.md):
#
#   sudo scripts/slurm_local.sh start    # install (Debian: slurm-wlm, munge), configure, start
#   sudo scripts/slurm_local.sh status   # sinfo + squeue
#   sudo scripts/slurm_local.sh stop     # stop the daemons it started
#
# One node (this host, its CPUs), one partition "debug", no cgroups and no accounting
# database (squeue and scontrol keep finished jobs for an hour instead). The node declares
# two GPUs (stand-in device files): a job may ask for them, so a multi-GPU run's
# torchrun launch is exercised, but CUDA stays whatever the machine has (none on a CPU box).
# It writes /etc/slurm/slurm.conf only when there is none or it wrote the one there.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# written by ropelab scripts/slurm_local.sh"
STATE=${SLURM_LOCAL_STATE:-/var/lib/ropelab-slurm}
NODE=$(hostname -s)

install() {
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    fi
}

configure() {
    if [[ -f $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
        echo "error: $CONF exists and was not written by this script; not touching a real cluster's config" >&2
        exit 2
    fi
    local cpus mem
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))  # MB; half, other work runs here too
    mkdir -p "$STATE"/{ctld,d,log} /etc/slurm
    cat >"$CONF" <<EOF
$MARK
ClusterName=local
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=3600
KillWait=30
JobRequeue=1
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    # Slurm counts a GPU only with a device file: two stand-ins with /dev/null's numbers.
    for i in 0 1; do [[ -e $STATE/gpu$i ]] || mknod "$STATE/gpu$i" c 1 3; done
    echo "NodeName=$NODE Name=gpu File=$STATE/gpu[0-1]" >/etc/slurm/gres.conf
}

start() {
    install
    configure
    if ! pgrep -x munged >/dev/null; then
        mkdir -p /run/munge && chown munge:munge /run/munge
        runuser -u munge -- munged
    fi
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    for _ in $(seq 30); do  # the node registers within seconds
        if sinfo -h -N -o %T 2>/dev/null | grep -q drain; then  # left so by an earlier failed start
            scontrol update NodeName="$NODE" State=RESUME || true
        fi
        if sinfo -h -N -o %T 2>/dev/null | grep -qx idle; then
            sinfo
            return 0
        fi
        sleep 1
    done
    echo "error: the node did not come up; see $STATE/log/" >&2
    exit 1
}

stop_daemon() {  # by the pid file the daemon wrote, never by name
    local pidfile=$1
    [[ -f $pidfile ]] || return 0
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 20); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.5
    done
}

stop() {
    scancel --user=root 2>/dev/null || true
    stop_daemon "$STATE/slurmd.pid"
    stop_daemon "$STATE/slurmctld.pid"
    stop_daemon /run/munge/munged.pid
    echo "slurm stopped"
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) sinfo && squeue ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
