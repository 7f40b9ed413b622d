// SPDX-License-Identifier: MIT
/*
 * kv_batch_cut (kv_send.c) on its own: how a cross-host KV batch is cut into
 * a transport's posts. Every output is checked against the specification,
 * written here independently of the code:
 *   - the post size fb is total / (2 * nchan) rounded up to 4 KiB, clamped
 *     to the transport's frame_min .. frame_max
 *   - each entry becomes sub-pieces at offsets 0, fb, 2 fb ... of it, in
 *     order (src and dst advance together); a zero-length entry gives none;
 *     adjacent entries are never merged, even when contiguous
 *   - posts take sub-pieces in order, as many as fit: a post ends only when
 *     it holds max_pieces, or when the next sub-piece would take it over fb
 * Cases: both real transports (kv_xport_tcp: 4096 entries, 1..2 MiB;
 * kv_xport_rdma: one piece of 4 MiB) and a small made-up one, entries and
 * posts exactly at and one byte over each limit, the 4096-entry limit, the
 * empty batch, and seeded random batches.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "kv_int.h"

#define KIB	1024ULL
#define MIB	(1024ULL * 1024)

/* A made-up transport with small limits: the rules without big batches. */
static const struct kv_xport_ops small_xo = {
	.name = "small",
	.max_pieces = 3,
	.frame_min = 8 * KIB,
	.frame_max = 16 * KIB,
};

struct cut {
	struct kv_piece *sp;
	struct kv_frame *fr;
	uint32_t nfr;
	uint64_t nsp;	/* sub-pieces the posts cover */
};

static uint64_t model_fb(const struct kv_xport_ops *xo, int nchan, const struct kv_piece *p,
			 uint32_t n)
{
	uint64_t total = 0, share;

	for (uint32_t i = 0; i < n; i++)
		total += p[i].len;
	share = total / (2 * (uint64_t)nchan);
	if (share % (4 * KIB))
		share += 4 * KIB - share % (4 * KIB);
	if (share < xo->frame_min)
		return xo->frame_min;
	return share > xo->frame_max ? xo->frame_max : share;
}

/*
 * Check c against the specification for p[0..n); returns a reason for the
 * first violation, NULL when c is right.
 */
static const char *check_cut(const struct kv_xport_ops *xo, int nchan, const struct kv_piece *p,
			     uint32_t n, const struct cut *c, char *why, size_t whylen)
{
	uint64_t fb = model_fb(xo, nchan, p, n), k = 0, covered = 0;

	/* The sub-pieces: walk the entries and expect each split of each. */
	for (uint32_t f = 0; f < c->nfr; f++)
		covered += c->fr[f].n;
	for (uint32_t i = 0; i < n; i++) {
		for (uint64_t off = 0; off < p[i].len; off += fb, k++) {
			uint64_t want = p[i].len - off < fb ? p[i].len - off : fb;

			if (k >= covered) {
				snprintf(why, whylen, "entry %u offset %llu: no sub-piece", i,
					 (unsigned long long)off);
				return why;
			}
			if (c->sp[k].src != p[i].src + off || c->sp[k].dst != p[i].dst + off ||
			    c->sp[k].len != want) {
				snprintf(why, whylen,
					 "sub-piece %llu is {%llu,%llu,%llu}, want {%llu,%llu,%llu}",
					 (unsigned long long)k, (unsigned long long)c->sp[k].src,
					 (unsigned long long)c->sp[k].dst, (unsigned long long)c->sp[k].len,
					 (unsigned long long)(p[i].src + off),
					 (unsigned long long)(p[i].dst + off), (unsigned long long)want);
				return why;
			}
		}
	}
	if (k != covered) {
		snprintf(why, whylen, "posts cover %llu sub-pieces, want %llu",
			 (unsigned long long)covered, (unsigned long long)k);
		return why;
	}
	/* The posts: in order, within the limits, each one as full as allowed. */
	for (uint32_t f = 0, next = 0; f < c->nfr; f++) {
		const struct kv_frame *fr = &c->fr[f];
		uint64_t bytes = 0;

		if (fr->first != next || !fr->n || fr->n > xo->max_pieces) {
			snprintf(why, whylen, "post %u: first %u n %u (want first %u, n 1..%u)", f,
				 fr->first, fr->n, next, xo->max_pieces);
			return why;
		}
		for (uint32_t j = 0; j < fr->n; j++)
			bytes += c->sp[fr->first + j].len;
		if (fr->bytes != bytes || bytes > fb) {
			snprintf(why, whylen, "post %u: bytes %llu, sum %llu, limit %llu", f,
				 (unsigned long long)fr->bytes, (unsigned long long)bytes,
				 (unsigned long long)fb);
			return why;
		}
		next += fr->n;
		if (next < covered && fr->n < xo->max_pieces && bytes + c->sp[next].len <= fb) {
			snprintf(why, whylen, "post %u ends early: sub-piece %u still fits", f, next);
			return why;
		}
	}
	return NULL;
}

