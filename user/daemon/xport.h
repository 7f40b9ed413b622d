/* SPDX-License-Identifier: MIT */
/*
 * The transport ops table: how the steps of a multi-host op move bytes
 * between daemons (xport_tcp.c, xport_rdma.c; xport.c picks one, net.c
 * gives it to each new communicator as mh->xport, mh.c calls it).
 */
#ifndef KCOLLD_XPORT_H
#define KCOLLD_XPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kd_op;
struct kd_step;
struct kd_mh;

/*
 * The transport ops table: how steps move bytes between daemons. TCP
 * (xport_tcp.c) today; RDMA verbs plug in here. run_steps runs n steps
 * numbered first.. in order; chained (one send and one receive per step, the
 * send of step t being what step t - 1 received) lets piece j of step t go
 * once piece j of step t - 1 is in. Returns 0 or a negative errno with
 * *bad_host the host it failed on (or waited for).
 */
struct kd_xport_ops {
	const char *name;
	/* Once, when xport.c considers it: 0 if usable (it logs what it runs
	 * on), else -errno with why filled in. NULL: always usable. */
	int (*init)(char *why, size_t cap);
	int (*run_steps)(struct kd_mh *mh, struct kd_op *op, const struct kd_step *st, uint32_t n,
			 uint32_t first, bool chain, uint32_t *bad_host);
	/* Release mh->xpriv (the net thread has stopped); NULL: nothing to. */
	void (*close)(struct kd_mh *mh);
	/* kcollctl status: the transport's own state for mh (json: one
	 * "key":value member); NULL: nothing to show. Returns bytes written. */
	size_t (*render)(struct kd_mh *mh, char *buf, size_t cap, int json);
};

extern const struct kd_xport_ops kd_xport_tcp;	/* xport_tcp.c */
extern const struct kd_xport_ops kd_xport_rdma;	/* xport_rdma.c */

/* xport.c: the transport new communicators use (KCOLL_NET_XPORT; auto: the
 * best whose init succeeds, RDMA before TCP, logging why once). */
const struct kd_xport_ops *kd_xport_default(void);
/* xport.c: that choice and why, as logged ("tcp (rdma not used: ...)");
 * "" before kd_xport_default() first ran. For kcollctl status. */
const char *kd_xport_choice(void);

#endif /* KCOLLD_XPORT_H */
