#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for the tests: munged, slurmctld and slurmd with a
# slurm.conf of our own (proctrack/linuxproc, no cgroups), all state under one directory.
#   tests/slurm/cluster.sh start DIR    writes DIR/slurm.conf, starts the daemons, waits for the node
#   tests/slurm/cluster.sh stop DIR     stops them (whatever state they are in) and frees the ports
# Needs root (the daemons run as root here) and Debian's slurm-wlm, munge and libpmix-dev
# (scripts/install-deps.sh --with-tests). Clients use SLURM_CONF=DIR/slurm.conf.
set -euo pipefail
action=${1:?start or stop}
dir=${2:?state directory}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/slurm.conf

# The job step daemons (slurmstepd) of this cluster: each listens on a socket in the cluster's
# spool directory (NODE_JOB.STEP), so they are told apart from those of any other Slurm on the
# machine, a real one included, by that socket and never by their name.
own_step_daemons() {
  local inodes
  inodes=$(awk -v spool="$dir/spool/" 'index($8, spool) == 1 { print $7 }' /proc/net/unix | sort -u)
  [[ -n $inodes ]] || return 0
  { find /proc/[0-9]*/fd -lname 'socket:*' -printf '%h %l\n' 2>/dev/null || true; } |  # (processes come and go)
    awk -v inodes="$inodes" 'BEGIN { n = split(inodes, list, "\n"); for (i = 1; i <= n; i++) ours["socket:[" list[i] "]"] = 1 }
                             $2 in ours { split($1, part, "/"); print part[3] }' | sort -u
}

# The processes PIDS and every process started under them.
with_descendants() {
  ps -e -o pid=,ppid= | awk -v roots="$*" '
    BEGIN { n = split(roots, list, " "); for (i = 1; i <= n; i++) ours[list[i]] = 1 }
    { parent[$1] = $2 }
    END { for (grew = 1; grew;) { grew = 0; for (p in parent) if (!(p in ours) && (parent[p] in ours)) { ours[p] = 1; grew = 1 } }
          for (p in ours) print p }'
}

# Ends what this cluster started and nothing else: its jobs (scancel, while slurmctld answers),
# its daemons (by their pid files), then any of its step daemons that outlived them.
stop() {
  if [[ -f $dir/slurmctld.pid ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    local jobs
    jobs=$(SLURM_CONF=$conf timeout 10 squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      SLURM_CONF=$conf timeout 10 scancel $jobs 2>/dev/null || true
      for _ in $(seq 1 50); do
        [[ -z $(SLURM_CONF=$conf timeout 10 squeue -h -t running,completing -o %i 2>/dev/null) ]] && break
        sleep 0.2
      done
    fi
  fi
  for daemon in slurmd slurmctld; do
    if [[ -f $dir/$daemon.pid ]]; then
      pid=$(cat "$dir/$daemon.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/$daemon.pid"
    fi
  done
  local stepds
  stepds=$(own_step_daemons)
  [[ -z $stepds ]] || kill -9 $(with_descendants $stepds) 2>/dev/null || true
}

if [[ $action == stop ]]; then
  stop
  exit 0
fi
[[ $action == start ]] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "SKIP: the test cluster's daemons need root"; exit 77; }
for tool in slurmctld slurmd munged sbatch; do
  command -v "$tool" >/dev/null || { echo "error: $tool missing: run scripts/install-deps.sh --with-tests" >&2; exit 1; }
done
stop  # leftovers of an earlier run that was killed

# munge: Slurm's authentication; the system's key and socket.
if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
  su -s /bin/sh munge -c munged 2>/dev/null || munged --force
fi

host=$(hostname)
rm -rf "$dir/state" "$dir/spool" "$dir/pmix"  # every start is a new cluster: no jobs of an earlier run
mkdir -p "$dir/state" "$dir/spool" "$dir/pmix"
# PMIx's per-step directories are named by job and step id only, which every new cluster counts
# from 1 again: under the cluster's own directory, not the machine's /tmp, so that what a killed
# cluster left there (or another cluster's running step) cannot make a step's launch fail.
echo "PMIxCliTmpDirBase=$dir/pmix" >"$dir/mpi.conf"
cat >"$conf" <<CONF
# The dstrain tests' one-node cluster (tests/slurm/cluster.sh).
ClusterName=dstraintest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued batch job waits for its credential to expire before it starts again: 10 s here
# instead of the default 120.
AuthInfo=cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=${DSTRAIN_SLURMCTLD_PORT:-16817}
SlurmdPort=${DSTRAIN_SLURMD_PORT:-16818}
# The plugins, and more CPUs than the machine has, so that 4-rank jobs run on small machines.
Include $(cd "$(dirname "$0")" && pwd)/test_cluster_plugins.conf
ReturnToService=2
KillWait=5
InactiveLimit=0
MinJobAge=600
NodeName=$host CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld -f "$conf"
slurmd -f "$conf"
export SLURM_CONF=$conf
for _ in $(seq 1 120); do  # 60 s: slurmd registers late on a loaded machine
  if sinfo -h -o %T 2>/dev/null | grep -qE '^idle'; then
    echo "test cluster up: SLURM_CONF=$conf"
    exit 0
  fi
  sleep 0.5
done
echo "error: the test cluster's node did not come up; its logs:" >&2
tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
exit 1
