// SPDX-License-Identifier: MIT
/*
 * A multi-host communicator's net thread: it runs the comm's ops in order,
 * each in three phases (docs/multihost.md):
 *
 *   1. local:  the host's ranks' inputs -> the accumulator (reduced for
 *              all-reduce and reduce-scatter, placed for all-gather, the
 *              root's for broadcast)
 *   2. hosts:  an inter-host algorithm on the accumulators, as steps that
 *              the transport (mh->xport) runs (schedule.c)
 *   3. local:  the accumulator -> every local rank's receive buffer
 *
 * Only one set of flows per host pair carries the op, whatever the number of
 * local ranks. Failures abort the comm from this op on, here and on every
 * peer, naming the rank (or a rank of the host) at fault.
 *
 * mh.c sits above comm.c and exec.c and below net.c, which starts and stops
 * the net thread and hands it ops (struct kd_comm_net_ops.run); it tells
 * peers of a failure through comm.c (kd_comm_abort_peers) and the C4
 * planner through its hooks (c4d.h).
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "c4d.h"
#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "reduce.h"
#include "schedule.h"

/* ---- local phases ------------------------------------------------------- */

/* acc[0, bytes) = reduction of the local ranks' send buffers (or a copy). */
static int local_reduce(struct kd_mh *mh, struct kd_op *op, uint64_t bytes, uint32_t *bad)
{
	struct kd_comm *comm = op->comm;
	const uint8_t *ins[KD_MAX_RANKS];
	size_t chunk = mh->piece;
	int r = kd_grow(&mh->stage, &mh->stage_size, chunk * comm->nlocal);

	if (r)
		return r;
	for (uint64_t off = 0; off < bytes; off += chunk) {
		size_t n = bytes - off < chunk ? bytes - off : chunk;
		uint32_t k = 0;

		for (uint32_t rk = 0; rk < comm->nranks; rk++) {
			struct kd_contrib *ct = &op->c[rk];

			if (!ct->present)
				continue;
			/* One local rank (one rank per host): a copy lands in acc
			 * itself, no second memcpy from the stage. */
			r = kd_buf_read(ct->client, &ct->sbuf, off, n,
					comm->nlocal == 1 ? mh->acc + off : mh->stage + k * chunk, &ins[k]);
			if (r) {
				*bad = rk;
				return r;
			}
			k++;
		}
		if (k == 1 && ins[0] != mh->acc + off)
			memcpy(mh->acc + off, ins[0], n);
		else if ((r = kcoll_reduce_n(op->dtype, mh->redop, mh->acc + off,
					     (const void *const *)ins, k, n / op->esz)))
			return r;
	}
	return 0;
}

/* Copy rank rk's send buffer [0, bytes) to acc + at. */
static int local_place(struct kd_mh *mh, struct kd_op *op, uint32_t rk, uint64_t at, uint64_t bytes)
{
	struct kd_contrib *ct = &op->c[rk];
	size_t chunk = mh->piece;
	int r = 0;

	/* A copy (process_vm_readv, device staging) lands in acc directly. */
	for (uint64_t off = 0; !r && off < bytes; off += chunk) {
		size_t n = bytes - off < chunk ? bytes - off : chunk;
		const uint8_t *p;

		r = kd_buf_read(ct->client, &ct->sbuf, off, n, mh->acc + at + off, &p);
		if (!r && p != mh->acc + at + off)
			memcpy(mh->acc + at + off, p, n);
	}
	return r;
}

/*
 * A local rank's receive buffer that kcolld maps (shared memory, or pinned
 * through kcoll.ko) can be the accumulator itself: the rank does not look at
 * it until the op completes. Saves a copy in and a copy out of the whole
 * message. Reduce-scatter's accumulator is larger than any receive buffer.
 */
static uint8_t *pick_acc(struct kd_op *op, uint64_t bytes)
{
	if (op->opcode == KCOLL_OP_REDUCE_SCATTER || !bytes)
		return NULL;
	for (uint32_t rk = 0; rk < op->comm->nranks; rk++) {
		struct kd_contrib *ct = &op->c[rk];

		/* Broadcast leaves the root's receive buffer alone. */
		if (ct->present && ct->rbuf.direct && ct->rbuf.len >= bytes &&
		    !(op->opcode == KCOLL_OP_BROADCAST && rk == op->root))
			return ct->rbuf.direct;
	}
	return NULL;
}

