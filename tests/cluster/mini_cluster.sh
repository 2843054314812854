#!/usr/bin/env bash
# A Slurm cluster in miniature on this one machine, for the tests of label `cluster`: a head node
# (slurmctld, the login shell of sbatch and squeue) and N compute nodes (slurmd), each a network
# namespace with a host name of its own (a UTS namespace), joined by veth pairs to a bridge that
# lives in a namespace of its own, the fabric. Ranks on one node talk over shared memory, ranks on
# two nodes over TCP through the bridge: the NVLink / InfiniBand split of a real cluster. The links
# between the nodes and the fabric get a bandwidth with tc's token bucket (tbf), both directions.
# Nothing of the machine's own network changes, and only the namespaces' addresses (198.18.0.0/24,
# the range set aside for benchmarking networks) are ever used.
#
#   mini_cluster.sh start DIR [NODES [RATE]]   NODES compute nodes (2), links of RATE (tc's units,
#                                              e.g. 1gbit; "none": unshaped); waits for the nodes
#   mini_cluster.sh stop DIR                   kills every process of the cluster, removes it
#   mini_cluster.sh lose DIR NODE              takes NODE's link down, then kills all of its processes
#   mini_cluster.sh restore DIR NODE           brings NODE's link up and its slurmd back
#   mini_cluster.sh head DIR COMMAND...        runs COMMAND on the head node (SLURM_CONF set)
#   mini_cluster.sh on DIR NODE COMMAND...     runs COMMAND in NODE's network namespace
#
# Needs root, network namespaces, the bridge and veth drivers, tc, and Slurm with munge
# (scripts/install-deps.sh --with-tests). Exit 77 (skip) with the reason where the machine does not
# permit namespaces. The daemons' state and logs are under DIR.
set -euo pipefail
action=${1:?start, stop, lose, restore, head or on}
dir=${2:?state directory}
shift 2
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/slurm.conf
source_root=$(cd "$(dirname "$0")/../.." && pwd)
# Every namespace of the cluster is named prefix-...; the prefix is the directory's, so that two
# clusters (two checkouts' tests) on one machine neither meet nor stop each other.
prefix=dstrain-mc-$(printf '%s' "$dir" | md5sum | cut -c 1-8)
fabric=$prefix-fabric
subnet=198.18.0

node_ns() { echo "$prefix-$1"; }
node_address() { [[ $1 == head ]] && echo "$subnet.1" || echo "$subnet.$((10 + ${1#node}))"; }
nodes() { cat "$dir/nodes" 2>/dev/null || true; }

# Every process in the cluster's namespaces, killed; the namespaces removed (the veth pairs go with them).
stop() {
  local ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
  done
  sleep 0.2
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
}

