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
 * the net thread and hands it ops (struct kd_comm_net_ops.run); phases 1
 * and 3 run as jobs on exec.c's worker pool (kd_exec_job), or on the GPU
 * when every local buffer lies on one (kd_exec_gpu_dev); it tells
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
#include "kcoll_gpu.h"
#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "reduce.h"
#include "schedule.h"

/* ---- local phases ------------------------------------------------------- */

/*
 * Phases 1 and 3 are cut into tasks of one piece of one rank's buffer (or,
 * for a reduction, of every local rank's) and run as a job on exec.c's
 * worker pool, the net thread taking its share: process_vm_readv/writev and
 * the reduction then use the host's CPUs, not one.
 */
struct local_job {
	struct kd_job job;
	struct kd_mh *mh;
	struct kd_op *op;
	uint64_t bytes;		/* a reduction's in all, else per rank */
	uint64_t at_step;	/* phase 1 placing: rank rk's bytes go to acc + rk * at_step */
	size_t chunk;		/* bytes per task and rank */
	uint32_t per_rank;	/* tasks per rank */
	uint32_t n;
	uint32_t ranks[KD_MAX_RANKS];	/* the local ranks it reads or writes */
	atomic_int err;		/* phase 1: the first error wins ... */
	atomic_uint bad;	/* ... naming this rank (KCOLL_RANK_NONE: none) */
};

static void lj_fail(struct local_job *lj, int err, uint32_t rk)
{
	int expected = 0;

	if (atomic_compare_exchange_strong(&lj->err, &expected, err))
		atomic_store(&lj->bad, rk);
}

/* Run lj with ntasks tasks; phase 1's error (*bad: the rank) or 0. */
static int lj_run(struct local_job *lj, void (*task)(struct kd_job *, uint32_t), uint32_t ntasks,
		  uint32_t *bad)
{
	lj->job.task = task;
	lj->job.ntasks = ntasks;
	atomic_init(&lj->err, 0);
	atomic_init(&lj->bad, KCOLL_RANK_NONE);
	kd_exec_job(&lj->job);
	*bad = atomic_load(&lj->bad);
	return atomic_load(&lj->err);
}

static void lj_chunk(struct local_job *lj, size_t chunk)
{
	lj->chunk = chunk;
	lj->per_rank = lj->bytes ? (lj->bytes + chunk - 1) / chunk : 0;
}

static void lj_init(struct local_job *lj, struct kd_mh *mh, struct kd_op *op, uint64_t bytes,
		    size_t chunk)
{
	lj->mh = mh;
	lj->op = op;
	lj->bytes = bytes;
	lj_chunk(lj, chunk);
	lj->n = 0;
	for (uint32_t rk = 0; rk < op->comm->nranks; rk++)
		if (op->c[rk].present)
			lj->ranks[lj->n++] = rk;
}

/* Bytes per task of a copy without staging: a piece, or more where pieces
 * would make over four tasks per thread (fewer system calls and wake-ups
 * for the same parallelism). A multiple of 4 KiB: whole elements. */
static size_t copy_chunk(const struct kd_mh *mh, uint64_t bytes, uint32_t nranks)
{
	uint64_t per = bytes * nranks / (4 * ((uint64_t)(kd.nworkers > 0 ? kd.nworkers : 0) + 1));

	per = (per + 4095) & ~(uint64_t)4095;
	return per > mh->piece ? per : mh->piece;
}

