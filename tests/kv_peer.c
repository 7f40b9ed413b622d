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
 *                               in flight until one fails; print its error;
 *                               then one more write: the descriptor expired
 *                               ("any" after shm: any error will do, no
 *                               expiry check: the owner's kcolld is killed)
 *   kv_peer count DIR SIZE N K  register SIZE bytes (shm), write DIR/desc,
 *                               wait for counter 0 to reach N, check it stays
 *                               N and that slice i of K holds part i's pattern
 *   kv_peer part DIR I K R      initiator I of K: R batches of scattered
 *                               blocks into slice I (pattern of I), each
 *                               notifying counter 0; read the slice back
 *
 *   kv_peer victim DIR SIZE [shm]  the target of a fault on the initiator's
 *                               side: register SIZE bytes (2 counters) and a
 *                               patterned 1 MiB neighbour, write DIR/desc,
 *                               wait for DIR/killed (the number of batches
 *                               the initiator saw complete); then check
 *                               counter 1 counts only whole batches (the
 *                               buffer holds batch c's pattern, or c+1's
 *                               partly), nothing changes any more and the
 *                               neighbour is intact; write DIR/checked; then
 *                               wait for a fresh initiator's batch (counter 0
 *                               reaches 3) and check it landed whole
 *   kv_peer stream DIR [shm]    import, notify 0, then whole-segment batches
 *                               one at a time, batch j filling the segment
 *                               with pat_j and notifying counter 1, printing
 *                               "done j" after each, until one fails (its
 *                               kcolld was killed: the error must come, not
 *                               a hang) or 150 s passed
 *   kv_peer after DIR [shm]     a fresh initiator: one whole-segment batch
 *                               of 0xc3 notifying counter 0, read back,
 *                               then notify counter 0 again (done)
 *   kv_peer notif-owner DIR SIZE K N [shm]  notifications: take K x N
 *                               messages "i:q", each once, in order per
 *                               sender, region q of slice i landed first;
 *                               then the full queue part 0 leaves; then
 *                               unregister (DIR/drained, DIR/gone)
 *   kv_peer notif-part DIR I K N [shm]  part I: N batches with a message,
 *                               4 in flight; part 0 then bad input, the
 *                               queue filled (-ENOBUFS), the owner gone
 *
 * init, flood, part, stream and after take "shm" after their arguments: the initiator's own
 * buffers then come from kcoll_mem_alloc (both sides mapped: what kcolld
 * moves over RDMA when a device is there). KV_PEER_MIB sets init's local
 * buffer size (default 40). The unreg owner also keeps a neighbouring
 * segment nobody imports and checks it is untouched.
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
#include "peer_check.h"

#define MiB	(1024 * 1024ULL)


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
	if (unreg) {
		/* A neighbour nobody was given: it must never change. */
		size_t nsize = 1 * MiB;
		uint8_t *nb = buf_alloc(k, nsize, shm);
		struct kcoll_seg *nseg = NULL;
		uint64_t nh;

		if (!nb || kcoll_seg_register(k, nb, nsize, NULL, &nseg))
			return 2;
		for (size_t i = 0; i < nsize; i++)
			nb[i] = (uint8_t)(i * 7 + 3);
		nh = fnv(nb, nsize);
		file_write(dir, "desc", &d, sizeof(d));
		r = kcoll_seg_notify_wait(seg, 0, 1, 60000);
		usleep(50000);	/* let frames land */
		r = r ? r : kcoll_seg_unregister(seg);
		h = fnv(buf, size);
		usleep(300000);
		h2 = fnv(buf, size);
		check(r == 0 && h == h2, "unregister_quiet", "(%s; %s)", kcoll_strerror(r),
		      h == h2 ? "no write after unregister" : "buffer changed after unregister");
		check(fnv(nb, nsize) == nh, "neighbour_intact", "(the other segment's checksum)");
		kcoll_seg_unregister(nseg);
		buf_free(k, nb, shm);
		file_write(dir, "unreg_done", "1", 1);
		buf_free(k, buf, shm);
		kcoll_disconnect(k);
		return failed;
	}
	file_write(dir, "desc", &d, sizeof(d));
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