static int cut(const struct kv_xport_ops *xo, int nchan, const struct kv_piece *p, uint32_t n,
	       struct cut *c)
{
	int r;

	memset(c, 0, sizeof(*c));
	r = kv_batch_cut(xo, nchan, p, n, &c->sp, &c->fr, &c->nfr);
	for (uint32_t f = 0; !r && f < c->nfr; f++)
		c->nsp += c->fr[f].n;
	return r;
}

static void cut_free(struct cut *c)
{
	free(c->sp);
	free(c->fr);
}

/* Cut p, check it against the model and, where given (>= 0), the number
 * of posts and sub-pieces worked out by hand. */
static void expect(const char *name, const struct kv_xport_ops *xo, int nchan,
		       const struct kv_piece *p, uint32_t n, long want_nfr, long want_nsp)
{
	char why[256];
	const char *bad;
	struct cut c;
	int r = cut(xo, nchan, p, n, &c);

	if (r) {
		tap_ok(0, "%s: kv_batch_cut failed (%d)", name, r);
		return;
	}
	bad = check_cut(xo, nchan, p, n, &c, why, sizeof(why));
	if (!bad && want_nfr >= 0 && c.nfr != (uint32_t)want_nfr) {
		snprintf(why, sizeof(why), "%u posts, want %ld", c.nfr, want_nfr);
		bad = why;
	}
	if (!bad && want_nsp >= 0 && c.nsp != (uint64_t)want_nsp) {
		snprintf(why, sizeof(why), "%llu sub-pieces, want %ld", (unsigned long long)c.nsp,
			 want_nsp);
		bad = why;
	}
	tap_ok(!bad, "%s (%s, %u entries, %u posts)%s%s", name, xo->name, n, c.nfr,
	       bad ? ": " : "", bad ? bad : "");
	cut_free(&c);
}

/* Entries of the given lengths, contiguous on both sides unless gap. */
static struct kv_piece *pieces(uint32_t n, const uint64_t *len, uint64_t one_len, uint64_t gap)
{
	struct kv_piece *p = calloc(n ? n : 1, sizeof(*p));
	uint64_t src = 0, dst = 1 << 30;

	for (uint32_t i = 0; p && i < n; i++) {
		p[i] = (struct kv_piece){ src, dst, len ? len[i] : one_len };
		src += p[i].len + gap;
		dst += p[i].len + gap;
	}
	return p;
}

/* One hand-worked case: n entries of lengths len[] (or each one_len),
 * gap bytes apart, cut for nchan channels into nfr posts of nsp sub-pieces. */
struct kcase {
	const char *name;
	int nchan;
	uint32_t n;
	const uint64_t *len;
	uint64_t one_len, gap;
	long nfr, nsp;
};

static void run_cases(const struct kv_xport_ops *xo, const struct kcase *t, size_t nt)
{
	for (size_t i = 0; i < nt; i++) {
		struct kv_piece *p = pieces(t[i].n, t[i].len, t[i].one_len, t[i].gap);

		expect(t[i].name, xo, t[i].nchan, p, t[i].n, t[i].nfr, t[i].nsp);
		free(p);
	}
}