/* acc[off, off + n) = reduction of the local ranks' send buffers there (or a copy). */
static void reduce_task(struct kd_job *job, uint32_t t)
{
	struct local_job *lj = (struct local_job *)job;
	struct kd_mh *mh = lj->mh;
	struct kd_op *op = lj->op;
	const uint8_t *ins[KD_MAX_RANKS];
	uint64_t off = (uint64_t)t * lj->chunk;
	size_t n = lj->bytes - off < lj->chunk ? lj->bytes - off : lj->chunk;
	uint8_t *stage = lj->n > 1 ? kd_exec_stage(lj->chunk * lj->n) : NULL;
	int r;

	if (atomic_load(&lj->err))
		return;
	if (lj->n > 1 && !stage)
		return lj_fail(lj, -ENOMEM, KCOLL_RANK_NONE);
	for (uint32_t k = 0; k < lj->n; k++) {
		struct kd_contrib *ct = &op->c[lj->ranks[k]];

		/* One local rank (one rank per host): a copy lands in acc
		 * itself, no second memcpy from the stage. */
		r = kd_buf_read(ct->client, &ct->sbuf, off, n,
				lj->n == 1 ? mh->acc + off : stage + k * lj->chunk, &ins[k]);
		if (r)
			return lj_fail(lj, r, lj->ranks[k]);
	}
	if (lj->n == 1 && ins[0] != mh->acc + off)
		memcpy(mh->acc + off, ins[0], n);
	else if (lj->n > 1 && (r = kcoll_reduce_n(op->dtype, mh->redop, mh->acc + off,
						  (const void *const *)ins, lj->n, n / op->esz)))
		lj_fail(lj, r, KCOLL_RANK_NONE);
}

/* acc[0, bytes) = reduction of the local ranks' send buffers (or a copy). */
static int local_reduce(struct kd_mh *mh, struct kd_op *op, uint64_t bytes, uint32_t *bad)
{
	struct local_job lj;

	lj_init(&lj, mh, op, bytes, mh->piece);
	if (lj.n == 1)	/* no stage: straight into acc */
		lj_chunk(&lj, copy_chunk(mh, bytes, 1));
	return lj.n ? lj_run(&lj, reduce_task, lj.per_rank, bad) : 0;
}

/* Integer avg: acc (64-bit) elements [e, e + m) = sum of the local ranks' inputs. */
static void widen_task(struct kd_job *job, uint32_t t)
{
	struct local_job *lj = (struct local_job *)job;
	struct kd_op *op = lj->op;
	size_t chunk = lj->chunk / 8;	/* elements */
	uint64_t n = lj->bytes / op->esz, e = (uint64_t)t * chunk;
	uint64_t m = n - e < chunk ? n - e : chunk;
	uint8_t *stage = kd_exec_stage(chunk * op->esz);

	if (atomic_load(&lj->err))
		return;
	if (!stage)
		return lj_fail(lj, -ENOMEM, KCOLL_RANK_NONE);
	for (uint32_t k = 0; k < lj->n; k++) {
		struct kd_contrib *ct = &op->c[lj->ranks[k]];
		const uint8_t *p;
		int r = kd_buf_read(ct->client, &ct->sbuf, e * op->esz, m * op->esz, stage, &p);

		if (r)
			return lj_fail(lj, r, lj->ranks[k]);
		kcoll_avg_widen_add(op->dtype, (int64_t *)lj->mh->acc + e, p, m, k == 0);
	}
}

/* Integer avg, phase 1: acc (64-bit) = sum of the local ranks' inputs. */
static int local_widen(struct kd_mh *mh, struct kd_op *op, uint64_t n, uint32_t *bad)
{
	struct local_job lj;
	size_t chunk = mh->piece / 8;	/* elements per task */

	lj_init(&lj, mh, op, n * op->esz, chunk * 8);
	return lj.n && n ? lj_run(&lj, widen_task, (n + chunk - 1) / chunk, bad) : 0;
}

/* Copy one piece of a rank's send buffer to acc + rk * at_step. */
static void place_task(struct kd_job *job, uint32_t t)
{
	struct local_job *lj = (struct local_job *)job;
	uint32_t rk = lj->ranks[t / lj->per_rank];
	struct kd_contrib *ct = &lj->op->c[rk];
	uint64_t off = (uint64_t)(t % lj->per_rank) * lj->chunk;
	size_t n = lj->bytes - off < lj->chunk ? lj->bytes - off : lj->chunk;
	uint8_t *to = lj->mh->acc + rk * lj->at_step + off;
	const uint8_t *p;
	int r;

	if (atomic_load(&lj->err))
		return;
	/* A copy (process_vm_readv, device staging) lands in acc directly. */
	r = kd_buf_read(ct->client, &ct->sbuf, off, n, to, &p);
	if (r)
		return lj_fail(lj, r, rk);
	if (p != to)
		memcpy(to, p, n);
}