/*
 * One local rank whose input kcolld maps: the ring and power-of-two
 * Rabenseifner all-reduce (and ring reduce-scatter) read it in place in
 * their first step instead of copying it into the accumulator first.
 */
static const uint8_t *fused_input(struct kd_mh *mh, struct kd_op *op, uint64_t bytes)
{
	struct kd_contrib *ct = NULL;
	enum kd_algo a = op->opcode == KCOLL_OP_REDUCE_SCATTER ? KD_ALGO_RING : kd_sched_algo(mh, bytes);
	bool pow2 = !(mh->nhosts & (mh->nhosts - 1));

	if (op->comm->nlocal != 1 || !bytes ||
	    !(a == KD_ALGO_RING || a == KD_ALGO_DIRECT || (a == KD_ALGO_RABENSEIFNER && pow2)))
		return NULL;
	for (uint32_t rk = 0; rk < op->comm->nranks && !ct; rk++)
		if (op->c[rk].present)
			ct = &op->c[rk];
	if (!ct || !ct->sbuf.direct || ct->sbuf.len < bytes)
		return NULL;
	return ct->sbuf.direct;
}

/* Integer avg, phase 1: acc (64-bit) = sum of the local ranks' inputs. */
static int local_widen(struct kd_mh *mh, struct kd_op *op, uint64_t n, uint32_t *bad)
{
	size_t chunk = mh->piece / 8;	/* elements */
	int64_t *acc = (int64_t *)mh->acc;
	int r = kd_grow(&mh->stage, &mh->stage_size, chunk * op->esz);

	for (uint64_t e = 0; !r && e < n; e += chunk) {
		uint64_t m = n - e < chunk ? n - e : chunk;
		bool first = true;

		for (uint32_t rk = 0; rk < op->comm->nranks; rk++) {
			struct kd_contrib *ct = &op->c[rk];
			const uint8_t *p;

			if (!ct->present)
				continue;
			r = kd_buf_read(ct->client, &ct->sbuf, e * op->esz, m * op->esz, mh->stage, &p);
			if (r) {
				*bad = rk;
				return r;
			}
			kcoll_avg_widen_add(op->dtype, acc + e, p, m, first);
			first = false;
		}
	}
	return r;
}

static uint32_t op_sig(const struct kd_op *op)
{
	uint64_t v = op->count * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)op->opcode << 48) ^
		     ((uint64_t)op->dtype << 40) ^ ((uint64_t)op->redop << 32) ^ op->root;

	return (uint32_t)(v ^ v >> 32) | 1;
}

/* Fail op (and the comm from it on, everywhere) for a network error. */
static void net_fail(struct kd_mh *mh, struct kd_op *op, int err, uint32_t bad_host)
{
	struct kd_comm *comm = op->comm;

	if (err == -ECANCELED) {
		/* The comm was aborted under us: its verdict is the op's. */
		pthread_mutex_lock(&comm->lock);
		kd_op_fail(op, comm->abort_err ? comm->abort_err : -ECONNRESET, comm->abort_rank,
			   comm->abort_flags);
		pthread_mutex_unlock(&comm->lock);
		return;
	}
	uint32_t rank = bad_host < mh->nhosts ? mh->hosts[bad_host].first_rank : KCOLL_RANK_NONE;

	kd_op_fail(op, err, rank, 0);
	if (kd_comm_abort(comm, err, rank, 0, op->seq)) {
		kc_warn("comm %s: op %llu failed with host %u (%s): %s", comm->name,
			(unsigned long long)op->seq, bad_host,
			bad_host < mh->nhosts ? mh->hosts[bad_host].info.name : "?", kcoll_strerror(err));
		kd_comm_abort_peers(comm, err, rank, 0, op->seq);
	}
}

