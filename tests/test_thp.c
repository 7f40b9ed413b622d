// SPDX-License-Identifier: MIT
/*
 * libkcoll's huge-page hint for large malloc buffers (KCOLL_THP_MIN_BYTES):
 * two ranks all-reduce 8 MiB buffers that kcolld reaches with
 * process_vm_readv/writev. Checks that results stay bit-exact (out of place,
 * in place, the same buffers again once collapsed, a misaligned start), that
 * the 2 MiB pages inside the buffers became huge pages, and that with the
 * knob at 0 they did not. Where the kernel cannot collapse anything right now
 * (no MADV_COLLAPSE, THP off, no free huge page) the page checks SKIP.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "reduce.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#define NRANKS	2
#define COUNT	((8u << 20) / 4 + 1001)	/* f32: a bit over 8 MiB */
#define HUGE_SZ	(2ul << 20)
#define WANT_KB	(3 * (long)(HUGE_SZ >> 10))	/* 3 of the 4 whole huge pages per buffer */

struct result {
	int ok_values;		/* every all-reduce bit-exact */
	long huge_kb[2];	/* AnonHugePages gained by the send and the receive buffer's mapping */
	int same_vma;		/* both buffers in one mapping (adjacent mmaps merge) */
	int self_err;		/* not huge after the op: errno of our own MADV_COLLAPSE
				 * of the same ranges right after (0: it worked) */
	char why[160];
};

static struct result *res;

/* AnonHugePages (kB) of the mapping that holds addr, -1 if not found;
 * *start: where that mapping begins. */
static long anon_huge_kb_at(const void *addr, unsigned long *start)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	unsigned long lo, hi, a = (unsigned long)addr;
	char line[512];
	int in = 0;
	long kb = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in = a >= lo && a < hi;
			if (in && start)
				*start = lo;
			continue;
		}
		if (in && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1)
			break;
	}
	fclose(f);
	return kb;
}

static void fill(float *p, size_t n, int rank, int salt)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (float)((int)((i * 7 + (size_t)rank * 13 + (size_t)salt) % 1000) - 500) / 8.0f;
}

static int check(const float *got, size_t n, int salt, int iters_in_place, struct result *r,
		 const char *what)
{
	for (size_t i = 0; i < n; i++) {
		/* Sums of eighths well inside f32's exact range: order does not matter. */
		float want = 0;

		for (int k = 0; k < NRANKS; k++) {
			float v = (float)((int)((i * 7 + (size_t)k * 13 + (size_t)salt) % 1000) - 500) / 8.0f;

			want += v;
		}
		for (int j = 1; j < iters_in_place; j++)
			want *= NRANKS;
		if (memcmp(&got[i], &want, sizeof(want))) {
			snprintf(r->why, sizeof(r->why), "%s: element %zu is %g, want %g", what, i,
				 (double)got[i], (double)want);
			return 0;
		}
	}
	return 1;
}

static int allreduce(struct kcoll_comm *c, const void *s, void *d, size_t n, struct result *r,
		     const char *what)
{
	struct kcoll_req *req;
	int e = kcoll_allreduce(c, s, d, n, KCOLL_F32, KCOLL_SUM, &req);

	if (!e)
		e = kcoll_wait(req, 60000);
	if (e)
		snprintf(r->why, sizeof(r->why), "%s: %s", what, kcoll_strerror(e));
	return !e;
}

