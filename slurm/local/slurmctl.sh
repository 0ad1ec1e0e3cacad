#!/usr/bin/env bash
# A private SLURM for tests and trying sweeps on one machine (run as root): one node, or N hosts.
#
#   slurm/local/slurmctl.sh install              apt-get the daemons if missing (Debian/Ubuntu)
#   slurm/local/slurmctl.sh start [--nodes N] [--extra FILE]
#                                                install if missing, start munged + slurmctld + N slurmd
#   slurm/local/slurmctl.sh status               daemons' PIDs, `sinfo`, and what is left of the hosts
#   slurm/local/slurmctl.sh stop                 end every process, remove the hosts' namespaces, veths and
#                                                bridge, and the directory (also after a failed start)
#   slurm/local/slurmctl.sh env                  the line to eval in a shell: export SLURM_CONF=...
#   slurm/local/slurmctl.sh exec NODE CMD...     run CMD on a host of a --nodes N cluster (its network + UTS
#                                                namespaces: its hostname and address)
#   slurm/local/slurmctl.sh kill-node NODE       SIGKILL every process of that host (slurmd included): a lost node
#   slurm/local/slurmctl.sh start-node NODE      start that host's slurmd again (the node returns to service)
#
# --nodes 1 (the default): the node is this host, at 127.0.0.1.
# --nodes N>1: N hosts wagma-n1..wagma-nN, each a network namespace + UTS namespace with its own hostname,
# address 10.213.X.(10+i) on eth0 (a veth whose other end is on the private bridge wagma-brX, which holds
# 10.213.X.1: slurmctld's address) and its own slurmd. X is the first /24 of 10.213.0.0/16 that no interface
# uses. The hosts reach only each other and the bridge address (no default route, no forwarding). The
# file system is shared, as on a cluster: munge's unix socket, the venv, the run directories.
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
NODE=$(hostname -s)  # one node: this host; ranks rendezvous at its name (launch.slurm_master)
NODES=1
NET=  # X of 10.213.X.0/24 (--nodes N>1)
NET_LOCK=/tmp/wagma-slurm-net.lock  # two clusters started at once pick different subnets
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

node_names() { if [ "$NODES" = 1 ]; then echo "$NODE"; else seq -f 'wagma-n%g' 1 "$NODES"; fi; }
node_addr() { echo "10.213.$NET.$((10 + ${1#wagma-n}))"; }  # wagma-nI
ctld_addr() { if [ "$NODES" = 1 ]; then echo 127.0.0.1; else echo "10.213.$NET.1"; fi; }
netns() { echo "wagma$NET-${1#wagma-}"; }  # a host's network namespace, wagmaX-nI
uts_file() { echo "$DIR/ns/$1.uts"; }  # a host's UTS namespace, bound to a file

node_lines() {
  local n
  if [ "$NODES" = 1 ]; then
    echo "NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN"
    echo "PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP"
    return
  fi
  for n in $(node_names); do echo "NodeName=$n NodeAddr=$(node_addr "$n") CPUs=$CPUS State=UNKNOWN"; done
  echo "PartitionName=local Nodes=wagma-n[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
}

write_conf() {
  local ctld_port slurmd_port host pidfile=slurmd.pid
  ctld_port=$(free_port); slurmd_port=$(free_port); host=$(hostname -s)
  [ "$NODES" = 1 ] || pidfile=slurmd-%n.pid  # one slurmd per host, each its own port on its own address
  cat >"$DIR/slurm.conf" <<EOF
# Written by slurm/local/slurmctl.sh: a private $NODES-node cluster under $DIR.
ClusterName=wagmalocal
SlurmctldHost=$host($(ctld_addr))
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s); 10 s still
# covers a step launch on a loaded machine (slurmd checks the credential when the launch arrives, moments
# after srun got it)
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/$pidfile
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd$([ "$NODES" = 1 ] || echo -%n).log
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
# a node whose slurmd stopped answering is DOWN after this long (default 300 s), its jobs end (NODE_FAIL)
SlurmdTimeout=$([ "$NODES" = 1 ] && echo 300 || echo 15)
InactiveLimit=0
GresTypes=gpu
# stand-in CLOUD nodes (--extra) are never powered up: they only exist for sbatch --test-only
SuspendProgram=/bin/true
ResumeProgram=/bin/false
ResumeTimeout=60
$(node_lines)
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
  local i n up
  for i in $(seq 1 150); do
    up=$(SLURM_CONF="$DIR/slurm.conf" sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc)' || true)
    [ "$up" -ge "$NODES" ] && return 0
    sleep 0.2
  done
  echo "slurmctl: $((NODES - up)) of $NODES node(s) did not become idle; logs:" >&2
  tail -n 20 "$DIR"/log/slurm*.log >&2 || true
  return 1
}

