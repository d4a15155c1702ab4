#!/usr/bin/env bash
# Start a real single-node Slurm cluster on this machine (localhost), for the `slurm` tests.
#
#   bash .ci/slurm_setup.sh          # install (if needed), configure, start, wait until the node is idle
#   bash .ci/slurm_setup.sh --stop   # stop the daemons this script started (by their pid files)
#
# Idempotent: a second call with the cluster already up only checks it. Works as root on a fresh
# Debian (bookworm) machine or container with no systemd: the daemons are started directly.
# Debian packages: slurm-wlm (slurmctld + slurmd + slurm-client) and munge.
# The config has no cgroup requirements (proctrack/linuxproc, task/none, no accounting), so it
# also runs inside unprivileged containers. The node line is read from `slurmd -C` at run time
# (this host's real hostname, CPUs, sockets/cores/threads and memory).
set -euo pipefail

SLURM_ETC=/etc/slurm
SLURM_CONF=$SLURM_ETC/slurm.conf
RUN_DIR=/run/slurm
LOG_DIR=/var/log/slurm
PARTITION=${LONGCTX_SLURM_PARTITION:-debug}
WAIT_S=${LONGCTX_SLURM_WAIT_S:-60}

log() { echo "[slurm_setup] $*"; }
die() { echo "[slurm_setup] ERROR: $*" >&2; exit 1; }

alive() {  # the pid file $1 names a live process called $2 (a stale file's pid may have been reused)
  local pid; pid=$(cat "$1" 2>/dev/null) || return 1
  [[ -n $pid && $(cat /proc/"$pid"/comm 2>/dev/null) == "$2" ]]
}

stop_pidfile() {  # stop the process named $2 whose id is in the pid file $1, if it is alive
  local pidfile=$1 name=$2
  if alive "$pidfile" "$name"; then
    local pid; pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$pidfile"
}

if [[ ${1:-} == --stop ]]; then
  stop_pidfile $RUN_DIR/slurmd.pid slurmd
  stop_pidfile $RUN_DIR/slurmctld.pid slurmctld
  stop_pidfile /run/munge/munged.pid munged
  log "stopped"
  exit 0
fi

[[ $(id -u) -eq 0 ]] || die "must run as root (installs Debian packages and starts daemons)"

node_state() {  # state of our node as sinfo prints it ("idle", "mix", "down*", ...) or empty
  timeout 10 sinfo -h -N -n "$(hostname -s)" -o '%t' 2>/dev/null | head -n1 || true
}
node_ready() { [[ $(node_state) =~ ^(idle|mix|alloc|allocated|comp)$ ]]; }

# Never touch a Slurm that this script did not configure (a real cluster's node, say).
MARK="# Written by .ci/slurm_setup.sh"
if [[ -f $SLURM_CONF ]] && ! grep -qF "$MARK" $SLURM_CONF; then
  die "$SLURM_CONF exists and was not written by this script: refusing to replace it"
fi

# --- already up? ----------------------------------------------------------------------------------
if [[ -f $SLURM_CONF ]] && alive $RUN_DIR/slurmctld.pid slurmctld && alive $RUN_DIR/slurmd.pid slurmd && node_ready; then
  log "slurm already up: $(sinfo -h -o '%P %a %D %t' | head -n1)"
  exit 0
fi

# --- packages -------------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sinfo >/dev/null || ! command -v munged >/dev/null; then
  log "installing slurm-wlm and munge from Debian packages"
  # Keep the packages' maintainer scripts from trying to start services (no init system here).
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt_ok=1
  { apt-get update -qq && apt-get install -y -q --no-install-recommends slurm-wlm munge; } \
    >/tmp/slurm_setup_apt.log 2>&1 || apt_ok=0
  if [[ $made_policy -eq 1 ]]; then rm -f /usr/sbin/policy-rc.d; fi
  [[ $apt_ok -eq 1 ]] || { tail -n 30 /tmp/slurm_setup_apt.log; die "apt-get install slurm-wlm munge failed"; }
fi

# --- munge ----------------------------------------------------------------------------------------
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  log "creating munge key"
  if command -v mungekey >/dev/null; then mungekey --create --force --keyfile=/etc/munge/munge.key
  else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key
if ! (munge -n | unmunge) >/dev/null 2>&1; then
  log "starting munged"
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged --force
  for _ in $(seq 50); do (munge -n | unmunge) >/dev/null 2>&1 && break; sleep 0.1; done
  (munge -n | unmunge) >/dev/null 2>&1 || die "munged did not come up (see /var/log/munge/munged.log)"
fi

# --- slurm.conf -----------------------------------------------------------------------------------
HOST=$(hostname -s)
# `slurmd -C` prints this host's real layout: NodeName=<host> CPUs=.. Boards=.. SocketsPerBoard=..
# CoresPerSocket=.. ThreadsPerCore=.. RealMemory=..  Using it verbatim means the node never drains
# for a topology mismatch.
NODE_LINE=$(slurmd -C | head -n1)
[[ $NODE_LINE == NodeName=* ]] || die "unexpected 'slurmd -C' output: $NODE_LINE"
mkdir -p $SLURM_ETC $RUN_DIR $LOG_DIR /var/spool/slurmctld /var/spool/slurmd
NEW_CONF=$(cat <<EOF
${MARK}: a single-node cluster on localhost, no cgroups, no accounting.
ClusterName=longctx
SlurmctldHost=${HOST}(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobContainerType=job_container/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
PropagateResourceLimits=NONE
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=10
MinJobAge=300
${NODE_LINE} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=${PARTITION} Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
)
conf_changed=1
if [[ -f $SLURM_CONF ]] && [[ "$(cat $SLURM_CONF)" == "$NEW_CONF" ]]; then conf_changed=0; fi
if [[ $conf_changed -eq 1 ]]; then
  log "writing $SLURM_CONF ($NODE_LINE)"
  printf '%s\n' "$NEW_CONF" > $SLURM_CONF
fi

# --- daemons --------------------------------------------------------------------------------------
if [[ $conf_changed -eq 1 ]]; then
  stop_pidfile $RUN_DIR/slurmd.pid slurmd
  stop_pidfile $RUN_DIR/slurmctld.pid slurmctld
fi
if ! alive $RUN_DIR/slurmctld.pid slurmctld; then
  log "starting slurmctld"
  # -c: start clean (forget jobs from a previous life of this throwaway cluster)
  /usr/sbin/slurmctld -c || die "slurmctld failed to start; tail of $LOG_DIR/slurmctld.log: $(tail -n 20 $LOG_DIR/slurmctld.log)"
fi
if ! alive $RUN_DIR/slurmd.pid slurmd; then
  log "starting slurmd"
  /usr/sbin/slurmd || die "slurmd failed to start; tail of $LOG_DIR/slurmd.log: $(tail -n 20 $LOG_DIR/slurmd.log)"
fi

# --- wait for the node ----------------------------------------------------------------------------
deadline=$((SECONDS + WAIT_S))
while ! node_ready; do
  state=$(node_state)
  if [[ $state =~ ^(down|drain|drng|fail) ]]; then
    scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true
  fi
  if (( SECONDS > deadline )); then
    echo "--- sinfo"; sinfo -N -l || true
    echo "--- slurmctld.log"; tail -n 30 $LOG_DIR/slurmctld.log || true
    echo "--- slurmd.log"; tail -n 30 $LOG_DIR/slurmd.log || true
    die "node $HOST not idle after ${WAIT_S}s (state: '${state}')"
  fi
  sleep 1
done
log "slurm up: $(sinfo -h -o '%P %a %D %t %c' | head -n1) (partition/avail/nodes/state/cpus)"
