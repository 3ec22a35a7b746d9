#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests (tests/slurm/) and for trying
# job scripts by hand: munged, slurmctld and slurmd started as plain processes (no
# systemd), with their configuration, state and logs in one folder.
#
#   bash scripts/slurm-cluster.sh start [DIR]   install slurm-wlm and munge when missing
#                                               (apt, as root), write DIR/slurm.conf and
#                                               start the daemons; prints the SLURM_CONF line
#   bash scripts/slurm-cluster.sh status [DIR]  sinfo, or why not
#   bash scripts/slurm-cluster.sh stop [DIR]    stop the daemons this script started, by
#                                               the PIDs in their own PID files
#
# DIR defaults to $DISTSEG_SLURM_DIR, else /tmp/distseg-slurm. Then, in a shell:
#   export SLURM_CONF=DIR/slurm.conf; sbatch ...
# One partition, "generic", the default one: distseg-jobs --partition generic writes no
# #SBATCH --partition line, so its jobs land there. Needs root (the daemons and munge's
# key); docs/cluster.md#a-real-slurm-in-the-tests.
set -euo pipefail

cmd=${1:-}
DIR=${2:-${DISTSEG_SLURM_DIR:-/tmp/distseg-slurm}}
CONF=$DIR/slurm.conf
CPUS=${DISTSEG_SLURM_CPUS:-$(nproc)}
HOST=$(hostname -s)

die() { echo "error: $*" >&2; exit 1; }

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 || missing+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || missing+=(munge)
  [ "${#missing[@]}" = 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "${missing[*]} not installed and not root: apt-get install ${missing[*]}"
  echo "installing ${missing[*]} (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >"$DIR/apt.log" 2>&1 \
    || { apt-get update -q >>"$DIR/apt.log" 2>&1 &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>"$DIR/apt.log" 2>&1; } \
    || die "apt-get install ${missing[*]} failed; see $DIR/apt.log"
}

write_conf() {
  # A whole node of $CPUS CPUs, one core each; linuxproc tracks a job's processes by
  # parentage and task/none binds nothing (no cgroups in a container).
  cat >"$CONF" <<EOF
# Written by scripts/slurm-cluster.sh: a one-node test cluster.
ClusterName=distseg-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${DISTSEG_SLURM_PORT:-6817}
SlurmdPort=$(( ${DISTSEG_SLURM_PORT:-6817} + 1 ))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.sock
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
KillWait=10
InactiveLimit=0
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=generic Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
}

running() {  # running NAME: the daemon whose PID file is DIR/NAME.pid is alive
  local f=$DIR/$1.pid
  [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

start_munge() {
  running munged && return 0
  mkdir -p "$DIR/munge"
  if [ ! -s "$DIR/munge/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chown -R munge:munge "$DIR/munge"
  chmod 700 "$DIR/munge"
  chmod 400 "$DIR/munge/munge.key"
  # --force: the folder sits under /tmp (world-writable, sticky), which munged would
  # otherwise refuse.
  runuser -u munge -- munged --force --socket="$DIR/munge/munge.sock" \
    --key-file="$DIR/munge/munge.key" --log-file="$DIR/munge/munged.log" \
    --pid-file="$DIR/munge/munged.pid" --seed-file="$DIR/munge/munged.seed" \
    || die "munged did not start; see $DIR/munge/munged.log"
  cp "$DIR/munge/munged.pid" "$DIR/munged.pid"
}

wait_for_node() {
  for _ in $(seq 1 60); do
    if sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
      return 0
    fi
    sleep 0.5
  done
  sinfo 2>&1 || true
  die "the node did not come up in 30 s; see $DIR/slurmctld.log and $DIR/slurmd.log"
}

start() {
  [ "$(id -u)" = 0 ] || die "the test cluster runs its daemons as root; run as root"
  mkdir -p "$DIR/state" "$DIR/spool"
  chmod 755 "$DIR"  # munged (user munge) reaches its folder inside it
  install_packages
  write_conf
  export SLURM_CONF=$CONF
  start_munge
  if ! running slurmctld; then
    # -c: a clean start, no jobs or node state from an earlier run of the same folder.
    slurmctld -c -f "$CONF" || die "slurmctld did not start; see $DIR/slurmctld.log"
  fi
  if ! running slurmd; then
    slurmd -f "$CONF" || die "slurmd did not start; see $DIR/slurmd.log"
  fi
  wait_for_node
  echo "export SLURM_CONF=$CONF"
}

stop_one() {  # stop_one NAME: TERM, then KILL after 10 s, by the PID in DIR/NAME.pid
  local f=$DIR/$1.pid pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

stop() {
  export SLURM_CONF=$CONF
  if running slurmctld && command -v scancel >/dev/null 2>&1; then
    scancel --full --quiet --user "$(id -un)" 2>/dev/null || true  # end jobs left behind
    sleep 1
  fi
  stop_one slurmd
  stop_one slurmctld
  stop_one munged
  rm -f "$DIR/munge/munged.pid"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  status)
    export SLURM_CONF=$CONF
    [ -f "$CONF" ] || die "no cluster in $DIR (bash scripts/slurm-cluster.sh start)"
    sinfo && squeue
    ;;
  *) echo "usage: $0 start|stop|status [DIR]" >&2; exit 2 ;;
esac