static void run_op(struct kd_mh *mh, struct kd_op *op)
{
	struct kd_comm *comm = op->comm;
	struct kd_sched_op sop;
	const uint8_t *in0 = NULL;
	uint64_t bytes = 0, block = 0, wbytes, wblock;
	uint32_t bad = KCOLL_RANK_NONE, bad_host = KCOLL_RANK_NONE, root_host = 0;
	int64_t t0, t1, t2;
	bool wide, avg;
	int r = 0;

	if (kd_c4)
		kd_c4->op_start(mh, op);
	atomic_store(&mh->running_since, kd_now_ns());
	atomic_store(&mh->last_progress, atomic_load(&mh->running_since));
	atomic_store(&mh->running_seq, op->seq);
	if (atomic_load(&op->err)) {
		/* A local rank's SQE was invalid: the op cannot run anywhere. */
		uint32_t rk = atomic_load(&op->err_rank);
		int err = atomic_load(&op->err);

		if (kd_comm_abort(comm, err, rk, 0, op->seq))
			kd_comm_abort_peers(comm, err, rk, 0, op->seq);
		goto done;
	}
	if (op->seq >= __atomic_load_n(&comm->limit_seq, __ATOMIC_RELAXED)) {
		net_fail(mh, op, -ECANCELED, KCOLL_RANK_NONE);
		goto done;
	}
	/* Valid from here (kd_sqe_check passed on every local rank). */
	op->esz = kcoll_dtype_size(op->dtype);
	mh->sig = op_sig(op);
	mh->piece = mh->net_piece / 8 * 8;
	/* avg: sum everywhere, divide once at the end; integers are summed in
	 * 64 bits (as on one host), so the wire and accumulator are 64-bit. */
	mh->redop = op->redop == KCOLL_AVG ? KCOLL_SUM : op->redop;
	avg = op->redop == KCOLL_AVG &&
	      (op->opcode == KCOLL_OP_ALLREDUCE || op->opcode == KCOLL_OP_REDUCE_SCATTER);
	mh->dtype = avg ? kcoll_avg_sum_dtype(op->dtype) : op->dtype;
	wide = mh->dtype != op->dtype;
	mh->esz = kcoll_dtype_size(mh->dtype);
	block = op->count * op->esz;
	switch (op->opcode) {
	case KCOLL_OP_ALLREDUCE:
	case KCOLL_OP_BROADCAST:
		bytes = block;
		break;
	case KCOLL_OP_REDUCE_SCATTER:
	case KCOLL_OP_ALLGATHER:
		bytes = block * comm->nranks;
		break;
	}
	/* wbytes: what the accumulator holds and the hosts exchange */
	wbytes = bytes / op->esz * mh->esz;
	wblock = block / op->esz * mh->esz;
	for (uint32_t rk = 0; rk < comm->nranks; rk++) {
		struct kd_contrib *ct = &op->c[rk];

		if (!ct->present)
			continue;
		kd_buf_resolve_kind(ct->client, ct->send, ct->sbuf.len, ct->send_mem, &ct->sbuf);
		kd_buf_resolve_kind(ct->client, ct->recv, ct->rbuf.len, ct->recv_mem, &ct->rbuf);
	}
	mh->acc = wide ? NULL : pick_acc(op, bytes);
	if (!mh->acc) {
		r = kd_grow(&mh->own, &mh->acc_size, wbytes ? wbytes : 1);
		if (r) {
			net_fail(mh, op, r, KCOLL_RANK_NONE);
			goto done;
		}
		mh->acc = mh->own;
	}

	/* 1. local inputs */
	t0 = kd_now_ns();
	switch (op->opcode) {
	case KCOLL_OP_ALLREDUCE:
	case KCOLL_OP_REDUCE_SCATTER:
		if (wide)
			r = local_widen(mh, op, bytes / op->esz, &bad);
		else if (!(in0 = fused_input(mh, op, bytes)))
			r = local_reduce(mh, op, bytes, &bad);
		break;
	case KCOLL_OP_ALLGATHER:
		for (uint32_t rk = 0; !r && rk < comm->nranks; rk++)
			if (op->c[rk].present && (r = local_place(mh, op, rk, rk * block, block)))
				bad = rk;
		break;
	case KCOLL_OP_BROADCAST:
		root_host = mh->rank_host[op->root];
		if (root_host == mh->self && (r = local_place(mh, op, op->root, 0, bytes)))
			bad = op->root;
		break;
	}
	if (r) {
		/* Our input is unreadable: the peers cannot complete either. */
		kd_op_fail(op, r, bad, 0);
		if (kd_comm_abort(comm, r, bad, 0, op->seq))
			kd_comm_abort_peers(comm, r, bad, 0, op->seq);
		goto done;
	}

	/* 2. between hosts */
	t1 = kd_now_ns();
	sop = (struct kd_sched_op){ .opcode = op->opcode, .bytes = wbytes, .block = wblock,
				    .esz = op->esz, .nranks = comm->nranks, .root_host = root_host, .in0 = in0 };
	if (op->opcode == KCOLL_OP_BROADCAST)
		sop.bytes = bytes;
	r = kd_sched_run(mh, op, &sop, &bad_host);
	if (!r && op->seq >= __atomic_load_n(&comm->limit_seq, __ATOMIC_RELAXED))
		r = -ECANCELED;	/* aborted while we finished: fail it like the peers do */
	if (r) {
		net_fail(mh, op, r, bad_host);
		goto done;
	}
	if (avg)
		kcoll_avg_finish(op->dtype, mh->acc, bytes / op->esz, comm->nranks);

	/* 3. local outputs */
	t2 = kd_now_ns();
	for (uint32_t rk = 0; rk < comm->nranks && bytes; rk++) {
		struct kd_contrib *ct = &op->c[rk];

		if (!ct->present)
			continue;
		switch (op->opcode) {
		case KCOLL_OP_ALLREDUCE:
		case KCOLL_OP_ALLGATHER:
			r = kd_buf_write(ct->client, &ct->rbuf, 0, mh->acc, bytes);
			break;
		case KCOLL_OP_REDUCE_SCATTER:
			r = kd_buf_write(ct->client, &ct->rbuf, 0, mh->acc + rk * block, block);
			break;
		case KCOLL_OP_BROADCAST:
			r = rk == op->root ? 0 : kd_buf_write(ct->client, &ct->rbuf, 0, mh->acc, bytes);
			break;
		}
		if (r)
			kd_op_fail(op, r, rk, 0);	/* that rank's problem alone */
	}
	/* Where a multi-host op's time goes (docs/perf.md, section 10). */
	kc_dbg("comm %s: op %llu %llu bytes: local in %lld us, hosts %lld us, local out %lld us",
	       comm->name, (unsigned long long)op->seq, (unsigned long long)bytes,
	       (long long)(t1 - t0) / 1000, (long long)(t2 - t1) / 1000,
	       (long long)(kd_now_ns() - t2) / 1000);
done:
	atomic_store(&mh->running_seq, UINT64_MAX);
}

