# shellcheck shell=bash
# Soft-RoCE set-up inside the QEMU guest, sourced by the VM tests
# (tests/vm/t_rdma.sh, t_kv_rdma.sh) and the VM benchmarks
# (scripts/bench-rdma-vm.sh, bench-kv-rdma-vm.sh). One veth with every "host"
# address on it and one rxe device over it: rdma_rxe in the guest's kernel
# (6.1) sends from the initial network namespace only, so the hosts share it.

# vm_rxe_load: load veth and rdma_rxe. crc32_generic goes first, else rxe
# fails with "failed to init crc32 algorithm". Returns 1 when rdma_rxe is not
# loaded, with modprobe's message in $why (set either way).
vm_rxe_load() {
	modprobe veth 2>/dev/null
	modprobe crc32_generic 2>/dev/null
	# shellcheck disable=SC2034 # read by the caller
	why=$(modprobe rdma_rxe 2>&1)
	[ -d /sys/module/rdma_rxe ]
}

# vm_rxe_link IF RXE ADDR...: loopback up, the veth pair IF/IFp up, each ADDR
# (a /24) on IF, and the rxe device RXE over IF (one GID per address).
# Returns the status of the first step that failed.
vm_rxe_link() {
	local ifname=$1 rxe=$2 a
	shift 2
	ip link set lo up
	ip link add "$ifname" type veth peer name "${ifname}p" && ip link set "$ifname" up &&
		ip link set "${ifname}p" up || return
	for a in "$@"; do
		ip addr add "$a/24" dev "$ifname" || return
	done
	rdma link add "$rxe" type rxe netdev "$ifname"
}

# vm_ib_write_bw RXE SERVER_ADDR SIZE ITERS DIR: perftest's ib_write_bw
# between GID 1 (server) and GID 2 of RXE; prints its MB/sec (2^20 bytes/s)
# for SIZE, nothing when it failed. DIR keeps its output (srv, cli).
vm_ib_write_bw() {
	local rxe=$1 addr=$2 s=$3 iters=$4 dir=$5
	timeout 120 ib_write_bw -d "$rxe" -x 1 -s "$s" -n "$iters" -F >"$dir/srv" 2>&1 &
	sleep 1
	timeout 120 ib_write_bw -d "$rxe" -x 2 -s "$s" -n "$iters" -F "$addr" >"$dir/cli" 2>&1 || true
	wait || true
	awk -v s="$s" '$1 == s && NF >= 4 { print $4 }' "$dir/cli" | tail -1
}
