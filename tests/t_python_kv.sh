#!/usr/bin/env bash
# kcoll.kv, the Python KV-transfer agent (user/python/kcoll/kv.py), against
# the kcolld at $KCOLL_SOCKET (tests/python/kv_check.py local): every byte
# of scattered batches over each memory kind, > 4096 blocks, merging,
# notifications once and in order per sender, errors as exceptions that
# write nothing (bad descriptors, out-of-range entries, a dead owner), the
# full queue (also with batches in flight: the refused ones get ENOBUFS,
# those behind them go on), the GIL released. Then across two hosts of a netns cluster
# (SKIP without root or namespaces): tagged batches from host 1 into host
# 0, every byte checked when its tag arrives; the full queue with batches
# in flight across hosts; once with malloc'd numpy arrays, once with
# segments in kcolld-mapped memory (Agent.alloc; over RDMA in the VM tier's
# t_kv_rdma.sh). Then the prefill/decode
# example (examples/kv_connector.py) on one host and across the pair.
# Needs /usr/bin/python3 with numpy. Bounded: about 20-40 s. TAP.
set -u
shopt -s lastpipe	# emit (cluster_lib.sh), at the end of a pipe, counts in this shell
. "${KCOLL_TOP:?run through tests/run.sh}/tests/cluster_lib.sh"
pick_python
export PYTHONPATH="$top/user/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
export KCOLL_LIB="$B/lib/libkcoll.so.1"

py_asan_preload || skip_all "$why"
"$PY" -c 'import numpy' 2>/dev/null || skip_all "numpy missing for $PY (apt-get install python3-numpy)"

timeout -k 5 120 "$PY" "$top/tests/python/kv_check.py" local 2>&1 | emit
rc=${PIPESTATUS[0]}
ok $rc "kv_check.py local exits 0 within 120 s (exit $rc)"

mkdir -p "$KCOLL_TEST_TMP/kvconn"
timeout -k 5 120 "$PY" "$top/examples/kv_connector.py" both "$KCOLL_TEST_TMP/kvconn" --layers 8 2>&1 | emit
rc=${PIPESTATUS[0]}
ok $rc "examples/kv_connector.py both (one host) exits 0 (exit $rc)"
# --device cuda keeps the pools in GPU memory (torch CUDA tensors): run on a
# GPU by scripts/gpu-check.sh's python_cuda part; here it must refuse, saying why.
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	skip "examples/kv_connector.py --device cuda refusal: torch sees a GPU here (gpu-check runs it)"
else
	out=$(timeout -k 5 60 "$PY" "$top/examples/kv_connector.py" both "$KCOLL_TEST_TMP/kvconn-cuda" --device cuda 2>&1)
	rc=$?
	[ "$rc" -ne 0 ] && grep -qE "sees no GPU \(use --device cpu\)|--device cuda needs torch" <<<"$out"
	ok $? "examples/kv_connector.py --device cuda without a GPU in torch: refused, saying why (exit $rc: $(grep -m1 "error:" <<<"$out"))"
fi

pair() {	# NAME SCRIPT OWNER-ARGS -- INIT-ARGS: host 0 and host 1 of the cluster
	local name=$1 script=$2 d="$T/$1" orc irc
	shift 2
	local oargs=() iargs=()
	while [ "$1" != -- ]; do oargs+=("$1"); shift; done
	shift
	iargs=("$@")
	mkdir -p "$d"
	"$C" exec 0 timeout -k 5 120 "$PY" "$script" "${oargs[@]/DIR/$d}" >"$d/owner.out" 2>&1 &
	local owner=$!
	"$C" exec 1 timeout -k 5 120 "$PY" "$script" "${iargs[@]/DIR/$d}" >"$d/init.out" 2>&1
	irc=$?
	wait "$owner"
	orc=$?
	emit <"$d/init.out"
	emit <"$d/owner.out"
	[ $irc -eq 0 ] && [ $orc -eq 0 ]; ok $? "$name: both sides exit 0 (host 1 $irc, host 0 $orc)"
}

if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
	skip "across hosts: needs root and iproute2 (network namespaces)"
else
	cluster_prefix "pk$$"
	if ! ip netns add "$P-probe" 2>/dev/null; then
		skip "across hosts: cannot create network namespaces here"
	else
		ip netns del "$P-probe"
		cluster_tmp pykv
		chmod 755 "$T"
		trap cluster_cleanup EXIT
		trap 'exit 130' INT TERM
		"$C" up -H 2 >"$T/up.log" 2>&1
		if ok $? "cluster of 2 hosts up (prefix $P)"; then
			pair kv-pair "$top/tests/python/kv_check.py" owner DIR 8 -- init DIR 8
			pair kv-pair-mapped "$top/tests/python/kv_check.py" owner DIR 8 mapped \
				-- init DIR 8 mapped
			pair kv-connector "$top/examples/kv_connector.py" decode DIR --layers 8 -- \
				prefill DIR --layers 8
		else
			cat "$T/up.log"
		fi
	fi
fi
echo "1..$n"
exit $failed
