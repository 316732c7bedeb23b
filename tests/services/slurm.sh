#!/usr/bin/env bash
# A throwaway single-node Slurm for the tests: its own munged, slurmctld and slurmd, on loopback
# ports chosen free at start, every file (key, sockets, state, spool, logs, pids) under DIR, so it
# never touches a system munge or Slurm (/etc/munge, /etc/slurm, /run/munge stay as they are).
#
#   tests/services/slurm.sh start DIR   set up and start under DIR; waits until `sinfo` shows the
#                                       node idle and `srun -N1 true` runs; prints
#                                       `export SLURM_CONF=... RUNYARD_TEST_SLURM=...` for eval
#   tests/services/slurm.sh stop DIR    cancel its jobs, end every process it started (daemons,
#                                       slurmstepd and what they launched) and delete DIR;
#                                       idempotent, a DIR that is gone is fine
#
# Needs Debian's `slurm-wlm` and `munge` packages (Slurm 22.05 on Debian 12). No systemd.
#
# Who runs what. As root: munged as the `munge` user and slurmctld as the `slurm` user (both
# created by the packages), unprivileged; slurmd as ROOT, because a slurmd can only start job
# steps as its own user unless it is root (it setuid()s to the job's owner), and the tests submit
# as root here. Not as root: all three run as the calling user (SlurmUser = SlurmdUser = the caller),
# which Slurm allows for jobs of that one user.
#
# Clients (sbatch, srun, squeue, scancel, scontrol, sinfo) need only SLURM_CONF: the munge socket
# under DIR reaches them through AuthInfo=socket=... in that slurm.conf (libmunge itself has no
# environment variable for it). RUNYARD_TEST_SLURM is the same path, for tests/slurm_cluster.py.
#
# Every daemon gets RUNYARD_SLURM_SERVICE=DIR in its environment; slurmstepd inherits it from
# slurmd, and `stop` ends exactly those processes and their descendants (the jobs' processes), no
# other slurm or munge on the machine.
set -euo pipefail

cmd="${1:-}"; dir="${2:-}"
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR" >&2; exit 2
fi
log() { echo "[slurm.sh] $*" >&2; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Processes started by this service (marked with RUNYARD_SLURM_SERVICE=DIR) and all their
# descendants, one pid a line.
our_processes() {
  local marker="RUNYARD_SLURM_SERVICE=$1" roots="" p
  for p in /proc/[0-9]*; do
    if { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qxF "$marker"; then
      roots="$roots ${p#/proc/}"
    fi
  done
  [ -n "$roots" ] || return 0
  ps -e -o pid=,ppid= | awk -v roots="$roots" '
    { parent[$1] = $2 }
    END {
      n = split(roots, r, " "); for (i = 1; i <= n; i++) mine[r[i]] = 1
      do { grew = 0; for (p in parent) if (!(p in mine) && (parent[p] in mine)) { mine[p] = 1; grew = 1 } } while (grew)
      for (p in mine) if (p != "") print p
    }'
}

stop_all() {
  local d="$1" conf="$1/etc/slurm.conf" pids i
  [ -d "$d" ] || return 0
  d="$(cd "$d" && pwd)"; conf="$d/etc/slurm.conf"
  # Jobs first, so that slurmstepd ends them the ordinary way (a slurmd that stops leaves its
  # steps running). Best effort: the controller may be down already.
  if [ -f "$conf" ] && [ -f "$d/ctld/slurmctld.pid" ]; then
    local jobs
    jobs="$(SLURM_CONF="$conf" timeout 5 squeue -h -o %A 2>/dev/null || true)"
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      SLURM_CONF="$conf" timeout 5 scancel $jobs 2>/dev/null || true
      for i in $(seq 1 40); do
        [ -z "$(SLURM_CONF="$conf" timeout 5 squeue -h -t running,completing -o %A 2>/dev/null || true)" ] && break
        sleep 0.25
      done
    fi
  fi
  pids="$(our_processes "$d")"
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for i in $(seq 1 40); do
      pids="$(our_processes "$d")"
      [ -z "$pids" ] && break
      sleep 0.25
    done
    if [ -n "$pids" ]; then
      log "still running after SIGTERM, killing: $(echo $pids)"
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
      sleep 0.2
    fi
  fi
  rm -rf "$d"
}

case "$cmd" in
  start)
    for b in munged mungekey slurmctld slurmd sinfo srun; do
      command -v "$b" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin"
      command -v "$b" >/dev/null 2>&1 \
        || { log "no $b found: install Debian's slurm-wlm and munge packages (apt-get install -y slurm-wlm munge)"; exit 1; }
    done
    t0="$(date +%s.%N)"
    mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"
    if [ -e "$dir/etc/slurm.conf" ]; then log "$dir holds a cluster already: stop it first"; exit 1; fi
    chmod 0755 "$dir"
    if [ "$(id -u)" -eq 0 ]; then
      munge_user=munge; ctld_user=slurm; slurmd_user=root
      id munge >/dev/null 2>&1 && id slurm >/dev/null 2>&1 \
        || { log "the munge and slurm users are missing (the munge and slurm-wlm packages create them)"; exit 1; }
      runuser -u slurm -- test -x "$dir" \
        || { log "the slurm user cannot reach $dir: choose a DIR whose parents others may enter (chmod o+x)"; exit 1; }
    else
      munge_user="$(id -un)"; ctld_user="$munge_user"; slurmd_user="$munge_user"
    fi
    as() {  # run a command as user $1 with the service marker
      local u="$1"; shift
      if [ "$u" = "$(id -un)" ]; then env RUNYARD_SLURM_SERVICE="$dir" "$@"
      else runuser -u "$u" -- env RUNYARD_SLURM_SERVICE="$dir" "$@"; fi
    }
    trap 'rc=$?; if [ $rc -ne 0 ]; then log "start failed; logs:"; tail -n 20 "$dir"/log/*.log "$dir"/munge/*.log >&2 2>/dev/null || true; stop_all "$dir"; fi' EXIT

    mkdir -p "$dir/etc" "$dir/munge" "$dir/ctld/state" "$dir/slurmd/spool" "$dir/log"
    chown "$munge_user": "$dir/munge"; chmod 0755 "$dir/munge"   # clients must reach the socket
    chown -R "$ctld_user": "$dir/ctld"; chmod 0755 "$dir/ctld"
    chown "$ctld_user": "$dir/log"; chmod 0755 "$dir/log"       # slurmctld writes here; slurmd is root

    # munge: a fresh key for this cluster only, and munged on its own socket.
    as "$munge_user" mungekey --create --keyfile="$dir/munge/munge.key" >&2
    as "$munge_user" munged --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
      --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" \
      --num-threads=2 \
      || { log "munged did not start"; exit 1; }

    # The node as it is: CPUs and memory from slurmd -C (a larger claim drains the node).
    hw="$(slurmd -C | head -1)"
    cpus="$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hw")"
    mem="$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")"
    topo="$(grep -o 'Boards=[0-9]* SocketsPerBoard=[0-9]* CoresPerSocket=[0-9]* ThreadsPerCore=[0-9]*' <<<"$hw")"
    ctld_port="$(free_port)"; slurmd_port="$(free_port)"
    while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port="$(free_port)"; done

    cat >"$dir/etc/slurm.conf" <<EOF