static int rank_main(int rank, const kcoll_unique_id_t *id, const char *knob)
{
	struct result *r = &res[rank];
	size_t bytes = (size_t)COUNT * 4;
	struct kcoll_comm *c;
	struct kcoll *k;
	uint8_t *sraw, *rraw;
	float *s, *d;
	long before[2];
	int e, ok = 1;

	alarm(120);
	if (knob)
		setenv("KCOLL_THP_MIN_BYTES", knob, 1);
	/* Start 4 KiB + 12 bytes past a malloc block: not 2 MiB aligned. */
	sraw = malloc(bytes + 8192);
	rraw = malloc(bytes + 8192);
	if (!sraw || !rraw) {
		snprintf(r->why, sizeof(r->why), "out of memory");
		return 1;
	}
	s = (float *)(sraw + 4108);
	d = (float *)(rraw + 4108);
	fill(s, COUNT, rank, 0);
	memset(d, 0, bytes);
	before[0] = anon_huge_kb_at(s, NULL);
	before[1] = anon_huge_kb_at(d, NULL);
	e = kcoll_connect(NULL, &k);
	if (!e)
		e = kcoll_comm_init_rank(k, id, NRANKS, rank, &c);
	if (e) {
		snprintf(r->why, sizeof(r->why), "setup: %s", kcoll_strerror(e));
		return 1;
	}
	ok = allreduce(c, s, d, COUNT, r, "first, out of place") &&
	     check(d, COUNT, 0, 1, r, "first, out of place");
	/* Default run: what the mappings hold now (THP "always" may have made
	 * them huge before the op); knob at 0: what the op added. */
	{
		unsigned long vs = 0, vd = 1;

		r->huge_kb[0] = anon_huge_kb_at(s, &vs) - (knob ? before[0] : 0);
		r->huge_kb[1] = anon_huge_kb_at(d, &vd) - (knob ? before[1] : 0);
		r->same_vma = vs == vd;
		if (!knob && !(r->same_vma ? r->huge_kb[0] >= 2 * WANT_KB :
			       r->huge_kb[0] >= WANT_KB && r->huge_kb[1] >= WANT_KB)) {
			/* Could the kernel have done it at all right now? (Tells a
			 * missing hint from no free huge page.) */
			for (int b = 0; b < 2 && !r->self_err; b++) {
				unsigned long a = (unsigned long)(b ? (void *)d : (void *)s);
				unsigned long lo = (a + HUGE_SZ - 1) & ~(HUGE_SZ - 1);
				unsigned long hi = (a + bytes) & ~(HUGE_SZ - 1);

				if (madvise((void *)lo, hi - lo, MADV_COLLAPSE))
					r->self_err = errno;
			}
		}
	}
	/* Same buffers again (now on huge pages where that worked), new values. */
	fill(s, COUNT, rank, 5);
	ok = ok && allreduce(c, s, d, COUNT, r, "again, out of place") &&
	     check(d, COUNT, 5, 1, r, "again, out of place");
	/* In place, twice: the second sums the first's result. */
	fill(d, COUNT, rank, 9);
	ok = ok && allreduce(c, d, d, COUNT, r, "in place") && allreduce(c, d, d, COUNT, r, "in place, again") &&
	     check(d, COUNT, 9, 2, r, "in place, twice");
	/* A misaligned tail of the same buffer: a range inside a collapsed one. */
	fill(s + 1, COUNT - 1, rank, 3);
	ok = ok && allreduce(c, s + 1, d + 1, COUNT - 1, r, "offset by one element") &&
	     check(d + 1, COUNT - 1, 3, 1, r, "offset by one element");
	r->ok_values = ok;
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	free(sraw);
	free(rraw);
	return 0;
}

static int thp_always(void)
{
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	char buf[128] = "";

	if (f) {
		if (!fgets(buf, sizeof(buf), f))
			buf[0] = 0;
		fclose(f);
	}
	return strstr(buf, "[always]") != NULL;
}

