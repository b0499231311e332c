#!/usr/bin/env bash
# A real one-node Slurm cluster (with accounting) for tests, run as root, no systemd needed.
#
#   slurm/local-cluster.sh install   apt-get the packages (quick no-op when installed)
#   slurm/local-cluster.sh start     install if needed, start everything, wait until usable;
#                                     last stdout line: export SLURM_CONF=...
#   slurm/local-cluster.sh stop      scancel all jobs, stop the daemons this script started
#   slurm/local-cluster.sh status    daemons, node state (exit 0 running, 3 stopped, 1 partial)
#   slurm/local-cluster.sh env       print the export line
#   slurm/local-cluster.sh logs      tail every log
#
# Everything (config, state, logs, pid files, munge socket, MariaDB data) lives under
# $DAPO_SLURM_BASE (default /tmp/dapo-slurm). Every server listens on 127.0.0.1 only.
# Progress goes to stderr; only the export line goes to stdout, so
#   eval "$(slurm/local-cluster.sh start)"
# works. Processes are only ever signalled through pid files this script wrote, after
# checking /proc/PID/comm (never by name).
set -euo pipefail

BASE=${DAPO_SLURM_BASE:-/tmp/dapo-slurm}
CLUSTER=${DAPO_SLURM_CLUSTER:-dapo}
PARTITION=local
CTLD_PORT=${DAPO_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${DAPO_SLURM_SLURMD_PORT:-6818}
DBD_PORT=${DAPO_SLURM_DBD_PORT:-6819}
DB_PORT=${DAPO_SLURM_DB_PORT:-6833}
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)

ETC=$BASE/etc
CONF=$ETC/slurm.conf
PIDS=$BASE/pids          # pid files written by this script (one per daemon)
RUN=$BASE/run            # pid files the daemons write themselves
LOG=$BASE/log
MUNGE_DIR=$BASE/munge
MUNGE_SOCK=$MUNGE_DIR/munge.socket.2
DB_DIR=$BASE/mariadb
DB_SOCK=$DB_DIR/mysqld.sock
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)   # start order; stop is the reverse

export SLURM_CONF=$CONF

say() { echo "[local-slurm] $*" >&2; }
die() { say "ERROR: $*"; exit 1; }
unsupported() { say "cannot run here: $*"; exit 4; }   # exit 4: tests skip instead of failing

# ---------------------------------------------------------------- process bookkeeping
# alive NAME: the pid in $PIDS/NAME.pid exists, is not a zombie, and its comm is NAME.
# (Exited daemons can linger as zombies here, so kill -0 is not enough.)
alive() {
  local name=$1 pid comm
  pid=$(cat "$PIDS/$name.pid" 2>/dev/null) || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [ "$comm" = "${name:0:15}" ] && live_pid "$pid"
}

# live_pid PID: the process exists and is not a zombie.
live_pid() {
  local stat
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }                       # field 3 (state) follows "(comm) "
  case ${stat%% *} in Z|X|x) return 1 ;; esac
}

pid_of() { cat "$PIDS/$1.pid"; }

# launch NAME CMD...: run CMD detached (own session, stdio to the log), record its pid.
# CMD must exec the daemon itself in the foreground so that $! is the daemon's pid.
launch() {
  local name=$1; shift
  setsid "$@" </dev/null >>"$LOG/$name.out" 2>&1 9>&- &   # 9: our lock, not theirs
  echo $! >"$PIDS/$name.pid"
}

# The Slurm daemons (and srun) bind to the address gethostname() resolves to
# (CommunicationParameters=NoInAddrAny/NoCtldInAddrAny); clients reach them at 127.0.0.1.
# If the hostname does not resolve to loopback here (e.g. Docker's /etc/hosts), run them
# in a private mount namespace whose /etc/hosts maps the hostname to 127.0.0.1.
NETWRAP=()
setup_netwrap() {
  local h addr
  h=$(hostname)
  addr=$(getent ahostsv4 "$h" | awk 'NR == 1 {print $1}')
  [[ $addr == 127.* ]] && return 0
  say "hostname $h resolves to '${addr:-nothing}', not loopback: daemons get a private /etc/hosts"
  { echo "127.0.0.1 $h $(hostname -s)"; grep -vw -e "$h" -e "$(hostname -s)" /etc/hosts || true; } \
    | write_if_changed "$ETC/hosts" 644
  NETWRAP=(unshare --mount --propagation private sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$ETC/hosts")
  "${NETWRAP[@]}" true 2>/dev/null \
    || die "hostname $h does not resolve to 127.0.0.1 and 'unshare --mount' is not allowed here;" \
           "add '127.0.0.1 $h' to /etc/hosts"
}

# wait_for SECONDS WHAT CMD...: poll CMD every 0.2 s until it succeeds.
wait_for() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then say "timed out after ${limit}s waiting for $what"; return 1; fi
    sleep 0.2
  done
}