static int xfer_notif_sync(struct kcoll_seg *l, struct kcoll_rseg *rs, const struct kcoll_xfer_entry *e,
			   uint32_t n, uint32_t notify, const void *msg, uint32_t len)
{
	struct kcoll_req *rq;
	int r = kcoll_xfer_write_notif(l, rs, e, n, notify, msg, len, &rq);

	return r ? r : kcoll_wait(rq, 30000);
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

static int initiator(const char *dir, int shm)
{
	struct kcoll *k = conn();
	kcoll_seg_desc_t d, bad;
	struct kcoll_seg_wire w;
	struct kcoll_rseg *rs, *rbad;
	struct kcoll_seg *ls, *lb;
	struct kcoll_xfer_entry *e = calloc(KCOLL_XFER_MAX_ENTRIES, sizeof(*e));
	size_t size, lsize = (getenv("KV_PEER_MIB") ? strtoull(getenv("KV_PEER_MIB"), NULL, 0) : 40) * MiB;
	uint8_t *src = buf_alloc(k, lsize, shm), *back = buf_alloc(k, lsize, shm), *image;
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
	buf_free(k, src, shm);
	buf_free(k, back, shm);
	kcoll_disconnect(k);
	free(image);
	free(e);
	return failed;
}

static int flood(const char *dir, int shm, int any)
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
	src = buf_alloc(k, size, shm);
	if (!src)
		return 2;
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
	/* any: the owner's kcolld dies; whatever the error, there is one. */
	check(!hung && (any ? first != 0 : first == -EIDRM || first == -ECONNRESET), "flood_error",
	      "-> %s, %d hung", kcoll_strerror(first), hung);
	if (first && !any) {
		/* The segment is gone now: the descriptor has expired. */
		r = xfer_sync(1, ls, rs, e, 1, KCOLL_NOTIFY_NONE);
		check(r == -EIDRM, "expired_descriptor", "-> %s", kcoll_strerror(r));
	}
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(ls);
	buf_free(k, src, shm);	/* before the disconnect: kcoll_mem_free needs k */
	kcoll_disconnect(k);
	return failed;
}

static uint8_t pat(uint32_t part, uint64_t off)
{
	return (uint8_t)((off * 131 + part * 29 + (off >> 9)) ^ (part << 5));
}

/* Owner of the concurrency test: exact counter, every slice intact. */
static int count_owner(const char *dir, size_t size, uint32_t want, uint32_t parts)
{
	struct kcoll *k = conn();
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 1 };
	struct kcoll_seg *seg;
	kcoll_seg_desc_t d;
	uint8_t *buf;
	size_t slice = size / parts, bad = 0;
	int r;

	if (kcoll_mem_alloc(k, size, (void **)&buf) || kcoll_seg_register(k, buf, size, &o, &seg))
		return 2;
	memset(buf, 0, size);
	kcoll_seg_export(seg, &d);
	file_write(dir, "desc", &d, sizeof(d));
	r = kcoll_seg_notify_wait(seg, 0, want, 240000);
	check(r == 0, "counter_reached", "(%u notifies expected: %s)", want, kcoll_strerror(r));
	usleep(500000);	/* a late extra increment would show now */
	{
		uint32_t v = 0;

		r = kcoll_seg_notify_get(seg, 0, &v);
		check(r == 0 && v == want, "counter_exact", "(%u, want %u)", v, want);
	}
	for (uint32_t p = 0; p < parts; p++)
		for (size_t i = 0; i < slice; i++)
			bad += buf[p * slice + i] != pat(p, i);
	check(bad == 0, "slices_intact", "(%zu of %zu bytes differ from the parts' patterns)", bad,
	      slice * parts);
	kcoll_seg_unregister(seg);
	kcoll_mem_free(k, buf);
	kcoll_disconnect(k);
	return failed;
}

