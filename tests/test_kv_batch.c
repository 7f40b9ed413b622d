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
 * of posts and sub-pieces worked out by hand. Returns the cut's posts. */
static uint32_t expect(const char *name, const struct kv_xport_ops *xo, int nchan,
		       const struct kv_piece *p, uint32_t n, long want_nfr, long want_nsp)
{
	char why[256];
	const char *bad;
	struct cut c;
	uint32_t nfr;
	int r = cut(xo, nchan, p, n, &c);

	if (r) {
		tap_ok(0, "%s: kv_batch_cut failed (%d)", name, r);
		return 0;
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
	nfr = c.nfr;
	cut_free(&c);
	return nfr;
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

static void test_small(void)
{
	const struct kv_xport_ops *xo = &small_xo;
	/* One channel, under 16 KiB in all: fb is frame_min, 8 KiB. */
	uint64_t at[] = { 8 * KIB }, over[] = { 8 * KIB + 1 };
	uint64_t pair_at[] = { 3 * KIB, 5 * KIB }, pair_over[] = { 3 * KIB, 5 * KIB + 1 };
	uint64_t zeros[] = { 0, 100, 0, 0, 200, 0 }, only_zero[] = { 0, 0 };
	uint64_t three[] = { 1, 1, 1 }, four[] = { 1, 1, 1, 1 };
	struct {
		const char *name;
		uint32_t n;
		const uint64_t *len;
		uint64_t gap;
		long nfr, nsp;
	} t[] = {
		{ "an entry exactly at the post size stays whole", 1, at, 0, 1, 1 },
		{ "an entry one byte over the post size is split", 1, over, 0, 2, 2 },
		{ "two entries exactly filling a post share it", 2, pair_at, 0, 1, 2 },
		{ "two entries one byte over a post take two", 2, pair_over, 0, 2, 2 },
		{ "contiguous entries are not merged", 2, pair_at, 0, 1, 2 },
		{ "entries with a gap share a post too", 2, pair_at, 4096, 1, 2 },
		{ "zero-length entries give no sub-piece", 6, zeros, 0, 1, 2 },
		{ "only zero-length entries give no post", 2, only_zero, 0, 0, 0 },
		{ "max_pieces entries fill one post", 3, three, 0, 1, 3 },
		{ "one entry over max_pieces opens a post", 4, four, 0, 2, 4 },
	};

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct kv_piece *p = pieces(t[i].n, t[i].len, 0, t[i].gap);

		expect(t[i].name, xo, 1, p, t[i].n, t[i].nfr, t[i].nsp);
		free(p);
	}
	expect("the empty batch gives no post", xo, 1, NULL, 0, 0, 0);
}

/* The share of the batch per channel sets the post size between the bounds. */
static void test_share(void)
{
	const struct kv_xport_ops *xo = &small_xo;
	/* 2 channels, 44 KiB: share 11 KiB, posts of 12 KiB (rounded up). */
	uint64_t mid[] = { 44 * KIB };
	/* 4 channels, 40 KiB + 1: share 5 KiB, clamped to frame_min 8 KiB. */
	uint64_t low[] = { 40 * KIB + 1 };
	/* 1 channel, 1 MiB: share 512 KiB, clamped to frame_max 16 KiB. */
	uint64_t high[] = { MIB };
	/* 1 channel, 24 KiB: share exactly 12 KiB, no rounding up to 16. */
	uint64_t exact[] = { 24 * KIB };
	struct kv_piece *p;

	p = pieces(1, mid, 0, 0);
	expect("posts of a channel's share, rounded up to 4 KiB", xo, 2, p, 1, 4, 4);
	free(p);
	p = pieces(1, low, 0, 0);
	expect("a small share is raised to frame_min", xo, 4, p, 1, 6, 6);
	free(p);
	p = pieces(1, high, 0, 0);
	expect("a large share is cut to frame_max", xo, 1, p, 1, 64, 64);
	free(p);
	p = pieces(1, exact, 0, 0);
	expect("a share on a 4 KiB boundary is kept", xo, 1, p, 1, 2, 2);
	free(p);
}

/* kv_xport_tcp: up to KV_FRAME_ENTRIES entries and 1..2 MiB per frame. */
static void test_tcp(void)
{
	const struct kv_xport_ops *xo = &kv_xport_tcp;
	uint64_t at[] = { MIB }, over[] = { MIB + 1 }, two_at[] = { 512 * KIB, 512 * KIB };
	uint64_t two_over[] = { 512 * KIB, 512 * KIB + 1 };
	struct kv_piece *p;

	tap_ok(xo->max_pieces == KV_FRAME_ENTRIES && xo->frame_min == MIB && xo->frame_max == 2 * MIB,
	       "kv_xport_tcp's limits are the ones this test assumes (4096, 1..2 MiB)");
	p = pieces(KV_FRAME_ENTRIES, NULL, 8, 0);
	expect("tcp: 4096 entries fill one frame", xo, 1, p, KV_FRAME_ENTRIES, 1, KV_FRAME_ENTRIES);
	free(p);
	p = pieces(KV_FRAME_ENTRIES + 1, NULL, 8, 0);
	expect("tcp: 4097 entries take two frames", xo, 1, p, KV_FRAME_ENTRIES + 1, 2,
	       KV_FRAME_ENTRIES + 1);
	free(p);
	p = pieces(3 * KV_FRAME_ENTRIES, NULL, 1, 64);
	expect("tcp: 12288 spread entries take three frames", xo, 8, p, 3 * KV_FRAME_ENTRIES, 3,
	       3 * KV_FRAME_ENTRIES);
	free(p);
	p = pieces(1, at, 0, 0);
	expect("tcp: an entry exactly at the frame size", xo, 1, p, 1, 1, 1);
	free(p);
	p = pieces(1, over, 0, 0);
	expect("tcp: an entry one byte over the frame size", xo, 1, p, 1, 2, 2);
	free(p);
	p = pieces(2, two_at, 0, 0);
	expect("tcp: two entries exactly filling a frame", xo, 1, p, 2, 1, 2);
	free(p);
	p = pieces(2, two_over, 0, 0);
	expect("tcp: two entries one byte over a frame", xo, 1, p, 2, 2, 2);
	free(p);
}

/* kv_xport_rdma: one piece of at most 4 MiB per post. */
static void test_rdma(void)
{
	const struct kv_xport_ops *xo = &kv_xport_rdma;
	uint64_t at[] = { 4 * MIB }, over[] = { 4 * MIB + 1 }, small[] = { 1, 2, 0, 3 };
	struct kv_piece *p;

	tap_ok(xo->max_pieces == 1 && xo->frame_min == 4 * MIB && xo->frame_max == 4 * MIB,
	       "kv_xport_rdma's limits are the ones this test assumes (1, 4 MiB)");
	p = pieces(1, at, 0, 0);
	expect("rdma: an entry exactly at the work request size", xo, 1, p, 1, 1, 1);
	free(p);
	p = pieces(1, over, 0, 0);
	expect("rdma: an entry one byte over it", xo, 1, p, 1, 2, 2);
	free(p);
	p = pieces(4, small, 0, 0);
	expect("rdma: small entries one per post, none for length 0", xo, 1, p, 4, 3, 3);
	free(p);
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
