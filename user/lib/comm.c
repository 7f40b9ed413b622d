// SPDX-License-Identifier: MIT
/*
 * libkcoll: communicators and the collective calls. Creating and destroying
 * a communicator (and taking its lanes), checking and submitting each
 * collective, and running the small all-reduces that go over lanes
 * (lane.c does their exchange) as requests like the others.
 * Locking: lib.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>
#include <kcoll/ring.h>

#include "lib.h"
#include "log.h"

/* ---- lane ops (lane.c does the exchange) ---- */

/* Complete c's lane op. lane_lock and ring_lock held. */
static void lane_done(struct kcoll_comm *c, int res, uint32_t err_rank)
{
	struct kcoll_req *rq = c->lane_rq;

	rq->state = REQ_DONE;
	rq->res = res;
	rq->err_rank = res ? err_rank : KCOLL_RANK_NONE;
	rq->lane_comm = NULL;
	c->lane_rq = NULL;
}

/* Move c's lane op on for up to timeout_ms (0: one pass, < 0: until it
 * ends): 1 when there is none (any more), 0 while it runs. lane_lock held. */
static int lane_progress(struct kcoll_comm *c, int timeout_ms)
{
	struct kcoll *k = c->k;
	uint32_t host;
	int res;

	if (!c->lane_rq)
		return 1;
	if (kcoll_load_relaxed(&k->dead) || (kcoll_load_relaxed(&k->ring->status) & KCOLL_RING_DEAD))
		kc_lanes_kill(c->lanes, -ENOTCONN);
	if (!kc_lanes_progress(c->lanes, timeout_ms, k->sock, &res, &host))
		return 0;
	pthread_mutex_lock(&k->ring_lock);
	if (res == -ENOTCONN && host == KCOLL_RANK_NONE)
		k->dead = 1;	/* the lanes saw kcolld go: so does everything else */
	lane_done(c, res, host);
	pthread_mutex_unlock(&k->ring_lock);
	return 1;
}

static int lane_submit(struct kcoll_comm *c, const void *send, void *recv, size_t count, int dtype,
		       int op, struct kcoll_req **req)
{
	struct kcoll *k = c->k;
	struct kcoll_req *rq;
	int64_t now;
	int r;

	pthread_mutex_lock(&c->lane_lock);
	/* A communicator's lane ops run one at a time, in the order issued. */
	lane_progress(c, -1);
	r = kc_req_take(k, 0, &rq);
	if (r) {
		if (r == -ENOTCONN)
			kc_lanes_kill(c->lanes, r);
		pthread_mutex_unlock(&c->lane_lock);
		return r;
	}
	rq->lane_comm = c;
	c->lane_rq = rq;
	pthread_mutex_unlock(&k->ring_lock);
	/* Is kcolld still there? At most once a millisecond (a system call per
	 * op would cost more than this check is worth); a wait in
	 * kc_lanes_progress watches its socket anyway. */
	now = kc_now_ns();
	if (now - c->lane_checked > 1000000) {
		c->lane_checked = now;
		if (!kc_daemon_alive(k)) {
			pthread_mutex_lock(&k->ring_lock);
			k->dead = 1;
			pthread_mutex_unlock(&k->ring_lock);
		}
	}
	r = kcoll_load_relaxed(&k->dead) ? -ENOTCONN : kc_lanes_start(c->lanes, send, recv, count, dtype, op);
	if (r) {
		uint32_t host;

		if (r == -ENOTCONN)
			kc_lanes_kill(c->lanes, r);
		pthread_mutex_lock(&k->ring_lock);
		lane_done(c, r, kc_lanes_error(c->lanes, &host) == r ? host : KCOLL_RANK_NONE);
		pthread_mutex_unlock(&k->ring_lock);
	} else {
		lane_progress(c, 0);	/* our input leaves now */
	}
	*req = rq;
	pthread_mutex_unlock(&c->lane_lock);
	return 0;
}

/* rq is a pending lane op: move it on (see lane_progress). */
int kc_lane_req_progress(struct kcoll_req *rq, int timeout_ms)
{
	struct kcoll_comm *c = rq->lane_comm;
	int done;

	pthread_mutex_lock(&c->lane_lock);
	done = c->lane_rq != rq || lane_progress(c, timeout_ms);
	pthread_mutex_unlock(&c->lane_lock);
	return done;
}