# wait_up NAME SECONDS CMD...: like wait_for, but give up at once if daemon NAME died.
wait_up() {
  local name=$1 limit=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    # just launched: the pid may still be setsid/setpriv/unshare until it execs the daemon
    live_pid "$(pid_of "$name")" || { say "$name exited"; return 1; }
    if [ $SECONDS -ge $deadline ]; then say "timed out after ${limit}s waiting for $name"; return 1; fi
    sleep 0.2
  done
}

# stop_daemon NAME SECONDS: SIGTERM, wait, then SIGKILL; only the pid we recorded.
stop_daemon() {
  local name=$1 limit=$2 pid deadline
  if ! alive "$name"; then rm -f "$PIDS/$name.pid"; return 0; fi
  pid=$(pid_of "$name")
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + limit))
  while alive "$name"; do
    if [ $SECONDS -ge $deadline ]; then
      say "$name (pid $pid) ignored SIGTERM for ${limit}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
      break
    fi
    sleep 0.1
  done
  rm -f "$PIDS/$name.pid"
  say "stopped $name (pid $pid)"
}

fail_with_log() {   # fail_with_log NAME MESSAGE
  say "ERROR: $2"
  for f in "$LOG/$1.log" "$LOG/$1.out"; do
    [ -s "$f" ] && { say "--- tail of $f"; tail -n 25 "$f" >&2; }
  done
  exit 1
}

# ---------------------------------------------------------------- install
installed() {
  local p s
  for p in "${PACKAGES[@]}"; do
    s=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) || return 1
    [ "$s" = "install ok installed" ] || return 1
  done
  command -v slurmctld >/dev/null && command -v mariadbd >/dev/null && command -v munged >/dev/null
}

do_install() {
  if installed; then say "packages already installed"; return 0; fi
  [ "$(id -u)" = 0 ] || unsupported "installing needs root (apt-get install ${PACKAGES[*]})"
  command -v apt-get >/dev/null || unsupported "no apt-get: install ${PACKAGES[*]} yourself"
  local policy=/usr/sbin/policy-rc.d t0=$SECONDS
  if [ ! -e "$policy" ]; then      # keep apt from starting the packages' own services
    printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  mkdir -p "$LOG"
  local apt=(apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-unsafe-io
             -o Dpkg::Options::=--force-confdef
             -o Dpkg::Options::=--force-confold "${PACKAGES[@]}")
  say "apt-get install ${PACKAGES[*]}"
  if ! "${apt[@]}" >"$LOG/apt.log" 2>&1; then
    say "install failed; apt-get update and retry"
    apt-get update -q >>"$LOG/apt.log" 2>&1 || true
    "${apt[@]}" >>"$LOG/apt.log" 2>&1 || { tail -n 30 "$LOG/apt.log" >&2; die "apt-get install failed"; }
  fi
  if [ "$(trap -p EXIT)" ]; then rm -f "$policy"; trap - EXIT; fi
  installed || die "packages still missing after apt-get install"
  say "installed in $((SECONDS - t0))s"
}

