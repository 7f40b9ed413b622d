// SPDX-License-Identifier: MIT
/*
 * Running a matched op. An op is cut into tasks (one chunk of one segment);
 * the thread that made it ready runs tasks itself and, for large ops, shares
 * them with the worker pool. Whoever finishes the last task completes the op
 * and starts the communicator's next one.
 *
 * How each rank's buffer is reached is mem.c's business (kd_buf_read/write).
 * When every buffer of an op is GPU memory on one device, run_task_gpu does
 * the same work there instead: kcoll_gpu_reduce_n over the mapped inputs into
 * one receiver, device-to-device copies to the others, on kcolld's stream of
 * that device, synchronized before the task counts as done (docs/gpu.md).
 *
 * exec.c sits above comm.c: comm.c hands it ready single-host ops through
 * the struct kd_comm_exec_ops that kd_pool_start installs; multi-host ops
 * go to their net thread (mh.c) instead, which runs its node-local phases
 * as jobs (struct kd_job) on the same pool: it waits for them, so the pool
 * takes jobs before ops. Where kd_exec_gpu_dev finds the local ranks'
 * buffers on one GPU, mh.c runs those phases on the GPU instead.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>

#include <kcoll/kcoll.h>

#include "kcoll_gpu.h"
#include "kcolld.h"
#include "log.h"
#include "reduce.h"

static struct {
	pthread_t *threads;
	int n;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct kd_op *queue;	/* ops with tasks left to claim */
	struct kd_job *jobs;	/* jobs with tasks left to claim */
	bool stop;
} pool = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static __thread uint8_t *stage;
static __thread size_t stage_size;

static uint8_t *stage_get(size_t size)
{
	if (stage_size < size) {
		free(stage);
		stage = malloc(size);
		stage_size = stage ? size : 0;
	}
	return stage;
}

uint8_t *kd_exec_stage(size_t size)
{
	return stage_get(size);
}

void kd_exec_thread_done(void)
{
	free(stage);
	stage = NULL;
	stage_size = 0;
}

/* One task of an op whose buffers all lie on GPU op->gpu_dev. */
static void run_task_gpu(struct kd_op *op, uint32_t seg, uint64_t e, uint64_t n)
{
	uint32_t nr = op->comm->nranks;
	size_t bytes = n * op->esz;
	const void *ins[KD_MAX_RANKS];
	const struct kcoll_gpu_kernels *k;
	uint64_t soff, roff;
	uint32_t src_rank, dst;
	uint8_t *out;
	const char *what;
	void *st;
	int r = kd_gpu_stream(op->gpu_dev, &k, &st);

	if (r)
		return kd_op_fail(op, r, KCOLL_RANK_NONE, 0);
	switch (op->opcode) {
	case KCOLL_OP_ALLREDUCE:
	case KCOLL_OP_REDUCE_SCATTER:
		soff = (seg * op->seg_elems + e) * op->esz;
		roff = op->opcode == KCOLL_OP_ALLREDUCE ? soff : e * op->esz;
		dst = op->opcode == KCOLL_OP_REDUCE_SCATTER ? seg : 0;
		for (uint32_t i = 0; i < nr; i++)
			ins[i] = op->c[i].sbuf.dptr + soff;
		out = op->c[dst].rbuf.dptr + roff;
		what = "reduction";
		r = k->reduce_n(op->dtype, op->redop, out, ins, nr, n, st);
		for (uint32_t i = 0; !r && op->opcode == KCOLL_OP_ALLREDUCE && i < nr; i++) {
			what = "device-to-device copy";
			if (i != dst)
				r = k->copy_async(op->c[i].rbuf.dptr + roff, out, bytes, st);
		}
		break;
	default:	/* all-gather, broadcast */
		src_rank = op->opcode == KCOLL_OP_ALLGATHER ? seg : op->root;
		soff = e * op->esz;
		roff = (seg * op->seg_elems + e) * op->esz;
		what = "device-to-device copy";
		r = 0;
		for (uint32_t i = 0; !r && i < nr; i++) {
			uint8_t *to = op->c[i].rbuf.dptr + roff;
			const uint8_t *from = op->c[src_rank].sbuf.dptr + soff;

			/* broadcast's root, all-gather in place: already there */
			if (to == from || (op->opcode == KCOLL_OP_BROADCAST && i == src_rank))
				continue;
			r = k->copy_async(to, from, bytes, st);
		}
		break;
	}
	if (!r) {
		what = "stream synchronization";
		r = k->stream_sync(st);	/* done on the GPU before the task counts */
	}
	if (r) {
		kc_warn("comm %s: GPU %d %s failed: %s", op->comm->name, op->gpu_dev, what,
			k->last_error());
		k->stream_sync(st);	/* nothing of this task may still run after it fails */
		kd_op_fail(op, r, KCOLL_RANK_NONE, 0);
	}
}

