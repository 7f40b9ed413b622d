// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * kcoll flow steering: move foreign IPv4 TCP/UDP flows from one path to
 * another without the sockets noticing. kcoll_steer_out (tc egress of the home
 * interface) rewrites the home address pair to the via pair, sets the via
 * interface's MACs and redirects the packet there; kcoll_steer_in (tc ingress
 * of the via interface) rewrites the via pair back to the home pair and lets
 * the packet go up the stack. Checksums are updated incrementally (the TCP/UDP
 * pseudo header too, which also keeps CHECKSUM_PARTIAL/GSO packets right).
 * Packets that match no rule pass untouched. Records and lookup order: steer.h.
 *
 * These filters sit before the flow tracker's (flows.bpf.c, a lower tc
 * priority number): a packet they do not redirect goes on to the next filter
 * (TC_ACT_UNSPEC), else the tracker would stop counting on every interface
 * the steering classifiers are attached to.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "bpf_common.h"
#include "steer.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

KCOLL_PINNED_MAP(BPF_MAP_TYPE_HASH, KCOLL_STEER_MAX, struct kcoll_steer_key,
		 struct kcoll_steer_val) steer_out SEC(".maps");

KCOLL_PINNED_MAP(BPF_MAP_TYPE_HASH, KCOLL_STEER_MAX, struct kcoll_steer_key,
		 struct kcoll_steer_val) steer_in SEC(".maps");

KCOLL_PINNED_MAP(BPF_MAP_TYPE_HASH, 64, __u32, __u32) steer_ifs SEC(".maps");

struct pkt {
	struct kcoll_steer_key key;
	__u32 l4_off;		/* offset of the TCP/UDP header */
	__u32 csum_off;		/* offset of its checksum field */
};

/* Parse an IPv4 TCP/UDP packet, key from this host's side (out: src is local). */
static __always_inline int parse(struct __sk_buff *skb, int out, struct pkt *p)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *iph = data + ETH_HLEN;
	__u16 *ports;
	__u32 ihl;

	if ((void *)(iph + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	if (iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP)
		return -1;
	if (iph->frag_off & bpf_htons(0x3fff))	/* fragments: no ports to match */
		return -1;
	ihl = iph->ihl * 4;
	if (ihl < sizeof(*iph))
		return -1;
	ports = data + ETH_HLEN + ihl;
	if ((void *)(ports + 2) > end)
		return -1;
	__builtin_memset(&p->key, 0, sizeof(p->key));
	p->key.proto = iph->protocol;
	p->key.laddr = out ? iph->saddr : iph->daddr;
	p->key.raddr = out ? iph->daddr : iph->saddr;
	p->key.lport = bpf_ntohs(out ? ports[0] : ports[1]);
	p->key.rport = bpf_ntohs(out ? ports[1] : ports[0]);
	p->l4_off = ETH_HLEN + ihl;
	p->csum_off = p->l4_off + (iph->protocol == IPPROTO_TCP ? 16 : 6);
	return 0;
}

static __always_inline struct kcoll_steer_val *find(void *map, struct kcoll_steer_key *k)
{
	struct kcoll_steer_val *v;
	__u16 lp = k->lport, rp = k->rport;

	v = bpf_map_lookup_elem(map, k);
	if (v)
		return v;
	k->lport = 0;
	v = bpf_map_lookup_elem(map, k);
	if (v)
		return v;
	k->lport = lp;
	k->rport = 0;
	v = bpf_map_lookup_elem(map, k);
	if (v)
		return v;
	k->lport = 0;
	v = bpf_map_lookup_elem(map, k);
	k->rport = rp;
	k->lport = lp;
	return v;
}

/* Replace one IPv4 address (at off in the IP header) and fix both checksums. */
static __always_inline int set_addr(struct __sk_buff *skb, const struct pkt *p, __u32 off,
				    __u32 from, __u32 to)
{
	__u64 l4f = BPF_F_PSEUDO_HDR | sizeof(to);

	if (from == to)
		return 0;
	if (p->key.proto == IPPROTO_UDP)
		l4f |= BPF_F_MARK_MANGLED_0;	/* UDP checksum 0 = none: keep it 0 */
	if (bpf_l4_csum_replace(skb, p->csum_off, from, to, l4f))
		return -1;
	if (bpf_l3_csum_replace(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, check), from, to, sizeof(to)))
		return -1;
	return bpf_skb_store_bytes(skb, ETH_HLEN + off, &to, sizeof(to), 0) ? -1 : 0;
}

/* Rewrite src/dst; returns -1 if the packet could not be rewritten (drop it:
 * half-rewritten packets must not leave). */
static __always_inline int rewrite(struct __sk_buff *skb, const struct pkt *p, __u32 src_from,
				   __u32 src_to, __u32 dst_from, __u32 dst_to)
{
	if (set_addr(skb, p, __builtin_offsetof(struct iphdr, saddr), src_from, src_to))
		return -1;
	return set_addr(skb, p, __builtin_offsetof(struct iphdr, daddr), dst_from, dst_to);
}

SEC("tc")
int kcoll_steer_out(struct __sk_buff *skb)
{
	struct kcoll_steer_val *v;
	struct pkt p;

	if (parse(skb, 1, &p))
		return TC_ACT_UNSPEC;
	v = find(&steer_out, &p.key);
	if (!v || !v->ifindex)
		return TC_ACT_UNSPEC;
	__sync_fetch_and_add(&v->pkts, 1);
	__sync_fetch_and_add(&v->bytes, skb->len);
	if (rewrite(skb, &p, p.key.laddr, v->new_laddr, p.key.raddr, v->new_raddr))
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, 0, v->dmac, 6, 0) || bpf_skb_store_bytes(skb, 6, v->smac, 6, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(v->ifindex, 0);
}

SEC("tc")
int kcoll_steer_in(struct __sk_buff *skb)
{
	struct kcoll_steer_val *v;
	struct pkt p;

	if (parse(skb, 0, &p))
		return TC_ACT_UNSPEC;
	v = find(&steer_in, &p.key);
	if (!v)
		return TC_ACT_UNSPEC;
	__sync_fetch_and_add(&v->pkts, 1);
	__sync_fetch_and_add(&v->bytes, skb->len);
	/* in: src is the remote end, dst the local one. */
	if (rewrite(skb, &p, p.key.raddr, v->new_raddr, p.key.laddr, v->new_laddr))
		return TC_ACT_SHOT;
	return TC_ACT_UNSPEC;
}