static void test_small(void)
{
	/* One channel, under 16 KiB in all: fb is frame_min, 8 KiB. */
	static const uint64_t at[] = { 8 * KIB }, over[] = { 8 * KIB + 1 };
	static const uint64_t pair_at[] = { 3 * KIB, 5 * KIB };
	static const uint64_t pair_over[] = { 3 * KIB, 5 * KIB + 1 };
	static const uint64_t zeros[] = { 0, 100, 0, 0, 200, 0 }, only_zero[] = { 0, 0 };
	static const uint64_t three[] = { 1, 1, 1 }, four[] = { 1, 1, 1, 1 };
	static const struct kcase t[] = {
		{ "an entry exactly at the post size stays whole", 1, 1, at, 0, 0, 1, 1 },
		{ "an entry one byte over the post size is split", 1, 1, over, 0, 0, 2, 2 },
		{ "two entries exactly filling a post share it", 1, 2, pair_at, 0, 0, 1, 2 },
		{ "two entries one byte over a post take two", 1, 2, pair_over, 0, 0, 2, 2 },
		{ "contiguous entries are not merged", 1, 2, pair_at, 0, 0, 1, 2 },
		{ "entries with a gap share a post too", 1, 2, pair_at, 0, 4096, 1, 2 },
		{ "zero-length entries give no sub-piece", 1, 6, zeros, 0, 0, 1, 2 },
		{ "only zero-length entries give no post", 1, 2, only_zero, 0, 0, 0, 0 },
		{ "max_pieces entries fill one post", 1, 3, three, 0, 0, 1, 3 },
		{ "one entry over max_pieces opens a post", 1, 4, four, 0, 0, 2, 4 },
		{ "the empty batch gives no post", 1, 0, NULL, 0, 0, 0, 0 },
	};

	run_cases(&small_xo, t, sizeof(t) / sizeof(t[0]));
}

/* The share of the batch per channel sets the post size between the bounds. */
static void test_share(void)
{
	static const struct kcase t[] = {
		/* 44 KiB: share 11 KiB, posts of 12 KiB (rounded up). */
		{ "posts of a channel's share, rounded up to 4 KiB", 2, 1, NULL, 44 * KIB, 0,
		  4, 4 },
		/* 40 KiB + 1: share 5 KiB, clamped to frame_min 8 KiB. */
		{ "a small share is raised to frame_min", 4, 1, NULL, 40 * KIB + 1, 0, 6, 6 },
		/* 1 MiB: share 512 KiB, clamped to frame_max 16 KiB. */
		{ "a large share is cut to frame_max", 1, 1, NULL, MIB, 0, 64, 64 },
		/* 24 KiB: share exactly 12 KiB, no rounding up to 16. */
		{ "a share on a 4 KiB boundary is kept", 1, 1, NULL, 24 * KIB, 0, 2, 2 },
	};

	run_cases(&small_xo, t, sizeof(t) / sizeof(t[0]));
}

/* kv_xport_tcp: up to KV_FRAME_ENTRIES entries and 1..2 MiB per frame. */
static void test_tcp(void)
{
	const struct kv_xport_ops *xo = &kv_xport_tcp;
	static const uint64_t two_at[] = { 512 * KIB, 512 * KIB };
	static const uint64_t two_over[] = { 512 * KIB, 512 * KIB + 1 };
	static const struct kcase t[] = {
		{ "tcp: 4096 entries fill one frame", 1, KV_FRAME_ENTRIES, NULL, 8, 0, 1,
		  KV_FRAME_ENTRIES },
		{ "tcp: 4097 entries take two frames", 1, KV_FRAME_ENTRIES + 1, NULL, 8, 0, 2,
		  KV_FRAME_ENTRIES + 1 },
		{ "tcp: 12288 spread entries take three frames", 8, 3 * KV_FRAME_ENTRIES, NULL, 1,
		  64, 3, 3 * KV_FRAME_ENTRIES },
		{ "tcp: an entry exactly at the frame size", 1, 1, NULL, MIB, 0, 1, 1 },
		{ "tcp: an entry one byte over the frame size", 1, 1, NULL, MIB + 1, 0, 2, 2 },
		{ "tcp: two entries exactly filling a frame", 1, 2, two_at, 0, 0, 1, 2 },
		{ "tcp: two entries one byte over a frame", 1, 2, two_over, 0, 0, 2, 2 },
	};

	tap_ok(xo->max_pieces == KV_FRAME_ENTRIES && xo->frame_min == MIB && xo->frame_max == 2 * MIB,
	       "kv_xport_tcp's limits are the ones this test assumes (4096, 1..2 MiB)");
	run_cases(xo, t, sizeof(t) / sizeof(t[0]));
}

