// SPDX-License-Identifier: MIT
/*
 * One side of the cross-host KV tests (tests/t_kv_cluster.sh runs it in the
 * netns cluster's hosts). Files in DIR carry the descriptor and results:
 *
 *   kv_peer owner DIR SIZE [shm] register SIZE bytes (2 counters), write
 *                               DIR/desc, wait for counter 1, write the
 *                               buffer's checksum to DIR/owner_hash
 *   kv_peer unreg DIR SIZE      register, write DIR/desc, wait for counter 0,
 *                               unregister mid-flood, write DIR/unreg_ok
 *                               if the buffer no longer changes
 *   kv_peer init DIR            import DIR/desc; random scattered batches
 *                               (1 B .. 16 MiB) and 4 KiB batches, written
 *                               and read back; bad input; then notify 1 and
 *                               write the expected image's checksum to
 *                               DIR/init_hash
 *   kv_peer flood DIR           import, notify 0, keep whole-segment writes
 *                               in flight until one fails; print its error
 *
 * Each check prints "check NAME: PASS|FAIL detail"; exit status 0 if all
 * passed. Not a test_* program: run.sh does not run it alone.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>

#include "kv_util.h"

#define MiB	(1024 * 1024ULL)

static int failed;
static void check(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(int ok, const char *name, const char *fmt, ...)
{
	va_list ap;

	printf("check %s: %s ", name, ok ? "PASS" : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	failed |= !ok;
}

static int file_write(const char *dir, const char *name, const void *p, size_t n)
{
	char path[512], tmp[520];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f))
		return -EIO;
	return rename(tmp, path) ? -errno : 0;
}

static int file_read(const char *dir, const char *name, void *p, size_t n, int wait_s)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	for (int i = 0; i < wait_s * 20; i++) {
		FILE *f = fopen(path, "r");

		if (f) {
			size_t got = fread(p, 1, n, f);

			fclose(f);
			return got == n ? 0 : -EIO;
		}
		usleep(50000);
	}
	return -ETIMEDOUT;
}

static struct kcoll *conn(void)
{
	struct kcoll *k;
	int r = kcoll_connect(NULL, &k);

	if (r) {
		fprintf(stderr, "kv_peer: kcoll_connect: %s\n", kcoll_strerror(r));
		exit(2);
	}
	return k;
}

static void buf_free(struct kcoll *k, uint8_t *buf, int shm)
{
	if (shm)
		kcoll_mem_free(k, buf);
	else
		free(buf);
}

/* shm: the buffer comes from kcoll_mem_alloc (kcolld receives in place). */
static int owner(const char *dir, size_t size, int unreg, int shm)
{
	struct kcoll *k = conn();
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 2 };
	uint8_t *buf = NULL;
	struct kcoll_seg *seg;
	kcoll_seg_desc_t d;
	uint64_t h, h2;
	int r;

	if (shm) {
		if (kcoll_mem_alloc(k, size, (void **)&buf))
			return 2;
		memset(buf, 0, size);
	} else {
		buf = calloc(1, size);
	}
	r = kcoll_seg_register(k, buf, size, &o, &seg);
	if (r) {
		fprintf(stderr, "kv_peer: register: %s\n", kcoll_strerror(r));
		return 2;
	}
	kcoll_seg_export(seg, &d);
	file_write(dir, "desc", &d, sizeof(d));
	if (unreg) {
		r = kcoll_seg_notify_wait(seg, 0, 1, 60000);
		usleep(50000);	/* let frames land */
		r = r ? r : kcoll_seg_unregister(seg);
		h = fnv(buf, size);
		usleep(300000);
		h2 = fnv(buf, size);
		check(r == 0 && h == h2, "unregister_quiet", "(%s; %s)", kcoll_strerror(r),
		      h == h2 ? "no write after unregister" : "buffer changed after unregister");
		file_write(dir, "unreg_done", "1", 1);
		buf_free(k, buf, shm);
		kcoll_disconnect(k);
		return failed;
	}
	r = kcoll_seg_notify_wait(seg, 1, 1, 120000);
	check(r == 0, "owner_notified", "(%s)", kcoll_strerror(r));
	h = fnv(buf, size);
	file_write(dir, "owner_hash", &h, sizeof(h));
	kcoll_seg_unregister(seg);
	buf_free(k, buf, shm);
	kcoll_disconnect(k);
	return failed;
}