/* Small ops run on the ring thread that made them ready, when the comm's
 * net thread is idle: a thread handoff costs more than they do. */
static bool small(const struct kd_op *op)
{
	uint64_t bytes = op->count * kcoll_dtype_size(op->dtype);

	if (op->opcode == KCOLL_OP_REDUCE_SCATTER || op->opcode == KCOLL_OP_ALLGATHER)
		bytes *= op->comm->nranks;
	return bytes <= KD_SCHED_SMALL_BYTES;
}

/* Run op and the comm's ops that become runnable after it; inline: stop at
 * (and return) the first that is not small. */
static struct kd_op *run_chain(struct kd_mh *mh, struct kd_op *op, bool inline_only)
{
	while (op) {
		run_op(mh, op);
		op = kd_comm_op_done(op);
		if (op && inline_only && !small(op))
			return op;
	}
	return NULL;
}

static void *net_thread(void *arg)
{
	struct kd_mh *mh = arg;

	for (;;) {
		struct kd_op *op;

		pthread_mutex_lock(&mh->qlock);
		while ((!mh->queue || mh->busy) && !mh->stop)
			pthread_cond_wait(&mh->qcond, &mh->qlock);
		op = mh->busy ? NULL : mh->queue;
		if (op) {
			mh->queue = op->next;
			mh->busy = true;
		}
		pthread_mutex_unlock(&mh->qlock);
		if (!op)
			break;	/* stopping; the comm is aborted and its ranks are gone */
		op->next = NULL;
		run_chain(mh, op, false);
		pthread_mutex_lock(&mh->qlock);
		mh->busy = false;
		pthread_cond_broadcast(&mh->qcond);
		pthread_mutex_unlock(&mh->qlock);
	}
	kd_exec_thread_done();
	return NULL;
}

int kd_mh_start(struct kd_mh *mh)
{
	sigset_t all, old;
	int r;

	mh->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (mh->abort_fd < 0)
		return -errno;
	pthread_mutex_init(&mh->qlock, NULL);
	pthread_cond_init(&mh->qcond, NULL);
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = pthread_create(&mh->thread, NULL, net_thread, mh);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r) {
		close(mh->abort_fd);
		mh->abort_fd = -1;
		return -r;
	}
	mh->thread_started = true;
	return 0;
}

void kd_mh_wake(struct kd_mh *mh)
{
	uint64_t one = 1;

	if (mh->abort_fd >= 0 && write(mh->abort_fd, &one, sizeof(one)) < 0)
		kc_dbg("abort eventfd: %m");
}

