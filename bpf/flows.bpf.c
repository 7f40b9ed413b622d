// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * kcoll flow tracker: tc ingress/egress classifiers that count tracked IPv4
 * TCP/UDP flows per 5-tuple, tagged with kcoll link and peer host (readers
 * sum per link: one map update per packet, not two), and a sockops
 * program that adds TCP retransmissions and smoothed RTT. Never drops or
 * changes a packet (always TC_ACT_OK). Record layout: flows.h; maps and
 * bpftool commands: docs/bpf.md.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "bpf_common.h"
#include "flows.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

KCOLL_PINNED_MAP(BPF_MAP_TYPE_LRU_HASH, KCOLL_FLOWS_MAX, struct kcoll_flow_key,
		 struct kcoll_flow_val) flows SEC(".maps");

KCOLL_PINNED_MAP(BPF_MAP_TYPE_LRU_HASH, KCOLL_FLOWS_MAX, struct kcoll_flow_key,
		 struct kcoll_tcp_val) tcp SEC(".maps");

KCOLL_PINNED_MAP(BPF_MAP_TYPE_HASH, 256, struct kcoll_link_cfg_key, __u32) link_cfg SEC(".maps");

KCOLL_PINNED_MAP(BPF_MAP_TYPE_HASH, 1024, __u32, __u32) peer_cfg SEC(".maps");

KCOLL_PINNED_MAP(BPF_MAP_TYPE_ARRAY, KCOLL_TRACK_SLOTS, __u32,
		 struct kcoll_port_range) track_ports SEC(".maps");

KCOLL_PINNED_MAP(BPF_MAP_TYPE_HASH, 64, __u64, __u32) track_cg SEC(".maps");

KCOLL_PINNED_MAP(BPF_MAP_TYPE_LRU_HASH, KCOLL_FLOWS_MAX, struct kcoll_flow_key,
		 __u32) track_flows SEC(".maps");

KCOLL_PINNED_MAP(BPF_MAP_TYPE_ARRAY, 1, __u32, struct kcoll_bpf_settings) settings SEC(".maps");

KCOLL_PINNED_MAP(BPF_MAP_TYPE_HASH, 256, __u32, __u32) ifaces SEC(".maps");

static __always_inline int port_tracked(__u16 a, __u16 b)
{
	for (__u32 i = 0; i < KCOLL_TRACK_SLOTS; i++) {
		__u32 k = i;
		struct kcoll_port_range *r = bpf_map_lookup_elem(&track_ports, &k);

		if (!r || !r->in_use)
			continue;
		if ((a >= r->lo && a <= r->hi) || (b >= r->lo && b <= r->hi))
			return 1;
	}
	return 0;
}

/* At egress the skb belongs to a local socket: is it in a tracked cgroup? */
static __always_inline int cgroup_tracked(struct __sk_buff *skb)
{
	for (int lvl = 1; lvl <= KCOLL_CG_DEPTH; lvl++) {
		__u64 id = bpf_skb_ancestor_cgroup_id(skb, lvl);

		if (!id)
			break;
		if (bpf_map_lookup_elem(&track_cg, &id))
			return 1;
	}
	return 0;
}

