#!/usr/bin/env bash
# A private single-node SLURM for tests and trying sweeps on one machine (run as root).
#
#   slurm/local/slurmctl.sh install              apt-get the daemons if missing (Debian/Ubuntu)
#   slurm/local/slurmctl.sh start [--extra FILE] install if missing, start munged + slurmctld + slurmd
#   slurm/local/slurmctl.sh status               daemons' PIDs and `sinfo`
#   slurm/local/slurmctl.sh stop                 stop the daemons by PID (TERM, then KILL)
#   slurm/local/slurmctl.sh env                  the line to eval in a shell: export SLURM_CONF=...
#
# Everything lives under $WAGMA_SLURM_DIR (default /tmp/wagma-slurm): slurm.conf, a private munge key
# and socket, state, spool, logs, PID files. Clients (sbatch, squeue, scontrol) find this cluster
# through SLURM_CONF=$WAGMA_SLURM_DIR/slurm.conf, so the machine's own /etc/slurm is never touched.
# Ports are free ports picked at start. The node (named as this host) claims $WAGMA_SLURM_CPUS CPUs (default 8)
# whatever the real core count (SlurmdParameters=config_overrides), in partition `local`.
# --extra FILE appends FILE to slurm.conf (the tests declare stand-in partitions of real clusters there,
# made of CLOUD nodes that never run anything, so that `sbatch --test-only` checks scripts for them).
set -euo pipefail

DIR=${WAGMA_SLURM_DIR:-/tmp/wagma-slurm}
CPUS=${WAGMA_SLURM_CPUS:-8}
NODE=$(hostname -s)  # the node is this host: ranks rendezvous at its name (launch.slurm_master)
PACKAGES=(slurmctld slurmd slurm-client munge)

die() { echo "slurmctl: $*" >&2; exit 1; }

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
      && command -v munged >/dev/null; then
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "SLURM is not installed and installing needs root: apt-get install ${PACKAGES[*]}"
  command -v apt-get >/dev/null || die "no apt-get here: install ${PACKAGES[*]} with your package manager"
  echo "slurmctl: installing ${PACKAGES[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
  # the packages enable and start the system-wide daemons where systemd runs; ours are private
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now slurmctld slurmd munge >/dev/null 2>&1 || true
  fi
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
  local ctld_port slurmd_port host
  ctld_port=$(free_port); slurmd_port=$(free_port); host=$(hostname -s)
  cat >"$DIR/slurm.conf" <<EOF
# Written by slurm/local/slurmctl.sh: a private one-node cluster under $DIR.
ClusterName=wagmalocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=20
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# no cgroups in containers: track processes through /proc
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# test pending jobs every few seconds (defaults: 60 s main loop, 30 s backfill): a requeue resumes promptly
SchedulerParameters=sched_interval=5,bf_interval=5
# no database: sacct reports that accounting is disabled; finished jobs are appended to jobcomp.txt
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
MpiDefault=none
ReturnToService=2
# the node claims CPUs=$CPUS whatever the real core count
SlurmdParameters=config_overrides
# an impossible request fails at submission instead of pending forever
EnforcePartLimits=ALL
DependencyParameters=kill_invalid_depend
# finished jobs stay visible to squeue/scontrol for 10 minutes; cancelled steps are killed after 5 s
MinJobAge=600
KillWait=5
InactiveLimit=0
GresTypes=gpu
# stand-in CLOUD nodes (--extra) are never powered up: they only exist for sbatch --test-only
SuspendProgram=/bin/true
ResumeProgram=/bin/false
ResumeTimeout=60
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  if [ -n "${EXTRA:-}" ]; then
    printf '\n# --- appended from %s ---\n' "$EXTRA" >>"$DIR/slurm.conf"
    cat "$EXTRA" >>"$DIR/slurm.conf"
  fi
}

start_munge() {
  # munged runs as `munge`; its socket directory must be 711 (700: "Socket is inaccessible").
  mkdir -p "$DIR/munge"
  [ -f "$DIR/munge/munge.key" ] || dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chown -R munge:munge "$DIR/munge"
  chmod 711 "$DIR/munge"
  chmod 400 "$DIR/munge/munge.key"
  runuser -u munge -- munged --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munge.seed"
  cp "$DIR/munge/munged.pid" "$DIR/run/munged.pid"
}