/*
 * One task: elements [e, e+n) of segment 'seg'. Segments: all-reduce and
 * broadcast have one; reduce-scatter and all-gather one per rank.
 */
static void run_task(struct kd_op *op, uint32_t task)
{
	uint32_t nr = op->comm->nranks;
	uint32_t seg = task / op->tasks_per_seg;
	uint64_t e = (uint64_t)(task % op->tasks_per_seg) * op->chunk_elems;
	uint64_t n = op->seg_elems - e < op->chunk_elems ? op->seg_elems - e : op->chunk_elems;
	size_t bytes = n * op->esz;
	size_t cb = op->chunk_elems * op->esz;
	const uint8_t *ins[KD_MAX_RANKS];
	uint8_t *tmp = stage_get(cb * (nr + 1));
	uint8_t *out;
	uint64_t soff, roff;
	uint32_t src_rank, dst;
	int r;

	if (!tmp) {
		kd_op_fail(op, -ENOMEM, KCOLL_RANK_NONE, 0);
		return;
	}
	if (atomic_load(&op->err))
		return;	/* already failed: do no more work */
	if (op->on_gpu)
		return run_task_gpu(op, seg, e, n);

	switch (op->opcode) {
	case KCOLL_OP_ALLREDUCE:
	case KCOLL_OP_REDUCE_SCATTER:
		soff = (seg * op->seg_elems + e) * op->esz;
		for (uint32_t k = 0; k < nr; k++) {
			r = kd_buf_read(op->c[k].client, &op->c[k].sbuf, soff, bytes, tmp + k * cb, &ins[k]);
			if (r)
				return kd_op_fail(op, r, k, 0);
		}
		/* Reduce straight into a receiver that is shared memory if any. */
		roff = (op->opcode == KCOLL_OP_ALLREDUCE ? soff : e * op->esz);
		dst = op->opcode == KCOLL_OP_REDUCE_SCATTER ? seg : 0;
		out = tmp + nr * cb;
		if (op->opcode == KCOLL_OP_ALLREDUCE) {
			for (uint32_t k = 0; k < nr; k++) {
				if (op->c[k].rbuf.direct) {
					dst = k;
					break;
				}
			}
		}
		if (op->c[dst].rbuf.direct)
			out = op->c[dst].rbuf.direct + roff;
		r = kcoll_reduce_n(op->dtype, op->redop, out, (const void *const *)ins, nr, n);
		if (r)
			return kd_op_fail(op, r, KCOLL_RANK_NONE, 0);
		if (op->opcode == KCOLL_OP_REDUCE_SCATTER) {
			r = kd_buf_write(op->c[seg].client, &op->c[seg].rbuf, roff, out, bytes);
			if (r)
				kd_op_fail(op, r, seg, 0);
			return;
		}
		for (uint32_t k = 0; k < nr; k++) {
			r = kd_buf_write(op->c[k].client, &op->c[k].rbuf, roff, out, bytes);
			if (r)
				return kd_op_fail(op, r, k, 0);
		}
		return;

	case KCOLL_OP_ALLGATHER:
	case KCOLL_OP_BROADCAST:
		src_rank = op->opcode == KCOLL_OP_ALLGATHER ? seg : op->root;
		soff = e * op->esz;
		roff = (seg * op->seg_elems + e) * op->esz;
		r = kd_buf_read(op->c[src_rank].client, &op->c[src_rank].sbuf, soff, bytes, tmp, &ins[0]);
		if (r)
			return kd_op_fail(op, r, src_rank, 0);
		for (uint32_t k = 0; k < nr; k++) {
			if (op->opcode == KCOLL_OP_BROADCAST && k == src_rank)
				continue;
			r = kd_buf_write(op->c[k].client, &op->c[k].rbuf, roff, ins[0], bytes);
			if (r)
				return kd_op_fail(op, r, k, 0);
		}
		return;
	}
}

