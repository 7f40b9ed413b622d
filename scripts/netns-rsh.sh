#!/usr/bin/env bash
# An rsh for the netns cluster (scripts/netns-cluster.sh): Open MPI's launcher
# calls it as it would call ssh,
#   netns-rsh.sh [-x | -T | -o OPT ...] HOST COMMAND...
# and it runs COMMAND in HOST's namespace with sh, as sshd would, via
# 'netns-cluster.sh exec' (the host's own hostname, KCOLL_SOCKET, cluster variables).
# HOST is one of the host's addresses (10.10.0.N or 10.20.0.N), hN or P-hN;
# the cluster is $KCOLL_CLUSTER_PREFIX's (default kc).
#   mpirun --hostfile H --mca plm_rsh_agent scripts/netns-rsh.sh ...
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# ssh options a launcher may pass before the host; the ones with a value take it.
while [ $# -gt 0 ]; do
	case "$1" in
	-[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
	-*) shift ;;
	*) break ;;
	esac
done
[ $# -ge 2 ] || { echo "netns-rsh: usage: $0 HOST COMMAND..." >&2; exit 255; }
host=$1
shift
# ssh hands the joined words to the remote shell; so do we.
exec "$here/netns-cluster.sh" exec "$host" sh -c "$*"