# --- hosts: a network + UTS namespace each, joined by veths on a private bridge (--nodes N>1) ------------
pick_net() {
  # the first 10.213.X.0/24 no interface uses and no cluster of ours has taken (called under $NET_LOCK)
  local x used
  used=$(ip -o -4 addr show | awk '{print $4}')
  for x in $(seq 1 254); do
    if ! grep -q "^10\.213\.$x\." <<<"$used" && ! ip link show "wagma-br$x" >/dev/null 2>&1; then
      NET=$x; return 0
    fi
  done
  die "no free 10.213.X.0/24 subnet"
}

make_hosts() {
  local n ns veth
  exec 9>"$NET_LOCK"; flock 9
  pick_net
  echo "NODES=$NODES NET=$NET" >"$DIR/cluster.env"  # before anything exists: stop finds what to remove
  ip link add "wagma-br$NET" type bridge
  ip addr add "10.213.$NET.1/24" dev "wagma-br$NET"
  ip link set "wagma-br$NET" up
  exec 9>&-
  mkdir -p "$DIR/ns"
  for n in $(node_names); do
    ns=$(netns "$n"); veth="wagma$NET-h${n#wagma-n}"
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "$veth-c"
    ip link set "$veth-c" netns "$ns"
    ip link set "$veth" master "wagma-br$NET" up
    ip -n "$ns" link set "$veth-c" name eth0
    ip -n "$ns" addr add "$(node_addr "$n")/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    touch "$(uts_file "$n")"
    unshare --uts="$(uts_file "$n")" hostname "$n"
  done
}

on_node() {  # on_node NODE CMD...: run CMD in that host's namespaces
  local n=$1; shift
  [ -e "/run/netns/$(netns "$n")" ] || die "no host $n in the cluster under $DIR"
  nsenter --net="/run/netns/$(netns "$n")" --uts="$(uts_file "$n")" -- "$@"
}

kill_node() {  # every process in the host's network namespace (its slurmd, slurmstepds, tasks)
  local ns pids
  ns=$(netns "$1")
  [ -e "/run/netns/$ns" ] || return 0
  pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
  # shellcheck disable=SC2086
  [ -z "${pids// }" ] || kill -KILL $pids 2>/dev/null || true
}

remove_hosts() {
  local n ns i
  for n in $(node_names); do
    ns=$(netns "$n")
    for i in $(seq 1 50); do  # killed processes leave the namespace once reaped
      kill_node "$n"
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.1
    done
    ip netns del "$ns" 2>/dev/null || true  # removes its veth end, and so the pair
    ip link del "wagma$NET-h${n#wagma-n}" 2>/dev/null || true  # a pair not yet moved (failed start)
    umount "$(uts_file "$n")" 2>/dev/null || true
  done
  ip link del "wagma-br$NET" 2>/dev/null || true
}

start_slurmd() {
  local n
  if [ "$NODES" = 1 ]; then
    SLURM_CONF="$DIR/slurm.conf" slurmd -f "$DIR/slurm.conf" -N "$NODE"
    return
  fi
  for n in $(node_names); do
    on_node "$n" env SLURM_CONF="$DIR/slurm.conf" slurmd -f "$DIR/slurm.conf" -N "$n"
  done
}

slurmd_pidfiles() {
  local n
  if [ "$NODES" = 1 ]; then echo "$DIR/run/slurmd.pid"; return; fi
  for n in $(node_names); do echo "$DIR/run/slurmd-$n.pid"; done
}

start() {
  [ "$(id -u)" = 0 ] || die "start needs root (the daemons run as root under $DIR)"
  [[ "$NODES" =~ ^[1-9][0-9]?$ ]] || die "--nodes must be 1 to 99, got $NODES"
  install
  if pid_alive "$DIR/run/slurmctld.pid"; then
    echo "slurmctl: already running under $DIR" >&2
    echo "export SLURM_CONF=$DIR/slurm.conf"
    return 0
  fi
  [ ! -f "$DIR/cluster.env" ] || (load_env && stop)  # the leftovers of a killed run
  rm -rf "$DIR"
  mkdir -p "$DIR"/{state,spool,run,log}
  chmod 755 "$DIR"
  echo "NODES=$NODES NET=" >"$DIR/cluster.env"
  trap 'echo "slurmctl: start failed; removing what it made" >&2; stop' EXIT  # set -e: any failure ends here
  [ "$NODES" = 1 ] || make_hosts
  write_conf
  start_munge
  # SLURM_CONF in the daemons' environment marks their slurmstepd children as this cluster's (see stop)
  SLURM_CONF="$DIR/slurm.conf" slurmctld -f "$DIR/slurm.conf" -i
  start_slurmd
  # slurmd/slurmctld write their PID files after daemonising
  local i f ready
  for i in $(seq 1 50); do
    ready=1
    for f in "$DIR/run/slurmctld.pid" $(slurmd_pidfiles); do [ -s "$f" ] || ready=; done
    [ -n "$ready" ] && break
    sleep 0.1
  done
  wait_node || die "start failed"
  trap - EXIT
  echo "slurmctl: running under $DIR (partition local, nodes $(node_names | paste -sd,), CPUs=$CPUS each)" >&2
  echo "export SLURM_CONF=$DIR/slurm.conf"
}