#define PART_DEPTH_MAX	8

/* Part i of K: its slice in R batches of scattered blocks, each notifying,
 * up to D batches in flight at once (across hosts: several queued for the
 * import's streams together). */
static int part(const char *dir, uint32_t me, uint32_t parts, uint32_t rounds, int shm, int depth)
{
	struct kcoll *k = conn();
	struct kcoll_xfer_entry *e[PART_DEPTH_MAX] = { 0 };
	struct kcoll_req *rq[PART_DEPTH_MAX] = { 0 };
	kcoll_seg_desc_t d;
	struct kcoll_rseg *rs;
	struct kcoll_seg *ls;
	size_t slice;
	uint8_t *src, *back;
	uint64_t done = 0;
	int r = 0;

	depth = depth < 1 ? 1 : depth > PART_DEPTH_MAX ? PART_DEPTH_MAX : depth;
	for (int i = 0; i < depth; i++)
		if (!(e[i] = calloc(KCOLL_XFER_MAX_ENTRIES, sizeof(*e[i]))))
			return 2;
	rng_state ^= (me + 1) * 0x9e3779b97f4a7c15ULL;
	if (file_read(dir, "desc", &d, sizeof(d), 30) || kcoll_seg_import(k, &d, &rs))
		return 2;
	slice = kcoll_rseg_size(rs) / parts;
	src = buf_alloc(k, 2 * slice, shm);
	if (!src || kcoll_seg_register(k, src, 2 * slice, NULL, &ls))
		return 2;
	back = src + slice;
	for (size_t i = 0; i < slice; i++)
		src[i] = pat(me, i);
	/* Round j writes the blocks of [j * slice / R, (j+1) * slice / R): the
	 * slice cut into blocks of 1 B .. 64 KiB, shuffled; slot j % D holds
	 * its entries until it completes. */
	for (uint32_t j = 0; j < rounds + (uint32_t)depth; j++) {
		int slot = j % depth;
		uint64_t lo = j * slice / rounds, hi = (j + 1) * slice / rounds, at = lo;
		uint32_t n = 0;

		if (rq[slot]) {
			int x = kcoll_wait(rq[slot], 60000);

			rq[slot] = NULL;
			done += !x;
			r = r ? r : x;
		}
		if (j >= rounds || r)
			continue;
		while (at < hi && n < KCOLL_XFER_MAX_ENTRIES) {
			uint64_t len = 1 + rnd() % (1ULL << (rnd() % 17));

			len = len > hi - at || n == KCOLL_XFER_MAX_ENTRIES - 1 ? hi - at : len;
			e[slot][n++] = (struct kcoll_xfer_entry){ at, me * slice + at, len };
			at += len;
		}
		shuffle_entries(e[slot], n);
		r = kcoll_xfer_write(ls, rs, e[slot], n, 0, &rq[slot]);
		if (r)
			rq[slot] = NULL;
	}
	check(r == 0 && done == rounds, "part_writes", "(part %u: %llu of %u batches, %d in flight: %s)",
	      me, (unsigned long long)done, rounds, depth, kcoll_strerror(r));
	/* An empty batch with a request right behind it in the ring, 16 times:
	 * it has no frame for the streams, so it must not wait on them. */
	for (int i = 0; i < 16 && !r; i++) {
		struct kcoll_xfer_entry one = { 0, me * slice, slice < 4096 ? slice : 4096 };
		struct kcoll_req *eq = NULL, *wq = NULL;
		int x = kcoll_xfer_write(ls, rs, e[0], 0, KCOLL_NOTIFY_NONE, &eq);

		r = x ? x : kcoll_xfer_write(ls, rs, &one, 1, KCOLL_NOTIFY_NONE, &wq);
		r = wq ? kcoll_wait(wq, 20000) : r;
		x = eq ? kcoll_wait(eq, 20000) : x;
		r = r ? r : x;
	}
	check(r == 0, "part_empty_batches", "(part %u: 16 empty batches, each with a write behind it: %s)",
	      me, kcoll_strerror(r));
	memset(back, 0, slice);
	e[0][0] = (struct kcoll_xfer_entry){ slice, me * slice, slice };
	r = xfer_sync(0, ls, rs, e[0], 1, KCOLL_NOTIFY_NONE);
	check(r == 0 && !memcmp(back, src, slice), "part_read_back", "(part %u: %s)", me,
	      r ? kcoll_strerror(r) : "compared");
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(ls);
	buf_free(k, src, shm);
	kcoll_disconnect(k);
	for (int i = 0; i < depth; i++)
		free(e[i]);
	return failed;
}