/* Copy the send buffers of the local ranks (all, or only rank 'only') to
 * acc + rk * at_step: all-gather's blocks, broadcast's root. */
static int local_place(struct kd_mh *mh, struct kd_op *op, uint32_t only, uint64_t at_step,
		       uint64_t bytes, uint32_t *bad)
{
	struct local_job lj;

	lj_init(&lj, mh, op, bytes, mh->piece);
	if (only != KCOLL_RANK_NONE) {
		lj.ranks[0] = only;
		lj.n = 1;
	}
	lj_chunk(&lj, copy_chunk(mh, bytes, lj.n));
	lj.at_step = at_step;
	return lj.n && bytes ? lj_run(&lj, place_task, lj.n * lj.per_rank, bad) : 0;
}

/* Phase 3: one piece of the accumulator to one local rank's receive buffer;
 * a rank whose buffer fails is that rank's problem alone. */
static void out_task(struct kd_job *job, uint32_t t)
{
	struct local_job *lj = (struct local_job *)job;
	struct kd_op *op = lj->op;
	uint32_t rk = lj->ranks[t / lj->per_rank];
	struct kd_contrib *ct = &op->c[rk];
	uint64_t off = (uint64_t)(t % lj->per_rank) * lj->chunk;
	size_t n = lj->bytes - off < lj->chunk ? lj->bytes - off : lj->chunk;
	const uint8_t *src = lj->mh->acc + off;
	int r;

	if (op->opcode == KCOLL_OP_REDUCE_SCATTER)
		src += rk * lj->bytes;	/* its block */
	r = kd_buf_write(ct->client, &ct->rbuf, off, src, n);
	if (r)
		kd_op_fail(op, r, rk, 0);
}

static void local_out(struct kd_mh *mh, struct kd_op *op, uint64_t bytes, uint64_t block)
{
	struct local_job lj;
	uint32_t k = 0, none;

	lj_init(&lj, mh, op, op->opcode == KCOLL_OP_REDUCE_SCATTER ? block : bytes, mh->piece);
	/* Broadcast leaves the root's receive buffer alone; a receive buffer
	 * that is the accumulator already holds the result. */
	for (uint32_t i = 0; i < lj.n; i++) {
		const struct kd_buf *rb = &op->c[lj.ranks[i]].rbuf;

		if ((op->opcode != KCOLL_OP_BROADCAST || lj.ranks[i] != op->root) &&
		    rb->direct != mh->acc)
			lj.ranks[k++] = lj.ranks[i];
	}
	lj.n = k;
	lj_chunk(&lj, copy_chunk(mh, lj.bytes, lj.n));
	if (lj.n && lj.bytes)
		lj_run(&lj, out_task, lj.n * lj.per_rank, &none);
}

/* ---- local phases on the GPU ------------------------------------------- */

/*
 * When every local rank's buffers lie on one GPU (kd_exec_gpu_dev), phase 1
 * reduces them there (kcoll_gpu_reduce_n on kcolld's stream, as exec.c's
 * run_task_gpu) into mh->dacc and copies that once to the accumulator, and
 * phase 3 copies the result once to one rank's buffer and device-to-device
 * to the others: no per-rank staging through host memory, no CPU reduction.
 */

/* A GPU step of op failed: name the comm and the step, make sure nothing of
 * it still runs on the stream, return its error. */
