// SPDX-License-Identifier: MIT
/*
 * Ring helpers in isolation: geometry, index wrap-around at 2^32, detection
 * of impossible indices, and multi-threaded producer/consumer stress with
 * the futex doorbell protocol (a lost wakeup shows up as a timed-out sleep
 * while data was waiting).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <kcoll/futex.h>
#include <kcoll/ring.h>
#include <kcoll/tap.h>

#define STRESS_ITEMS	400000u
#define PRODUCERS	4

struct shared {
	struct kcoll_ring_hdr hdr;
	struct kcoll_sqe sq[64];
};

static struct shared *ring_new(uint32_t start)
{
	struct shared *s = aligned_alloc(64, sizeof(*s));

	memset(s, 0, sizeof(*s));
	s->hdr.sq_tail = s->hdr.sq_head = start;
	return s;
}

static void test_geometry(void)
{
	tap_ok(kcoll_ring_sq_off() == KCOLL_RING_HDR_SIZE, "SQ starts after the header page");
	tap_ok(kcoll_ring_cq_off(256) == KCOLL_RING_HDR_SIZE + 256 * 64, "CQ follows 256 SQEs");
	tap_ok(kcoll_ring_size(256, 512) == 4096 + 256 * 64 + 512 * 32, "ring size for 256/512");
	tap_ok(kcoll_ring_size(2, 4) % 4096 == 0, "ring size is page-rounded");
	tap_ok(!kcoll_is_pow2(0) && kcoll_is_pow2(1) && kcoll_is_pow2(4096) && !kcoll_is_pow2(48),
	       "power-of-two check");
}

/* Indices are free-running: crossing 2^32 must be invisible. */
static void test_wrap(void)
{
	struct shared *s = ring_new(UINT32_MAX - 20);
	struct kcoll_queue p, c;
	int ok = 1;

	kcoll_queue_init(&p, &s->hdr.sq_tail, &s->hdr.sq_head, s->sq, 64, sizeof(struct kcoll_sqe));
	kcoll_queue_init(&c, &s->hdr.sq_head, &s->hdr.sq_tail, s->sq, 64, sizeof(struct kcoll_sqe));
	for (uint64_t i = 0; i < 1000 && ok; i++) {
		struct kcoll_sqe *e, got;

		ok &= kcoll_queue_space(&p) == 64;
		e = kcoll_queue_slot(&p, 0);
		e->user_data = i;
		kcoll_queue_publish(&p, 1);
		ok &= kcoll_queue_ready(&c) == 1;
		kcoll_queue_copy(&c, 0, &got);
		ok &= got.user_data == i;
		kcoll_queue_release(&c, 1);
	}
	tap_ok(ok, "1000 entries across the 2^32 index wrap, in order");

	/* Fill completely, then the producer must see zero space. */
	for (int i = 0; i < 64; i++)
		kcoll_queue_publish(&p, 1);
	tap_ok(kcoll_queue_space(&p) == 0 && kcoll_queue_ready(&c) == 64, "full queue: no space, 64 ready");
	free(s);
}

static void test_corrupt(void)
{
	struct shared *s = ring_new(100);
	struct kcoll_queue p, c;

	kcoll_queue_init(&p, &s->hdr.sq_tail, &s->hdr.sq_head, s->sq, 64, sizeof(struct kcoll_sqe));
	kcoll_queue_init(&c, &s->hdr.sq_head, &s->hdr.sq_tail, s->sq, 64, sizeof(struct kcoll_sqe));
	s->hdr.sq_tail = 100 + 65;
	tap_ok(kcoll_queue_ready(&c) == -EBADMSG, "tail more than a ring ahead is refused");
	s->hdr.sq_tail = 99;
	tap_ok(kcoll_queue_ready(&c) == -EBADMSG, "tail behind head is refused");
	s->hdr.sq_tail = 100 + 64;
	tap_ok(kcoll_queue_ready(&c) == 64, "tail exactly a ring ahead is fine");
	s->hdr.sq_head = 100 + 1;	/* consumer claims more than produced */
	tap_ok(kcoll_queue_space(&p) == -EBADMSG, "head ahead of the producer is refused");
	/* The producer never reads its own index back from shared memory. */
	s->hdr.sq_head = 100;
	s->hdr.sq_tail = 12345;
	tap_ok(kcoll_queue_space(&p) == 64, "forged shared tail does not change the producer's view");
	free(s);
}