/* Batch j (from 1) of stream fills the segment with this; 0: nothing yet. */
static uint8_t stream_pat(uint64_t j)
{
	return j ? (uint8_t)((j - 1) % 255 + 1) : 0;
}

#define STREAM_BLOCKS	16

static int stream(const char *dir, int shm)
{
	struct kcoll *k = conn();
	struct kcoll_xfer_entry e[STREAM_BLOCKS];
	kcoll_seg_desc_t d;
	struct kcoll_rseg *rs;
	struct kcoll_seg *ls;
	struct timespec t0, t1;
	uint64_t j = 0;
	uint8_t *src;
	size_t size;
	int r = 0;

	if (file_read(dir, "desc", &d, sizeof(d), 30) || kcoll_seg_import(k, &d, &rs))
		return 2;
	size = kcoll_rseg_size(rs);
	src = buf_alloc(k, size, shm);
	if (!src || kcoll_seg_register(k, src, size, NULL, &ls))
		return 2;
	for (int i = 0; i < STREAM_BLOCKS; i++)
		e[i] = (struct kcoll_xfer_entry){ i * (size / STREAM_BLOCKS), i * (size / STREAM_BLOCKS),
						  size / STREAM_BLOCKS };
	r = xfer_sync(1, ls, rs, e, 0, 0);	/* tell the owner we start */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	t1 = t0;
	while (!r && t1.tv_sec - t0.tv_sec < 150) {
		struct kcoll_req *rq;

		memset(src, stream_pat(j + 1), size);
		r = kcoll_xfer_write(ls, rs, e, STREAM_BLOCKS, 1, &rq);
		if (!r)
			r = kcoll_wait(rq, 60000);
		if (!r) {
			printf("done %llu\n", (unsigned long long)++j);
			fflush(stdout);
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
	}
	/* Any error but a timeout: the request ended on its own. */
	check(r != 0 && r != -ETIMEDOUT, "stream_error", "-> %s after %llu batches", kcoll_strerror(r),
	      (unsigned long long)j);
	/* Its kcolld is gone: these fail, and release what this side holds. */
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(ls);
	buf_free(k, src, shm);
	kcoll_disconnect(k);
	return failed;
}

static int after(const char *dir, int shm)
{
	struct kcoll *k = conn();
	struct kcoll_xfer_entry e = { 0, 0, 0 };
	kcoll_seg_desc_t d;
	struct kcoll_rseg *rs;
	struct kcoll_seg *ls;
	uint8_t *src, *back;
	size_t size;
	int r;

	if (file_read(dir, "desc", &d, sizeof(d), 30))
		return 2;
	r = kcoll_seg_import(k, &d, &rs);
	check(r == 0, "after_import", "(%s)", kcoll_strerror(r));
	if (r)
		return failed;
	size = kcoll_rseg_size(rs);
	src = buf_alloc(k, 2 * size, shm);
	if (!src || kcoll_seg_register(k, src, 2 * size, NULL, &ls))
		return 2;
	back = src + size;
	memset(src, 0xc3, size);
	memset(back, 0, size);
	e.len = size;
	r = xfer_sync(1, ls, rs, &e, 1, 0);
	check(r == 0, "after_write", "(a fresh batch: %s)", kcoll_strerror(r));
	e.local_off = size;
	r = r ? r : xfer_sync(0, ls, rs, &e, 1, KCOLL_NOTIFY_NONE);
	check(r == 0 && !memcmp(src, back, size), "after_read_back", "(%s)",
	      r ? kcoll_strerror(r) : "compared");
	/* Done: the victim checks its segment once counter 0 says so. */
	r = r ? r : xfer_sync(1, ls, rs, &e, 0, 0);
	check(r == 0, "after_done", "(notify: %s)", kcoll_strerror(r));
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(ls);
	buf_free(k, src, shm);
	kcoll_disconnect(k);
	return failed;
}

static size_t count_not(const uint8_t *p, size_t n, uint8_t a, uint8_t b)
{
	size_t bad = 0;

	for (size_t i = 0; i < n; i++)
		bad += p[i] != a && p[i] != b;
	return bad;
}

static int victim(const char *dir, size_t size, int shm)
{
	struct kcoll *k = conn();
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 2 };
	size_t nsize = 1 * MiB, bad;
	struct kcoll_seg *seg, *nseg;
	uint8_t *buf, *nb;
	kcoll_seg_desc_t d;
	uint64_t h, h2, nh;
	uint32_t c = 0;
	char seen[32] = { 0 };
	unsigned long long k_seen;
	int r;

	buf = buf_alloc(k, size, shm);
	nb = buf_alloc(k, nsize, shm);
	if (!buf || !nb)
		return 2;
	memset(buf, 0, size);
	for (size_t i = 0; i < nsize; i++)
		nb[i] = (uint8_t)(i * 7 + 3);
	nh = fnv(nb, nsize);
	if (kcoll_seg_register(k, buf, size, &o, &seg) || kcoll_seg_register(k, nb, nsize, NULL, &nseg))
		return 2;
	kcoll_seg_export(seg, &d);
	file_write(dir, "desc", &d, sizeof(d));
	r = file_read(dir, "killed", seen, sizeof(seen) - 1, 240);
	if (r == -EIO)	/* shorter than the buffer: fine */
		r = 0;
	if (r) {
		check(0, "victim_killed", "(no DIR/killed: %s)", kcoll_strerror(r));
		return failed;
	}
	k_seen = strtoull(seen, NULL, 10);
	/* The test script wrote DIR/killed once this kcolld had dropped the
	 * initiator's connections: nothing may change from here on. */
	h = fnv(buf, size);
	kcoll_seg_notify_get(seg, 1, &c);
	usleep(300000);
	h2 = fnv(buf, size);
	check(h == h2, "victim_quiet", "(the segment no longer changes)");
	check(c == k_seen || c == k_seen + 1, "victim_counter",
	      "(counter 1 = %u, the initiator saw %llu batches complete)", c, k_seen);
	bad = count_not(buf, size, stream_pat(c), stream_pat(c + 1));
	check(bad == 0, "victim_whole_batches",
	      "(%zu of %zu bytes are neither batch %u's pattern nor the broken batch %u's)", bad, size,
	      c, c + 1);
	check(fnv(nb, nsize) == nh, "victim_neighbour_intact", "(the other segment's checksum)");
	file_write(dir, "checked", "1", 1);
	/* the fresh initiator's batch (notifying), its read back, its notify */
	r = kcoll_seg_notify_wait(seg, 0, 3, 240000);
	bad = r ? size : count_not(buf, size, 0xc3, 0xc3);
	check(r == 0 && bad == 0, "victim_new_transfer", "(a fresh initiator's batch: %s, %zu bytes differ)",
	      kcoll_strerror(r), bad);
	check(fnv(nb, nsize) == nh, "victim_neighbour_still_intact", "(the other segment's checksum)");
	kcoll_seg_notify_get(seg, 1, &c);
	kcoll_seg_unregister(nseg);
	kcoll_seg_unregister(seg);
	buf_free(k, nb, shm);
	buf_free(k, buf, shm);
	kcoll_disconnect(k);
	return failed;
}

