/* SPDX-License-Identifier: MIT */
/*
 * libkcoll internals shared by its files (not installed, not exported: the
 * version script exports the kcoll_* API only). The files, one job each:
 * conn.c the connection to kcolld, req.c requests on the ring, comm.c
 * communicators and collectives, mem.c memory, lane.c lanes, kv.c KV
 * segments and transfers, strerror.c error sentences (the data types'
 * names and sizes: user/common/dtype.c).
 *
 * Locking: k->ctl_lock serializes control request/reply pairs on the socket;
 * k->ring_lock covers SQ production, CQ consumption and the request table.
 * Neither is held while sleeping on the CQ doorbell. A communicator's
 * lane_lock is taken before ring_lock, never after.
 */
#ifndef KCOLL_LIB_H
#define KCOLL_LIB_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>
#include <kcoll/ring.h>

#include "kdev.h"

enum req_state { REQ_FREE, REQ_PENDING, REQ_DONE };

struct kcoll_req {
	struct kcoll *k;
	uint32_t idx;
	uint32_t gen;
	enum req_state state;
	int res;
	uint32_t err_rank;
	int64_t spin_ns;	/* how long kcoll_wait polls before sleeping */
	struct kcoll_comm *lane_comm;	/* a lane op (lane.c) while it is pending */
	struct kcoll_req *next_free;
};

#define KCOLL_THP_SEEN	16	/* ranges kcoll_thp_collapse remembers */

/* How a region of kcoll_region came to be, and so how it is let go. */
enum kc_region_kind {
	KC_REGION_ALLOC,	/* kcoll_mem_alloc: our mapping, unmapped on free */
	KC_REGION_PINNED,	/* kcoll_mem_register: pinned through /dev/kcoll */
	KC_REGION_SHARED,	/* kcoll_mem_share: the caller's pages, left mapped */
};

struct kcoll_region {
	void *addr;
	size_t size;
	uint64_t kdev_handle;	/* KC_REGION_PINNED: the /dev/kcoll handle */
	enum kc_region_kind kind;
	struct kcoll_region *next;
};

/* A GPU allocation registered with kcolld (MEM_REG_DEV). */
struct kcoll_devreg {
	uint64_t base, size, buffer_id;
	struct kcoll_devreg *next;
};

struct kcoll {
	int sock;
	pthread_mutex_t ctl_lock;
	uint32_t ctl_seq;
	int timeout_ms;
	bool timeout_set;	/* KCOLL_TIMEOUT_MS set in our environment */

	struct kcoll_ring_hdr *ring;
	size_t ring_size;
	pthread_mutex_t ring_lock;
	struct kcoll_queue sq, cq;
	struct kcoll_req *reqs;
	uint32_t nreqs;
	struct kcoll_req *free_reqs;
	int dead;		/* daemon gone: everything fails with -ENOTCONN */
	int64_t spin_ns;
	bool spin_set;		/* KCOLL_SPIN_US given in the environment */

	pthread_mutex_t mem_lock;
	struct kcoll_region *regions;
	struct kcoll_kdev kdev;	/* opened on the first kcoll_mem_register */
	bool kdev_tried;
	uint32_t daemon_pid;

	pthread_mutex_t dev_lock;	/* held across a device registration */
	struct kcoll_devreg *devregs;

	size_t thp_min;		/* KCOLL_THP_MIN_BYTES; 0: no collapsing */
	uint64_t thp_done[KCOLL_THP_SEEN][2];	/* ranges collapsed lately (mem_lock) */
	unsigned int thp_next;
};

struct kcoll_comm {
	struct kcoll *k;
	uint32_t comm_id;
	int rank;
	int nranks;
	uint32_t nhosts;	/* hosts the communicator spans */

	/* Lanes (lane.c): small all-reduces run here, not in kcolld. */
	struct kc_lanes *lanes;
	pthread_mutex_t lane_lock;	/* taken before ring_lock, never after */
	struct kcoll_req *lane_rq;	/* the lane op in flight */
	int64_t lane_checked;		/* when we last asked whether kcolld lives */
};

/* ---- conn.c ---- */

/* One control round trip; reply must hold at least a kcoll_msg_hdr. */
int kcoll_priv_ctl(struct kcoll *k, void *msg, size_t len, int fd, void *reply, size_t cap,
		   int *reply_fd, int timeout_ms);
/* 1 while the daemon is there (and not known dead). */
int kcoll_priv_alive(struct kcoll *k);
/* The daemon's socket has not hung up and its ring is not marked dead. */
int kc_daemon_alive(struct kcoll *k);
int64_t kc_now_ns(void);

/* ---- req.c ---- */

/* Queue one SQE as a request, waits spinning KCOLL_SPIN_US. */
int kcoll_priv_submit(struct kcoll *k, struct kcoll_sqe *sqe, struct kcoll_req **req);
/* The same, waits spinning spin_ns. */
int kc_submit(struct kcoll *k, struct kcoll_sqe *sqe, struct kcoll_req **req, int64_t spin_ns);
/* A free request, made pending: 0 with ring_lock held, or -ENOTCONN / -EBUSY without it. */
int kc_req_take(struct kcoll *k, int64_t spin_ns, struct kcoll_req **out);

/* ---- comm.c ---- */

/* rq is a pending lane op: move it on for up to timeout_ms; 1 once it is over. */
int kc_lane_req_progress(struct kcoll_req *rq, int timeout_ms);

/* ---- mem.c ---- */

/* Is the CUDA driver loaded in this process (cheap enough to ask per op)? */
bool kc_cuda_loaded(void);
/* The SQE memory kind of [ptr, ptr + bytes), registering a device allocation. */
int kc_mem_kind(struct kcoll *k, const void *ptr, size_t bytes, uint8_t *kind);
/* Collapse a large host buffer into huge pages once (a hint). */
void kc_thp_collapse(struct kcoll *k, const void *ptr, size_t bytes);
/* A range kcoll_mem_share claimed for this process is let go. */
void kc_share_drop(const void *lo);

/* ---- lane.c ---- */

/* Lanes (lane.c): small all-reduces run by the ranks, one rank per host.
 * Hosts are the ranks here (err_host is a rank). */
#define KCOLL_LANES_MAX_HOSTS 8
struct kc_lanes;
/* fds[h] for every h != self (taken, set to -1). */
int kc_lanes_new(uint32_t nhosts, uint32_t self, int *fds, uint32_t max_bytes, int timeout_ms,
		 int64_t spin_ns, struct kc_lanes **out);
void kc_lanes_free(struct kc_lanes *l);
/* Our daemon is gone: shut the lanes down so the other ranks see it. */
void kc_lanes_kill(struct kc_lanes *l, int err);
int kc_lanes_fit(const struct kc_lanes *l, size_t bytes);
/* The sticky error (0: none) and the host it names. */
int kc_lanes_error(const struct kc_lanes *l, uint32_t *err_host);
/* Start an all-reduce (sends go out during progress): 0, or the sticky error. */
int kc_lanes_start(struct kc_lanes *l, const void *send, void *recv, size_t count, int dtype, int op);
/* Move the op on for up to timeout_ms (0: one pass, < 0: until done):
 * 1 done (*res, *err_host), 0 still running. */
int kc_lanes_progress(struct kc_lanes *l, int timeout_ms, int daemon_fd, int *res, uint32_t *err_host);

#endif /* KCOLL_LIB_H */
