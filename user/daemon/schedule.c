// SPDX-License-Identifier: MIT
/*
 * The inter-host algorithms of a multi-host op (phase 2 of mh.c's three):
 * each host runs the same schedule on its accumulator, as steps of sends
 * and receives that the step engine (step.c) carries out over the
 * communicator's transport (mh->xport).
 * Direct (small), ring, recursive doubling or Rabenseifner for all-reduce,
 * ring reduce-scatter/all-gather, scatter + ring all-gather (or direct, if
 * small) for broadcast, dissemination for barrier. Nothing here knows the
 * ranks' buffers or the wire: tests/test_sched.c runs every schedule for
 * 1..9 hosts over an in-process transport and checks every byte.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <kcoll/kcoll.h>

#include "kcolld.h"
#include "mh.h"
#include "reduce.h"
#include "schedule.h"
#include "step.h"
#include "xport.h"

#define DIRECT_MAX	(4u << 20)	/* direct: (H - 1) x this in scratch; ring above */
#define MEDIUM_BYTES	(1u << 20)	/* auto: Rabenseifner up to here (2^k hosts) */
#define BCAST_DIRECT	(256u << 10)	/* broadcast: root sends to all up to here */

struct run {
	struct kd_mh *mh;
	struct kd_op *op;
	uint32_t step;
	uint32_t bad_host;
	/* The single local rank's input, used in place by the first step that
	 * touches each byte (no copy into the accumulator); NULL: acc has it. */
	const uint8_t *in0;
};

static int step(struct run *x, const struct kd_step *st)
{
	return kd_step_run(x->mh, x->op, st, 1, x->step++, false, &x->bad_host);
}

static void xfer(struct kd_xfer *f, uint32_t host, const struct kd_range *r, uint32_t nr)
{
	*f = (struct kd_xfer){ .host = host, .nr = nr, .r = r };
}

/* Elements [h*n/H, (h+1)*n/H) of n, as bytes. */
static struct kd_range split(uint64_t n, uint32_t h, uint32_t H, size_t esz)
{
	uint64_t a = n * h / H, b = n * (h + 1) / H;

	return (struct kd_range){ a * esz, (b - a) * esz };
}

/* ---- ring ----------------------------------------------------------------- */

struct segs {
	struct kd_range *r;	/* all ranges */
	uint32_t *first, *n;	/* [H]: host h's ranges are r[first[h]..+n[h]] */
};

static void segs_free(struct segs *s)
{
	free(s->r);
	free(s->first);
	free(s->n);
}

/* Even split of S bytes (esz elements) into H segments. */
static int segs_even(struct segs *s, uint64_t bytes, size_t esz, uint32_t H)
{
	s->r = calloc(H, sizeof(*s->r));
	s->first = calloc(H, sizeof(*s->first));
	s->n = calloc(H, sizeof(*s->n));
	if (!s->r || !s->first || !s->n)
		return -ENOMEM;
	for (uint32_t h = 0; h < H; h++) {
		s->r[h] = split(bytes / esz, h, H, esz);
		s->first[h] = h;
		s->n[h] = 1;
	}
	return 0;
}

/* Host h's segment: the blocks of its ranks (count elements each). */
static int segs_hosts(struct segs *s, const struct kd_mh *mh, uint32_t nranks, uint64_t block)
{
	uint32_t H = mh->nhosts, k = 0;

	s->r = calloc(nranks, sizeof(*s->r));
	s->first = calloc(H, sizeof(*s->first));
	s->n = calloc(H, sizeof(*s->n));
	if (!s->r || !s->first || !s->n)
		return -ENOMEM;
	for (uint32_t h = 0; h < H; h++) {
		s->first[h] = k;
		for (uint32_t r = 0; r < nranks; r++) {
			if (mh->rank_host[r] != h)
				continue;
			if (s->n[h] && s->r[k - 1].off + s->r[k - 1].len == r * block)
				s->r[k - 1].len += block;	/* contiguous: one range */
			else
				s->r[k++] = (struct kd_range){ r * block, block }, s->n[h]++;
		}
	}
	return 0;
}

/*
 * Ring phases as one chain of steps: reduce-scatter (host h ends with
 * segment h reduced), all-gather (host h starts with segment h), or both.
 */
