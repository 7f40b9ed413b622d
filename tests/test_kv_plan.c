// SPDX-License-Identifier: MIT
/*
 * kcoll_xfer_plan (the batch planning kcoll.kv runs before every transfer),
 * in process, no kcolld: random batches (laid out in order with gaps of 0
 * or more on either side, then shuffled; or offsets thrown at random, which
 * overlap) against a plain reference (every check spelt out, an O(n^2)
 * stable sort, merging), both directions; every error alone and together;
 * n = 0, 1 and KCOLL_XFER_MAX_ENTRIES.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>
#include <kcoll/tap.h>

typedef struct kcoll_xfer_entry ent_t;

static uint64_t rnd_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

static uint64_t rnd_below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

/* The reference: in a copy, the same contract without any shortcut. */
static int ref_plan(const ent_t *in, size_t n, uint64_t lsz, uint64_t rsz, int write,
		    ent_t *out, size_t *out_n)
{
	int zero = 0, range = 0;
	size_t i, j, m = 0;

	*out_n = 0;
	for (i = 0; i < n; i++) {
		unsigned __int128 le = (unsigned __int128)in[i].local_off + in[i].len;
		unsigned __int128 re = (unsigned __int128)in[i].remote_off + in[i].len;

		zero |= in[i].len == 0;
		range |= le > lsz || re > rsz;
	}
	if (zero)
		return -EINVAL;
	if (range)
		return -ERANGE;
	memcpy(out, in, n * sizeof(*in));
	for (i = 1; i < n; i++)	/* insertion sort: stable */
		for (j = i; j > 0; j--) {
			uint64_t a = write ? out[j - 1].remote_off : out[j - 1].local_off;
			uint64_t b = write ? out[j].remote_off : out[j].local_off;
			ent_t t;

			if (a <= b)
				break;
			t = out[j - 1];
			out[j - 1] = out[j];
			out[j] = t;
		}
	for (i = 0; i < n; i++)
		for (j = i + 1; j < n; j++) {
			uint64_t a = write ? out[i].remote_off : out[i].local_off;
			uint64_t b = write ? out[j].remote_off : out[j].local_off;

			if (a < b + out[j].len && b < a + out[i].len)
				return -EINVAL;
		}
	for (i = 0; i < n; i++) {
		if (m && out[m - 1].local_off + out[m - 1].len == out[i].local_off &&
		    out[m - 1].remote_off + out[m - 1].len == out[i].remote_off) {
			out[m - 1].len += out[i].len;
			continue;
		}
		out[m++] = out[i];
	}
	*out_n = m;
	return 0;
}

/* Run both on blocks; 1 if they agree (rc, and on 0 the plan). */
static int agree(const ent_t *blocks, size_t n, uint64_t lsz, uint64_t rsz, int write, int *rc_out)
{
	ent_t *a = malloc((n + 1) * sizeof(*a)), *b = malloc((n + 1) * sizeof(*b));
	size_t na = 99, nb = 99;
	int ra, rb, ok;

	if (!a || !b)
		abort();
	memcpy(a, blocks, n * sizeof(*a));
	ra = kcoll_xfer_plan(a, n, lsz, rsz, write, &na);
	rb = ref_plan(blocks, n, lsz, rsz, write, b, &nb);
	ok = ra == rb && na == nb && (ra || !memcmp(a, b, na * sizeof(*a)));
	if (!ok)
		tap_diag("n %zu write %d: plan %d (%zu entries), reference %d (%zu)", n, write, ra,
			 na, rb, nb);
	*rc_out = ra;
	free(a);
	free(b);
	return ok;
}

/* n blocks in order on both sides with gaps often 0, then shuffled
 * (mode 0), or at random offsets (mode 1). */
