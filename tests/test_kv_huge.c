// SPDX-License-Identifier: MIT
/*
 * kcoll memory on huge pages: kcoll_mem_alloc of at least
 * KCOLL_THP_MIN_BYTES maps the memfd 2 MiB aligned and collapses its whole
 * 2 MiB pages (libkcoll region_map), and kcolld maps such a region 2 MiB
 * aligned too (user/daemon/mem.c), so both processes' mappings take the
 * huge pages one page-table entry each (ShmemPmdMapped in smaps). Two
 * regions of 8 MiB + 12 KiB: a KV write of one into the other must land
 * bit-exact, both of this process's mappings and both of kcolld's (which it
 * faulted in by the copy) must be PMD-mapped for their 4 whole 2 MiB pages;
 * with the knob at 0 nothing is collapsed. Where the kernel gives no shmem
 * huge page right now (MADV_COLLAPSE refused, shmem_enabled "deny", no free
 * huge page) the page checks SKIP.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "kv_util.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#define HUGE_SZ		(2ul << 20)
#define REG_BYTES	((8ul << 20) + 12288)	/* a size no other memfd mapping has */
#define WANT_KB		(4 * (long)(HUGE_SZ >> 10))	/* its 4 whole 2 MiB pages */

/*
 * ShmemPmdMapped (kB) of the mappings of /proc/PID/smaps that either hold
 * addr (addr != 0) or are REG_BYTES long and named after kcoll_mem_alloc's
 * memfd (addr == 0): the value of each found into kb[], up to max; returns
 * how many were found, -1 if smaps cannot be read.
 */
static int pmd_kb(pid_t pid, unsigned long addr, long *kb, int max)
{
	char path[64], line[512];
	unsigned long lo, hi;
	int n = 0, in = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		long v;

		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in = addr ? addr >= lo && addr < hi :
			     hi - lo == REG_BYTES && strstr(line, "kcoll-buf") != NULL;
			if (in && n < max)
				kb[n] = 0;
			continue;
		}
		if (in && n < max && sscanf(line, "ShmemPmdMapped: %ld kB", &v) == 1) {
			kb[n++] = v;
			in = 0;
		}
	}
	fclose(f);
	return n;
}

/* kcolld's pid: the peer of a connection to its socket. */
static pid_t daemon_pid(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *path = getenv("KCOLL_SOCKET");
	struct ucred cr = { 0 };
	socklen_t len = sizeof(cr);
	int fd;

	if (!path || strlen(path) >= sizeof(sa.sun_path))
		return -1;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len))
		cr.pid = -1;
	close(fd);
	return cr.pid;
}

