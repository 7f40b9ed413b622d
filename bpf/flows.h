/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * Records shared by the eBPF flow tracker (flows.bpf.c) and its user-space
 * readers (kcoll_bpf.c, bpftool). __u types only: this header is compiled
 * both by clang -target bpf (with vmlinux.h) and by the host compiler (with
 * <linux/types.h>). Every struct has explicit padding and a size that is a
 * multiple of 8, so the two sides agree without packing attributes.
 *
 * Maps (pinned by name under the pin directory, /sys/fs/bpf/kcoll/ by
 * default; docs/bpf.md shows the bpftool commands):
 *   flows        LRU   kcoll_flow_key  -> kcoll_flow_val    per 5-tuple per interface,
 *                                                           tagged with link and peer host
 *   tcp          LRU   kcoll_flow_key  -> kcoll_tcp_val     sockops: retrans, srtt (ifindex 0)
 *   link_cfg     HASH  kcoll_link_cfg_key -> __u32 link id  filled by the daemon
 *   peer_cfg     HASH  __u32 addr      -> __u32 host index  filled by the daemon
 *   track_ports  ARRAY __u32 slot      -> kcoll_port_range  KCOLL_TRACK_SLOTS port ranges
 *   track_cg     HASH  __u64 cgroup id -> __u32 1           tracked cgroups (and below)
 *   track_flows  LRU   kcoll_flow_key  -> __u32 1           5-tuples learnt from track_cg
 *   settings     ARRAY __u32 0         -> kcoll_bpf_settings
 *   ifaces       HASH  __u32 ifindex   -> __u32 1           where the classifiers are attached
 */
#ifndef KCOLL_BPF_FLOWS_H
#define KCOLL_BPF_FLOWS_H

#define KCOLL_FLOWS_MAX 16384	/* flows map entries (LRU: the oldest go first) */
#define KCOLL_TRACK_SLOTS 16	/* port ranges in track_ports */
#define KCOLL_ROCE_PORT 4791	/* RoCEv2 UDP destination port: always tracked */
#define KCOLL_LINK_NONE 0xffffffffu	/* link_id / peer_host when no config matches */
#define KCOLL_CG_DEPTH 8	/* cgroup ancestors checked against track_cg */

/*
 * One flow as seen from this host: local/remote rather than src/dst, so both
 * directions of a connection add to one record. IPv4 only (the transports
 * kcoll uses between daemons are IPv4); addresses in network byte order,
 * ports in host byte order.
 */
struct kcoll_flow_key {
	__u32 laddr;
	__u32 raddr;
	__u16 lport;
	__u16 rport;
	__u8 proto;		/* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad[3];
	__u32 ifindex;		/* 0 in the tcp map (sockops has no device) */
	__u32 pad2;
};

/* Flow flags (kcoll_flow_val.flags). */
#define KCOLL_FLOW_ROCE		0x1	/* UDP 4791 seen: RoCEv2 */
#define KCOLL_FLOW_BY_PORT	0x2	/* tracked because of a port range */
#define KCOLL_FLOW_BY_CGROUP	0x4	/* tracked because of its cgroup */

struct kcoll_flow_val {
	__u64 tx_bytes;		/* skb->len at tc egress (L3 and up) */
	__u64 tx_pkts;		/* skbs (a GSO skb counts once) */
	__u64 tx_payload;	/* L4 payload bytes */
	__u64 rx_bytes;
	__u64 rx_pkts;
	__u64 rx_payload;
	__u64 roce_pkts;	/* RoCEv2 packets, both directions */
	__u64 first_seen_ns;	/* CLOCK_MONOTONIC at tick resolution (bpf_ktime_get_coarse_ns) */
	__u64 last_seen_ns;	/* same clock */
	__u32 link_id;		/* from link_cfg, or KCOLL_LINK_NONE */
	__u32 peer_host;	/* from peer_cfg, or KCOLL_LINK_NONE */
	__u32 flags;		/* KCOLL_FLOW_* */
	__u32 pad;
};

struct kcoll_tcp_val {
	__u64 retrans;		/* BPF_SOCK_OPS_RETRANS_CB calls */
	__u64 rtt_samples;	/* BPF_SOCK_OPS_RTT_CB calls */
	__u32 srtt_us;		/* smoothed RTT, microseconds (tcp_sock srtt_us >> 3) */
	__u32 total_retrans;	/* tcp_sock total_retrans at the last callback */
	__u64 last_seen_ns;
};

/* link_cfg key: an interface and a local address (0: any address on it). */
struct kcoll_link_cfg_key {
	__u32 ifindex;
	__u32 laddr;
};

/* A tracked port range; a packet matches when its local or remote port is in it. */
struct kcoll_port_range {
	__u16 lo;
	__u16 hi;		/* inclusive; an empty slot has lo > hi (both 0 is port 0 only: never used) */
	__u32 in_use;
};

#define KCOLL_SET_TRACK_ALL	0x1	/* count every IPv4 TCP/UDP flow */

struct kcoll_bpf_settings {
	__u32 flags;		/* KCOLL_SET_* */
	__u32 pad;
	__u64 netns_cookie;	/* sockops: only sockets of this netns (0: any) */
};

#endif
