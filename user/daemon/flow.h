/* SPDX-License-Identifier: MIT */
/*
 * Flow observation: the hooks through which kcolld_bpf.c (KCOLL_BPF=1, eBPF
 * flow tracking) learns communicators' peers and hands flow statistics and
 * steering to the network and C4. kcolld_bpf.c sets them in kd_bpf_start
 * (main.c, after kd_net_start) and clears them in kd_bpf_stop; while NULL,
 * nothing is tracked. Each is defined where it is read (kd_net_table_hook
 * in net_boot.c, kd_bpf_sums_hook in c4d.c, the steering ones in
 * c4d_plan.c): the tracker depends on them, not they on it.
 */
#ifndef KCOLLD_FLOW_H
#define KCOLLD_FLOW_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/* Called on the control thread when a communicator's host table is installed
 * (flow tracking learns peers' addresses and ports from it); NULL: none. */
extern void (*kd_net_table_hook)(const struct kd_p_hostinfo *hosts, uint32_t nhosts, uint32_t you);
/* BPF flow statistics summed per (peer host, link) over the tracked flows
 * (cumulative counters); c4d.c feeds them to the detector. Set by
 * kcolld_bpf.c while tracking is on (KCOLL_BPF=1), NULL otherwise. Fills
 * at most max, *n: how many; 0 or a negative errno. */
struct kd_bpf_sum {
	uint32_t host, link;
	uint64_t tx_payload, rx_payload, retrans;
	uint32_t srtt_us;	/* the largest of its flows active in the last second; 0 unknown */
	uint32_t nflows;
};
extern int (*kd_bpf_sums_hook)(struct kd_bpf_sum *out, uint32_t max, uint32_t *n);
/* Foreign tracked flows (not kcolld's own streams) follow the C4 plan: per
 * peer host, the links our planner and the peer's want left, the link to use
 * instead, the addresses of both hosts on every link. kcolld_bpf.c moves each
 * such flow with kcoll_steer (two phases, kcoll_steer.h: the sending half
 * only once the peer says it restores on that link) and fills recv_ready.
 * Control thread; NULL while tracking is off. */
#define KD_STEER_LINKS 4
struct kd_steer_want {
	uint32_t host;
	uint32_t avoid_mine, avoid_peer;	/* link bitmaps */
	uint32_t peer_recv;			/* links the peer restores on (its steer_recv) */
	uint32_t via[KD_STEER_LINKS];		/* instead of link l; UINT32_MAX: none */
	uint32_t laddr[KD_STEER_LINKS], raddr[KD_STEER_LINKS];	/* network order; 0 unknown */
	uint32_t recv_ready;			/* out: links we restore on (for our steer_recv) */
};
extern void (*kd_bpf_steer_hook)(struct kd_steer_want *w, uint32_t n, int64_t now);
/* `kcollctl plan`: the foreign flows and why (text or a JSON array). */
extern size_t (*kd_bpf_steer_render)(char *buf, size_t cap, int json);

#endif /* KCOLLD_FLOW_H */