int kd_exec_gpu_dev(const struct kd_op *op)
{
	int dev = -1;

	for (uint32_t k = 0; k < op->comm->nranks; k++) {
		const struct kd_contrib *ct = &op->c[k];

		if (!ct->present)
			continue;
		if (dev < 0)
			dev = ct->sbuf.gpu_dev;
		if (ct->sbuf.ops != &kd_mem_dev || ct->rbuf.ops != &kd_mem_dev ||
		    ct->sbuf.gpu_dev != dev || ct->rbuf.gpu_dev != dev ||
		    ((uintptr_t)ct->sbuf.dptr | (uintptr_t)ct->rbuf.dptr) % op->esz)
			return -1;
	}
	return dev;
}

/* Resolve every rank's buffers and cut the op into tasks. */
static void op_prepare(struct kd_op *op)
{
	uint32_t nr = op->comm->nranks;
	uint64_t chunk = __atomic_load_n(&kd.chunk_bytes, __ATOMIC_RELAXED);
	/* Segments: reduce-scatter and all-gather have one per rank. */
	uint32_t nseg = op->opcode == KCOLL_OP_REDUCE_SCATTER || op->opcode == KCOLL_OP_ALLGATHER ? nr : 1;

	op->esz = kcoll_dtype_size(op->dtype);
	op->seg_elems = op->count;
	if (op->opcode == KCOLL_OP_BARRIER || atomic_load(&op->err) || !op->count) {
		op->ntasks = 0;
		return;
	}
	for (uint32_t k = 0; k < nr; k++) {
		struct kd_contrib *ct = &op->c[k];

		kd_buf_resolve_kind(ct->client, ct->send, ct->sbuf.len, ct->send_mem, &ct->sbuf);
		kd_buf_resolve_kind(ct->client, ct->recv, ct->rbuf.len, ct->recv_mem, &ct->rbuf);
	}
	/* Every buffer on one GPU: stay there. Otherwise kd_mem_dev stages
	 * device buffers through host memory. */
	op->gpu_dev = kd_exec_gpu_dev(op);
	op->on_gpu = op->gpu_dev >= 0;
	if (op->on_gpu)
		kc_dbg("comm %s: op %llu runs on GPU %d", op->comm->name, (unsigned long long)op->seq,
		       op->gpu_dev);
	/* The stage holds nr + 1 chunks; keep it bounded for many ranks. */
	if (chunk * (nr + 1) > KD_STAGE_MAX)
		chunk = KD_STAGE_MAX / (nr + 1);
	op->chunk_elems = chunk / op->esz ? chunk / op->esz : 1;
	op->tasks_per_seg = (op->seg_elems + op->chunk_elems - 1) / op->chunk_elems;
	op->ntasks = op->tasks_per_seg * nseg;
}

/* Claim and run tasks until none are left; true if we ran the last one. */
static bool work_on(struct kd_op *op)
{
	for (;;) {
		uint32_t t = atomic_fetch_add(&op->next_task, 1);

		if (t >= op->ntasks)
			return false;
		run_task(op, t);
		if (atomic_fetch_sub(&op->tasks_left, 1) == 1)
			return true;
	}
}

static void op_finish_chain(struct kd_op *op);

/* Drop the caller's use and wait until no other thread is inside the
 * task loop (each finishes the task it claimed and finds no more). */
static void drain_users(atomic_uint *users)
{
	atomic_fetch_sub(users, 1);
	while (atomic_load(users))
		sched_yield();
}

/*
 * Take an op or a job (both queues link through ->next and count ->users)
 * off its pool queue, so no new thread can join it, then drain it: after
 * this nobody touches it, and it may be completed, freed or go out of
 * scope. A macro because the two queues hold different types.
 */
#define pool_unlink_drain(head, item) do {				\
	pthread_mutex_lock(&pool.lock);					\
	for (__typeof__(item) *pp_ = &(head); *pp_; pp_ = &(*pp_)->next) { \
		if (*pp_ == (item)) {					\
			*pp_ = (item)->next;				\
			break;						\
		}							\
	}								\
	pthread_mutex_unlock(&pool.lock);				\
	drain_users(&(item)->users);					\
} while (0)

/*
 * A thread is done with an op it worked on. The one that ran the last task
 * unlinks and drains it (the others find no task and return at once), then
 * completes it: nobody touches a freed op.
 */
static void op_leave(struct kd_op *op, bool last)
{
	if (!last) {
		atomic_fetch_sub(&op->users, 1);
		return;
	}
	pool_unlink_drain(pool.queue, op);
	op_finish_chain(op);
}