/* Take the communicator's lanes from kcolld, one per other host. */
static int lanes_open(struct kcoll_comm *c, const struct kcoll_msg_comm_init_reply *rep)
{
	int fds[KCOLL_LANES_MAX_HOSTS];
	int r = 0;

	if (rep->nhosts < 2 || rep->nhosts > KCOLL_LANES_MAX_HOSTS || rep->self_host >= rep->nhosts ||
	    rep->nhosts != (uint32_t)c->nranks || rep->self_host != (uint32_t)c->rank)
		return -EPROTO;
	for (uint32_t h = 0; h < rep->nhosts; h++)
		fds[h] = -1;
	for (uint32_t h = 0; h < rep->nhosts && !r; h++) {
		struct kcoll_msg_comm_lane req = { .hdr.type = KCOLL_MSG_COMM_LANE, .comm_id = c->comm_id,
						   .host = h };
		struct kcoll_msg_hdr lrep;

		if (h == rep->self_host)
			continue;
		r = kcoll_priv_ctl(c->k, &req, sizeof(req), -1, &lrep, sizeof(lrep), &fds[h], 5000);
		if (!r && fds[h] < 0)
			r = -EPROTO;
	}
	if (!r)
		r = kc_lanes_new(rep->nhosts, rep->self_host, fds, rep->lane_bytes, (int)rep->timeout_ms,
				 c->k->spin_ns, &c->lanes);
	for (uint32_t h = 0; h < rep->nhosts; h++)
		if (fds[h] >= 0)
			close(fds[h]);
	return r;
}

int kcoll_comm_init_rank(struct kcoll *k, const kcoll_unique_id_t *id, int nranks, int rank,
			 struct kcoll_comm **out)
{
	struct kcoll_msg_comm_init req = { .hdr.type = KCOLL_MSG_COMM_INIT };
	struct kcoll_msg_comm_init_reply rep;
	struct kcoll_comm *c;
	int r;

	if (!k || !id || !out || nranks < 1 || rank < 0 || rank >= nranks)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	memcpy(&req.id, id->bytes, sizeof(req.id));
	req.nranks = nranks;
	req.rank = rank;
	/* Our KCOLL_TIMEOUT_MS if we set one, else 0: kcolld's own (its
	 * environment or /sys/kernel/kcoll/timeout_ms). */
	req.timeout_ms = k->timeout_set ? k->timeout_ms : 0;
	/* A process with CUDA may pass device buffers: its communicators get
	 * no lanes (they move host memory only). */
	req.flags = kc_cuda_loaded() ? KCOLL_COMM_F_GPU : 0;
	memset(&rep, 0, sizeof(rep));
	/* kcolld enforces the timeout and a dead daemon is seen as a hangup;
	 * this bound only guards against one that is stuck. */
	r = kcoll_priv_ctl(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL,
			   (k->timeout_set ? k->timeout_ms : 3600000) + 5000);
	if (r) {
		if (rep.hdr.magic == KCOLL_PROTO_MAGIC && rep.error[0])
			fprintf(stderr, "libkcoll: communicator init failed: %.*s\n",
				(int)sizeof(rep.error), rep.error);
		free(c);
		return r;
	}
	c->k = k;
	c->comm_id = rep.comm_id;
	c->nhosts = rep.nhosts ? rep.nhosts : 1;
	c->rank = rank;
	c->nranks = nranks;
	pthread_mutex_init(&c->lane_lock, NULL);
	if (rep.lane_bytes) {
		r = lanes_open(c, &rep);
		if (r) {
			fprintf(stderr, "libkcoll: communicator init failed: cannot take its lanes from kcolld: "
				"%s (KCOLL_LANE_BYTES=0 on the daemon that issued the id turns lanes off)\n",
				strerror(-r));
			kcoll_comm_destroy(c);
			return r;
		}
	}
	*out = c;
	return 0;
}

int kcoll_comm_destroy(struct kcoll_comm *c)
{
	struct kcoll_msg_comm_destroy req = { .hdr.type = KCOLL_MSG_COMM_DESTROY };
	struct kcoll_msg_hdr rep;
	int r;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->lane_lock);
	if (c->lane_rq) {
		pthread_mutex_lock(&c->k->ring_lock);
		lane_done(c, -ECANCELED, KCOLL_RANK_NONE);
		pthread_mutex_unlock(&c->k->ring_lock);
	}
	kc_lanes_free(c->lanes);
	c->lanes = NULL;
	pthread_mutex_unlock(&c->lane_lock);
	pthread_mutex_destroy(&c->lane_lock);
	req.comm_id = c->comm_id;
	r = kcoll_priv_ctl(c->k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);
	free(c);
	return r;
}

int kcoll_comm_rank(const struct kcoll_comm *c)
{
	return c ? c->rank : -EINVAL;
}

int kcoll_comm_size(const struct kcoll_comm *c)
{
	return c ? c->nranks : -EINVAL;
}

