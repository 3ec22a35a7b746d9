#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests (tests/slurm/) and for trying
# job scripts by hand: munged, slurmctld and slurmd started as plain processes (no
# systemd), with their configuration, state and logs in one folder.
#
#   bash scripts/slurm-cluster.sh install      install slurm-wlm, munge and lmod when missing
#                                               (apt, as root); nothing else (make test
#                                               runs it before the test tiers that use
#                                               Slurm's commands)
#   bash scripts/slurm-cluster.sh start [DIR] [--nodes N] [--link-rate RATE]
#                                               install slurm-wlm and munge when missing
#                                               (apt, as root), write DIR/slurm.conf and
#                                               start the daemons; prints the SLURM_CONF line
#   bash scripts/slurm-cluster.sh status [DIR]  sinfo, or why not
#   bash scripts/slurm-cluster.sh stop [DIR]    stop the daemons this script started, by
#                                               the PIDs in their own PID files (and remove
#                                               the namespaces of --nodes N)
#
# DIR defaults to $DISTSEG_SLURM_DIR, else /tmp/distseg-slurm. Then, in a shell:
#   export SLURM_CONF=DIR/slurm.conf; sbatch ...
# One partition, "generic", the default one: distseg-jobs --partition generic writes no
# #SBATCH --partition line, so its jobs land there. Needs root (the daemons and munge's
# key); docs/cluster.md#a-real-slurm-in-the-tests.
#
# --nodes N (or DISTSEG_SLURM_NODES=N), N > 1: N slurmd "nodes" on this machine, each in
# a network namespace of its own (a veth to a bridge in this namespace, where slurmctld
# listens), a UTS namespace with the node's name as host name, and a mount namespace in
# which DIR/tmpfs (the TmpFS, where the PMIx plugin puts its client folders) is that
# node's own. The addresses are $DISTSEG_SLURM_NET.1..N/24 (default 10.78.0), the
# controller $DISTSEG_SLURM_NET.254; DISTSEG_SLURM_CPUS is then per node (default
# nproc / N). Debian's slurmd is built without --enable-multiple-slurmd, hence this.
# --link-rate RATE (or DISTSEG_SLURM_LINK_RATE), with --nodes N > 1: each node's link
# sends at most RATE each way (tc's token bucket, e.g. 1gbit or 10gbit); this kernel has
# no netem, so a link's latency cannot be set. The qdiscs go with the veths at stop.
set -euo pipefail

die() { echo "error: $*" >&2; exit 1; }

cmd=${1:-}
[ $# = 0 ] || shift
DIR=""
NODES=${DISTSEG_SLURM_NODES:-1}
RATE=${DISTSEG_SLURM_LINK_RATE:-}
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) [ $# -ge 2 ] || die "--nodes needs a number"; NODES=$2; shift 2 ;;
    --nodes=*) NODES=${1#*=}; shift ;;
    --link-rate) [ $# -ge 2 ] || die "--link-rate needs a rate (e.g. 1gbit)"; RATE=$2; shift 2 ;;
    --link-rate=*) RATE=${1#*=}; shift ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$DIR" ] || die "one DIR only"; DIR=$1; shift ;;
  esac
done
case $NODES in ''|*[!0-9]*|0) die "--nodes: a positive number, not '$NODES'" ;; esac
DIR=${DIR:-${DISTSEG_SLURM_DIR:-/tmp/distseg-slurm}}
CONF=$DIR/slurm.conf
if [ "$NODES" -gt 1 ]; then
  CPUS=${DISTSEG_SLURM_CPUS:-$(( $(nproc) / NODES > 0 ? $(nproc) / NODES : 1 ))}
else
  CPUS=${DISTSEG_SLURM_CPUS:-$(nproc)}
fi
HOST=$(hostname -s)
PORT=${DISTSEG_SLURM_PORT:-6817}
NET=${DISTSEG_SLURM_NET:-10.78.0}
TAG=dss$PORT  # names of the namespaces, links and nodes: short (link names <= 15)

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 || missing+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || missing+=(munge)
  # Lmod's `module`, for the test that installs and submits as a cluster user would
  [ -e /usr/share/lmod/lmod/init/bash ] || missing+=(lmod)
  [ "${#missing[@]}" = 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "${missing[*]} not installed and not root: apt-get install ${missing[*]}"
  echo "installing ${missing[*]} (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >"$DIR/apt.log" 2>&1 \
    || { apt-get update -q >>"$DIR/apt.log" 2>&1 &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>"$DIR/apt.log" 2>&1; } \
    || die "apt-get install ${missing[*]} failed; see $DIR/apt.log"
}

