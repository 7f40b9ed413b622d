// SPDX-License-Identifier: MIT
/*
 * kcoll_mem_share: ordinary memory made kcolld-mapped without kcoll.ko.
 *
 * Bad input (NULL, size 0, no whole page inside, kcoll memory already, a
 * hole, a read-only range, a file or shared mapping) gets its errno and
 * changes nothing. A malloc buffer shared at an odd offset: only its inner
 * whole pages, every byte of the block (and the head and tail pages'
 * neighbours) the same before and after, the pages now the memfd. Two ranks
 * all-reduce on shared buffers: exact, and not one byte copied by kcolld
 * (its counters; the same op on a plain buffer copies, which shows the
 * check can fail). Deregister keeps the data and the mapping and puts the
 * buffer back on the copy path; sharing again works; disconnect leaves the
 * pages; a child forked afterwards shares them (the documented caveat).
 * Needs the kcolld of tests/run.sh ($KCOLL_SOCKET).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "rawclient.h"

#define COUNT	(300000u)	/* f32: 1.2 MB, not a whole number of pages */
#define SKEW	100u		/* bytes past the malloc block's start */

static size_t page;

/* The /proc/self/maps line of the mapping holding addr, "" if none. */
static const char *maps_line(const void *addr)
{
	static char line[512];
	FILE *f = fopen("/proc/self/maps", "r");
	unsigned long lo, hi;

	if (!f)
		return "";
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (unsigned long)addr >= lo &&
		    (unsigned long)addr < hi) {
			fclose(f);
			line[strcspn(line, "\n")] = 0;
			return line;
		}
	}
	fclose(f);
	return "";
}

static void fill(float *p, size_t n, int rank)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (float)((int)((i * 7 + (size_t)rank * 13) % 1000) - 500);
}

/* p[0 .. n) holds the sums of fill's elements first .. first + n. */
static int sum_ok(const float *p, size_t first, size_t n, int nranks)
{
	for (size_t i = first; i < first + n; i++) {
		float want = 0;

		for (int r = 0; r < nranks; r++)
			want += (float)((int)((i * 7 + (size_t)r * 13) % 1000) - 500);
		if (p[i - first] != want)
			return 0;
	}
	return 1;
}

/* Every error leaves the bytes as they were: check a buffer after each. */
static void bad_input(struct kcoll *k)
{
	uint8_t *m = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	void *lo = NULL, *kmem;
	size_t len = 0, i;
	int fd, ok;

	if (m == MAP_FAILED) {
		tap_ok(0, "mmap for the bad-input cases: %s", strerror(errno));
		return;
	}
	for (i = 0; i < 4 * page; i++)
		m[i] = (uint8_t)(i * 31 + 7);
	tap_ok(kcoll_mem_share(NULL, m, page, &lo, &len) == -EINVAL, "NULL handle: EINVAL");
	tap_ok(kcoll_mem_share(k, NULL, page, &lo, &len) == -EINVAL, "NULL buffer: EINVAL");
	tap_ok(kcoll_mem_share(k, m, 0, &lo, &len) == -EINVAL, "size 0: EINVAL");
	tap_ok(kcoll_mem_share(k, m, page, NULL, &len) == -EINVAL &&
	       kcoll_mem_share(k, m, page, &lo, NULL) == -EINVAL, "NULL out-parameters: EINVAL");
	tap_ok(kcoll_mem_share(k, m + 100, page - 200, &lo, &len) == -ERANGE,
	       "a range inside one page: ERANGE");
	tap_ok(kcoll_mem_share(k, m + 1, 2 * page - 2, &lo, &len) == -ERANGE,
	       "a range over two pages without a whole one: ERANGE");
	tap_ok(kcoll_mem_share(k, m, page - 1, &lo, &len) == -ERANGE,
	       "one byte short of a page: ERANGE");
	tap_ok(kcoll_mem_share(k, m, (size_t)-1 - (uintptr_t)m + 2, &lo, &len) != 0,
	       "a size that wraps the address space is refused");
	ok = !kcoll_mem_alloc(k, 2 * page, &kmem);
	tap_ok(ok && kcoll_mem_share(k, kmem, 2 * page, &lo, &len) == -EEXIST,
	       "kcoll_mem_alloc memory: EEXIST");
	if (ok)
		kcoll_mem_free(k, kmem);
	mprotect(m + 3 * page, page, PROT_READ);
	tap_ok(kcoll_mem_share(k, m + 2 * page, 2 * page, &lo, &len) == -EACCES,
	       "a read-only page in the range: EACCES");
	mprotect(m + 3 * page, page, PROT_READ | PROT_WRITE);
	fd = memfd_create("not-ours", MFD_CLOEXEC);
	if (fd >= 0 && !ftruncate(fd, 2 * page)) {
		void *s = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		void *p = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);

		tap_ok(s != MAP_FAILED && kcoll_mem_share(k, s, 2 * page, &lo, &len) == -EOPNOTSUPP,
		       "a shared file mapping: EOPNOTSUPP");
		tap_ok(p != MAP_FAILED && kcoll_mem_share(k, p, 2 * page, &lo, &len) == -EOPNOTSUPP,
		       "a private file mapping: EOPNOTSUPP");
		if (s != MAP_FAILED)
			munmap(s, 2 * page);
		if (p != MAP_FAILED)
			munmap(p, 2 * page);
	} else {
		tap_ok(0, "memfd for the file-mapping cases: %s", strerror(errno));
	}
	if (fd >= 0)
		close(fd);
	for (ok = 1, i = 0; i < 4 * page; i++)
		ok &= m[i] == (uint8_t)(i * 31 + 7);
	tap_ok(ok && strstr(maps_line(m), "kcoll-share") == NULL,
	       "after every refusal the bytes and the mapping are as they were");
	munmap(m + page, page);	/* a hole in the middle */
	tap_ok(kcoll_mem_share(k, m, 4 * page, &lo, &len) == -EFAULT, "a hole in the range: EFAULT");
	munmap(m, 4 * page);
}