/* ---- notifications across hosts (docs/kv.md "Notifications") ---------- */

#define NT_DEPTH	4

/* Region q of part i: its bytes, seeded so the owner can check them. */
static uint8_t npat(uint32_t part, uint32_t q, uint64_t off)
{
	return (uint8_t)(off * 7 + q * 13 + part * 101 + (off >> 8));
}

/*
 * Owner: K parts each send N messages "i:q" with a batch writing region q
 * of slice i. Each message must come exactly once, in order per sender
 * (one sender value per part), with its region's bytes already landed, and
 * counter 0 must equal K x N. Then DIR/drained; part 0 fills the queue
 * (KCOLL_SEG_NOTIF_QUEUE alone, the next refused) and writes DIR/full:
 * the queue holds exactly those, in order. Unregister, write DIR/gone.
 */
static int notif_owner(const char *dir, size_t size, uint32_t parts, uint32_t n, int shm)
{
	struct kcoll *k = conn();
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 1 };
	struct kcoll_notif *nt = calloc(KCOLL_SEG_NOTIF_QUEUE + 1, sizeof(*nt));
	uint64_t sender[16] = { 0 };
	uint32_t next[16] = { 0 }, total = 0, bad = 0, late = 0, v = 0, got = 0, nr;
	size_t slice = size / parts, region = slice / n;
	struct kcoll_seg *seg;
	kcoll_seg_desc_t d;
	uint8_t *buf = buf_alloc(k, size, shm);
	int64_t end = time(NULL) + 120;
	char c;
	int r;

	if (!nt || !buf || parts > 16 || kcoll_seg_register(k, buf, size, &o, &seg))
		return 2;
	memset(buf, 0, size);
	kcoll_seg_export(seg, &d);
	file_write(dir, "desc", &d, sizeof(d));
	while (total < parts * n && !bad && time(NULL) < end) {
		if (kcoll_seg_notif_wait(seg, 1000))
			continue;
		nt[0].size = sizeof(nt[0]);
		if (kcoll_seg_get_notifs(seg, nt, 64, &nr))
			break;
		for (uint32_t j = 0; j < nr && !bad; j++) {
			unsigned int i, q;

			if (sscanf((char *)nt[j].data, "%u:%u", &i, &q) != 2 || i >= parts || q != next[i] ||
			    (sender[i] && sender[i] != nt[j].sender) || nt[j].notify_id != 0) {
				printf("# unexpected notification '%.32s'\n", (char *)nt[j].data);
				bad++;
				break;
			}
			for (size_t b = 0; b < region; b++)
				late += buf[i * slice + q * region + b] != npat(i, q, b);
			sender[i] = nt[j].sender;
			next[i]++;
			total++;
		}
	}
	for (uint32_t i = 0; i < parts; i++)
		for (uint32_t j = 0; j < i; j++)
			bad += sender[i] == sender[j];
	check(!bad && total == parts * n, "notif_once_in_order",
	      "(%u of %u messages, each once, in order per sender, senders distinct)", total, parts * n);
	check(late == 0, "notif_after_bytes", "(%u bytes not landed when their message was taken)", late);
	usleep(300000);	/* a duplicate or an extra increment would show now */
	kcoll_seg_notify_get(seg, 0, &v);
	nt[0].size = sizeof(nt[0]);
	kcoll_seg_get_notifs(seg, nt, 4, &nr);
	check(v == parts * n && nr == 0, "notif_counter", "(counter %u, want %u; %u late messages)", v,
	      parts * n, nr);
	file_write(dir, "drained", "1", 1);
	r = file_read(dir, "full", &c, 1, 60);
	if (!r) {
		nt[0].size = sizeof(nt[0]);
		r = kcoll_seg_get_notifs(seg, nt, KCOLL_SEG_NOTIF_QUEUE + 1, &got);
		for (uint32_t j = 0; j < got && !r; j++) {
			char m[16];

			snprintf(m, sizeof(m), "f%u", j);
			r = strcmp((char *)nt[j].data, m) ? -EBADMSG : 0;
		}
	}
	check(r == 0 && got == KCOLL_SEG_NOTIF_QUEUE, "notif_full_queue",
	      "(%u queued, want %u in order: %s)", got, KCOLL_SEG_NOTIF_QUEUE, kcoll_strerror(r));
	kcoll_seg_unregister(seg);
	file_write(dir, "gone", "1", 1);
	buf_free(k, buf, shm);
	kcoll_disconnect(k);
	free(nt);
	return failed;
}

