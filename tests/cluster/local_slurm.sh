#!/usr/bin/env bash
# A real single-node SLURM on this machine, from Debian packages, to run the SLURM profile against:
# munge, MariaDB + slurmdbd (accounting, so sacct works), slurmctld and slurmd; one node shaped like
# a typical cluster node (16 CPUs, 90% of this machine's memory; slurmd takes the configured shape,
# so jobs asking for 8 CPUs schedule on a small machine, sharing its real cores), partitions `cpu`
# (default) and `gpu`, and four fake GPUs (a `gpu` GRES backed by /dev/null and other harmless
# device files) so that GPU requests schedule (nothing runs on a GPU). Needs root (packages, daemons).
#
#   tests/cluster/local_slurm.sh start    # install what is missing, start what is not running
#   tests/cluster/local_slurm.sh stop     # stop the daemons it started, by PID
#   tests/cluster/local_slurm.sh env      # the line to export: SLURM_CONF=...
#
# Idempotent: `start` twice starts nothing twice. Everything lives in $GNA_SLURM_DIR
# (default /var/tmp/gna-slurm): configs, PIDs, logs, spool. Clients find it through SLURM_CONF, and
# through /etc/slurm/slurm.conf, a link made by `start` and removed by `stop`: inside a job the
# executor plugin clears every SLURM_* variable before it calls srun. A machine with its own
# /etc/slurm/slurm.conf is refused: it already has a SLURM.
set -euo pipefail

STATE=${GNA_SLURM_DIR:-/var/tmp/gna-slurm}
PACKAGES=(munge mariadb-server slurmdbd slurmctld slurmd slurm-client)
HOST=$(hostname -s)
export SLURM_CONF=$STATE/slurm.conf

say() { echo "local_slurm: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=tests/cluster/apt_install.sh
source "$(dirname "$0")/apt_install.sh"
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local seconds=$1 what=$2
    shift 2
    for _ in $(seq $((seconds * 5))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    die "$what did not come up within ${seconds}s (logs in $STATE)"
}

install_packages() {
    install_missing "$STATE" "${PACKAGES[@]}"
}

write_configs() {
    local cpus mem
    cpus=${GNA_SLURM_CPUS:-16}
    mem=$(($(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) * 9 / 10))
    mkdir -p "$STATE/ctld" "$STATE/spool"
    cat >"$STATE/slurm.conf" <<EOF
# gna local test cluster (tests/cluster/local_slurm.sh)
ClusterName=gna
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
MinJobAge=300
ReturnToService=2
SchedulerType=sched/backfill
NodeName=$HOST CPUs=$cpus RealMemory=$mem Gres=gpu:4 State=UNKNOWN
PartitionName=cpu Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$HOST MaxTime=INFINITE State=UP
EOF
    echo "NodeName=$HOST Name=gpu File=/dev/null,/dev/zero,/dev/full,/dev/urandom" >"$STATE/gres.conf"
    mkdir -p /etc/slurm
    ln -sfn "$STATE/slurm.conf" /etc/slurm/slurm.conf
    cat >"$STATE/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
LogFile=$STATE/slurmdbd.log
PidFile=$STATE/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=gna-local-test
StorageLoc=gna_slurm_acct
EOF
    chmod 600 "$STATE/slurmdbd.conf"
}

start_munge() {
    install -d -o munge -g munge -m 0755 /run/munge
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
        runuser -u munge -- munged
        wait_for 20 munged sh -c 'munge -n | unmunge'
        cp /run/munge/munged.pid "$STATE/munged.pid"  # started here, so stopped here
    fi
}

start_mariadb() {
    if ! mariadb-admin --socket=/run/mysqld/mysqld.sock ping >/dev/null 2>&1; then
        install -d -o mysql -g mysql /run/mysqld
        setsid mariadbd --user=mysql --datadir=/var/lib/mysql --socket=/run/mysqld/mysqld.sock \
            --pid-file=/run/mysqld/gna-mariadb.pid --skip-networking >"$STATE/mariadb.log" 2>&1 </dev/null &
        wait_for 60 MariaDB mariadb-admin --socket=/run/mysqld/mysqld.sock ping
        cp /run/mysqld/gna-mariadb.pid "$STATE/mariadb.pid"
    fi
    mariadb --socket=/run/mysqld/mysqld.sock -e "
        CREATE DATABASE IF NOT EXISTS gna_slurm_acct;
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'gna-local-test';
        GRANT ALL ON gna_slurm_acct.* TO 'slurm'@'localhost';"
}

start_slurm() {
    alive "$STATE/slurmdbd.pid" || { slurmdbd; wait_for 30 slurmdbd alive "$STATE/slurmdbd.pid"; }
    wait_for 30 "slurmdbd (port)" bash -c 'exec 3<>/dev/tcp/127.0.0.1/6819'
    alive "$STATE/slurmctld.pid" || slurmctld
    wait_for 30 slurmctld scontrol ping
    alive "$STATE/slurmd.pid" || slurmd
    wait_for 60 "node $HOST idle" sh -c "sinfo -h -N -o %T | grep -qx idle"
    wait_for 30 "accounting" sacct -n -X --starttime now-1minute
}

ours() { [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$STATE/slurm.conf" ]; }

case "${1:-}" in
start)
    [ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"
    if [ -e /etc/slurm/slurm.conf ] && ! ours; then
        die "/etc/slurm/slurm.conf exists and is not this script's: this machine has a SLURM already; use it"
    fi
    mkdir -p "$STATE"
    install_packages
    write_configs
    start_munge
    start_mariadb
    start_slurm
    say "up: $(sinfo -h -o '%P %a %D %T' | tr '\n' ';') (export SLURM_CONF=$SLURM_CONF)"
    ;;
stop)
    for daemon in slurmd slurmctld slurmdbd mariadb munged; do
        if alive "$STATE/$daemon.pid"; then
            pid=$(cat "$STATE/$daemon.pid")
            kill "$pid"
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$STATE/$daemon.pid"
    done
    if ours; then rm -f /etc/slurm/slurm.conf; fi
    say "stopped"
    ;;
env)
    echo "export SLURM_CONF=$SLURM_CONF"
    ;;
*)
    echo "usage: $0 start|stop|env" >&2
    exit 2
    ;;
esac