static int coll_submit(struct kcoll_comm *c, uint8_t opcode, const void *send, void *recv,
		       size_t count, int dtype, int op, int root, struct kcoll_req **req)
{
	struct kcoll_sqe sqe = { .opcode = opcode };
	size_t esz, sbytes, rbytes;
	int r;

	if (!c || !req)
		return -EINVAL;
	if ((unsigned int)dtype >= KCOLL_DTYPE_MAX || (unsigned int)op >= KCOLL_REDOP_MAX)
		return -EINVAL;
	if (root < 0 || root >= c->nranks)
		return -EINVAL;
	if (count && (!recv || (!send && opcode != KCOLL_OP_BROADCAST)))
		return -EFAULT;
	if (count > (SIZE_MAX / 16) / (size_t)c->nranks)
		return -EOVERFLOW;
	if (send == recv)
		sqe.flags |= KCOLL_SQE_F_IN_PLACE;
	esz = kcoll_dtype_size(dtype);
	sbytes = rbytes = count * esz;
	if (opcode == KCOLL_OP_REDUCE_SCATTER)
		sbytes *= (size_t)c->nranks;
	else if (opcode == KCOLL_OP_ALLGATHER)
		rbytes *= (size_t)c->nranks;
	r = kc_mem_kind(c->k, opcode == KCOLL_OP_BROADCAST && !send ? recv : send, sbytes,
			&sqe.coll.send_mem);
	if (!r)
		r = kc_mem_kind(c->k, recv, rbytes, &sqe.coll.recv_mem);
	if (r)
		return r;
	/* avg is left to kcolld: recursive doubling would average averages. */
	if (opcode == KCOLL_OP_ALLREDUCE && op != KCOLL_AVG && c->lanes && kc_lanes_fit(c->lanes, sbytes)) {
		/* Every rank takes this path for this op: its size decides. */
		if (sqe.coll.send_mem != KCOLL_MEM_HOST || sqe.coll.recv_mem != KCOLL_MEM_HOST) {
			kc_warn("a device buffer in an all-reduce of %zu bytes, which this communicator runs "
				"over lanes (host memory only; it was made before this process loaded CUDA): "
				"make communicators after loading CUDA, or set KCOLL_LANE_BYTES=0 on the "
				"daemon that issues the id", sbytes);
			return -EOPNOTSUPP;
		}
		return lane_submit(c, send, recv, count, dtype, op, req);
	}
	if (sqe.coll.send_mem == KCOLL_MEM_HOST && send && send != recv)
		kc_thp_collapse(c->k, send, sbytes);
	if (sqe.coll.recv_mem == KCOLL_MEM_HOST)
		kc_thp_collapse(c->k, recv, rbytes);
	sqe.coll.send_addr = (uintptr_t)send;
	sqe.coll.recv_addr = (uintptr_t)recv;
	sqe.coll.count = count;
	sqe.coll.comm_id = c->comm_id;
	sqe.coll.root = root;
	sqe.coll.dtype = dtype;
	sqe.coll.redop = op;
	/*
	 * An op across hosts takes tens of microseconds at best; polling for
	 * it would take the CPU from the daemons doing it (on a shared or
	 * oversubscribed machine that costs more than a futex wake-up). Unless
	 * KCOLL_SPIN_US is set, such waits sleep at once.
	 */
	return kc_submit(c->k, &sqe, req, c->nhosts > 1 && !c->k->spin_set ? 0 : c->k->spin_ns);
}

int kcoll_allreduce(struct kcoll_comm *c, const void *send, void *recv, size_t count,
		    enum kcoll_dtype dtype, enum kcoll_redop op, struct kcoll_req **req)
{
	return coll_submit(c, KCOLL_OP_ALLREDUCE, send, recv, count, dtype, op, 0, req);
}

int kcoll_reduce_scatter(struct kcoll_comm *c, const void *send, void *recv, size_t recvcount,
			 enum kcoll_dtype dtype, enum kcoll_redop op, struct kcoll_req **req)
{
	return coll_submit(c, KCOLL_OP_REDUCE_SCATTER, send, recv, recvcount, dtype, op, 0, req);
}

int kcoll_allgather(struct kcoll_comm *c, const void *send, void *recv, size_t sendcount,
		    enum kcoll_dtype dtype, struct kcoll_req **req)
{
	return coll_submit(c, KCOLL_OP_ALLGATHER, send, recv, sendcount, dtype, 0, 0, req);
}

int kcoll_broadcast(struct kcoll_comm *c, void *buf, size_t count, enum kcoll_dtype dtype, int root,
		    struct kcoll_req **req)
{
	return coll_submit(c, KCOLL_OP_BROADCAST, buf, buf, count, dtype, 0, root, req);
}

int kcoll_barrier(struct kcoll_comm *c, struct kcoll_req **req)
{
	return coll_submit(c, KCOLL_OP_BARRIER, NULL, NULL, 0, KCOLL_U8, 0, 0, req);
}