static __always_inline int count(struct __sk_buff *skb, int egress)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct kcoll_flow_key k = {};
	struct kcoll_flow_val *v;
	struct iphdr *ip;
	__u32 zero = 0, hdr, flags = 0;
	__u16 sport, dport;
	__u64 len, payload;
	struct kcoll_bpf_settings *s;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > end || ip->ihl < 5)
		return TC_ACT_OK;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return TC_ACT_OK;
	if (ip->frag_off & bpf_htons(0x1fff))
		return TC_ACT_OK;	/* a non-first fragment carries no ports */
	hdr = ip->ihl * 4;
	if (ip->protocol == IPPROTO_TCP) {
		struct tcphdr *th = (void *)ip + hdr;

		if ((void *)(th + 1) > end)
			return TC_ACT_OK;
		sport = bpf_ntohs(th->source);
		dport = bpf_ntohs(th->dest);
		hdr += th->doff * 4;
	} else {
		struct udphdr *uh = (void *)ip + hdr;

		if ((void *)(uh + 1) > end)
			return TC_ACT_OK;
		sport = bpf_ntohs(uh->source);
		dport = bpf_ntohs(uh->dest);
		hdr += sizeof(*uh);
		if (dport == KCOLL_ROCE_PORT)
			flags |= KCOLL_FLOW_ROCE;
	}

	k.proto = ip->protocol;
	k.ifindex = skb->ifindex;
	if (egress) {
		k.laddr = ip->saddr;
		k.raddr = ip->daddr;
		k.lport = sport;
		k.rport = dport;
	} else {
		k.laddr = ip->daddr;
		k.raddr = ip->saddr;
		k.lport = dport;
		k.rport = sport;
	}

	v = bpf_map_lookup_elem(&flows, &k);
	if (!v) {
		struct kcoll_link_cfg_key ck = { .ifindex = k.ifindex, .laddr = k.laddr };
		struct kcoll_flow_val nv = {};
		__u32 *id;

		s = bpf_map_lookup_elem(&settings, &zero);
		if (port_tracked(k.lport, k.rport))
			flags |= KCOLL_FLOW_BY_PORT;
		if (egress && cgroup_tracked(skb))
			flags |= KCOLL_FLOW_BY_CGROUP;
		if (!(flags & KCOLL_FLOW_BY_CGROUP)) {
			struct kcoll_flow_key tk = k;

			tk.ifindex = 0;
			if (bpf_map_lookup_elem(&track_flows, &tk))
				flags |= KCOLL_FLOW_BY_CGROUP;
		} else {
			struct kcoll_flow_key tk = k;
			__u32 one = 1;

			tk.ifindex = 0;	/* the sockops program and ingress look it up too */
			bpf_map_update_elem(&track_flows, &tk, &one, BPF_ANY);
		}
		if (!flags && !(s && (s->flags & KCOLL_SET_TRACK_ALL)))
			return TC_ACT_OK;

		nv.link_id = KCOLL_LINK_NONE;
		nv.peer_host = KCOLL_LINK_NONE;
		id = bpf_map_lookup_elem(&link_cfg, &ck);
		if (!id) {
			ck.laddr = 0;
			id = bpf_map_lookup_elem(&link_cfg, &ck);
		}
		if (id)
			nv.link_id = *id;
		id = bpf_map_lookup_elem(&peer_cfg, &k.raddr);
		if (id)
			nv.peer_host = *id;
		nv.flags = flags;
		nv.first_seen_ns = bpf_ktime_get_coarse_ns();
		bpf_map_update_elem(&flows, &k, &nv, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&flows, &k);
		if (!v)
			return TC_ACT_OK;
	}

	if (v->peer_host == KCOLL_LINK_NONE) {
		/* The daemon learns peers when a communicator forms, after its
		 * bootstrap connections opened: tag those flows once it knows. */
		__u32 *peer = bpf_map_lookup_elem(&peer_cfg, &k.raddr);

		if (peer)
			v->peer_host = *peer;
	}
	len = skb->len - ETH_HLEN;
	payload = skb->len > ETH_HLEN + hdr ? skb->len - ETH_HLEN - hdr : 0;
	if (egress) {
		__sync_fetch_and_add(&v->tx_bytes, len);
		__sync_fetch_and_add(&v->tx_pkts, 1);
		__sync_fetch_and_add(&v->tx_payload, payload);
	} else {
		__sync_fetch_and_add(&v->rx_bytes, len);
		__sync_fetch_and_add(&v->rx_pkts, 1);
		__sync_fetch_and_add(&v->rx_payload, payload);
	}
	if (flags & KCOLL_FLOW_ROCE || (k.proto == IPPROTO_UDP &&
	    (k.lport == KCOLL_ROCE_PORT || k.rport == KCOLL_ROCE_PORT)))
		__sync_fetch_and_add(&v->roce_pkts, 1);
	v->last_seen_ns = bpf_ktime_get_coarse_ns();	/* tick resolution: cheaper per packet */
	return TC_ACT_OK;
}

SEC("tc")
int kcoll_ingress(struct __sk_buff *skb)
{
	return count(skb, 0);
}

SEC("tc")
int kcoll_egress(struct __sk_buff *skb)
{
	return count(skb, 1);
}

/*
 * sockops: turn on the RETRANS and RTT callbacks for tracked connections when
 * they are established, then record each retransmission and the smoothed RTT.
 */
static __always_inline void sock_key(struct bpf_sock_ops *skops, struct kcoll_flow_key *k)
{
	k->laddr = skops->local_ip4;
	k->raddr = skops->remote_ip4;
	k->lport = (__u16)skops->local_port;			/* host order */
	k->rport = bpf_ntohl(skops->remote_port) & 0xffff;	/* network order in the low 16 bits */
	k->proto = IPPROTO_TCP;
}

SEC("sockops")
int kcoll_sockops(struct bpf_sock_ops *skops)
{
	struct kcoll_flow_key k = {};
	struct kcoll_bpf_settings *s;
	struct kcoll_tcp_val *v;
	__u32 zero = 0, op = skops->op;

	if (skops->family != 2 /* AF_INET */)
		return 1;
	s = bpf_map_lookup_elem(&settings, &zero);
	if (s && s->netns_cookie && bpf_get_netns_cookie(skops) != s->netns_cookie)
		return 1;
	sock_key(skops, &k);

	switch (op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		if (!(s && (s->flags & KCOLL_SET_TRACK_ALL)) &&
		    !port_tracked(k.lport, k.rport) && !bpf_map_lookup_elem(&track_flows, &k))
			return 1;
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
					  BPF_SOCK_OPS_RETRANS_CB_FLAG | BPF_SOCK_OPS_RTT_CB_FLAG);
		break;
	case BPF_SOCK_OPS_RETRANS_CB:
	case BPF_SOCK_OPS_RTT_CB:
		break;
	default:
		return 1;
	}

	v = bpf_map_lookup_elem(&tcp, &k);
	if (!v) {
		struct kcoll_tcp_val z = {};

		bpf_map_update_elem(&tcp, &k, &z, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&tcp, &k);
		if (!v)
			return 1;
	}
	if (op == BPF_SOCK_OPS_RETRANS_CB)
		__sync_fetch_and_add(&v->retrans, 1);
	else if (op == BPF_SOCK_OPS_RTT_CB)
		__sync_fetch_and_add(&v->rtt_samples, 1);
	v->srtt_us = skops->srtt_us >> 3;
	v->total_retrans = skops->total_retrans;
	v->last_seen_ns = bpf_ktime_get_coarse_ns();
	return 1;
}