struct stress {
	struct shared *s;
	struct kcoll_queue p, c;
	pthread_mutex_t plock;
	uint32_t per_producer;
	int nproducers;
	int next_id;
	int lost_wakeups;
	int bad;
	uint64_t consumed;
};

/* Producer side of the doorbell: publish, fence, wake if the consumer sleeps. */
static void *producer(void *arg)
{
	struct stress *st = arg;
	int id = __atomic_fetch_add(&st->next_id, 1, __ATOMIC_RELAXED);

	for (uint32_t i = 0; i < st->per_producer;) {
		pthread_mutex_lock(&st->plock);
		if (kcoll_queue_space(&st->p) > 0) {
			struct kcoll_sqe *e = kcoll_queue_slot(&st->p, 0);

			e->user_data = (uint64_t)id << 32 | i;
			e->coll.count = ~e->user_data;
			kcoll_queue_publish(&st->p, 1);
			i++;
			kcoll_smp_mb();
			if (kcoll_load_relaxed(&st->s->hdr.sq_flags) & KCOLL_SQ_NEED_WAKEUP)
				kcoll_futex_wake(&st->s->hdr.sq_tail, 1);
		}
		pthread_mutex_unlock(&st->plock);
	}
	return NULL;
}

/* Consumer side: drain, and when empty sleep exactly as kcolld's ring thread does. */
static void *consumer(void *arg)
{
	struct stress *st = arg;
	uint32_t *next = calloc(st->nproducers, sizeof(*next));
	uint64_t total = (uint64_t)st->per_producer * st->nproducers;

	while (st->consumed < total) {
		int64_t n = kcoll_queue_ready(&st->c);

		if (n < 0) {
			st->bad++;
			break;
		}
		if (n == 0) {
			uint32_t tail = st->c.local;

			kcoll_store_relaxed(&st->s->hdr.sq_flags, KCOLL_SQ_NEED_WAKEUP);
			kcoll_smp_mb();
			if (kcoll_load_acquire(&st->s->hdr.sq_tail) == tail &&
			    kcoll_futex_wait(&st->s->hdr.sq_tail, tail, 2000000000LL) == -ETIMEDOUT)
				st->lost_wakeups++;
			kcoll_store_relaxed(&st->s->hdr.sq_flags, 0);
			continue;
		}
		for (int64_t i = 0; i < n; i++) {
			struct kcoll_sqe e;
			uint32_t pid, seq;

			kcoll_queue_copy(&st->c, i, &e);
			pid = e.user_data >> 32;
			seq = (uint32_t)e.user_data;
			if (pid >= (uint32_t)st->nproducers || seq != next[pid] || e.coll.count != ~e.user_data)
				st->bad++;
			else
				next[pid]++;
		}
		kcoll_queue_release(&st->c, n);
		st->consumed += n;
	}
	free(next);
	return NULL;
}

static void stress(int nproducers)
{
	struct stress st = { .nproducers = nproducers, .per_producer = STRESS_ITEMS / nproducers };
	pthread_t prod[PRODUCERS], cons;

	st.s = ring_new(UINT32_MAX - 1000);
	pthread_mutex_init(&st.plock, NULL);
	kcoll_queue_init(&st.p, &st.s->hdr.sq_tail, &st.s->hdr.sq_head, st.s->sq, 64, sizeof(struct kcoll_sqe));
	kcoll_queue_init(&st.c, &st.s->hdr.sq_head, &st.s->hdr.sq_tail, st.s->sq, 64, sizeof(struct kcoll_sqe));
	pthread_create(&cons, NULL, consumer, &st);
	for (int i = 0; i < nproducers; i++)
		pthread_create(&prod[i], NULL, producer, &st);
	for (int i = 0; i < nproducers; i++)
		pthread_join(prod[i], NULL);
	pthread_join(cons, NULL);
	tap_ok(st.consumed == (uint64_t)st.per_producer * nproducers && !st.bad,
	       "%d producer(s) x %u entries: all consumed in per-producer order, intact (%d bad)",
	       nproducers, st.per_producer, st.bad);
	tap_ok(!st.lost_wakeups, "%d producer(s): no lost doorbell wakeup (%d)", nproducers, st.lost_wakeups);
	free(st.s);
}

int main(void)
{
	test_geometry();
	test_wrap();
	test_corrupt();
	stress(1);
	stress(PRODUCERS);
	return tap_done();
}