static int ring(struct run *x, const struct segs *sg, bool rs, bool ag)
{
	struct kd_mh *mh = x->mh;
	uint32_t H = mh->nhosts, h = mh->self, n = 0;
	uint32_t next = (h + 1) % H, prev = (h + H - 1) % H;
	struct kd_step *st = calloc(2 * H, sizeof(*st));
	int r;

	if (!st)
		return -ENOMEM;
	for (int phase = 0; phase < 2; phase++) {
		bool reduce = phase == 0;

		if ((reduce && !rs) || (!reduce && !ag))
			continue;
		for (uint32_t s = 0; s + 1 < H; s++, n++) {
			uint32_t sb = reduce ? (h + 2 * H - s - 1) % H : (h + H - s) % H;
			uint32_t rb = reduce ? (h + 2 * H - s - 2) % H : (h + 2 * H - s - 1) % H;

			st[n].nsend = st[n].nrecv = 1;
			st[n].reduce = reduce;
			xfer(&st[n].send[0], next, &sg->r[sg->first[sb]], sg->n[sb]);
			xfer(&st[n].recv[0], prev, &sg->r[sg->first[rb]], sg->n[rb]);
			/* Reduce-scatter touches every segment once from the input:
			 * segment h-1 is sent first, each other is received once. */
			if (reduce && x->in0) {
				st[n].recv[0].src = x->in0;
				if (s == 0)
					st[n].send[0].base = x->in0;
			}
		}
	}
	r = n ? kd_step_run(mh, x->op, st, n, x->step, true, &x->bad_host) : 0;
	x->step += n;
	free(st);
	return r;
}

/* ---- recursive doubling / Rabenseifner, with the non-power-of-two fold ---- */

/* Hosts [0, 2*rem) pair up: the even one hands its data to the odd one and
 * sits out; the rest form a power of two of virtual hosts. */
struct fold {
	uint32_t p, rem;
	int vh;			/* our virtual index, -1 if we sit out */
};

static struct fold fold_of(uint32_t H, uint32_t h)
{
	struct fold f = { .p = 1 };

	while (f.p * 2 <= H)
		f.p *= 2;
	f.rem = H - f.p;
	f.vh = h < 2 * f.rem ? (h % 2 ? (int)(h / 2) : -1) : (int)(h - f.rem);
	return f;
}

static uint32_t real_host(const struct fold *f, uint32_t v)
{
	return v < f->rem ? 2 * v + 1 : v + f->rem;
}

static int fold_in(struct run *x, const struct fold *f, const struct kd_range *all)
{
	uint32_t h = x->mh->self;
	struct kd_step st = { .reduce = true };

	/* Step numbers are the same on every host: the data headers carry them. */
	if (h >= 2 * f->rem) {
		x->step++;
		return 0;
	}
	if (h % 2 == 0) {
		st.nsend = 1;
		xfer(&st.send[0], h + 1, all, 1);
	} else {
		st.nrecv = 1;
		xfer(&st.recv[0], h - 1, all, 1);
	}
	return step(x, &st);
}

static int fold_out(struct run *x, const struct fold *f, const struct kd_range *all)
{
	uint32_t h = x->mh->self;
	struct kd_step st = { .reduce = false };

	if (h >= 2 * f->rem) {
		x->step++;
		return 0;
	}
	if (h % 2) {
		st.nsend = 1;
		xfer(&st.send[0], h - 1, all, 1);
	} else {
		st.nrecv = 1;
		xfer(&st.recv[0], h + 1, all, 1);
	}
	return step(x, &st);
}

static int snap(struct kd_mh *mh, uint64_t bytes)
{
	if (mh->snap_size < bytes) {
		uint8_t *p;

		if (mh->snap)
			kd_unmap_notify(mh->snap, mh->snap_size);
		p = realloc(mh->snap, bytes);

		if (!p)
			return -ENOMEM;
		mh->snap = p;
		mh->snap_size = bytes;
	}
	memcpy(mh->snap, mh->acc, bytes);
	return 0;
}

static int allreduce_rd(struct run *x, uint64_t bytes)
{
	struct kd_mh *mh = x->mh;
	struct fold f = fold_of(mh->nhosts, mh->self);
	struct kd_range all = { 0, bytes };
	int r = fold_in(x, &f, &all);

	for (uint32_t d = 1; !r && d < f.p; d <<= 1) {
		struct kd_step st = { .nsend = 1, .nrecv = 1, .reduce = true };
		uint32_t peer = real_host(&f, f.vh ^ d);

		if (f.vh < 0) {
			x->step++;	/* folded away: sit this step out */
			continue;
		}
		/* Send what we had before this step: the reduction overwrites acc. */
		r = snap(mh, bytes);
		if (r)
			return r;
		xfer(&st.send[0], peer, &all, 1);
		st.send[0].base = mh->snap;
		xfer(&st.recv[0], peer, &all, 1);
		r = step(x, &st);
	}
	return r ? r : fold_out(x, &f, &all);
}