# ---------------------------------------------------------------- configuration
write_if_changed() {   # write_if_changed FILE MODE  (content on stdin)
  local tmp; tmp=$(mktemp "$1.XXXXXX")
  cat >"$tmp"; chmod "$2" "$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

make_dirs() {
  mkdir -p "$BASE" "$ETC" "$PIDS" "$RUN" "$LOG" "$BASE/state" "$BASE/spool"
  chmod 755 "$BASE"
  install -d -m 711 -o munge -g munge "$MUNGE_DIR"   # clients need +x to reach the socket
  install -d -m 750 -o mysql -g mysql "$DB_DIR"
  if [ ! -s "$MUNGE_DIR/munge.key" ]; then
    dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
  fi
  chown munge:munge "$MUNGE_DIR/munge.key"; chmod 400 "$MUNGE_DIR/munge.key"
  if [ ! -s "$ETC/db.pass" ]; then
    (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$ETC/db.pass")
  fi
}

write_configs() {
  local host node_line cpus mem defmem
  host=$(hostname -s)
  # `slurmd -C` prints e.g. "NodeName=vm CPUs=2 Boards=1 ... RealMemory=24105". It can
  # take seconds (hwloc) on a busy machine, so keep it while CPUs and memory are unchanged.
  local key; key="$(nproc) $(grep MemTotal /proc/meminfo)"
  if [ "$(head -n 1 "$ETC/slurmd-C" 2>/dev/null)" != "$key" ]; then
    { echo "$key"; slurmd -C | head -n 1; } >"$ETC/slurmd-C.tmp" && mv -f "$ETC/slurmd-C.tmp" "$ETC/slurmd-C"
  fi
  node_line=$(sed -n 2p "$ETC/slurmd-C")
  cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")
  mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")
  [ -n "$cpus" ] && [ -n "$mem" ] || die "cannot parse 'slurmd -C': $node_line"
  defmem=$((mem / cpus))
  node_line=$(sed -e 's/^NodeName=[^ ]* //' <<<"$node_line")
  write_if_changed "$CONF" 644 <<EOF
# Generated by slurm/local-cluster.sh; edits are overwritten on the next start.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK,cred_expire=5
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
MpiDefault=none
ReturnToService=2
KillWait=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$defmem
EnforcePartLimits=ALL
SchedulerParameters=batch_sched_delay=0,sched_interval=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCK
JobCompType=jobcomp/none
NodeName=$host NodeAddr=127.0.0.1 NodeHostname=$host $node_line State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  # slurmdbd has no -f: it reads slurmdbd.conf beside SLURM_CONF and wants mode 600.
  write_if_changed "$ETC/slurmdbd.conf" 600 <<EOF
# Generated by slurm/local-cluster.sh
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdAddr=127.0.0.1
CommunicationParameters=NoInAddrAny
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(cat "$ETC/db.pass")
StorageLoc=slurm_acct_db
EOF
}

# ---------------------------------------------------------------- daemons
db() { mariadb --no-defaults --protocol=socket -S "$DB_SOCK" -u root "$@"; }

start_munged() {
  alive munged && return 0
  launch munged setpriv --reuid=munge --regid=munge --init-groups \
    munged --foreground --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCK" \
    --pid-file="$MUNGE_DIR/munged.pid" --log-file="$LOG/munged.log" --seed-file="$MUNGE_DIR/munged.seed"
  wait_up munged 20 bash -c "munge -S '$MUNGE_SOCK' -n | unmunge -S '$MUNGE_SOCK'" \
    || fail_with_log munged "munged did not come up"
}

start_mariadbd() {
  alive mariadbd && return 0
  local data=$DB_DIR/data
  if [ ! -d "$data/mysql" ]; then
    say "initialising MariaDB data dir"
    rm -rf "$data"
    mariadb-install-db --no-defaults --user=mysql --datadir="$data" --skip-test-db \
      --auth-root-authentication-method=socket >"$LOG/mariadb-install.log" 2>&1 \
      || fail_with_log mariadb-install "mariadb-install-db failed"
  fi
  launch mariadbd mariadbd --no-defaults --user=mysql --datadir="$data" --socket="$DB_SOCK" \
    --pid-file="$DB_DIR/mariadbd.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
    --skip-name-resolve --log-error="$LOG/mariadbd.log" --innodb-buffer-pool-size=64M \
    --innodb-lock-wait-timeout=900
  wait_up mariadbd 60 db -e 'SELECT 1' || fail_with_log mariadbd "mariadbd did not come up"
  local pw; pw=$(cat "$ETC/db.pass")
  db <<EOF || fail_with_log mariadbd "cannot create the slurm db user"
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF
}

start_slurmdbd() {
  alive slurmdbd && return 0
  launch slurmdbd "${NETWRAP[@]}" slurmdbd -D
  wait_up slurmdbd 60 sacctmgr -n -P list cluster || fail_with_log slurmdbd "slurmdbd did not come up"
}

register_cluster() {
  if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >>"$LOG/sacctmgr.log" 2>&1 || die "sacctmgr add cluster failed"
  fi
  if ! sacctmgr -n -P list account format=account | grep -qx "$CLUSTER"; then
    sacctmgr -i add account "$CLUSTER" Cluster="$CLUSTER" Description=dapo Organization=dapo \
      >>"$LOG/sacctmgr.log" 2>&1 \
      || die "sacctmgr add account failed"
  fi
}

node_state() { sinfo -h -N -n "$(hostname -s)" -o %T 2>/dev/null | head -n 1; }
node_idle() { case $(node_state) in idle|mixed|allocated|completing) return 0 ;; *) return 1 ;; esac; }

