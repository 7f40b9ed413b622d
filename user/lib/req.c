// SPDX-License-Identifier: MIT
/*
 * libkcoll: requests on the ring. Taking a request slot, queueing its SQE,
 * reaping CQEs, waiting on the CQ doorbell (spin, then futex in slices that
 * notice a dead daemon), and kcoll_test / kcoll_wait / kcoll_timedwait /
 * kcoll_wait_status / kcoll_req_err_rank.
 * Locking: lib.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <kcoll/futex.h>
#include <kcoll/kcoll.h>
#include <kcoll/ring.h>

#include "lib.h"

/* Fail every pending request: the daemon is gone or we are leaving. */
static void reqs_fail_all(struct kcoll *k, int res)
{
	for (uint32_t i = 0; i < k->nreqs; i++) {
		/* A lane op fails when its communicator's lanes learn of it
		 * (lane_progress), under the locks that take it off them. */
		if (k->reqs[i].state == REQ_PENDING && !k->reqs[i].lane_comm) {
			k->reqs[i].state = REQ_DONE;
			k->reqs[i].res = res;
			k->reqs[i].err_rank = KCOLL_RANK_NONE;
		}
	}
}

/* Take completions off the CQ. Called with ring_lock held. */
static void cq_reap(struct kcoll *k)
{
	int64_t n = kcoll_queue_ready(&k->cq);
	struct kcoll_cqe cqe;

	if (n < 0) {
		k->dead = 1;
		reqs_fail_all(k, -EPROTO);
		return;
	}
	for (int64_t i = 0; i < n; i++) {
		uint32_t idx, gen;

		kcoll_queue_copy(&k->cq, i, &cqe);
		idx = (uint32_t)cqe.user_data;
		gen = (uint32_t)(cqe.user_data >> 32);
		if (idx >= k->nreqs || k->reqs[idx].gen != gen || k->reqs[idx].state != REQ_PENDING)
			continue;
		k->reqs[idx].state = REQ_DONE;
		k->reqs[idx].res = cqe.res;
		k->reqs[idx].err_rank = cqe.err_rank;
	}
	if (n)
		kcoll_queue_release(&k->cq, n);
}

/*
 * Wait until 'done' holds (checked under ring_lock after reaping), the
 * deadline passes (-ETIMEDOUT) or the daemon dies (-ENOTCONN, all pending
 * requests failed). Spin briefly, then sleep on the CQ doorbell in slices so
 * a dead daemon is noticed within a slice.
 */
static int cq_wait(struct kcoll *k, int (*done)(struct kcoll *, void *), void *arg, int timeout_ms,
		   int64_t spin_ns)
{
	const int64_t slice_ns = 100 * 1000000LL;
	int64_t start = kc_now_ns();
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000;

	for (;;) {
		uint32_t seen;
		int64_t t;

		pthread_mutex_lock(&k->ring_lock);
		cq_reap(k);
		/* Sleep only while the tail still equals what we consumed: a CQE
		 * posted after this point changes it and the futex won't block. */
		seen = k->cq.local;
		if (done(k, arg)) {
			pthread_mutex_unlock(&k->ring_lock);
			return 0;
		}
		if (k->dead) {
			reqs_fail_all(k, -ENOTCONN);
			pthread_mutex_unlock(&k->ring_lock);
			continue;	/* done() now sees the failure */
		}
		pthread_mutex_unlock(&k->ring_lock);

		t = kc_now_ns();
		if (t >= deadline)
			return -ETIMEDOUT;
		if (t - start < spin_ns) {
			kcoll_spin_yield();
			continue;
		}
		kcoll_store_relaxed(&k->ring->cq_flags, KCOLL_CQ_NEED_WAKEUP);
		kcoll_smp_mb();
		if (kcoll_load_acquire(&k->ring->cq_tail) == seen) {
			int64_t left = deadline - t;

			kcoll_futex_wait(&k->ring->cq_tail, seen, left < slice_ns ? left : slice_ns);
		}
		kcoll_store_relaxed(&k->ring->cq_flags, 0);
		/* A completion woke us: the daemon lives. Ask the socket only
		 * when nothing arrived (a slice ran out): one system call less
		 * per completion, and a dead daemon is still seen within a slice. */
		if (kcoll_load_acquire(&k->ring->cq_tail) == seen && !kc_daemon_alive(k)) {
			pthread_mutex_lock(&k->ring_lock);
			cq_reap(k);	/* keep completions that did arrive */
			k->dead = 1;
			pthread_mutex_unlock(&k->ring_lock);
		}
	}
}

static int have_free_req(struct kcoll *k, void *arg)
{
	return k->free_reqs != NULL || k->dead;
}

/*
 * A free request, made pending: 0 with ring_lock held, or -ENOTCONN (the
 * daemon is gone) / -EBUSY (none came free within the timeout) without it.
 */
int kc_req_take(struct kcoll *k, int64_t spin_ns, struct kcoll_req **out)
{
	struct kcoll_req *rq;
	int r;

	for (;;) {
		pthread_mutex_lock(&k->ring_lock);
		if (k->dead) {
			pthread_mutex_unlock(&k->ring_lock);
			return -ENOTCONN;
		}
		if (k->free_reqs)
			break;
		pthread_mutex_unlock(&k->ring_lock);
		/* Every slot in flight: wait for one to complete (and be freed). */
		r = cq_wait(k, have_free_req, NULL, k->timeout_ms, k->spin_ns);
		if (r)
			return r == -ETIMEDOUT ? -EBUSY : r;
	}
	rq = k->free_reqs;
	k->free_reqs = rq->next_free;
	rq->gen++;
	rq->state = REQ_PENDING;
	rq->spin_ns = spin_ns;
	*out = rq;
	return 0;
}

