/* SPDX-License-Identifier: MIT */
/*
 * kcoll_bpf: load, attach and read the eBPF collective-traffic tracker.
 *
 * The tracker is two tc classifiers (ingress and egress, on every interface
 * named at attach) and one sockops program (on the cgroup v2 root) that count
 * IPv4 TCP/UDP traffic per flow (5-tuple + interface), each flow tagged with
 * its kcoll link and peer host, with TCP retransmissions and smoothed RTT.
 * Only tracked flows are counted: a port range (kcoll_bpf_track_ports), a cgroup
 * (kcoll_bpf_track_cgroup), RoCEv2 (UDP 4791, always), or everything
 * (KCOLL_BPF_TRACK_ALL). Its state lives in maps and programs pinned under
 * a directory of bpffs (KCOLL_BPF_PIN_DEFAULT unless opts say otherwise), so
 * it outlives the process that attached it: any process (kcolld, kcoll-bpf,
 * the c4 detector, bpftool) reads it from the pins, and kcoll_bpf_detach
 * removes it.
 *
 * Conventions: every function returns 0 or a negative errno; nothing is
 * global (a struct kcoll_bpf is one pin directory). Errors that a person
 * must act on (no bpffs, no permission) are also described in a message
 * kcoll_bpf_strerror() returns for that handle.
 *
 * Typical use (daemon):
 *	struct kcoll_bpf *b;
 *	struct kcoll_bpf_opts o = { .size = sizeof(o) };
 *	err = kcoll_bpf_open(&b, &o);                  // mounts bpffs if needed
 *	err = kcoll_bpf_attach(b, ifindexes, n);       // loads + pins on first use
 *	err = kcoll_bpf_track_ports(b, 40000, 40100);
 *	err = kcoll_bpf_set_link(b, ifindex, laddr, link_id);
 *	err = kcoll_bpf_set_peer(b, raddr, host);
 *	...
 *	err = kcoll_bpf_flows_foreach(b, cb, arg);     // reader: pins only
 *	kcoll_bpf_close(b);                            // leaves it attached
 *	kcoll_bpf_detach(b) before close to remove everything.
 *
 * A reader (kcoll-bpf flows, the detector) only needs kcoll_bpf_open with
 * KCOLL_BPF_OPEN_READ: it opens the pinned maps and never loads anything.
 */
#ifndef KCOLL_BPF_H
#define KCOLL_BPF_H

#include <stdint.h>
#include <linux/types.h>

#include "flows.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KCOLL_BPF_PIN_DEFAULT "/sys/fs/bpf/kcoll"

/*
 * Pin directory dir must sit directly in a bpf filesystem: when its parent is
 * /sys/fs/bpf and none is mounted there, mount one (root; not from a private
 * mount namespace such as ip netns exec's). 0, or a negative errno with msg
 * saying what to do (example: a pin directory to name).
 */
int kcoll_bpffs_ensure(const char *dir, const char *example, char *msg, size_t len);

#define KCOLL_BPF_OPEN_READ	0x1	/* open the pins only; -ENOENT when not attached */
#define KCOLL_BPF_TRACK_ALL	0x2	/* at attach: count every IPv4 TCP/UDP flow */
#define KCOLL_BPF_NO_SOCKOPS	0x4	/* at attach: no sockops (no retrans/RTT) */

struct kcoll_bpf_opts {
	__u32 size;		/* sizeof(struct kcoll_bpf_opts) */
	__u32 flags;		/* KCOLL_BPF_* */
	const char *pin_dir;	/* NULL: KCOLL_BPF_PIN_DEFAULT */
	const char *cgroup;	/* sockops attach point; NULL: the cgroup v2 mount */
};

struct kcoll_bpf;