static int allreduce(struct kcoll_comm *c, void *p, size_t n)
{
	struct kcoll_req *req;
	int r = n ? kcoll_allreduce(c, p, p, n, KCOLL_F32, KCOLL_SUM, &req) : 0;

	return r || !n ? r : kcoll_wait(req, 30000);
}

/*
 * One rank, in place on a malloc buffer. mode 0: plain, one op. 1: shared,
 * the middle alone. 2: shared, head, middle and tail as three ops (what
 * kcoll.torch does). The part the mode reduced must be exact.
 */
static int rank_main(const kcoll_unique_id_t *id, int rank, int mode)
{
	uint8_t *raw = malloc(COUNT * sizeof(float) + SKEW);
	float *buf = (float *)(raw + SKEW), *mid;
	struct kcoll_comm *c;
	size_t len, head, n;
	struct kcoll *k;
	void *lo;

	alarm(60);
	if (!raw || kcoll_connect(NULL, &k) || kcoll_comm_init_rank(k, id, 2, rank, &c))
		return 2;
	fill(buf, COUNT, rank);
	if (mode == 0)
		return allreduce(c, buf, COUNT) ? 4 : sum_ok(buf, 0, COUNT, 2) ? 0 : 5;
	if (kcoll_mem_share(k, buf, COUNT * sizeof(float), &lo, &len))
		return 3;
	/* The page boundaries fall on elements: a malloc block is 16-byte aligned. */
	mid = lo;
	head = (size_t)(mid - buf);
	n = len / sizeof(float);
	if (mode == 1)
		return allreduce(c, mid, n) ? 4 : sum_ok(mid, head, n, 2) ? 0 : 5;
	if (allreduce(c, buf, head) || allreduce(c, mid, n) ||
	    allreduce(c, mid + n, COUNT - head - n))
		return 4;
	if (!sum_ok(buf, 0, COUNT, 2))
		return 5;
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	free(raw);
	return 0;
}