# Written by tests/services/slurm.sh: a throwaway single-node cluster under $dir.
ClusterName=runyard-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$ctld_user
SlurmdUser=$slurmd_user
AuthType=auth/munge
# cred_expire: a requeued job waits this long before it may start again (default 120 s).
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$dir/ctld/state
SlurmctldPidFile=$dir/ctld/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdSpoolDir=$dir/slurmd/spool
SlurmdPidFile=$dir/slurmd/slurmd.pid
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: processes are tracked through /proc, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
# Cores and memory are the consumable resources; a job without --mem gets DefMemPerCPU per CPU
# (without it a job would take the whole node's memory, one job at a time).
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
# Pending jobs whose begin time has come (a requeued job) are started by the periodic passes:
# every 2 s here instead of the defaults (60 s main, 30 s backfill).
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
# No slurmdbd: sacct has nothing to read (docs/SLURM_NOTES.md).
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
PreemptType=preempt/none
PreemptMode=OFF
JobRequeue=1
# Short times, for tests: squeue forgets a finished job MinJobAge seconds after it ends (the
# controller purges about every few seconds, so expect up to ~MinJobAge+5 s); SIGTERM -> SIGKILL
# after KillWait seconds.
MinJobAge=2
KillWait=2
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
Waittime=0
ReturnToService=2
MailProg=/bin/true
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus $topo RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    chmod 0644 "$dir/etc/slurm.conf"
    export SLURM_CONF="$dir/etc/slurm.conf"

    as "$ctld_user" SLURM_CONF="$SLURM_CONF" slurmctld -f "$SLURM_CONF" \
      || { log "slurmctld did not start"; exit 1; }
    as "$slurmd_user" SLURM_CONF="$SLURM_CONF" slurmd -f "$SLURM_CONF" -N localhost \
      || { log "slurmd did not start"; exit 1; }

    state=""
    for i in $(seq 1 120); do
      state="$(timeout 5 sinfo -h -n localhost -o %t 2>/dev/null || true)"
      [ "$state" = "idle" ] && break
      sleep 0.25
    done
    [ "$state" = "idle" ] || { log "the node is not idle after 30 s (sinfo says '${state:-nothing}')"; exit 1; }
    timeout 30 srun -N1 -t 1 -J runyard-test-ready true \
      || { log "srun -N1 true failed"; exit 1; }
    trap - EXIT
    log "Slurm $(sinfo -V | awk '{print $2}') ready on 127.0.0.1 (slurmctld :$ctld_port, slurmd :$slurmd_port," \
        "node localhost: $cpus CPUs, $mem MB) in $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s"
    echo "export SLURM_CONF=$SLURM_CONF RUNYARD_TEST_SLURM=$SLURM_CONF"
    ;;
  stop)
    stop_all "$dir"
    ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
