/* SPDX-License-Identifier: MIT */
/*
 * A multi-host communicator (struct kd_mh, comm->mh): its hosts, streams and
 * the net thread's state (mh.c), the steps an inter-host algorithm is made
 * of (schedule.c builds them, step.c runs them over a transport: xport.h),
 * and the per-stream observations and plan fields the C4 detector keeps
 * (c4d.c).
 * net_boot.c creates it when the communicator forms (from the root's
 * table), net_conn.c starts its thread once every connection is up and
 * net_ctrl.c tears it down.
 */
#ifndef KCOLLD_MH_H
#define KCOLLD_MH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

struct kd_comm;
struct kd_op;
struct kd_pconn;
struct kd_xport_ops;

struct kd_range {
	uint64_t off, len;	/* bytes of the op's accumulator */
};

/* Move ranges to or from one host. */
struct kd_xfer {
	uint32_t host;
	uint32_t nr;
	const struct kd_range *r;
	const uint8_t *base;	/* sends: where the ranges are (NULL: the accumulator) */
	uint8_t *dst;		/* receives, unreduced: where they go (NULL: the accumulator) */
	const uint8_t *src;	/* receives, reduced: our operand (NULL: the accumulator);
				 * the result always goes to the accumulator */
};

/* One step of an inter-host algorithm: every send and receive at once;
 * received pieces are reduced into the accumulator or stored in it. */
struct kd_step {
	uint32_t nsend, nrecv;
	bool reduce;
	struct kd_xfer send[KD_MAX_HOSTS];
	struct kd_xfer recv[KD_MAX_HOSTS];
};

/* A piece: the unit a transport moves and the receiver reduces. */
struct kd_piece {
	uint64_t off, len;
};

/* step.c: cut a transfer's ranges into pieces of at most piece bytes; at
 * least one (empty) piece. malloc'ed; NULL when out of memory. */
struct kd_piece *kd_xfer_cut(const struct kd_xfer *x, size_t piece, uint32_t *n);

struct kd_mh_host {
	struct kd_p_hostinfo info;
	uint32_t first_rank;
	uint32_t nranks;
	struct kd_pconn *ctrl;		/* control connection (control thread) */
	int data[KD_MAX_STREAMS];	/* data streams, -1 until connected */
	int lane;			/* lane to this host until the rank takes it, else -1 */
	bool answered;			/* query round */
	uint64_t submitted[4];
	bool dead;
	/* C4 (c4d.c): the local link (network index) each data stream uses, and
	 * what the net thread moved on it in pieces of KD_C4_OBS_MIN bytes or
	 * more: bytes and the time from a piece's first to its last byte. */
	uint8_t link[KD_MAX_STREAMS];
	_Atomic uint64_t obs_bytes[KD_MAX_STREAMS][2];	/* [stream][0 rx, 1 tx] */
	_Atomic uint64_t obs_busy[KD_MAX_STREAMS][2];
	int64_t obs_end[KD_MAX_STREAMS][2];	/* step.c: busy time counted up to here */
	/* C4 plan, under mh->plan_lock: streams left unused toward this host */
	uint32_t avoid;			/* in force for the op the net thread runs */
	uint32_t next_avoid;		/* agreed: in force from op next_from on */
	uint64_t next_from;
	bool next_valid;
	uint32_t prop_avoid;		/* we proposed it (lower host), no answer yet */
	uint64_t prop_from;
	bool prop_out;
	int64_t prop_sent;
	uint64_t peer_started;		/* its data path's progress, from a refusal */
	uint32_t agreed;		/* control thread: the last mask agreed */
	uint32_t peer_want;		/* control thread: what the peer's planner wants */
	uint32_t peer_steer_recv;	/* control thread: kd_p_c4.steer_recv of the peer */
};

#define KD_C4_OBS_MIN	(64u << 10)

struct kd_c4;

struct kd_mh {
	struct kd_comm *comm;
	uint32_t nhosts, self, nstreams;
	uint32_t algo;			/* enum kd_algo, fixed when the comm formed */
	size_t net_piece;		/* bytes per piece, fixed when the comm formed */
	uint32_t lane_bytes;		/* the ranks' lanes (0: none), fixed when formed */
	_Atomic int64_t last_progress;	/* the net loop moved bytes (hang detection) */
	struct kd_mh_host *hosts;
	uint16_t *rank_host;		/* [nranks] */
	uint32_t conns_needed, conns_up;
	const struct kd_xport_ops *xport;
	void *xpriv;			/* the transport's state (net thread) */
	size_t xpiece;			/* the piece the open transport takes (<= piece) */
	void *xfabric;			/* in-process transports (tests): what hosts share */

	/* net thread */
	pthread_t thread;
	bool thread_started;
	pthread_mutex_t qlock;
	pthread_cond_t qcond;
	struct kd_op *queue;
	bool busy;			/* an op of this comm runs (net thread or inline) */
	bool stop;
	int abort_fd;			/* eventfd: wakes the net thread on abort */
	uint8_t *acc;			/* the op's accumulator: own, or a local rank's buffer */
	uint8_t *own;			/* ours, kept between ops */
	size_t acc_size;
	void *dacc;			/* device buffers: the local reduction on the GPU ... */
	size_t dacc_size;
	int dacc_dev;			/* ... of this device, kept between ops */
	uint8_t *snap;			/* recursive doubling: what we send this step */
	size_t snap_size;
	uint8_t *rx[KD_MAX_HOSTS * KD_MAX_STREAMS];	/* reduce staging per receive stream */
	size_t rx_size;
	size_t piece;			/* bytes per piece (this op) */
	uint32_t sig;			/* this op's parameters, checked on every piece */
	uint8_t redop;			/* this op's reduction between hosts (avg: sum) */
	uint8_t dtype;			/* ... and its element type (integer avg: 64-bit) */
	size_t esz;

	/* what the net thread runs now, for the watchdog */
	_Atomic uint64_t running_seq;	/* UINT64_MAX: none */
	_Atomic int64_t running_since;
	int64_t query_deadline;		/* control thread: a query round is open */
	uint64_t query_seq;
	uint32_t wait_host;		/* the host the net thread waits for */
	uint32_t wait_stream;		/* ... on this stream */
	struct kd_c4 *c4;		/* detector and planner (c4d.c), comm->lock */
	pthread_mutex_t plan_lock;	/* the hosts' plan fields and 'started' */
	uint64_t started;		/* ops the data path has started */

	_Atomic uint64_t bytes_sent, bytes_recv;
};

/* mh.c: the net thread (started by net_conn.c, stopped by net_ctrl.c) and
 * the ops it runs */
int kd_mh_start(struct kd_mh *mh);
void kd_mh_stop(struct kd_mh *mh);
/* A ready op of mh's comm: run it inline if small and the thread is idle,
 * else queue it for the net thread (comm.c reaches it through net.c's
 * struct kd_comm_net_ops). */
void kd_mh_queue(struct kd_op *op);
/* The comm was aborted: the net thread stops waiting on peers. */
void kd_mh_wake(struct kd_mh *mh);

#endif /* KCOLLD_MH_H */