/* Two forked ranks; kcolld's copied bytes meanwhile (-1 if a rank failed). */
static long long two_ranks(struct kcoll *k, int mode)
{
	unsigned long long copied0 = kcoll_raw_status_num("bytes_copied");
	kcoll_unique_id_t id;
	pid_t pid[2];
	int ok = 1;

	if (kcoll_get_unique_id(k, &id))
		return -1;
	for (int r = 0; r < 2; r++) {
		pid[r] = fork();
		if (pid[r] == 0)
			_exit(rank_main(&id, r, mode));
	}
	for (int r = 0; r < 2; r++) {
		int st;

		waitpid(pid[r], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			tap_diag("rank %d (mode %d) exited with status %d", r, mode,
				 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
			ok = 0;
		}
	}
	return ok ? (long long)(kcoll_raw_status_num("bytes_copied") - copied0) : -1;
}

static void share_in_place(struct kcoll *k)
{
	size_t bytes = COUNT * sizeof(float) + SKEW + 64, len = 0, i;
	uint8_t *raw = malloc(bytes), *want = malloc(bytes), *lo = NULL, *start;
	void *lov;
	int ok, r;

	if (!raw || !want) {
		tap_ok(0, "malloc");
		return;
	}
	for (i = 0; i < bytes; i++)
		raw[i] = want[i] = (uint8_t)(i * 131 + 17);
	start = raw + SKEW;
	r = kcoll_mem_share(k, start, COUNT * sizeof(float), &lov, &len);
	lo = lov;
	tap_ok(r == 0, "kcoll_mem_share of a malloc buffer at an odd offset: %s", kcoll_strerror(r));
	if (r)
		goto out;
	ok = (uintptr_t)lo % page == 0 && lo >= start && lo - start < (ptrdiff_t)page &&
	     len % page == 0 && lo + len <= start + COUNT * sizeof(float) &&
	     (size_t)(start + COUNT * sizeof(float) - (lo + len)) < page;
	tap_ok(ok, "only the whole pages inside: [%p, +%zu) of [%p, +%zu)", (void *)lo, len,
	       (void *)start, (size_t)COUNT * sizeof(float));
	tap_ok(!memcmp(raw, want, bytes),
	       "every byte of the block the same, the head and tail pages' neighbours too");
	ok = strstr(maps_line(lo + len - 1), "kcoll-share") && !strstr(maps_line(lo - 1), "kcoll-share") &&
	     !strstr(maps_line(lo + len), "kcoll-share") && strstr(maps_line(lo), "kcoll-share");
	tap_ok(ok, "the shared pages and only they are the memfd now (%s)", maps_line(lo));
	memset(lo, 0x5a, page);
	tap_ok(lo[0] == 0x5a && lo[page - 1] == 0x5a && lo[page] == want[lo - raw + page],
	       "the pages take writes in place");
	memcpy(lo, want + (lo - raw), page);
	tap_ok(kcoll_mem_share(k, start, COUNT * sizeof(float), &lov, &len) == -EEXIST,
	       "sharing it twice: EEXIST");
	{
		struct kcoll *k2;

		r = kcoll_connect(NULL, &k2);
		tap_ok(!r && kcoll_mem_share(k2, lo + page, page, &lov, &len) == -EEXIST,
		       "sharing part of it on a second handle: EEXIST (it would swap the pages "
		       "under the first one's registration)");
		if (!r)
			kcoll_disconnect(k2);
	}
	tap_ok(kcoll_mem_free(k, lo) == -ENOENT, "kcoll_mem_free of shared pages: ENOENT (not ours to free)");
	r = kcoll_mem_deregister(k, lo);
	tap_ok(r == 0 && !memcmp(raw, want, bytes) && strstr(maps_line(lo), "kcoll-share"),
	       "deregister: 0, the data and the mapping stay (%s)", kcoll_strerror(r));
	tap_ok(kcoll_mem_deregister(k, lo) == -ENOENT, "deregister twice: ENOENT");
	r = kcoll_mem_share(k, start, COUNT * sizeof(float), &lov, &len);
	tap_ok(r == 0 && lov == lo && !memcmp(raw, want, bytes),
	       "shared again after deregister (a fresh copy), bytes unchanged: %s", kcoll_strerror(r));
	if (r)
		goto out;
	/* The documented caveat: the pages are MAP_SHARED, a forked child shares them. */
	{
		pid_t pid = fork();
		int st = -1;

		if (pid == 0) {
			lo[0] = 0x77;
			_exit(0);
		}
		waitpid(pid, &st, 0);
		tap_ok(lo[0] == 0x77, "fork caveat: a child's write to shared pages is seen by the parent");
		lo[0] = want[lo - raw];
	}
	/* Deregistered, the block goes back to malloc like any other. */
	r = kcoll_mem_deregister(k, lo);
	tap_ok(r == 0, "deregister before free: %s", kcoll_strerror(r));
out:
	free(want);
	free(raw);
}

int main(void)
{
	struct kcoll *k;
	long long copied;
	int r;

	page = (size_t)sysconf(_SC_PAGESIZE);
	r = kcoll_connect(NULL, &k);
	if (r) {
		tap_ok(0, "connect to kcolld at $KCOLL_SOCKET: %s", kcoll_strerror(r));
		return tap_done();
	}
	bad_input(k);
	share_in_place(k);
	copied = two_ranks(k, 0);
	tap_ok(copied >= 2 * (long long)(COUNT * sizeof(float)),
	       "control: 2 ranks on plain buffers, exact; kcolld copied %lld bytes", copied);
	copied = two_ranks(k, 1);
	tap_ok(copied == 0, "2 ranks, the shared pages of their buffers: exact, zero-copy "
	       "(kcolld copied %lld bytes)", copied);
	copied = two_ranks(k, 2);
	tap_ok(copied >= 0 && copied < (long long)(16 * page),
	       "2 ranks, the whole buffers as head, shared middle and tail: exact, kcolld copied "
	       "only the ends (%lld bytes)", copied);
	{
		uint8_t *p = malloc(4 * page), *in = (uint8_t *)(((uintptr_t)p + page - 1) & ~(page - 1));
		void *lo;
		size_t len;

		memset(in, 0x3c, 2 * page);
		r = p ? kcoll_mem_share(k, in, 2 * page, &lo, &len) : -ENOMEM;
		kcoll_disconnect(k);
		tap_ok(r == 0 && in[0] == 0x3c && in[2 * page - 1] == 0x3c,
		       "disconnect leaves shared pages mapped with their data");
		free(p);
	}
	return tap_done();
}