node_names() {  # the names of the N > 1 nodes (also their namespaces and host names)
  local i
  for i in $(seq 1 "$NODES"); do echo "${TAG}n$i"; done
}

write_conf() {
  # Nodes of $CPUS CPUs, one core each; linuxproc tracks a job's processes by parentage
  # and task/none binds nothing (no cgroups in a container). One node: this host on
  # 127.0.0.1. N nodes: slurmctld on the bridge's address, which every namespace
  # reaches; one spool, PID file and log per slurmd (%n: its node name); a TmpFS that
  # each node's mount namespace makes its own, since the PMIx plugin names its client
  # folder there by job and step only (TmpFS/spmix_appdir_UID_JOB.STEP) and two nodes
  # on one file system would remove each other's.
  local what="a one-node test cluster" ctld=127.0.0.1 per="" extra="" nodes="" lines="" name i=0
  if [ "$NODES" = 1 ]; then
    nodes=$HOST
    lines="NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN"
  else
    what="a test cluster of $NODES nodes in network namespaces"
    ctld=$NET.254 per=-%n extra="TmpFS=$DIR/tmpfs"
    for name in $(node_names); do
      i=$(( i + 1 ))
      nodes+=${nodes:+,}$name
      lines+=${lines:+$'\n'}"NodeName=$name NodeAddr=$NET.$i CPUs=$CPUS State=UNKNOWN"
    done
  fi
  cat >"$CONF" <<EOF
# Written by scripts/slurm-cluster.sh: $what.
ClusterName=distseg-test
SlurmctldHost=$HOST($ctld)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$PORT
SlurmdPort=$(( PORT + 1 ))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge-socket/munge.sock
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool$per
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd$per.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd$per.log
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
${extra:+$extra
}$lines
PartitionName=generic Nodes=$nodes Default=YES MaxTime=INFINITE State=UP
EOF
}

make_namespaces() {
  # A bridge here ($NET.254, slurmctld's address) and per node a network namespace
  # joined to it by a veth pair ($NET.i). Recorded in DIR/netns for stop.
  local name i=0
  if ! command -v ip >/dev/null 2>&1 || ! command -v unshare >/dev/null 2>&1 \
     || ! command -v nsenter >/dev/null 2>&1; then
    die "--nodes $NODES needs ip (iproute2), unshare and nsenter (util-linux)"
  fi
  echo "bridge ${TAG}br" >"$DIR/netns"
  if ! ip link show "${TAG}br" >/dev/null 2>&1; then
    ip link add "${TAG}br" type bridge || die "cannot create bridge ${TAG}br"
    ip addr add "$NET.254/24" dev "${TAG}br"
    ip link set "${TAG}br" up
  fi
  for name in $(node_names); do
    i=$(( i + 1 ))
    printf 'netns %s\nlink %s\n' "$name" "${TAG}h$i" >>"$DIR/netns"
    mkdir -p "$DIR/spool-$name" "$DIR/tmp-$name"
    if ! ip netns list | grep -qE "^$name( |\$)"; then
      ip netns add "$name" || die "ip netns add $name failed"
      ip link add "${TAG}h$i" type veth peer name "${TAG}v$i" netns "$name"
      ip link set "${TAG}h$i" master "${TAG}br" up
      ip -n "$name" addr add "$NET.$i/24" dev "${TAG}v$i"
      ip -n "$name" link set "${TAG}v$i" up
      ip -n "$name" link set lo up
    fi
    shape_link "$name" "${TAG}h$i" "${TAG}v$i"
  done
}

shape_link() {  # shape_link NETNS HOST_END NODE_END: both directions at most $RATE
  [ -n "$RATE" ] || return 0
  command -v tc >/dev/null 2>&1 || die "--link-rate needs tc (iproute2)"
  tc qdisc replace dev "$2" root tbf rate "$RATE" burst 256kb latency 50ms \
    || die "tc cannot shape $2 to $RATE"
  ip netns exec "$1" tc qdisc replace dev "$3" root tbf rate "$RATE" burst 256kb latency 50ms \
    || die "tc cannot shape $3 to $RATE"
}

