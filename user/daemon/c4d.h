/* SPDX-License-Identifier: MIT */
/*
 * C4 in kcolld (c4d.c, and the files c4d_int.h lists): the detector and
 * planner of multi-host communicators, and the hooks through which the
 * rooms below it report to it.
 *
 * C4 sits above comm.c, mh.c and the network (it sends its reports and
 * plans with net_conn.c's kd_net_ctrl_send). They reach it back only through
 * struct kd_c4_hooks: c4d.c installs its table with kd_c4_start(), which main.c
 * calls at start-up before kd_net_start, so before any multi-host
 * communicator exists. While kd_c4 is NULL (a program that links the
 * daemon's units without main.c) nothing is observed or planned.
 */
#ifndef KCOLLD_C4D_H
#define KCOLLD_C4D_H

#include <stddef.h>
#include <stdint.h>

struct kd_comm;
struct kd_mh;
struct kd_op;
struct kd_phdr;

struct kd_c4_hooks {
	/* the network, control thread: a communicator formed (net_conn.c;
	 * 0 or -errno: the formation fails) and is torn down (net_ctrl.c) */
	int (*attach)(struct kd_comm *comm);
	void (*detach)(struct kd_mh *mh);
	/* comm.c, comm->lock held: a local rank submitted op seq; an op completed */
	void (*submitted)(struct kd_comm *comm, uint32_t rank, uint64_t seq);
	void (*completed)(struct kd_comm *comm, const struct kd_op *op);
	/* net_ctrl.c, control thread: a peer's KD_P_C4, KD_P_PLAN, KD_P_C4_VIEW */
	void (*on_report)(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h);
	void (*on_plan)(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h);
	void (*on_view)(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h);
	/* mh.c, net thread (or an inline op), at the start of op seq: the agreed
	 * plans that apply from it on take effect; waits while a proposal for it
	 * is open. */
	void (*op_start)(struct kd_mh *mh, struct kd_op *op);
	/* net_status.c, kcollctl status: active anomalies over every host of comm (0:
	 * none or no detector); *seen: the hosts that hold one, a bitmap. */
	uint32_t (*summary)(struct kd_comm *comm, uint64_t *seen);
};

/* The installed table (daemon.c holds it); NULL: no detector. */
extern const struct kd_c4_hooks *kd_c4;

/* Install c4d.c's hooks (main.c, at start-up, before kd_net_start). */
void kd_c4_start(void);
/* Control thread, periodically (main.c) */
void kd_c4_tick(int64_t now);
/* Control thread: active anomalies of every communicator, counted by kind
 * into n[0..nkinds) (metrics.c). */
void kd_c4_active_kinds(uint64_t *n, uint32_t nkinds);
/* kcollctl anomalies / events / plan */
size_t kd_c4_render(uint32_t what, uint64_t since, char *buf, size_t cap, uint32_t flags);

#endif /* KCOLLD_C4D_H */