wait_node() {
  local i
  for i in $(seq 1 150); do
    if SLURM_CONF="$DIR/slurm.conf" sinfo -h -n "$NODE" -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
      return 0
    fi
    sleep 0.2
  done
  echo "slurmctl: node $NODE did not become idle; logs:" >&2
  tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
  return 1
}

start() {
  [ "$(id -u)" = 0 ] || die "start needs root (the daemons run as root under $DIR)"
  install
  if pid_alive "$DIR/run/slurmctld.pid"; then
    echo "slurmctl: already running under $DIR" >&2
    echo "export SLURM_CONF=$DIR/slurm.conf"
    return 0
  fi
  rm -rf "$DIR"
  mkdir -p "$DIR"/{state,spool,run,log}
  chmod 755 "$DIR"
  write_conf
  start_munge
  # SLURM_CONF in the daemons' environment marks their slurmstepd children as this cluster's (see stop)
  SLURM_CONF="$DIR/slurm.conf" slurmctld -f "$DIR/slurm.conf" -i
  SLURM_CONF="$DIR/slurm.conf" slurmd -f "$DIR/slurm.conf" -N "$NODE"
  # slurmd/slurmctld write their PID files after daemonising
  local i
  for i in $(seq 1 50); do
    [ -s "$DIR/run/slurmctld.pid" ] && [ -s "$DIR/run/slurmd.pid" ] && break
    sleep 0.1
  done
  wait_node || { stop; die "start failed"; }
  echo "slurmctl: running under $DIR (partition local, node $NODE, CPUs=$CPUS)" >&2
  echo "export SLURM_CONF=$DIR/slurm.conf"
}

cancel_jobs() {
  # jobs first: a step whose slurmd is gone would hang (its srun and slurmstepd never end)
  local ids i
  ids=$(SLURM_CONF="$DIR/slurm.conf" squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
  [ -n "${ids// }" ] || return 0
  # shellcheck disable=SC2086
  SLURM_CONF="$DIR/slurm.conf" scancel $ids 2>/dev/null || true
  for i in $(seq 1 100); do  # KillWait=5 s, then SIGKILL
    [ -z "$(SLURM_CONF="$DIR/slurm.conf" squeue -h -o %A 2>/dev/null)" ] && return 0
    sleep 0.2
  done
}

kill_stray_steps() {
  # slurmstepd processes of this cluster (SLURM_CONF inherited from our slurmd) and their tasks
  local pid child pgid
  for pid in $(pgrep -x slurmstepd || true); do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_CONF=$DIR/slurm.conf" || continue
    for child in $(pgrep -P "$pid" || true); do
      pgid=$(ps -o pgid= -p "$child" | tr -d ' ')
      if [ -n "$pgid" ] && [ "$pgid" != "$(ps -o pgid= -p $$ | tr -d ' ')" ]; then
        kill -KILL -- "-$pgid" 2>/dev/null || true
      fi
      kill -KILL "$child" 2>/dev/null || true
    done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

stop() {
  local name pid i
  pid_alive "$DIR/run/slurmctld.pid" && cancel_jobs
  for name in slurmd slurmctld munged; do
    [ -f "$DIR/run/$name.pid" ] || continue
    pid=$(cat "$DIR/run/$name.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$DIR/run/$name.pid"
  done
  kill_stray_steps
  echo "slurmctl: stopped (files kept under $DIR)" >&2
}

status() {
  local name rc=0
  for name in munged slurmctld slurmd; do
    if pid_alive "$DIR/run/$name.pid"; then
      echo "$name: running (pid $(cat "$DIR/run/$name.pid"))"
    else
      echo "$name: stopped"; rc=3
    fi
  done
  [ $rc = 0 ] && SLURM_CONF="$DIR/slurm.conf" sinfo
  return $rc
}

cmd=${1:-}
shift || true
EXTRA=
while [ $# -gt 0 ]; do
  case "$1" in
    --extra) EXTRA=$(realpath "$2"); shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
case "$cmd" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$DIR/slurm.conf" ;;
  *) die "usage: $0 install|start [--extra FILE]|stop|status|env" ;;
esac