/* Part i of K: N batches into its slice's regions, NT_DEPTH in flight,
 * each with message "i:q" and counter 0; part 0 then fills the owner's
 * queue, checks bad input, and a message to the unregistered segment. */
static int notif_part(const char *dir, uint32_t me, uint32_t parts, uint32_t n, int shm)
{
	struct kcoll *k = conn();
	struct kcoll_xfer_entry e[NT_DEPTH][64];
	struct kcoll_req *rq[NT_DEPTH] = { 0 };
	char msg[NT_DEPTH][32];
	kcoll_seg_desc_t d;
	struct kcoll_rseg *rs;
	struct kcoll_seg *ls;
	size_t slice, region;
	uint8_t *src;
	uint32_t done = 0;
	int r = 0;
	char c;

	rng_state ^= (me + 7) * 0x9e3779b97f4a7c15ULL;
	if (file_read(dir, "desc", &d, sizeof(d), 30) || kcoll_seg_import(k, &d, &rs))
		return 2;
	slice = kcoll_rseg_size(rs) / parts;
	region = slice / n;
	src = buf_alloc(k, slice, shm);
	if (!src || kcoll_seg_register(k, src, slice, NULL, &ls))
		return 2;
	for (uint32_t q = 0; q < n; q++)
		for (size_t b = 0; b < region; b++)
			src[q * region + b] = npat(me, q, b);
	for (uint32_t j = 0; j < n + NT_DEPTH; j++) {
		int slot = j % NT_DEPTH;
		uint64_t at = j * region, hi = at + region;
		uint32_t m = 0;

		if (rq[slot]) {
			int x = kcoll_wait(rq[slot], 60000);

			rq[slot] = NULL;
			done += !x;
			r = r ? r : x;
		}
		if (j >= n || r)
			continue;
		while (at < hi) {	/* the region in up to 64 blocks */
			uint64_t len = m == 63 ? hi - at : 1 + rnd() % (2 * region / 64);

			len = len > hi - at ? hi - at : len;
			e[slot][m++] = (struct kcoll_xfer_entry){ at, me * slice + at, len };
			at += len;
		}
		shuffle_entries(e[slot], m);
		snprintf(msg[slot], sizeof(msg[slot]), "%u:%u", me, j);
		r = kcoll_xfer_write_notif(ls, rs, e[slot], m, 0, msg[slot], strlen(msg[slot]) + 1,
					   &rq[slot]);
		if (r)
			rq[slot] = NULL;
	}
	check(r == 0 && done == n, "notif_part_writes", "(part %u: %u of %u batches with a message, "
	      "%d in flight: %s)", me, done, n, NT_DEPTH, kcoll_strerror(r));
	if (me == 0 && !file_read(dir, "drained", &c, 1, 120)) {
		struct kcoll_xfer_entry far = { 0, kcoll_rseg_size(rs) - 4, 8 };
		char big[KCOLL_NOTIF_MAX_BYTES + 1];

		memset(big, 'x', sizeof(big));
		r = xfer_notif_sync(ls, rs, &far, 1, 0, "far", 4);
		check(r == -ERANGE, "notif_range", "(entry past the end with a message: %s)",
		      kcoll_strerror(r));
		r = xfer_notif_sync(ls, rs, NULL, 0, 0, big, sizeof(big));
		check(r == -EMSGSIZE, "notif_too_long", "(%zu bytes: %s)", sizeof(big), kcoll_strerror(r));
		r = 0;
		for (uint32_t i = 0; i < KCOLL_SEG_NOTIF_QUEUE && !r; i++) {
			char m[16];

			snprintf(m, sizeof(m), "f%u", i);
			r = xfer_notif_sync(ls, rs, NULL, 0, KCOLL_NOTIFY_NONE, m, strlen(m) + 1);
		}
		r = r ? r : xfer_notif_sync(ls, rs, NULL, 0, KCOLL_NOTIFY_NONE, "over", 5);
		check(r == -ENOBUFS, "notif_queue_full", "(the %uth message: %s)",
		      KCOLL_SEG_NOTIF_QUEUE + 1, kcoll_strerror(r));
		{	/* the same for a batch of 2 MiB: several frames (TCP: the
			 * stream threads carry it) or RDMA, then the MSG frame */
			uint64_t len = slice < (2u << 20) ? slice : 2u << 20;
			struct kcoll_xfer_entry big_e = { 0, me * slice, len };

			r = xfer_notif_sync(ls, rs, &big_e, 1, KCOLL_NOTIFY_NONE, "over2", 6);
			check(r == -ENOBUFS, "notif_queue_full_batch", "(a %llu-byte batch with a message: %s)",
			      (unsigned long long)len, kcoll_strerror(r));
		}
		{	/* the refusal is the owner's answer: the import goes on */
			struct kcoll_xfer_entry one = { 0, 0, 4096 };

			r = xfer_sync(1, ls, rs, &one, 1, KCOLL_NOTIFY_NONE);
			check(r == 0, "notif_after_full", "(a plain batch right after -ENOBUFS: %s)",
			      kcoll_strerror(r));
		}
		file_write(dir, "full", "1", 1);
		r = file_read(dir, "gone", &c, 1, 60);
		r = r ? r : xfer_notif_sync(ls, rs, NULL, 0, KCOLL_NOTIFY_NONE, "gone?", 6);
		check(r == -EIDRM, "notif_owner_gone", "(a message to the unregistered segment: %s)",
		      kcoll_strerror(r));
	}
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(ls);
	buf_free(k, src, shm);
	kcoll_disconnect(k);
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
		return initiator(argv[2], argc >= 4 && !strcmp(argv[3], "shm"));
	if (argc >= 3 && !strcmp(argv[1], "flood"))
		return flood(argv[2], argc >= 4 && !strcmp(argv[3], "shm"),
			     argc >= 5 && !strcmp(argv[4], "any"));
	if (argc >= 6 && !strcmp(argv[1], "count"))
		return count_owner(argv[2], strtoull(argv[3], NULL, 0), atoi(argv[4]), atoi(argv[5]));
	if (argc >= 6 && !strcmp(argv[1], "part"))
		return part(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
			    argc >= 7 && !strcmp(argv[6], "shm"), argc >= 8 ? atoi(argv[7]) : 1);
	if (argc >= 4 && !strcmp(argv[1], "victim"))
		return victim(argv[2], strtoull(argv[3], NULL, 0), shm);
	if (argc >= 3 && !strcmp(argv[1], "stream"))
		return stream(argv[2], argc >= 4 && !strcmp(argv[3], "shm"));
	if (argc >= 6 && !strcmp(argv[1], "notif-owner"))
		return notif_owner(argv[2], strtoull(argv[3], NULL, 0), atoi(argv[4]), atoi(argv[5]),
				   argc >= 7 && !strcmp(argv[6], "shm"));
	if (argc >= 6 && !strcmp(argv[1], "notif-part"))
		return notif_part(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
				  argc >= 7 && !strcmp(argv[6], "shm"));
	if (argc >= 3 && !strcmp(argv[1], "after"))
		return after(argv[2], argc >= 4 && !strcmp(argv[3], "shm"));
	fprintf(stderr, "usage: kv_peer owner|unreg DIR SIZE [shm] | init|flood DIR [shm] | "
		"count DIR SIZE N K | part DIR I K R [shm|malloc [DEPTH]] | victim DIR SIZE [shm] | "
		"stream|after DIR [shm]\n");
	return 2;
}