/* Run a prepared op with more than one task: share it with the pool. */
static void op_start(struct kd_op *op)
{
	atomic_store(&op->tasks_left, op->ntasks);
	atomic_store(&op->next_task, 0);
	atomic_store(&op->users, 1);
	if (op->ntasks > 1 && pool.n) {
		pthread_mutex_lock(&pool.lock);
		op->next = pool.queue;
		pool.queue = op;
		pthread_cond_broadcast(&pool.cond);
		pthread_mutex_unlock(&pool.lock);
	}
	op_leave(op, work_on(op));
}

/* comm.c's runner: split a ready op into tasks, share them with the pool,
 * complete it and the comm's ops that become runnable after it. */
static void exec_run(struct kd_op *op)
{
	op_prepare(op);
	if (op->ntasks > 1) {
		op_start(op);
		return;
	}
	if (op->ntasks)
		run_task(op, 0);
	op_finish_chain(op);
}

static void op_finish_chain(struct kd_op *op)
{
	while (op) {
		struct kd_op *next = kd_comm_op_done(op);

		if (!next)
			return;
		op_prepare(next);
		if (next->ntasks > 1) {
			op_start(next);
			return;
		}
		/* Small op: run it right here, no pool round trip. */
		if (next->ntasks)
			run_task(next, 0);
		op = next;
	}
}

/* Claim and run a job's tasks until none are left. */
static void job_work_on(struct kd_job *job)
{
	for (uint32_t t; (t = atomic_fetch_add(&job->next_task, 1)) < job->ntasks;)
		job->task(job, t);
}

void kd_exec_job(struct kd_job *job)
{
	atomic_store(&job->next_task, 0);
	atomic_store(&job->users, 1);
	if (job->ntasks < 2 || !pool.n) {
		job_work_on(job);	/* nothing to share */
		return;
	}
	pthread_mutex_lock(&pool.lock);
	job->next = pool.jobs;
	pool.jobs = job;
	pthread_cond_broadcast(&pool.cond);
	pthread_mutex_unlock(&pool.lock);
	job_work_on(job);
	pool_unlink_drain(pool.jobs, job);	/* the job may live on our stack */
}

/* A worker takes a job (its caller waits) before an op. Called with
 * pool.lock held; returns with it released. */
static void worker_job(struct kd_job *job)
{
	if (atomic_load(&job->next_task) >= job->ntasks) {
		pool.jobs = job->next;	/* nothing left to claim */
		pthread_mutex_unlock(&pool.lock);
		return;
	}
	atomic_fetch_add(&job->users, 1);
	pthread_mutex_unlock(&pool.lock);
	job_work_on(job);
	atomic_fetch_sub(&job->users, 1);
}

static void *worker(void *arg)
{
	for (;;) {
		struct kd_op *op;

		pthread_mutex_lock(&pool.lock);
		while (!pool.queue && !pool.jobs && !pool.stop)
			pthread_cond_wait(&pool.cond, &pool.lock);
		if (pool.stop) {
			pthread_mutex_unlock(&pool.lock);
			kd_exec_thread_done();
			return NULL;
		}
		if (pool.jobs) {
			worker_job(pool.jobs);
			continue;
		}
		op = pool.queue;
		if (atomic_load(&op->next_task) >= op->ntasks) {
			/* Nothing left to claim: off the queue for everyone. */
			pool.queue = op->next;
			pthread_mutex_unlock(&pool.lock);
			continue;
		}
		atomic_fetch_add(&op->users, 1);
		pthread_mutex_unlock(&pool.lock);
		op_leave(op, work_on(op));
	}
}

static const struct kd_comm_exec_ops exec_ops = { .run = exec_run };

int kd_pool_start(int n)
{
	sigset_t all, old;

	kd_comm_set_exec(&exec_ops);

	pool.threads = calloc(n, sizeof(*pool.threads));
	if (n && !pool.threads)
		return -ENOMEM;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (pool.n = 0; pool.n < n; pool.n++)
		if (pthread_create(&pool.threads[pool.n], NULL, worker, NULL))
			break;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return pool.n == n ? 0 : -EAGAIN;
}

void kd_pool_stop(void)
{
	pthread_mutex_lock(&pool.lock);
	pool.stop = true;
	pthread_cond_broadcast(&pool.cond);
	pthread_mutex_unlock(&pool.lock);
	for (int i = 0; i < pool.n; i++)
		pthread_join(pool.threads[i], NULL);
	free(pool.threads);
	pool.threads = NULL;
	pool.n = 0;
}

/* Ring threads run ops' tasks too: their staging buffer goes when they exit. */
const struct kd_client_ops kd_exec_client_ops = {
	.name = "exec",
	.thread_done = kd_exec_thread_done,
};