static int xfer_sync(int write, struct kcoll_seg *l, struct kcoll_rseg *rs,
		     const struct kcoll_xfer_entry *e, uint32_t n, uint32_t notify)
{
	struct kcoll_req *rq;
	int r = (write ? kcoll_xfer_write : kcoll_xfer_read)(l, rs, e, n, notify, &rq);

	return r ? r : kcoll_wait(rq, 60000);
}

static uint32_t make_batch(struct kcoll_xfer_entry *e, uint32_t max, uint64_t src_size,
			   uint64_t dst_size, int bits_max, uint64_t fixed)
{
	uint64_t at = rnd() % 4096;
	uint32_t n = 0;

	while (n < max) {
		uint64_t len = fixed ? fixed : 1 + rnd() % (1ULL << (rnd() % (bits_max + 1)));

		at += fixed ? 0 : rnd() % 64;
		if (at + len > dst_size || len > src_size)
			break;
		e[n] = (struct kcoll_xfer_entry){ rnd() % (src_size - len + 1), at, len };
		at += len;
		n++;
	}
	shuffle_entries(e, n);
	return n;
}

static int initiator(const char *dir)
{
	struct kcoll *k = conn();
	kcoll_seg_desc_t d, bad;
	struct kcoll_seg_wire w;
	struct kcoll_rseg *rs, *rbad;
	struct kcoll_seg *ls, *lb;
	struct kcoll_xfer_entry *e = calloc(KCOLL_XFER_MAX_ENTRIES, sizeof(*e));
	size_t size, lsize = 40 * MiB;
	uint8_t *src = malloc(lsize), *back = malloc(lsize), *image;
	uint64_t h;
	int r;

	if (file_read(dir, "desc", &d, sizeof(d), 30) || !src || !back || !e) {
		fprintf(stderr, "kv_peer: no descriptor in %s (or out of memory)\n", dir);
		return 2;
	}
	for (size_t i = 0; i < lsize; i++)
		src[i] = (uint8_t)rnd();
	r = kcoll_seg_import(k, &d, &rs);
	check(r == 0, "import_remote", "(%s)", kcoll_strerror(r));
	if (r)
		return 1;
	size = kcoll_rseg_size(rs);
	image = calloc(1, size);
	kcoll_seg_register(k, src, lsize, NULL, &ls);
	kcoll_seg_register(k, back, lsize, NULL, &lb);

	/* wrong token: refused by the owner's daemon, nothing written */
	bad = d;
	memcpy(&w, bad.bytes, sizeof(w));
	w.token[0] ^= 0xff;
	memcpy(bad.bytes, &w, sizeof(w));
	r = kcoll_seg_import(k, &bad, &rbad);
	if (!r) {
		e[0] = (struct kcoll_xfer_entry){ 0, 0, 4096 };
		r = xfer_sync(1, ls, rbad, e, 1, KCOLL_NOTIFY_NONE);
		kcoll_rseg_close(rbad);
	}
	check(r == -EACCES, "wrong_token", "-> %s", kcoll_strerror(r));
	e[0] = (struct kcoll_xfer_entry){ 0, size - 10, 11 };
	r = xfer_sync(1, ls, rs, e, 1, 0);
	check(r == -ERANGE, "out_of_range", "-> %s", kcoll_strerror(r));
	r = xfer_sync(1, ls, rs, e, KCOLL_XFER_MAX_ENTRIES + 1, 0);
	check(r == -E2BIG, "over_limit", "-> %s", kcoll_strerror(r));

	for (int round = 0; round < 6; round++) {
		int small = round % 3 == 2;	/* batches of 1000 blocks of 4 KiB */
		uint32_t n = small ? make_batch(e, 1000, lsize, size, 0, 4096) :
			     make_batch(e, round & 1 ? 48 : 600, lsize, size, round & 1 ? 24 : 16, 0);
		uint64_t at = 0;
		uint32_t fit = 0;
		struct timespec t0, t1;

		clock_gettime(CLOCK_MONOTONIC, &t0);
		r = xfer_sync(1, ls, rs, e, n, KCOLL_NOTIFY_NONE);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		check(r == 0, "write_batch", "round %d: %u entries (%s, %.1f ms)", round, n,
		      kcoll_strerror(r), (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
		if (r)
			break;
		for (uint32_t i = 0; i < n; i++)
			memcpy(image + e[i].remote_off, src + e[i].local_off, e[i].len);
		while (fit < n && at + e[fit].len <= lsize) {
			e[fit].local_off = at;
			at += e[fit++].len;
		}
		memset(back, 0, lsize);
		r = xfer_sync(0, lb, rs, e, fit, KCOLL_NOTIFY_NONE);
		for (uint32_t i = 0; !r && i < fit; i++)
			if (memcmp(back + e[i].local_off, image + e[i].remote_off, e[i].len))
				r = -EBADMSG;
		check(r == 0, "read_back", "round %d: %u entries (%s)", round, fit, kcoll_strerror(r));
	}
	h = fnv(image, size);
	file_write(dir, "init_hash", &h, sizeof(h));
	r = xfer_sync(1, ls, rs, e, 0, 1);	/* done: notify only */
	check(r == 0, "notify_remote", "(%s)", kcoll_strerror(r));
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(ls);
	kcoll_seg_unregister(lb);
	kcoll_disconnect(k);
	free(image);
	free(src);
	free(back);
	free(e);
	return failed;
}

static int flood(const char *dir)
{
	struct kcoll *k = conn();
	kcoll_seg_desc_t d;
	struct kcoll_rseg *rs;
	struct kcoll_seg *ls;
	struct kcoll_xfer_entry e[16];
	struct kcoll_req *rq[8];
	uint8_t *src;
	size_t size;
	int r, first = 0, hung = 0;

	if (file_read(dir, "desc", &d, sizeof(d), 30) || kcoll_seg_import(k, &d, &rs))
		return 2;
	size = kcoll_rseg_size(rs);
	src = malloc(size);
	memset(src, 0x5a, size);
	kcoll_seg_register(k, src, size, NULL, &ls);
	for (int i = 0; i < 16; i++)
		e[i] = (struct kcoll_xfer_entry){ i * (size / 16), i * (size / 16), size / 16 };
	r = xfer_sync(1, ls, rs, e, 0, 0);	/* tell the owner we start */
	for (int round = 0; round < 40 && !first && !r; round++) {
		for (int i = 0; i < 8; i++)
			if ((r = kcoll_xfer_write(ls, rs, e, 16, KCOLL_NOTIFY_NONE, &rq[i])))
				rq[i] = NULL;
		for (int i = 0; i < 8; i++) {
			int x = rq[i] ? kcoll_wait(rq[i], 60000) : 0;

			if (x == -ETIMEDOUT)
				hung++;
			else if (x && !first)
				first = x;
		}
	}
	/* -EIDRM when the owner's kcolld could answer the frame; a frame that was
	 * arriving straight into the segment has its connection cut instead. */
	check(!hung && (first == -EIDRM || first == -ECONNRESET), "flood_error", "-> %s, %d hung",
	      kcoll_strerror(first), hung);
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(ls);
	kcoll_disconnect(k);
	free(src);
	return failed;
}

int main(int argc, char **argv)
{
	int shm = argc >= 5 && !strcmp(argv[4], "shm");

	if (argc >= 4 && !strcmp(argv[1], "owner"))
		return owner(argv[2], strtoull(argv[3], NULL, 0), 0, shm);
	if (argc >= 4 && !strcmp(argv[1], "unreg"))
		return owner(argv[2], strtoull(argv[3], NULL, 0), 1, shm);
	if (argc >= 3 && !strcmp(argv[1], "init"))
		return initiator(argv[2]);
	if (argc >= 3 && !strcmp(argv[1], "flood"))
		return flood(argv[2]);
	fprintf(stderr, "usage: kv_peer owner|unreg DIR SIZE [shm] | init|flood DIR\n");
	return 2;
}