# The machine's directories directly under /tmp that hold the cluster's state or the checkout
# (a project cloned under /tmp, say): every node sees them where they are, in its own /tmp.
shared_tmp_entries() {
  local path rest
  for path in "$dir" "$source_root"; do
    [[ $path == /tmp/* ]] || continue
    rest=${path#/tmp/}
    echo "/tmp/${rest%%/*}"
  done | sort -u
}

# Runs "$@" as NODE: its network namespace, its host name, an /etc/hosts that names the cluster's
# hosts and a /tmp of its own (a mount namespace), so that the daemons and their children all see
# one node, as on a cluster (PMIx and Open MPI keep per-node files in /tmp). What lies under the
# machine's /tmp and the cluster needs is mounted into the node's /tmp at the same place first.
as_node() {
  local node=$1
  shift
  # (nsenter rather than `ip netns exec`, which mounts a /sys without slurmd's cgroup file system)
  nsenter --net="/run/netns/$(node_ns "$node")" unshare --uts --mount -- \
    sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts && node_tmp=$3 shared=$4 && shift 4 &&
           for entry in $shared; do
             mkdir -p "$node_tmp/${entry#/tmp/}" && mount --bind "$entry" "$node_tmp/${entry#/tmp/}" || exit 1
           done &&
           mount --rbind "$node_tmp" /tmp && exec "$@"' \
    sh "$node" "$dir/hosts" "$dir/tmp/$node" "$(shared_tmp_entries)" "$@"
}

shape() {  # shape NAMESPACE DEVICE: traffic leaving DEVICE at the cluster's rate
  local rate
  rate=$(cat "$dir/rate")
  [[ $rate == none ]] && return 0
  # A burst of 256 KB (2 ms at 1 Gbit/s): any transfer longer than a few milliseconds sees the rate.
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$rate" burst 256kb latency 100ms
}

link() {  # link NODE: its namespace, a veth pair to the fabric's bridge, its address, shaped
  local node=$1 ns
  ns=$(node_ns "$node")
  ip netns add "$ns"
  ip -n "$fabric" link add "f-$node" type veth peer name eth0 netns "$ns"
  ip -n "$fabric" link set "f-$node" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$(node_address "$node")/24" dev eth0
  ip -n "$ns" link set eth0 up
  if [[ $node != head ]]; then
    shape "$fabric" "f-$node"
    shape "$ns" eth0
  fi
}

start_slurmd() {
  as_node "$1" slurmd -f "$conf"
}

write_config() {
  local node list=""
  {
    echo "127.0.0.1 localhost"
    echo "$(node_address head) head"
    for node in $(nodes); do echo "$(node_address "$node") $node"; done
  } >"$dir/hosts"
  for node in $(nodes); do list+="${list:+,}$node"; done
  cat >"$conf" <<CONF
# The dstrain tests' cluster in miniature (tests/cluster/mini_cluster.sh).
ClusterName=dstrainmini
SlurmctldHost=head($(node_address head))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits this long for its credential to expire before it starts again: time
# enough for slurmctld to learn that a lost node is gone (SlurmdTimeout, and its pings' interval).
AuthInfo=cred_expire=45
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
SlurmctldPort=6817
SlurmdPort=6818
Include $(cd "$(dirname "$0")/../slurm" && pwd)/test_cluster_plugins.conf
# A node that stops answering is down after SlurmdTimeout (longer than the tests' comm.timeout_s,
# so that dstrain, not Slurm, ends a job that lost a node); one that comes back serves again.
SlurmdTimeout=30
ReturnToService=2
KillWait=2
InactiveLimit=0
MinJobAge=600
NodeName=DEFAULT CPUs=4 Sockets=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=4000 State=UNKNOWN
CONF
  for node in $(nodes); do
    echo "NodeName=$node NodeAddr=$(node_address "$node") NodeHostname=$node" >>"$conf"
  done
  echo "PartitionName=debug Nodes=$list Default=YES MaxTime=INFINITE State=UP" >>"$conf"
}

wait_idle() {  # wait_idle COUNT: until COUNT nodes are idle
  local want=$1
  for _ in $(seq 1 120); do
    [[ $(as_head sinfo -h -N -o %T 2>/dev/null | grep -c '^idle') -ge $want ]] && return 0
    sleep 0.5
  done
  echo "error: the cluster's nodes did not come up; sinfo and the logs:" >&2
  as_head sinfo -N >&2 || true
  tail -n 15 "$dir"/*.log >&2 || true
  return 1
}

as_head() { SLURM_CONF=$conf ip netns exec "$(node_ns head)" "$@"; }

start() {
  local count=${1:-2} rate=${2:-1gbit}
  rm -f "$dir/skipped"
  [[ $(id -u) -eq 0 ]] || { echo "SKIP: the cluster in miniature needs root (network namespaces, slurmd)"; exit 77; }
  for tool in ip tc unshare slurmctld slurmd munged sbatch; do
    command -v "$tool" >/dev/null || { echo "error: $tool missing: run scripts/install-deps.sh --with-tests" >&2; exit 1; }
  done
  stop
  if ! ip netns add "$fabric" 2>"$dir/netns.err" || ! ip -n "$fabric" link add br0 type bridge 2>>"$dir/netns.err"; then
    echo "this machine does not permit network namespaces with a bridge: $(head -n 1 "$dir/netns.err")" >"$dir/skipped"
    echo "SKIP: $(cat "$dir/skipped")"
    stop
    exit 77
  fi
  ip -n "$fabric" link set br0 up
  echo "$rate" >"$dir/rate"
  seq -f 'node%g' 1 "$count" >"$dir/nodes"
  rm -rf "$dir/state" "$dir/spool" "$dir/tmp" "$dir"/*.log "$dir"/*.pid  # every start is a new cluster
  mkdir -p "$dir/state"
  for node in head $(nodes); do mkdir -p "$dir/spool/$node" "$dir/tmp/$node" && chmod 1777 "$dir/tmp/$node"; done
  write_config
  link head
  for node in $(nodes); do link "$node"; done
  if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    su -s /bin/sh munge -c munged 2>/dev/null || munged --force
  fi
  as_node head slurmctld -f "$conf"
  for node in $(nodes); do start_slurmd "$node"; done
  wait_idle "$count"
  echo "cluster in miniature up: head and $(nodes | tr '\n' ' ')(links: $rate); SLURM_CONF=$conf"
}

case $action in
  start) start "$@" ;;
  stop) stop ;;
  lose)
    node=${1:?which node}
    ip -n "$fabric" link set "f-$node" down
    pids=$(ip netns pids "$(node_ns "$node")")
    [[ -n $pids ]] && kill -9 $pids
    echo "lost $node: link down, its slurmd and tasks killed"
    ;;
  restore)
    node=${1:?which node}
    ip -n "$fabric" link set "f-$node" up
    start_slurmd "$node"
    echo "restored $node"
    ;;
  head) as_head "$@" ;;
  on)
    node=${1:?which node}
    shift
    ip netns exec "$(node_ns "$node")" "$@"
    ;;
  *)
    echo "usage: $0 start|stop|lose|restore|head|on DIR ..." >&2
    exit 2
    ;;
esac