start_slurmctld() {
  alive slurmctld && return 0
  launch slurmctld "${NETWRAP[@]}" slurmctld -D
}

start_slurmd() {
  alive slurmd && return 0
  launch slurmd "${NETWRAP[@]}" slurmd -D
}

export_line() { echo "export SLURM_CONF=$CONF"; }

# ---------------------------------------------------------------- commands
cmd_start() {
  local t0=$SECONDS d n=0
  for d in "${DAEMONS[@]}"; do alive "$d" && n=$((n + 1)); done
  if [ $n = ${#DAEMONS[@]} ] && [ -f "$CONF" ]; then
    say "already running (base $BASE); node $(node_state)"
    export_line; return 0
  fi
  [ "$(id -u)" = 0 ] || unsupported "start needs root"
  if [ -e "$BASE" ] && [ "$(stat -c %u "$BASE")" != 0 ]; then   # /tmp is shared: refuse a planted dir
    die "$BASE exists and is not owned by root"
  fi
  do_install
  make_dirs
  write_configs
  setup_netwrap
  start_munged
  start_mariadbd
  start_slurmdbd
  register_cluster
  start_slurmctld
  start_slurmd      # slurmd retries its registration until slurmctld answers
  wait_up slurmctld 30 scontrol ping || fail_with_log slurmctld "slurmctld did not come up"
  wait_up slurmd 60 node_idle || fail_with_log slurmd "node is '$(node_state)'"
  wait_for 30 sacct sacct -n -X -o JobID || fail_with_log slurmdbd "sacct does not answer"
  say "up in $((SECONDS - t0))s: partition '$PARTITION', node $(hostname -s), base $BASE"
  export_line
}

no_jobs() { local q; q=$(squeue -h -o %A) && [ -z "$q" ]; }

cancel_all_jobs() {
  alive slurmctld || return 0
  local ids
  ids=$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ') || return 0
  [ -n "${ids// /}" ] || return 0
  say "cancelling jobs: $ids"
  # shellcheck disable=SC2086
  scancel $ids 2>/dev/null || true
  # Wait for the jobs (and their slurmstepd) to end while slurmd can still reap them.
  wait_for 45 "jobs to end" no_jobs || say "jobs still listed; stopping anyway"
}

cmd_stop() {
  [ "$(id -u)" = 0 ] || unsupported "stop needs root"
  cancel_all_jobs
  stop_daemon slurmd 20
  stop_daemon slurmctld 20
  stop_daemon slurmdbd 20
  stop_daemon mariadbd 60
  stop_daemon munged 10
  say "stopped"
}

cmd_status() {
  local d n=0 rc
  for d in "${DAEMONS[@]}"; do
    if alive "$d"; then n=$((n + 1)); say "$d: running (pid $(pid_of "$d"))"; else say "$d: stopped"; fi
  done
  if [ $n = ${#DAEMONS[@]} ]; then
    say "node $(hostname -s): $(node_state); partition $PARTITION; base $BASE"; rc=0
  elif [ $n = 0 ]; then rc=3; else rc=1; fi
  export_line
  return $rc
}

cmd_logs() {
  local f
  for f in "$LOG"/*; do
    if [ -s "$f" ]; then echo "=== $f"; tail -n "${LINES_PER_LOG:-20}" "$f"; fi
  done
}

lock() {   # one start/stop at a time (e.g. several pytest-xdist workers)
  mkdir -p "$(dirname "$BASE")"
  if ! { exec 9>>"$BASE.lock"; } 2>/dev/null; then
    [ "$(id -u)" = 0 ] && die "cannot open $BASE.lock"
    return 0    # not root: start can only report a running cluster, so no lock needed
  fi
  flock -w 300 9 || die "another start/stop holds $BASE.lock"
}

case ${1:-} in
  install) lock; do_install ;;
  start) lock; cmd_start ;;
  stop) lock; cmd_stop ;;
  status) cmd_status ;;
  env) export_line ;;
  logs) cmd_logs ;;
  *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
