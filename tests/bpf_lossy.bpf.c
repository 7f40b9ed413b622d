// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/* Test helper for tests/t_bpf.sh: a tc classifier that drops every 8th data
 * packet (no netem or police action on the test machines), so that TCP has
 * something to retransmit. Counted, not random: a random 1-in-8 drop let a
 * 3 MB transfer of a few dozen GSO packets through untouched once in CI. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lossy_seen SEC(".maps");

SEC("tc")
int kcoll_test_lossy(struct __sk_buff *skb)
{
	__u32 zero = 0;
	__u64 *seen;

	if (skb->len <= 1000)
		return TC_ACT_OK;
	seen = bpf_map_lookup_elem(&lossy_seen, &zero);
	if (!seen)
		return TC_ACT_OK;
	return (__sync_fetch_and_add(seen, 1) & 7) == 7 ? TC_ACT_SHOT : TC_ACT_OK;
}
