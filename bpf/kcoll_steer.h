/* SPDX-License-Identifier: MIT */
/*
 * kcoll_steer: move foreign IPv4 TCP/UDP flows between two paths with a tc
 * classifier pair (steer.bpf.c, records in steer.h), transparently for the
 * sockets. A rule names a flow by its "home" address pair (what the sockets
 * use, e.g. eth0's network) and optional ports, and the "via" pair it should
 * travel on (e.g. eth1's network). This host's egress of the home pair goes
 * out of the via interface with the via addresses; what arrives on the via
 * interface with the via addresses (and the rule's ports) is given back the
 * home addresses. The peer host needs the mirror rule for its direction.
 * Deleting the rule moves the flow back at once (TCP does not notice: the
 * sockets never saw another address).
 *
 * Order matters across the two hosts: a packet that arrives with the via
 * addresses before the receiver restores them meets no socket and is
 * answered with a RST, which kills the flow. So move a flow in two phases:
 *   on: add with KCOLL_STEER_RECV_ONLY on both hosts, then add on both;
 *   off: add with KCOLL_STEER_RECV_ONLY on both hosts (both send on the home
 *        path again, late via packets are still restored), then del on both.
 *
 * Programs and maps are pinned under a directory of bpffs (pin NULL:
 * KCOLL_STEER_PIN_DEFAULT), loaded and attached by the first kcoll_steer_add
 * in a network namespace; kcoll_steer_detach removes filters and pins.
 * Interface indexes are per network namespace: call everything from the
 * namespace of the interfaces, one pin directory per namespace.
 *
 * Every function returns 0 or a negative errno; on failure msg (if not NULL)
 * holds a sentence saying what to do.
 *
 * Planner use: for a flow it wants on the other network, run the "on"
 * sequence above on both hosts (home = the flow's addresses, via = the same
 * hosts' addresses on the other network), and the "off" sequence to move it
 * back. Rules are map updates: re-planning attaches nothing.
 */
#ifndef KCOLL_STEER_H
#define KCOLL_STEER_H

#include <stddef.h>
#include <linux/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KCOLL_STEER_PIN_DEFAULT "/sys/fs/bpf/kcoll-steer"

/* rule flags */
#define KCOLL_STEER_RECV_ONLY 0x1	/* restore what arrives on the via path, send on home */

struct kcoll_steer_rule {
	__u8 proto;			/* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
	__u32 flags;			/* KCOLL_STEER_*; foreach reports RECV_ONLY too */
	__u16 lport, rport;		/* host byte order; 0 = any */
	__u32 home_laddr, home_raddr;	/* network byte order: what the sockets use */
	__u32 via_laddr, via_raddr;	/* network byte order: the other path */
	int via_ifindex;		/* where via_laddr lives (0: found from via_laddr) */
	int home_ifindex;		/* where home_laddr lives (0: found from home_laddr) */
	/* Filled by kcoll_steer_foreach (ignored by add/del): */
	__u8 via_dmac[6];		/* the neighbour MAC the rule sends to */
	__u64 out_pkts, out_bytes;	/* packets steered out (GSO packets count once) */
	__u64 in_pkts, in_bytes;	/* packets restored on the way in */
};

typedef int (*kcoll_steer_cb)(const struct kcoll_steer_rule *r, void *arg);

/* Add (or replace) a rule; loads and attaches the classifiers when needed.
 * With KCOLL_STEER_RECV_ONLY only the restoring half is installed (and this
 * host's sending half removed if it was there).
 * Resolves the via neighbour's MAC (sends one UDP datagram to make the
 * kernel ask ARP if it is not known yet). */
int kcoll_steer_add(const char *pin, const struct kcoll_steer_rule *r, char *msg, size_t len);
/* Delete the rule (both halves) with this proto, home pair and ports;
 * -ENOENT if none. */
int kcoll_steer_del(const char *pin, const struct kcoll_steer_rule *r, char *msg, size_t len);
/* Walk the rules (-ENOENT: nothing loaded in this pin directory). */
int kcoll_steer_foreach(const char *pin, kcoll_steer_cb cb, void *arg, char *msg, size_t len);
/* Remove the classifiers from every interface and every pin. Idempotent. */
int kcoll_steer_detach(const char *pin, char *msg, size_t len);

#ifdef __cplusplus
}
#endif
#endif