/* kv_xport_rdma: one piece of at most 4 MiB per post. */
static void test_rdma(void)
{
	const struct kv_xport_ops *xo = &kv_xport_rdma;
	static const uint64_t small[] = { 1, 2, 0, 3 };
	static const struct kcase t[] = {
		{ "rdma: an entry exactly at the work request size", 1, 1, NULL, 4 * MIB, 0, 1, 1 },
		{ "rdma: an entry one byte over it", 1, 1, NULL, 4 * MIB + 1, 0, 2, 2 },
		{ "rdma: small entries one per post, none for length 0", 1, 4, small, 0, 0, 3, 3 },
	};

	tap_ok(xo->max_pieces == 1 && xo->frame_min == 4 * MIB && xo->frame_max == 4 * MIB,
	       "kv_xport_rdma's limits are the ones this test assumes (1, 4 MiB)");
	run_cases(xo, t, sizeof(t) / sizeof(t[0]));
}

/* Zero, tiny, up to 40 units, and whole units exactly or one byte off. */
static uint64_t random_len(unsigned int *seed, uint64_t unit)
{
	uint32_t k = rand_r(seed) % 8;
	uint64_t units = 1 + rand_r(seed) % 20;

	if (k == 0)
		return 0;
	if (k < 3)
		return 1 + rand_r(seed) % 64;
	if (k < 6)
		return rand_r(seed) % (40 * unit);
	if (k == 6)
		return units * unit;
	return rand_r(seed) % 2 ? units * unit + 1 : units * unit - 1;
}

/* Seeded random batches over all three transports, against the model. */
static void test_random(void)
{
	const struct kv_xport_ops *xos[] = { &small_xo, &kv_xport_tcp, &kv_xport_rdma };
	unsigned int seed = 22;
	int bad = 0, runs = 0;

	for (int round = 0; round < 300; round++) {
		const struct kv_xport_ops *xo = xos[round % 3];
		uint64_t unit = xo == &small_xo ? KIB : 64 * KIB;
		uint32_t n = rand_r(&seed) % (round % 10 ? 40 : 5000);
		int nchan = 1 + rand_r(&seed) % KV_MAX_STREAMS;
		struct kv_piece *p = pieces(n, NULL, 0, 0);
		uint64_t src = 0, dst = 0;
		char why[256];
		const char *r;
		struct cut c;

		for (uint32_t i = 0; i < n; i++) {
			p[i].len = random_len(&seed, unit);
			p[i].src = src;
			p[i].dst = dst;
			src += p[i].len + (rand_r(&seed) % 2) * 4096;
			dst += p[i].len;
		}
		if (cut(xo, nchan, p, n, &c)) {
			bad++;
			tap_diag("round %d: kv_batch_cut failed", round);
		} else if ((r = check_cut(xo, nchan, p, n, &c, why, sizeof(why)))) {
			if (!bad)
				tap_diag("round %d (%s, %u entries, %d channels): %s", round, xo->name,
					 n, nchan, r);
			bad++;
		}
		runs++;
		cut_free(&c);
		free(p);
	}
	tap_ok(!bad, "%d random batches match the model (%d do not)", runs, bad);
}

int main(void)
{
	test_small();
	test_share();
	test_tcp();
	test_rdma();
	test_random();
	return tap_done();
}