static int gpu_fail(struct kd_op *op, int dev, const struct kcoll_gpu_kernels *k, void *st,
		    const char *phase, const char *step, int r)
{
	kc_warn("comm %s: op %llu: GPU %d %s %s failed: %s", op->comm->name,
		(unsigned long long)op->seq, dev, phase, step, k ? k->last_error() : kcoll_strerror(r));
	if (k && st)
		k->stream_sync(st);
	return r;
}

static void gpu_scratch_free(struct kd_mh *mh)
{
	const struct kcoll_gpu_kernels *k;

	if (!mh->dacc)
		return;
	if (kd_gpu_enter(mh->dacc_dev, &k) || k->mem_free(mh->dacc))
		kc_warn("GPU %d: freeing a multi-host comm's reduction buffer failed",
			mh->dacc_dev);
	mh->dacc = NULL;
	mh->dacc_size = 0;
}

/* mh->dacc: at least bytes of device memory on dev. */
static int gpu_scratch(struct kd_mh *mh, int dev, size_t bytes)
{
	const struct kcoll_gpu_kernels *k;
	int r;

	if (mh->dacc && mh->dacc_dev == dev && mh->dacc_size >= bytes)
		return 0;
	gpu_scratch_free(mh);
	r = kd_gpu_enter(dev, &k);
	if (!r)
		r = k->mem_alloc(&mh->dacc, bytes);
	if (r) {
		mh->dacc = NULL;
		return r;
	}
	mh->dacc_size = bytes;
	mh->dacc_dev = dev;
	return 0;
}

/* Phase 1 on GPU dev: the local ranks' inputs -> the accumulator. */
static int gpu_local_in(struct kd_mh *mh, struct kd_op *op, int dev, uint64_t bytes,
			uint64_t block, uint32_t root_host)
{
	const struct kcoll_gpu_kernels *k = NULL;
	const void *ins[KD_MAX_RANKS];
	const char *step = "kcolld's stream";
	uint32_t n = 0;
	void *st = NULL;
	int r = 0;

	if (!bytes)
		return 0;
	for (uint32_t rk = 0; rk < op->comm->nranks; rk++)
		if (op->c[rk].present)
			ins[n++] = op->c[rk].sbuf.dptr;
	if (n > 1 && (op->opcode == KCOLL_OP_ALLREDUCE || op->opcode == KCOLL_OP_REDUCE_SCATTER)) {
		step = "reduction buffer";
		r = gpu_scratch(mh, dev, bytes);
	}
	if (!r)
		r = kd_gpu_stream(dev, &k, &st);
	if (r)
		return gpu_fail(op, dev, k, st, "phase 1", step, r);
	switch (op->opcode) {
	case KCOLL_OP_ALLREDUCE:
	case KCOLL_OP_REDUCE_SCATTER:
		if (n == 1) {
			step = "copy to the host";
			r = k->copy_async(mh->acc, ins[0], bytes, st);
			break;
		}
		step = "reduction";
		r = k->reduce_n(op->dtype, mh->redop, mh->dacc, ins, n, bytes / op->esz, st);
		if (!r) {
			step = "copy to the host";
			r = k->copy_async(mh->acc, mh->dacc, bytes, st);
		}
		break;
	case KCOLL_OP_ALLGATHER:
		step = "copy to the host";
		for (uint32_t rk = 0; !r && rk < op->comm->nranks; rk++)
			if (op->c[rk].present)
				r = k->copy_async(mh->acc + rk * block, op->c[rk].sbuf.dptr, block, st);
		break;
	case KCOLL_OP_BROADCAST:
		step = "copy to the host";
		if (root_host == mh->self)
			r = k->copy_async(mh->acc, op->c[op->root].sbuf.dptr, bytes, st);
		break;
	}
	if (!r) {
		step = "stream synchronization";
		r = k->stream_sync(st);	/* the accumulator is complete before phase 2 */
	}
	if (r)
		return gpu_fail(op, dev, k, st, "phase 1", step, r);
	return 0;
}

