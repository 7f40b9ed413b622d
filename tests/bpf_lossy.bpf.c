// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/* Test helper for tests/t_bpf.sh: a tc classifier that drops about one
 * data packet in 8 (no netem or police action on the test machines), so that
 * TCP has something to retransmit. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

SEC("tc")
int kcoll_test_lossy(struct __sk_buff *skb)
{
	return skb->len > 1000 && (bpf_get_prandom_u32() & 7) == 0 ? TC_ACT_SHOT : TC_ACT_OK;
}