static void make_batch(ent_t *e, size_t n, uint64_t lsz, uint64_t rsz, int mode)
{
	uint64_t lo = 0, ro = 0, maxlen = 4096;
	size_t i;

	for (i = 0; i < n; i++) {
		uint64_t len = 1 + rnd_below(rnd() & 1 ? 8 : maxlen);

		if (mode) {
			e[i].local_off = rnd_below(lsz);
			e[i].remote_off = rnd_below(rsz);
			e[i].len = 1 + rnd_below(64);
			continue;
		}
		lo += rnd() % 3 ? 0 : rnd_below(64);
		ro += rnd() % 3 ? 0 : rnd_below(64);
		e[i] = (ent_t){ lo, ro, len };
		lo += len;
		ro += len;
	}
	if (!mode && rnd() % 4)	/* shuffle, or keep the order given */
		for (i = n; i > 1; i--) {
			size_t j = rnd_below(i);
			ent_t t = e[i - 1];

			e[i - 1] = e[j];
			e[j] = t;
		}
}

static void random_batches(void)
{
	static ent_t e[KCOLL_XFER_MAX_ENTRIES * 2];
	int counts[3] = { 0 }, bad = 0, rc, round;
	size_t i, j;

	for (round = 0; round < 4000; round++) {
		size_t n = round % 200 == 0 ? KCOLL_XFER_MAX_ENTRIES + rnd_below(2) * 4096
					   : rnd_below(200);
		int mode = round % 5 == 4;
		uint64_t lsz = 64 << 20, rsz = (64 << 20) + rnd_below(1 << 20);

		make_batch(e, n, lsz, rsz, mode);
		if (round % 7 == 3 && n)	/* one block beyond a segment */
			e[rnd_below(n)].remote_off = rsz - rnd_below(2);
		if (round % 7 == 5 && n > 1) {	/* two destinations overlapping */
			i = rnd_below(n);
			j = rnd_below(n - 1);
			j += j >= i;
			e[j].local_off = e[i].local_off + rnd_below(e[i].len);
			e[j].remote_off = e[i].remote_off + rnd_below(e[i].len);
		}
		if (round % 11 == 6 && n)	/* a zero length */
			e[rnd_below(n)].len = 0;
		bad += !agree(e, n, lsz, rsz, round & 1, &rc);
		counts[rc == 0 ? 0 : rc == -EINVAL ? 1 : 2]++;
	}
	tap_ok(!bad, "4000 random batches agree with the reference (%d disagree)", bad);
	tap_diag("accepted %d, -EINVAL %d, -ERANGE %d", counts[0], counts[1], counts[2]);
	tap_ok(counts[0] > 1000 && counts[1] > 100 && counts[2] > 100,
	       "the random batches exercise acceptance and both errors");
}

static void check(const char *what, ent_t *e, size_t n, uint64_t lsz, uint64_t rsz, int write,
		  int want, size_t want_n)
{
	size_t got_n = 99;
	int rc = kcoll_xfer_plan(e, n, lsz, rsz, write, &got_n);

	tap_ok(rc == want && got_n == want_n, "%s: %d, %zu entries (want %d, %zu)", what, rc, got_n,
	       want, want_n);
}