/* One flow, the shape the detector consumes (c4 helper). */
struct kcoll_bpf_flow {
	__u32 laddr, raddr;		/* network byte order */
	__u16 lport, rport;		/* host byte order */
	__u8 proto;			/* IPPROTO_TCP / IPPROTO_UDP */
	__u32 ifindex;
	__u32 link_id;			/* KCOLL_LINK_NONE if not configured */
	__u32 peer_host;		/* KCOLL_LINK_NONE if unknown */
	__u32 flags;			/* KCOLL_FLOW_* */
	__u64 tx_bytes, tx_pkts, tx_payload;
	__u64 rx_bytes, rx_pkts, rx_payload;
	__u64 roce_pkts;
	__u64 retrans;			/* TCP only; 0 without sockops */
	__u32 srtt_us;			/* TCP only; 0 when unknown */
	__u64 first_seen_ns, last_seen_ns;	/* CLOCK_MONOTONIC */
};

/* Totals per (link, peer host), summed over the flows; link_id/peer_host may
 * be KCOLL_LINK_NONE. */
struct kcoll_bpf_link {
	__u32 link_id;
	__u32 peer_host;
	__u64 tx_bytes, tx_pkts, rx_bytes, rx_pkts;
	__u64 last_seen_ns;
};

/* Callbacks return 0 to go on, anything else stops the walk and is returned. */
typedef int (*kcoll_bpf_flow_cb)(const struct kcoll_bpf_flow *f, void *arg);
typedef int (*kcoll_bpf_link_cb)(const struct kcoll_bpf_link *l, void *arg);

/* Open a handle on a pin directory; mounts bpffs on /sys/fs/bpf if absent. */
int kcoll_bpf_open(struct kcoll_bpf **out, const struct kcoll_bpf_opts *opts);
/* Close the handle; what is attached stays attached. NULL is fine. */
void kcoll_bpf_close(struct kcoll_bpf *b);
/* Human-readable reason for the last failure on this handle (never NULL). */
const char *kcoll_bpf_strerror(const struct kcoll_bpf *b);
/* Same for a failed kcoll_bpf_open (its handle does not exist): thread-local. */
const char *kcoll_bpf_open_error(void);

/* Load (once), pin, and attach the classifiers to these interfaces (more
 * calls add interfaces; attaching one again replaces our filter on it).
 * -ENOMEDIUM: no cgroup v2 is mounted here for sockops (open with
 * KCOLL_BPF_NO_SOCKOPS to go without retransmissions and RTT). */
int kcoll_bpf_attach(struct kcoll_bpf *b, const int *ifindex, int n);
/* By name: a comma-separated list ("eth0,eth1"). */
int kcoll_bpf_attach_names(struct kcoll_bpf *b, const char *ifnames);
/* Remove the classifiers from every interface, the sockops program from its
 * cgroup, and every pin (the directory too). Idempotent. -EXDEV from
 * another network namespace than the one that attached (its ifindexes). */
int kcoll_bpf_detach(struct kcoll_bpf *b);

/* Tracking filter. Ports match either end of a flow. */
int kcoll_bpf_track_ports(struct kcoll_bpf *b, __u16 lo, __u16 hi);
int kcoll_bpf_untrack_ports(struct kcoll_bpf *b, __u16 lo, __u16 hi);
/* A cgroup v2 directory (its sockets and those of its descendants). */
int kcoll_bpf_track_cgroup(struct kcoll_bpf *b, const char *cgroup_path);
int kcoll_bpf_set_track_all(struct kcoll_bpf *b, int on);

/* Link / peer config (the daemon fills it): laddr 0 = any address on ifindex. */
int kcoll_bpf_set_link(struct kcoll_bpf *b, __u32 ifindex, __u32 laddr, __u32 link_id);
int kcoll_bpf_set_peer(struct kcoll_bpf *b, __u32 raddr, __u32 host);

/* Readers: walk the pinned maps (a snapshot per entry, not of the whole map). */
int kcoll_bpf_flows_foreach(struct kcoll_bpf *b, kcoll_bpf_flow_cb cb, void *arg);
int kcoll_bpf_links_foreach(struct kcoll_bpf *b, kcoll_bpf_link_cb cb, void *arg);
/* Sum of every (link, peer) entry of one link (peer KCOLL_LINK_NONE in *out). */
int kcoll_bpf_link_total(struct kcoll_bpf *b, __u32 link_id, struct kcoll_bpf_link *out);
/* Zero every counter (flows, tcp); config and filters stay. */
int kcoll_bpf_reset(struct kcoll_bpf *b);

#ifdef __cplusplus
}
#endif
#endif