/* Phase 3 on GPU dev: the accumulator -> the local ranks' receive buffers. */
static void gpu_local_out(struct kd_mh *mh, struct kd_op *op, int dev, uint64_t bytes,
			  uint64_t block)
{
	const struct kcoll_gpu_kernels *k = NULL;
	const char *step = "kcolld's stream";
	uint8_t *first = NULL;
	void *st = NULL;
	int r = kd_gpu_stream(dev, &k, &st);

	for (uint32_t rk = 0; !r && rk < op->comm->nranks; rk++) {
		uint8_t *to = op->c[rk].rbuf.dptr;

		/* Broadcast leaves the root's receive buffer alone. */
		if (!op->c[rk].present || (op->opcode == KCOLL_OP_BROADCAST && rk == op->root))
			continue;
		if (op->opcode == KCOLL_OP_REDUCE_SCATTER) {
			/* every rank its own block */
			step = "copy to the device";
			r = block ? k->copy_async(to, mh->acc + rk * block, block, st) : 0;
		} else if (!first) {
			step = "copy to the device";
			first = to;
			r = bytes ? k->copy_async(to, mh->acc, bytes, st) : 0;
		} else if (to != first) {
			step = "device-to-device copy";
			r = bytes ? k->copy_async(to, first, bytes, st) : 0;
		}
	}
	if (!r) {
		step = "stream synchronization";
		r = k->stream_sync(st);	/* in the buffers before the op completes */
	}
	if (r)
		kd_op_fail(op, gpu_fail(op, dev, k, st, "phase 3", step, r), KCOLL_RANK_NONE, 0);
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

	if (op->comm->nlocal != 1 || !bytes || !kd_sched_reads_in0(a, mh->nhosts))
		return NULL;
	for (uint32_t rk = 0; rk < op->comm->nranks && !ct; rk++)
		if (op->c[rk].present)
			ct = &op->c[rk];
	if (!ct || !ct->sbuf.direct || ct->sbuf.len < bytes)
		return NULL;
	return ct->sbuf.direct;
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
	int gpu, r = 0;

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

	/* 1. local inputs: on the GPU where all the local buffers are, except
	 * integer avg's widening sum (64-bit, the CPU's kcoll_avg_widen_add) */
	t0 = kd_now_ns();
	gpu = kd_exec_gpu_dev(op);
	if (gpu >= 0)
		kc_dbg("comm %s: op %llu: local phases on GPU %d%s", comm->name,
		       (unsigned long long)op->seq, gpu,
		       wide ? " (phase 1 on the CPU: integer avg sums in 64 bits)" : "");
	if (op->opcode == KCOLL_OP_BROADCAST)
		root_host = mh->rank_host[op->root];
	if (gpu >= 0 && !wide)
		r = gpu_local_in(mh, op, gpu, bytes, block, root_host);
	else switch (op->opcode) {
	case KCOLL_OP_ALLREDUCE:
	case KCOLL_OP_REDUCE_SCATTER:
		if (wide)
			r = local_widen(mh, op, bytes / op->esz, &bad);
		else if (!(in0 = fused_input(mh, op, bytes)))
			r = local_reduce(mh, op, bytes, &bad);
		break;
	case KCOLL_OP_ALLGATHER:
		r = local_place(mh, op, KCOLL_RANK_NONE, block, block, &bad);
		break;
	case KCOLL_OP_BROADCAST:
		if (root_host == mh->self)
			r = local_place(mh, op, op->root, 0, bytes, &bad);
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
	if (gpu >= 0)
		gpu_local_out(mh, op, gpu, bytes, block);
	else
		local_out(mh, op, bytes, block);
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
	gpu_scratch_free(mh);
	free(mh->own);
	free(mh->snap);
	for (uint32_t i = 0; i < KD_MAX_HOSTS * KD_MAX_STREAMS; i++)
		free(mh->rx[i]);
	mh->acc = mh->own = mh->snap = NULL;
	mh->acc_size = mh->snap_size = 0;
}