/* Can a memfd of ours be PMD-mapped by MADV_COLLAPSE right now? */
static int collapse_works(char *why, size_t len)
{
	size_t sz = 2 * HUGE_SZ;
	int fd = memfd_create("kv-huge-probe", MFD_CLOEXEC);
	uint8_t *raw, *a;
	long kb = 0;
	int ok = 0;

	if (fd < 0 || ftruncate(fd, sz)) {
		snprintf(why, len, "memfd: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return 0;
	}
	raw = mmap(NULL, 2 * sz, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	a = (uint8_t *)(((unsigned long)raw + HUGE_SZ - 1) & ~(HUGE_SZ - 1));
	if (raw == MAP_FAILED || mmap(a, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
	    MAP_FAILED) {
		snprintf(why, len, "mmap: %s", strerror(errno));
	} else {
		memset(a, 1, sz);
		if (madvise(a, sz, MADV_COLLAPSE))
			snprintf(why, len, "MADV_COLLAPSE of a memfd: %s", strerror(errno));
		else if (pmd_kb(getpid(), (unsigned long)a, &kb, 1) != 1 || kb < (long)(sz >> 10))
			snprintf(why, len, "MADV_COLLAPSE of a memfd succeeded, smaps shows %ld kB "
				 "ShmemPmdMapped", kb);
		else
			ok = 1;
	}
	if (raw != MAP_FAILED)
		munmap(raw, 2 * sz);
	close(fd);
	return ok;
}

/* shmem may be huge without any hint ("always", "within_size", "force"). */
static int shmem_huge_anyway(void)
{
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
	char buf[160] = "";

	if (f) {
		if (!fgets(buf, sizeof(buf), f))
			buf[0] = 0;
		fclose(f);
	}
	return strstr(buf, "[always]") || strstr(buf, "[within_size]") || strstr(buf, "[force]");
}

struct pair {
	struct kcoll *k;
	uint8_t *src, *dst;
};

/* Two kcoll_mem_alloc regions; dst gets src by one KV write (1 MiB blocks,
 * shuffled, and the 12 KiB tail). 1: landed bit-exact. */
static int pair_run(struct pair *p, const char *what)
{
	struct kcoll_xfer_entry e[16];
	struct kcoll_seg *ls = NULL, *ds = NULL;
	struct kcoll_rseg *rs = NULL;
	struct kcoll_req *rq;
	kcoll_seg_desc_t d;
	uint32_t n = 0;
	int r, ok = 0;

	r = kcoll_connect(NULL, &p->k);
	if (!r && !(p->src = buf_alloc(p->k, REG_BYTES, 1)))
		r = -ENOMEM;
	if (!r && !(p->dst = buf_alloc(p->k, REG_BYTES, 1)))
		r = -ENOMEM;
	if (r) {
		tap_diag("%s: setup: %s", what, kcoll_strerror(r));
		return 0;
	}
	for (size_t i = 0; i < REG_BYTES; i += 8) {
		uint64_t v = rnd();

		memcpy(p->src + i, &v, 8);
	}
	memset(p->dst, 0, REG_BYTES);
	for (uint64_t off = 0; off < REG_BYTES; off += 1u << 20, n++)
		e[n] = (struct kcoll_xfer_entry){ .local_off = off, .remote_off = off,
						  .len = REG_BYTES - off < (1u << 20) ? REG_BYTES - off :
						  (1u << 20) };
	shuffle_entries(e, n);
	r = kcoll_seg_register(p->k, p->src, REG_BYTES, NULL, &ls);
	if (!r)
		r = kcoll_seg_register(p->k, p->dst, REG_BYTES, NULL, &ds);
	if (!r)
		r = kcoll_seg_export(ds, &d);
	if (!r)
		r = kcoll_seg_import(p->k, &d, &rs);
	if (!r)
		r = kcoll_xfer_write(ls, rs, e, n, KCOLL_NOTIFY_NONE, &rq);
	if (!r)
		r = kcoll_wait(rq, 60000);
	if (r)
		tap_diag("%s: KV write: %s", what, kcoll_strerror(r));
	else if (fnv(p->src, REG_BYTES) != fnv(p->dst, REG_BYTES) || memcmp(p->src, p->dst, REG_BYTES))
		tap_diag("%s: the destination differs from the source", what);
	else
		ok = 1;
	if (rs)
		kcoll_rseg_close(rs);
	if (ds)
		kcoll_seg_unregister(ds);
	if (ls)
		kcoll_seg_unregister(ls);
	return ok;
}

static void pair_free(struct pair *p)
{
	if (p->src)
		buf_free(p->k, p->src, 1);
	if (p->dst)
		buf_free(p->k, p->dst, 1);
	if (p->k)
		kcoll_disconnect(p->k);
}

int main(void)
{
	struct pair on = { 0 }, off = { 0 };
	char why[200] = "";
	long app[2] = { -1, -1 }, dmn[4] = { 0 };
	pid_t dpid = daemon_pid();
	int can, ok, nd;

	alarm(120);
	unsetenv("KCOLL_THP_MIN_BYTES");	/* the default, 4 MiB: these regions qualify */
	can = collapse_works(why, sizeof(why));
	ok = pair_run(&on, "default KCOLL_THP_MIN_BYTES");
	tap_ok(ok, "two 8 MiB + 12 KiB kcoll_mem_alloc regions: a KV write of one into the other "
	       "lands bit-exact");
	tap_ok(on.src && on.dst && !((unsigned long)on.src & (HUGE_SZ - 1)) &&
	       !((unsigned long)on.dst & (HUGE_SZ - 1)),
	       "both regions start 2 MiB aligned (%p, %p)", (void *)on.src, (void *)on.dst);
	if (on.src && on.dst) {
		pmd_kb(getpid(), (unsigned long)on.src, &app[0], 1);
		pmd_kb(getpid(), (unsigned long)on.dst, &app[1], 1);
	}
	nd = dpid > 0 ? pmd_kb(dpid, 0, dmn, 4) : -1;
	tap_diag("ShmemPmdMapped: this process %ld / %ld kB, kcolld (pid %d, %d mappings) %ld / %ld kB",
		 app[0], app[1], (int)dpid, nd, dmn[0], dmn[1]);
	if (!can) {
		tap_skip("this kernel gives a memfd no huge page now (%s)", why);
		tap_skip("this kernel gives a memfd no huge page now (%s)", why);
	} else {
		tap_ok(app[0] >= WANT_KB && app[1] >= WANT_KB,
		       "this process maps both regions' 4 whole 2 MiB pages as huge pages (>= %ld kB "
		       "each)", WANT_KB);
		if (nd < 0)
			tap_skip("cannot read kcolld's smaps (pid %d)", (int)dpid);
		else
			tap_ok(nd == 2 && dmn[0] >= WANT_KB && dmn[1] >= WANT_KB,
			       "kcolld maps both regions (%d found) with huge pages too (>= %ld kB each)",
			       nd, WANT_KB);
	}
	pair_free(&on);

	setenv("KCOLL_THP_MIN_BYTES", "0", 1);
	app[0] = app[1] = -1;
	ok = pair_run(&off, "KCOLL_THP_MIN_BYTES=0");
	tap_ok(ok, "KCOLL_THP_MIN_BYTES=0: the same KV write lands bit-exact");
	if (off.src && off.dst) {
		pmd_kb(getpid(), (unsigned long)off.src, &app[0], 1);
		pmd_kb(getpid(), (unsigned long)off.dst, &app[1], 1);
	}
	if (shmem_huge_anyway())
		tap_skip("shmem_enabled gives memfds huge pages without the hint here");
	else
		tap_ok(app[0] == 0 && app[1] == 0,
		       "KCOLL_THP_MIN_BYTES=0: no huge page in either region (%ld / %ld kB)", app[0],
		       app[1]);
	pair_free(&off);
	unsetenv("KCOLL_THP_MIN_BYTES");
	return tap_done();
}