start_node_slurmds() {
  local name
  mkdir -p "$DIR/tmpfs"
  for name in $(node_names); do
    running "slurmd-$name" && continue
    # In the node's namespaces: its network, its host name (slurmd finds its NodeName
    # by it) and DIR/tmpfs bound to DIR/tmp-NAME. slurmd forks into the background and
    # stays in them, and so do the jobs it starts. nsenter, not `ip netns exec`, which
    # mounts a fresh /sys without /sys/fs/cgroup, and slurmd will not start without it.
    # shellcheck disable=SC2016 # expanded by the inner sh
    nsenter --net="/run/netns/$name" unshare --uts --mount --propagation private sh -c \
      'hostname "$1" && mount --bind "$2/tmp-$1" "$2/tmpfs" && exec slurmd -f "$3"' \
      sh "$name" "$DIR" "$CONF" || die "slurmd of $name did not start; see $DIR/slurmd-$name.log"
  done
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
  # The key stays private; the socket's folder is open, so that any account here can
  # submit jobs (tests/slurm/test_cluster_user.py submits as an unprivileged user).
  mkdir -p "$DIR/munge-socket"
  chown -R munge:munge "$DIR/munge" "$DIR/munge-socket"
  chmod 700 "$DIR/munge"
  chmod 755 "$DIR/munge-socket"
  chmod 400 "$DIR/munge/munge.key"
  # --force: the folder sits under /tmp (world-writable, sticky), which munged would
  # otherwise refuse.
  runuser -u munge -- munged --force --socket="$DIR/munge-socket/munge.sock" \
    --key-file="$DIR/munge/munge.key" --log-file="$DIR/munge/munged.log" \
    --pid-file="$DIR/munge/munged.pid" --seed-file="$DIR/munge/munged.seed" \
    || die "munged did not start; see $DIR/munge/munged.log"
  cp "$DIR/munge/munged.pid" "$DIR/munged.pid"
}

wait_for_node() {
  local up
  for _ in $(seq 1 60); do
    up=$(sinfo -h -N -o '%t' 2>/dev/null | grep -cE '^(idle|mix|alloc)' || true)
    if [ "${up:-0}" -ge "$NODES" ]; then
      return 0
    fi
    sleep 0.5
  done
  sinfo 2>&1 || true
  die "the node(s) did not come up in 30 s; see $DIR/slurmctld.log and $DIR/slurmd*.log"
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
  if [ "$NODES" -gt 1 ]; then
    make_namespaces
    start_node_slurmds
  elif ! running slurmd; then
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
  local kind name pid
  if [ -f "$DIR/netns" ]; then
    while read -r kind name; do
      if [ "$kind" = netns ]; then stop_one "slurmd-$name"; fi
    done <"$DIR/netns"
  fi
  stop_one slurmctld
  stop_one munged
  rm -f "$DIR/munge/munged.pid"
  if [ -f "$DIR/netns" ]; then
    # What is left in a node's namespace was started by its slurmd (a job's processes):
    # ended by PID, then the namespace, the veth pair and the bridge go.
    while read -r kind name; do
      case $kind in
        netns)
          for pid in $(ip netns pids "$name" 2>/dev/null || true); do
            kill -9 "$pid" 2>/dev/null || true
          done
          ip netns del "$name" 2>/dev/null || true
          ;;
        link|bridge) ip link del "$name" 2>/dev/null || true ;;
      esac
    done <"$DIR/netns"
    rm -f "$DIR/netns"
  fi
}

case $cmd in
  install) mkdir -p "$DIR"; install_packages ;;
  start) start ;;
  stop) stop ;;
  status)
    export SLURM_CONF=$CONF
    [ -f "$CONF" ] || die "no cluster in $DIR (bash scripts/slurm-cluster.sh start)"
    sinfo && squeue
    ;;
  *) echo "usage: $0 install|start|stop|status [DIR] [--nodes N] [--link-rate RATE]" >&2; exit 2 ;;
esac