/* Queue one SQE; on success *req is the pending request. */
int kc_submit(struct kcoll *k, struct kcoll_sqe *sqe, struct kcoll_req **req, int64_t spin_ns)
{
	struct kcoll_req *rq;
	int r;

	if (!req)
		return -EINVAL;
	r = kc_req_take(k, spin_ns, &rq);
	if (r)
		return r;
	/* Requests in flight never exceed sq_entries, so the SQ has room. */
	sqe->user_data = (uint64_t)rq->gen << 32 | rq->idx;
	if (kcoll_queue_space(&k->sq) <= 0) {
		rq->state = REQ_FREE;
		rq->next_free = k->free_reqs;
		k->free_reqs = rq;
		pthread_mutex_unlock(&k->ring_lock);
		return -EPROTO;
	}
	memcpy(kcoll_queue_slot(&k->sq, 0), sqe, sizeof(*sqe));
	kcoll_queue_publish(&k->sq, 1);
	kcoll_smp_mb();	/* tail store before the NEED_WAKEUP load (see barrier.h) */
	if (kcoll_load_relaxed(&k->ring->sq_flags) & KCOLL_SQ_NEED_WAKEUP)
		kcoll_futex_wake(&k->ring->sq_tail, 1);
	pthread_mutex_unlock(&k->ring_lock);
	*req = rq;
	return 0;
}

static int req_is_done(struct kcoll *k, void *arg)
{
	return ((struct kcoll_req *)arg)->state == REQ_DONE;
}

/* Called with ring_lock held on a REQ_DONE request. */
static int req_finish(struct kcoll_req *rq)
{
	struct kcoll *k = rq->k;

	rq->state = REQ_FREE;
	rq->next_free = k->free_reqs;
	k->free_reqs = rq;
	return rq->res;
}

int kcoll_test(struct kcoll_req *rq, int *result)
{
	struct kcoll *k;
	int done = 0;

	if (!rq || !result)
		return -EINVAL;
	k = rq->k;
	if (rq->lane_comm && rq->state == REQ_PENDING)
		kc_lane_req_progress(rq, 0);
	pthread_mutex_lock(&k->ring_lock);
	cq_reap(k);
	if (rq->state == REQ_PENDING && k->dead)
		reqs_fail_all(k, -ENOTCONN);
	if (rq->state == REQ_DONE) {
		*result = req_finish(rq);
		done = 1;
	}
	pthread_mutex_unlock(&k->ring_lock);
	return done;
}

int kcoll_wait(struct kcoll_req *rq, int timeout_ms)
{
	struct kcoll *k;
	int r;

	if (!rq || rq->state == REQ_FREE)
		return -EINVAL;
	k = rq->k;
	if (rq->lane_comm && rq->state == REQ_PENDING && !kc_lane_req_progress(rq, timeout_ms))
		return -ETIMEDOUT;
	r = cq_wait(k, req_is_done, rq, timeout_ms, rq->spin_ns);
	if (r)
		return r;
	pthread_mutex_lock(&k->ring_lock);
	r = req_finish(rq);
	pthread_mutex_unlock(&k->ring_lock);
	return r;
}

int kcoll_wait_status(struct kcoll_req *rq, int timeout_ms, struct kcoll_status *st)
{
	struct kcoll *k;
	int r;

	if (!rq || !st || rq->state == REQ_FREE)
		return -EINVAL;
	k = rq->k;
	if (rq->lane_comm && rq->state == REQ_PENDING && !kc_lane_req_progress(rq, timeout_ms))
		return 0;
	r = cq_wait(k, req_is_done, rq, timeout_ms, rq->spin_ns);
	if (r)
		return r == -ETIMEDOUT ? 0 : r;
	pthread_mutex_lock(&k->ring_lock);
	/* Read before req_finish: the slot is free for the next submission
	 * the moment ring_lock is dropped. */
	*st = (struct kcoll_status){
		.result = rq->res,
		.err_rank = rq->res && rq->err_rank != KCOLL_RANK_NONE ? (int)rq->err_rank : -1,
	};
	req_finish(rq);
	pthread_mutex_unlock(&k->ring_lock);
	return 1;
}

int kcoll_timedwait(struct kcoll_req *rq, int timeout_ms, int *result)
{
	struct kcoll_status st;
	int r;

	if (!result)
		return -EINVAL;
	r = kcoll_wait_status(rq, timeout_ms, &st);
	if (r == 1)
		*result = st.result;
	return r;
}

int kcoll_req_err_rank(const struct kcoll_req *rq)
{
	return rq && rq->err_rank != KCOLL_RANK_NONE ? (int)rq->err_rank : -1;
}

/* For the other files of the library (lib.h). */
int kcoll_priv_submit(struct kcoll *k, struct kcoll_sqe *sqe, struct kcoll_req **req)
{
	return kc_submit(k, sqe, req, k->spin_ns);
}
