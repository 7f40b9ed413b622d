#!/usr/bin/env bash
# Loading and unloading kcoll.ko (guest only, as root). Prints TAP.
#   t_module.sh params KO        bad parameters are refused with a clear message
#   t_module.sh unload KO BIN    rmmod refused while a file, mapping or dma-buf is in use,
#                                clean afterwards; reload works
set -u
mode=$1 ko=$2 bin=${3:-}
n=0 failed=0

t() {	# ok?, description
	n=$((n + 1))
	if [ "$1" -eq 0 ]; then
		echo "ok $n - $2"
	else
		echo "not ok $n - $2"
		failed=$((failed + 1))
	fi
}

loaded() { [ -d /sys/module/kcoll ]; }
gone() { ! loaded && [ ! -e /dev/kcoll ] && [ ! -d /sys/kernel/kcoll ]; }

bad_param() {	# "params", message expected in dmesg
	local before after rc
	before=$(dmesg | grep -cF -- "$2")
	# shellcheck disable=SC2086
	insmod "$ko" $1 2>/dev/null
	rc=$?
	after=$(dmesg | grep -cF -- "$2")
	if [ "$rc" -eq 0 ]; then
		rmmod kcoll
		t 1 "insmod $1 is refused (it loaded)"
		return
	fi
	gone && [ "$after" -gt "$before" ]
	t $? "insmod $1 is refused, dmesg says \"$2\""
}

params() {
	loaded && rmmod kcoll
	bad_param "max_rings=0" "kcoll: max_rings=0 is out of range 1..4096; not loading"
	bad_param "max_rings=4097" "kcoll: max_rings=4097 is out of range"
	bad_param "max_rings=abc" "kcoll: \`abc' invalid for parameter \`max_rings'"
	bad_param "max_rings=-1" "kcoll: \`-1' invalid for parameter \`max_rings'"
	bad_param "max_pinned_mb=0" "kcoll: max_pinned_mb=0 is out of range 1..1048576"
	bad_param "max_pinned_mb=1048577" "kcoll: max_pinned_mb=1048577 is out of range"
	bad_param "max_buf_mb=0" "kcoll: max_buf_mb=0 is out of range"
	bad_param "max_buf_mb=4096 max_pinned_mb=8192" "kcoll: max_buf_mb=4096 is out of range"
	bad_param "max_buf_mb=64 max_pinned_mb=32" \
		"kcoll: max_buf_mb=64 is out of range 1..min(4095, max_pinned_mb=32)"
	bad_param "algo=fast" "kcoll: algo=fast is not one of auto, ring, direct; not loading"

	insmod "$ko" max_rings=1 algo=direct max_buf_mb=1 max_pinned_mb=2
	t $? "insmod with good parameters loads"
	[ "$(cat /sys/kernel/kcoll/algo)" = direct ] &&
		[ "$(cat /sys/module/kcoll/parameters/max_rings)" = 1 ]
	t $? "algo= sets the initial sysfs algo; parameters are visible read-only"
	[ -c /dev/kcoll ] && [ "$(stat -c %a /dev/kcoll)" = 666 ]
	t $? "/dev/kcoll exists with mode 0666"
	rmmod kcoll && gone
	t $? "rmmod removes /dev/kcoll and /sys/kernel/kcoll"
}

wait_for_line() {	# file, line, tries of 0.1 s
	local _
	for _ in $(seq "$3"); do
		grep -qx "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

unload() {
	local out holder refcnt
	loaded || insmod "$ko"
	[ "$(cat /sys/kernel/kcoll/rings)" = 0 ] && [ "$(cat /sys/kernel/kcoll/pinned_pages)" = 0 ] &&
		[ "$(cat /sys/kernel/kcoll/registered_bytes)" = 0 ]
	t $? "after all tests: rings, pinned_pages, registered_bytes are 0"

	exec 3<>/dev/kcoll
	refcnt=$(cat /sys/module/kcoll/refcnt)
	out=$(rmmod kcoll 2>&1)
	loaded && [ "$refcnt" = 1 ] && grep -q "in use" <<<"$out"
	t $? "rmmod refused while a file is open (refcnt $refcnt: $out)"
	exec 3>&-

	out=$(mktemp)
	"$bin/kcoll_dmabuf" --hold >"$out" &
	holder=$!
	wait_for_line "$out" ready 100
	t $? "a process exports a dma-buf and closes /dev/kcoll"
	rmmod kcoll 2>/dev/null
	loaded && [ "$(cat /sys/kernel/kcoll/pinned_pages)" = 1 ]
	t $? "rmmod refused while only a dma-buf remains (its page stays pinned)"
	kill -KILL "$holder"
	wait "$holder" 2>/dev/null
	rm -f "$out"

	out=$(mktemp)
	"$bin/kcoll_ring" --hold >"$out" &
	holder=$!
	wait_for_line "$out" ready 100
	t $? "a process maps a ring and closes its fd"
	rmmod kcoll 2>/dev/null
	loaded
	t $? "rmmod refused while only a mapping remains"
	kill -KILL "$holder"
	wait "$holder" 2>/dev/null
	rm -f "$out"

	rmmod kcoll && gone
	t $? "rmmod succeeds once the last user is gone"
	insmod "$ko" && [ "$(cat /sys/kernel/kcoll/rings)" = 0 ] && rmmod kcoll && gone
	t $? "reload and unload again"
}

case "$mode" in
params) params ;;
unload) unload ;;
*) echo "usage: t_module.sh params KO | unload KO BIN" >&2; exit 2 ;;
esac
echo "1..$n"
[ "$failed" -eq 0 ]