/*
 * Direct: every host sends its data to every other host in one step and
 * reduces all H inputs itself, in host order, so every host computes the
 * same bits. One network round instead of log2 H (plus the fold's two when
 * H is not a power of two): for small messages the round trips, each
 * waiting for a peer's wake-ups, cost more than the (H - 1) x bytes sent.
 */
static int allreduce_direct(struct run *x, uint64_t bytes)
{
	struct kd_mh *mh = x->mh;
	uint32_t H = mh->nhosts, h = mh->self;
	const uint8_t *mine = x->in0 ? x->in0 : mh->acc;
	const uint8_t *ins[KD_MAX_HOSTS];
	struct kd_range all = { 0, bytes };
	struct kd_step st = { .reduce = false };
	/* One scratch slot per other host: host k's input lands in slot k, or
	 * k - 1 above us. */
	int r = kd_grow(&mh->snap, &mh->snap_size, (H - 1) * bytes);

	if (r)
		return r;
	for (uint32_t k = 0; k < H; k++) {
		uint8_t *slot = mh->snap + (k - (k > h)) * bytes;

		ins[k] = k == h ? mine : slot;
		if (k == h)
			continue;
		xfer(&st.send[st.nsend], k, &all, 1);
		st.send[st.nsend++].base = mine;
		xfer(&st.recv[st.nrecv], k, &all, 1);
		st.recv[st.nrecv++].dst = slot;
	}
	r = step(x, &st);
	if (r)
		return r;
	return kcoll_reduce_n(mh->dtype, mh->redop, mh->acc, (const void *const *)ins, H,
			      bytes / mh->esz);
}

static int allreduce_rabenseifner(struct run *x, uint64_t bytes, size_t esz)
{
	struct kd_mh *mh = x->mh;
	struct fold f = fold_of(mh->nhosts, mh->self);
	struct kd_range all = { 0, bytes };
	uint64_t n = bytes / esz;
	uint32_t lo = 0, hi = f.p;
	int r = fold_in(x, &f, &all);

	/* Blocks b of the virtual hosts: elements [b*n/p, (b+1)*n/p). */
#define BLK(a, b) ((struct kd_range){ n * (a) / f.p * esz, (n * (b) / f.p - n * (a) / f.p) * esz })
	for (uint32_t d = f.p / 2; !r && d >= 1; d >>= 1) {
		struct kd_step st = { .nsend = 1, .nrecv = 1, .reduce = true };

		if (f.vh < 0) {
			x->step++;
			continue;
		}
		uint32_t mid = (lo + hi) / 2, peer = real_host(&f, f.vh ^ d);
		bool upper = f.vh & d;
		struct kd_range give = upper ? BLK(lo, mid) : BLK(mid, hi);
		struct kd_range keep = upper ? BLK(mid, hi) : BLK(lo, mid);

		xfer(&st.send[0], peer, &give, 1);
		xfer(&st.recv[0], peer, &keep, 1);
		if (d == f.p / 2 && x->in0) {
			/* First step: the whole input is either given or kept. */
			st.send[0].base = x->in0;
			st.recv[0].src = x->in0;
		}
		r = step(x, &st);
		if (upper)
			lo = mid;
		else
			hi = mid;
	}
	for (uint32_t d = 1; !r && d < f.p; d <<= 1) {
		struct kd_step st = { .nsend = 1, .nrecv = 1, .reduce = false };

		if (f.vh < 0) {
			x->step++;
			continue;
		}
		uint32_t sz = hi - lo, peer = real_host(&f, f.vh ^ d);
		bool upper = f.vh & d;
		struct kd_range mine = BLK(lo, hi);
		struct kd_range theirs = upper ? BLK(lo - sz, lo) : BLK(hi, hi + sz);

		xfer(&st.send[0], peer, &mine, 1);
		xfer(&st.recv[0], peer, &theirs, 1);
		r = step(x, &st);
		if (upper)
			lo -= sz;
		else
			hi += sz;
	}
#undef BLK
	return r ? r : fold_out(x, &f, &all);
}

static int allreduce_ring(struct run *x, uint64_t bytes, size_t esz)
{
	struct segs sg = { 0 };
	int r = segs_even(&sg, bytes, esz, x->mh->nhosts);

	if (!r)
		r = ring(x, &sg, true, true);
	segs_free(&sg);
	return r;
}

enum kd_algo kd_sched_algo(const struct kd_mh *mh, uint64_t bytes)
{
	enum kd_algo a = mh->algo;
	bool pow2 = !(mh->nhosts & (mh->nhosts - 1));