/* Can this process get a huge page by MADV_COLLAPSE right now? */
static int collapse_works(char *why, size_t len)
{
	size_t sz = 2 * HUGE_SZ;
	uint8_t *p = mmap(NULL, 2 * sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *a;
	int ok;

	if (p == MAP_FAILED) {
		snprintf(why, len, "mmap: %s", strerror(errno));
		return 0;
	}
	a = (uint8_t *)(((unsigned long)p + HUGE_SZ - 1) & ~(HUGE_SZ - 1));
	memset(a, 1, sz);
	ok = !madvise(a, sz, MADV_COLLAPSE);
	if (!ok)
		snprintf(why, len, "MADV_COLLAPSE on a test mapping: %s", strerror(errno));
	else if (anon_huge_kb_at(a, NULL) < (long)(HUGE_SZ >> 10)) {
		snprintf(why, len, "MADV_COLLAPSE succeeded but smaps shows no AnonHugePages");
		ok = 0;
	}
	munmap(p, 2 * sz);
	return ok;
}

static int run(const char *knob)
{
	kcoll_unique_id_t id;
	struct kcoll *k;
	pid_t pids[NRANKS];
	int ok = 1, e;

	memset(res, 0, sizeof(*res) * NRANKS);
	e = kcoll_connect(NULL, &k);
	if (!e)
		e = kcoll_get_unique_id(k, &id);
	if (e) {
		tap_diag("connect to kcolld at $KCOLL_SOCKET: %s", kcoll_strerror(e));
		return 0;
	}
	kcoll_disconnect(k);
	for (int i = 0; i < NRANKS; i++) {
		pids[i] = fork();
		if (pids[i] == 0)
			_exit(rank_main(i, &id, knob));
	}
	for (int i = 0; i < NRANKS; i++) {
		int st;

		waitpid(pids[i], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			ok = 0;
	}
	return ok;
}

int main(void)
{
	char why[160];
	int can, ok, all;

	res = mmap(NULL, sizeof(*res) * NRANKS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		   -1, 0);
	if (res == MAP_FAILED)
		return 1;

	/* Default threshold (4 MiB): the hint is on for these 8 MiB buffers. */
	ok = run(NULL);
	tap_ok(ok, "2 ranks, default KCOLL_THP_MIN_BYTES: both rank processes exited cleanly");
	all = 1;
	for (int i = 0; i < NRANKS; i++) {
		if (!res[i].ok_values)
			tap_diag("rank %d: %s", i, res[i].why);
		all &= res[i].ok_values;
	}
	tap_ok(ok && all, "8 MiB f32 all-reduce from malloc buffers bit-exact: out of place, again, "
	       "in place, misaligned");
	can = collapse_works(why, sizeof(why));
	if (!can) {
		tap_skip("this kernel gives no huge page now (%s)", why);
	} else {
		/* At least 3 of the 4 whole 2 MiB pages inside each 8 MiB buffer. */
		long want = WANT_KB;
		int refused = 0;

		all = 1;
		for (int i = 0; i < NRANKS; i++) {
			if (res[i].self_err)
				refused = res[i].self_err;
			tap_diag("rank %d: +%ld / +%ld kB AnonHugePages (send / receive)", i,
				 res[i].huge_kb[0], res[i].huge_kb[1]);
			if (res[i].same_vma)	/* one mapping: it holds both buffers' pages */
				all &= res[i].huge_kb[0] >= 2 * want;
			else
				all &= res[i].huge_kb[0] >= want && res[i].huge_kb[1] >= want;
		}
		if (!all && refused)
			tap_skip("not on huge pages, but the kernel refused the same MADV_COLLAPSE right "
				 "after too (%s): no free huge page", strerror(refused));
		else
			tap_ok(ok && all, "both buffers of every rank now on huge pages (>= %ld kB each)",
			       want);
	}

	/* Knob at 0: nothing collapsed, results the same. */
	ok = run("0");
	tap_ok(ok, "2 ranks, KCOLL_THP_MIN_BYTES=0: both rank processes exited cleanly");
	all = 1;
	for (int i = 0; i < NRANKS; i++) {
		if (!res[i].ok_values)
			tap_diag("rank %d: %s", i, res[i].why);
		all &= res[i].ok_values;
	}
	tap_ok(ok && all, "KCOLL_THP_MIN_BYTES=0: the same all-reduces bit-exact");
	all = 1;
	for (int i = 0; i < NRANKS; i++)
		all &= res[i].huge_kb[0] == 0 && res[i].huge_kb[1] == 0;
	if (!can)
		tap_skip("this kernel gives no huge page now (%s)", why);
	else if (thp_always())
		tap_skip("transparent_hugepage is 'always' here: malloc memory may be huge without the hint");
	else
		tap_ok(all, "KCOLL_THP_MIN_BYTES=0: no huge page in either buffer (+%ld / +%ld kB)",
		       res[0].huge_kb[0], res[0].huge_kb[1]);
	return tap_done();
}
