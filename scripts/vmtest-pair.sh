#!/usr/bin/env bash
# Two QEMU guests at once, joined by a virtual wire: each runs
# scripts/vmtest.sh with a virtio-net NIC on a QEMU "dgram" backend over a
# pair of unix sockets in a private /tmp directory (guest 0's datagrams go to
# guest 1's socket and back; nothing leaves the host), its own MAC, and a
# shared read-write directory for rendezvous files. See docs/vmtest.md.
#
#   scripts/vmtest-pair.sh [--timeout S] [--mem MB] -- CMD...
#       guest I (0, 1) runs "CMD... I DIR", DIR being the shared directory
#       (the same path in both guests and here); prints guest 0's output,
#       then guest 1's, each after a "# --- guest I" line; exits 0 when both
#       commands exited 0, else the first non-zero status (124: timeout).
#       When a guest cannot start (QEMU refuses the NIC backend, no memory)
#       it prints "ok 1 # SKIP <reason>" and exits 0: the caller's TAP
#       counts a skip, not a failure.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
timeout_s=600
mem_mb=1024
cmd=()
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
	case "$1" in
	--timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
	--mem) mem_mb=${2:?--mem needs MiB}; shift 2 ;;
	-h|--help) usage; exit 0 ;;
	--) shift; cmd=("$@"); break ;;
	*) echo "vmtest-pair.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
	esac
done
[ ${#cmd[@]} -gt 0 ] || { usage >&2; exit 2; }

mkdir -p "$top/build/vm"
# Sockets: a short private path (unix socket paths are limited to 108 bytes).
sockdir=$(mktemp -d /tmp/kcoll-pair.XXXXXX)
share=$(mktemp -d "$top/build/vm/pair.XXXXXX")
chmod 1777 "$share"
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$sockdir" "$share"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for g in 0 1; do
	o=$((1 - g))
	nic="dgram,local.type=unix,local.path=$sockdir/g$g,remote.type=unix,remote.path=$sockdir/g$o"
	"$top/scripts/vmtest.sh" --timeout "$timeout_s" --mem "$mem_mb" --tag "pair$g" \
		--nic "$nic" --mac "52:54:00:4b:00:0$((g + 1))" --share "$share" \
		-- "${cmd[@]}" "$g" "$share" >"$sockdir/out$g" 2>&1 &
	pids+=($!)
done
rcs=()
for g in 0 1; do
	set +e
	wait "${pids[g]}"
	rcs+=($?)
	set -e
done
pids=()

# A guest that QEMU refused to start (no dgram backend, no memory): a skip
# with QEMU's reason. A guest that started but never ran the command (the
# kernel did not boot) is a failure.
started=0 refused=
for g in 0 1; do
	c=$top/build/vm/console-pair$g.log
	if grep -q "vm-init: running command" "$c" 2>/dev/null; then
		started=$((started + 1))
	elif [ -z "$refused" ]; then
		refused=$(grep -h -m1 '^qemu-system' "$c" 2>/dev/null | grep -v 'terminating on signal' |
			tr -d '\r' | cut -c1-160)
	fi
done
if [ "$started" -lt 2 ]; then
	for g in 0 1; do
		echo "# --- guest $g (status ${rcs[g]})"
		tail -n 20 "$sockdir/out$g" | sed 's/^/# /'
	done
	if [ -n "$refused" ]; then
		echo "ok 1 # SKIP QEMU could not start a second guest: $refused"
		exit 0
	fi
	echo "not ok 1 - both guests boot and run the command (only $started did; build/vm/console-pair*.log)"
	exit 1
fi
rc=0
for g in 0 1; do
	echo "# --- guest $g (status ${rcs[g]})"
	cat "$sockdir/out$g"
	[ "$rc" -ne 0 ] || rc=${rcs[g]}
done
exit "$rc"