load_env() {
  # the cluster's size and subnet, as start wrote them
  local line
  [ -f "$DIR/cluster.env" ] || return 0
  line=$(cat "$DIR/cluster.env")
  NODES=$(sed -n 's/.*NODES=\([0-9]*\).*/\1/p' <<<"$line"); NET=$(sed -n 's/.*NET=\([0-9]*\).*/\1/p' <<<"$line")
  NODES=${NODES:-1}
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

stop_pids() {  # TERM them all, then KILL what is left after 5 s
  local f pid pids="" i
  for f in "$@"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f"); rm -f "$f"
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && pids="$pids $pid"
  done
  for i in $(seq 1 50); do
    for pid in $pids; do kill -0 "$pid" 2>/dev/null && break; pid=; done
    [ -z "${pid:-}" ] && return 0
    sleep 0.1
  done
  for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
}

stop() {
  trap - EXIT
  pid_alive "$DIR/run/slurmctld.pid" && cancel_jobs
  # shellcheck disable=SC2046
  stop_pids $(slurmd_pidfiles) "$DIR/run/slurmctld.pid"
  stop_pids "$DIR/run/munged.pid"  # the daemons' last words may need munge
  kill_stray_steps
  if [ "$NODES" != 1 ] && [ -n "$NET" ]; then
    remove_hosts
    rm -rf "$DIR"
    echo "slurmctl: stopped; removed the $NODES hosts, bridge wagma-br$NET and $DIR" >&2
  else
    echo "slurmctl: stopped (files kept under $DIR)" >&2
  fi
}

leftovers() {
  # namespaces, links and processes of this cluster still on the machine (empty: none)
  local n
  [ "$NODES" != 1 ] && [ -n "$NET" ] || return 0
  for n in $(node_names); do
    [ ! -e "/run/netns/$(netns "$n")" ] || echo "namespace $(netns "$n") ($n): $(ip netns pids "$(netns "$n")" | wc -l) processes"
  done
  ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^wagma(-br)?$NET(-|$)" \
    | sed 's/^/link /' || true
}

status() {
  local name f others rc=0
  for name in munged slurmctld; do
    if pid_alive "$DIR/run/$name.pid"; then
      echo "$name: running (pid $(cat "$DIR/run/$name.pid"))"
    else
      echo "$name: stopped"; rc=3
    fi
  done
  for f in $(slurmd_pidfiles); do
    name=$(basename "$f" .pid)
    if pid_alive "$f"; then echo "$name: running (pid $(cat "$f"))"; else echo "$name: stopped"; rc=3; fi
  done
  leftovers
  others=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^wagma[0-9]+-n[0-9]+$' \
    | grep -v "^wagma$NET-" | paste -sd' ' || true)
  [ -z "$others" ] || echo "hosts of other local clusters on this machine: $others"
  [ $rc = 0 ] && SLURM_CONF="$DIR/slurm.conf" sinfo
  return $rc
}

cmd=${1:-}
shift || true
EXTRA=
case "$cmd" in
  exec) load_env; [ $# -ge 2 ] || die "usage: $0 exec NODE CMD..."; on_node "$@"; exit ;;
  kill-node) load_env; [ $# = 1 ] || die "usage: $0 kill-node NODE"; kill_node "$1"; exit ;;
  start-node) load_env; [ $# = 1 ] || die "usage: $0 start-node NODE"
    on_node "$1" env SLURM_CONF="$DIR/slurm.conf" slurmd -f "$DIR/slurm.conf" -N "$1"; exit ;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    --extra) EXTRA=$(realpath "$2"); shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
case "$cmd" in
  install) install ;;
  start) start ;;
  stop) load_env; stop ;;
  status) load_env; status ;;
  env) echo "export SLURM_CONF=$DIR/slurm.conf" ;;
  *) die "usage: $0 install|start [--nodes N] [--extra FILE]|stop|status|env|exec NODE CMD...|kill-node NODE" ;;
esac