static void push(struct kd_mh *mh, struct kd_op *op)
{
	struct kd_op **pp;

	for (pp = &mh->queue; *pp; pp = &(*pp)->next)
		;
	op->next = NULL;
	*pp = op;
	pthread_cond_signal(&mh->qcond);
}

/* The comm is torn down: fail op and whatever becomes runnable after it. */
static void fail_chain(struct kd_op *op)
{
	while (op) {
		kd_op_fail(op, -ECONNRESET, KCOLL_RANK_NONE, 0);
		op = kd_comm_op_done(op);
	}
}

void kd_mh_queue(struct kd_op *op)
{
	struct kd_mh *mh = op->comm->mh;

	pthread_mutex_lock(&mh->qlock);
	if (mh->stop) {
		/* Torn down (every local rank left): nobody will run it. */
		pthread_mutex_unlock(&mh->qlock);
		fail_chain(op);
		return;
	}
	if (!mh->busy && !mh->queue && !mh->stop && small(op)) {
		mh->busy = true;
		pthread_mutex_unlock(&mh->qlock);
		op = run_chain(mh, op, true);
		pthread_mutex_lock(&mh->qlock);
		mh->busy = false;
		if (op && !mh->stop) {
			push(mh, op);
			op = NULL;
		}
		/* Wake the net thread (or kd_mh_stop) only if it has something to
		 * do: after every small op it would otherwise wake, take the lock,
		 * find nothing and sleep again (two context switches per op and
		 * host, on CPUs the peers need). */
		if (mh->queue || mh->stop)
			pthread_cond_broadcast(&mh->qcond);
		pthread_mutex_unlock(&mh->qlock);
		fail_chain(op);
		return;
	}
	push(mh, op);
	pthread_mutex_unlock(&mh->qlock);
}

void kd_mh_stop(struct kd_mh *mh)
{
	if (mh->thread_started) {
		pthread_mutex_lock(&mh->qlock);
		mh->stop = true;
		pthread_cond_broadcast(&mh->qcond);
		pthread_mutex_unlock(&mh->qlock);
		kd_mh_wake(mh);
		pthread_join(mh->thread, NULL);
		/* A ring thread may still run an op inline: the comm is aborted,
		 * so it returns soon; wait for it. */
		pthread_mutex_lock(&mh->qlock);
		while (mh->busy)
			pthread_cond_wait(&mh->qcond, &mh->qlock);
		struct kd_op *left = mh->queue;

		mh->queue = NULL;
		pthread_mutex_unlock(&mh->qlock);
		while (left) {
			struct kd_op *next = left->next;

			left->next = NULL;
			fail_chain(left);
			left = next;
		}
		mh->thread_started = false;
		pthread_mutex_destroy(&mh->qlock);
		pthread_cond_destroy(&mh->qcond);
	}
	if (mh->abort_fd >= 0)
		close(mh->abort_fd);
	mh->abort_fd = -1;
	if (mh->own)
		kd_unmap_notify(mh->own, mh->acc_size);
	if (mh->snap)
		kd_unmap_notify(mh->snap, mh->snap_size);
	free(mh->own);
	free(mh->snap);
	free(mh->stage);
	for (uint32_t i = 0; i < KD_MAX_HOSTS * KD_MAX_STREAMS; i++)
		free(mh->rx[i]);
	mh->acc = mh->own = mh->snap = mh->stage = NULL;
	mh->acc_size = mh->snap_size = mh->stage_size = 0;
}

struct kd_piece *kd_xfer_cut(const struct kd_xfer *x, size_t piece, uint32_t *n)
{
	uint32_t cnt = 0, i = 0;
	struct kd_piece *p;

	for (uint32_t k = 0; k < x->nr; k++)
		cnt += (x->r[k].len + piece - 1) / piece;
	p = malloc((cnt ? cnt : 1) * sizeof(*p));
	if (!p)
		return NULL;
	for (uint32_t k = 0; k < x->nr; k++)
		for (uint64_t o = 0; o < x->r[k].len; o += piece)
			p[i++] = (struct kd_piece){ x->r[k].off + o,
						    x->r[k].len - o < piece ? x->r[k].len - o : piece };
	if (!cnt)
		p[0] = (struct kd_piece){ 0, 0 };
	*n = cnt ? cnt : 1;
	return p;
}