static void edge_cases(void)
{
	static ent_t big[KCOLL_XFER_MAX_ENTRIES];
	const uint64_t S = 1 << 20, U = ~0ULL;
	size_t n = 99, i;
	ent_t e[4];

	check("n = 0", NULL, 0, S, S, 1, 0, 0);
	tap_ok(kcoll_xfer_plan(e, 1, S, S, 1, NULL) == -EINVAL, "out_n NULL: -EINVAL");
	tap_ok(kcoll_xfer_plan(NULL, 1, S, S, 1, &n) == -EINVAL, "entries NULL with n 1: -EINVAL");

	e[0] = (ent_t){ 5, 7, 9 };
	check("n = 1", e, 1, S, S, 1, 0, 1);
	tap_ok(e[0].local_off == 5 && e[0].remote_off == 7 && e[0].len == 9, "n = 1: untouched");
	e[0] = (ent_t){ 0, 0, S };
	check("one block filling both segments", e, 1, S, S, 0, 0, 1);

	e[0] = (ent_t){ 0, 0, 0 };
	check("zero length", e, 1, S, S, 1, -EINVAL, 0);
	e[0] = (ent_t){ S, 0, 1 };
	check("local offset at the end", e, 1, S, S, 1, -ERANGE, 0);
	e[0] = (ent_t){ 0, S - 1, 2 };
	check("remote end one past", e, 1, S, S, 1, -ERANGE, 0);
	e[0] = (ent_t){ S - 1, 0, U };
	check("length wrapping offset + length", e, 1, S, S, 1, -ERANGE, 0);
	e[0] = (ent_t){ U, 0, 1 };
	check("offset 2^64 - 1 (a negative one from Python)", e, 1, S, S, 1, -ERANGE, 0);
	e[0] = (ent_t){ 0, 0, 1 };
	e[1] = (ent_t){ S, 0, 0 };
	check("zero length and out of range: -EINVAL first", e, 2, S, S, 1, -EINVAL, 0);

	e[0] = (ent_t){ 0, 100, 10 };
	e[1] = (ent_t){ 50, 105, 10 };
	check("write: destinations overlap", e, 2, S, S, 1, -EINVAL, 0);
	e[0] = (ent_t){ 0, 100, 10 };
	e[1] = (ent_t){ 50, 105, 10 };
	check("read: the same blocks, disjoint destinations", e, 2, S, S, 0, 0, 2);
	e[0] = (ent_t){ 100, 0, 10 };
	e[1] = (ent_t){ 100, 50, 10 };
	check("write: same source twice is fine", e, 2, S, S, 1, 0, 2);
	check("read: same destination twice", e, 2, S, S, 0, -EINVAL, 0);

	/* contiguous on both sides, given backwards: one entry */
	e[0] = (ent_t){ 20, 1020, 10 };
	e[1] = (ent_t){ 10, 1010, 10 };
	e[2] = (ent_t){ 0, 1000, 10 };
	check("three blocks contiguous on both sides", e, 3, S, S, 1, 0, 1);
	tap_ok(e[0].local_off == 0 && e[0].remote_off == 1000 && e[0].len == 30, "merged to (0, 1000, 30)");
	e[0] = (ent_t){ 0, 1000, 10 };
	e[1] = (ent_t){ 11, 1010, 10 };
	check("contiguous at the destination only: not merged", e, 2, S, S, 1, 0, 2);

	/* KCOLL_XFER_MAX_ENTRIES blocks, reversed, contiguous: one entry */
	for (i = 0; i < KCOLL_XFER_MAX_ENTRIES; i++)
		big[KCOLL_XFER_MAX_ENTRIES - 1 - i] = (ent_t){ i * 64, S + i * 64, 64 };
	check("4096 contiguous blocks reversed", big, KCOLL_XFER_MAX_ENTRIES, S, 2 * S, 1, 0, 1);
	tap_ok(big[0].local_off == 0 && big[0].remote_off == S && big[0].len == 4096 * 64,
	       "merged to one block of 256 KiB");
	for (i = 0; i < KCOLL_XFER_MAX_ENTRIES; i++)
		big[i] = (ent_t){ i * 64, (KCOLL_XFER_MAX_ENTRIES - 1 - i) * 64, 64 };
	check("4096 blocks, contiguous at both sides in opposite orders", big,
	      KCOLL_XFER_MAX_ENTRIES, S, S, 1, 0, KCOLL_XFER_MAX_ENTRIES);
	big[4000].remote_off = big[17].remote_off + 1;
	check("4096 blocks, one overlap", big, KCOLL_XFER_MAX_ENTRIES, S, S, 1, -EINVAL, 0);
}

int main(void)
{
	edge_cases();
	random_batches();
	return tap_done();
}