	if (a == KD_ALGO_DIRECT && bytes > DIRECT_MAX)
		return KD_ALGO_RING;	/* would need H x bytes of scratch */
	if (a != KD_ALGO_AUTO)
		return a;
	if (bytes <= KD_SCHED_SMALL_BYTES)
		return KD_ALGO_RD;
	if (pow2 && bytes <= MEDIUM_BYTES)
		return KD_ALGO_RABENSEIFNER;
	return KD_ALGO_RING;
}

bool kd_sched_reads_in0(enum kd_algo a, uint32_t nhosts)
{
	/* Recursive doubling and the fold of a non-power-of-two Rabenseifner
	 * send acc from their first step. */
	return a == KD_ALGO_RING || a == KD_ALGO_DIRECT ||
	       (a == KD_ALGO_RABENSEIFNER && !(nhosts & (nhosts - 1)));
}

static int broadcast(struct run *x, uint64_t bytes, size_t esz, uint32_t root_host)
{
	struct kd_mh *mh = x->mh;
	uint32_t H = mh->nhosts, h = mh->self;
	struct kd_range all = { 0, bytes };
	struct kd_step st = { .reduce = false };
	struct segs sg = { 0 };
	int r;

	if (bytes <= BCAST_DIRECT || H == 2) {
		for (uint32_t k = 0; k < H && h == root_host; k++)
			if (k != root_host)
				xfer(&st.send[st.nsend++], k, &all, 1);
		if (h != root_host)
			xfer(&st.recv[st.nrecv++], root_host, &all, 1);
		return step(x, &st);
	}
	/* Scatter a segment to each host, then all-gather them around the ring. */
	r = segs_even(&sg, bytes, esz, H);
	for (uint32_t k = 0; !r && k < H && h == root_host; k++)
		if (k != root_host)
			xfer(&st.send[st.nsend++], k, &sg.r[k], 1);
	if (!r && h != root_host)
		xfer(&st.recv[st.nrecv++], root_host, &sg.r[h], 1);
	if (!r)
		r = step(x, &st);
	if (!r)
		r = ring(x, &sg, false, true);
	segs_free(&sg);
	return r;
}

static int barrier(struct run *x)
{
	uint32_t H = x->mh->nhosts, h = x->mh->self;
	int r = 0;

	for (uint32_t d = 1; !r && d < H; d <<= 1) {
		struct kd_step st = { .nsend = 1, .nrecv = 1 };

		xfer(&st.send[0], (h + d) % H, NULL, 0);
		xfer(&st.recv[0], (h + H - d) % H, NULL, 0);
		r = step(x, &st);
	}
	return r;
}

int kd_sched_run(struct kd_mh *mh, struct kd_op *op, const struct kd_sched_op *s, uint32_t *bad_host)
{
	struct run x = { .mh = mh, .op = op, .bad_host = KCOLL_RANK_NONE, .in0 = s->in0 };
	int r = 0;

	/* One host runs no step that would read the input in place. */
	if (mh->nhosts == 1 && s->in0 && s->bytes && s->opcode != KCOLL_OP_BROADCAST)
		memcpy(mh->acc, s->in0, s->bytes);
	switch (s->opcode) {
	case KCOLL_OP_ALLREDUCE:
		if (!s->bytes) {
			r = barrier(&x);	/* no data, but every host checks the op agrees */
			break;
		}
		switch (kd_sched_algo(mh, s->bytes)) {
		case KD_ALGO_DIRECT:
			r = allreduce_direct(&x, s->bytes);
			break;
		case KD_ALGO_RD:
			r = allreduce_rd(&x, s->bytes);
			break;
		case KD_ALGO_RABENSEIFNER:
			r = allreduce_rabenseifner(&x, s->bytes, mh->esz);
			break;
		default:
			r = allreduce_ring(&x, s->bytes, mh->esz);
			break;
		}
		break;
	case KCOLL_OP_REDUCE_SCATTER:
	case KCOLL_OP_ALLGATHER: {
		struct segs sg = { 0 };

		if (!s->bytes) {
			r = barrier(&x);
			break;
		}
		r = segs_hosts(&sg, mh, s->nranks, s->block);
		if (!r)
			r = ring(&x, &sg, s->opcode == KCOLL_OP_REDUCE_SCATTER, s->opcode == KCOLL_OP_ALLGATHER);
		segs_free(&sg);
		break;
	}
	case KCOLL_OP_BROADCAST:
		r = s->bytes ? broadcast(&x, s->bytes, s->esz, s->root_host) : barrier(&x);
		break;
	case KCOLL_OP_BARRIER:
		r = barrier(&x);
		break;
	default:
		r = -EINVAL;
		break;
	}
	*bad_host = x.bad_host;
	return r;
}
