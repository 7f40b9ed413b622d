/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * Records shared by the flow steering classifiers (steer.bpf.c) and their
 * loader (steer.c, bpftool). Same rules as flows.h: __u types, explicit
 * padding, sizes a multiple of 8.
 *
 * A rule moves the flows between two addresses of one path (the "home" pair,
 * e.g. the eth0 network) onto another path (the "via" pair, e.g. eth1) while
 * the sockets keep seeing the home pair:
 *   egress of the home interface: home pair -> via pair, MACs of the via
 *     interface and its neighbour, bpf_redirect() to the via interface;
 *   ingress of the via interface: via pair -> home pair, then up the stack.
 * Both hosts of a flow need the rule (each for its own side), or the replies
 * take the home path (still correct, just not steered).
 *
 * Maps (pinned by name under the steer pin directory, /sys/fs/bpf/kcoll-steer
 * by default):
 *   steer_out  HASH  kcoll_steer_key (home pair, as this host sends) -> kcoll_steer_val
 *   steer_in   HASH  kcoll_steer_key (via pair, as this host receives,
 *                    local/remote from this host's side)            -> kcoll_steer_val
 *   steer_ifs  HASH  __u32 ifindex -> __u32 KCOLL_STEER_HOOK_* bits (for detach)
 * Ports: 0 in a key is a wildcard; a packet looks up (lport, rport), then
 * (0, rport), then (lport, 0), then (0, 0).
 */
#ifndef KCOLL_BPF_STEER_H
#define KCOLL_BPF_STEER_H

#define KCOLL_STEER_MAX 1024		/* rules per map */
#define KCOLL_STEER_HOOK_EGRESS 0x1	/* steer_out's classifier is on this interface's egress */
#define KCOLL_STEER_HOOK_INGRESS 0x2	/* steer_in's classifier is on this interface's ingress */

/* Addresses network byte order, ports host byte order, from this host's side. */
struct kcoll_steer_key {
	__u32 laddr;
	__u32 raddr;
	__u16 lport;
	__u16 rport;
	__u8 proto;		/* IPPROTO_TCP / IPPROTO_UDP */
	__u8 pad[3];
};

struct kcoll_steer_val {
	__u32 new_laddr;	/* what laddr becomes (steer_out: via; steer_in: home) */
	__u32 new_raddr;
	__u32 ifindex;		/* steer_out: redirect here (the via interface); steer_in: 0 */
	__u8 smac[6];		/* steer_out: the via interface's MAC */
	__u8 dmac[6];		/* steer_out: the via neighbour's MAC */
	__u64 pkts;		/* packets rewritten (GSO packets count once) */
	__u64 bytes;		/* their skb->len */
};

#endif
