// SPDX-License-Identifier: MIT
/*
 * KV-cache transfers against the running kcolld (docs/kv.md):
 *  - integrity: random scattered batches (1 B .. 16 MiB blocks, destinations
 *    disjoint) written and read between two processes over every data path
 *    (malloc'ed or kcoll_mem_alloc'ed on either side), checked by checksum
 *    of the whole target and block by block on read-back;
 *  - many clients at once with notify counters that must come out exact;
 *  - every validation rule broken one at a time: the error, and the target
 *    and its counter untouched;
 *  - another uid: refused without a grant, served with one;
 *  - unregister and death of either side while transfers are in flight: an
 *    error on the other side, no hang, no write after unregister returns, a
 *    neighbouring segment untouched.
 *
 * The notifications are test_kv_notif.c's; test_kv.h has what both share.
 */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>
#include <kcoll/tap.h>

#include "kv_util.h"
#include "test_kv.h"

#define NOBODY		65534
#define MiB		(1024 * 1024ULL)

/*
 * A random batch: lengths log-uniform in [1, maxblk], destinations disjoint
 * (laid out in order with random gaps, then shuffled), sources anywhere.
 */
static uint32_t make_batch(struct kcoll_xfer_entry *e, uint32_t max, uint64_t src_size,
			   uint64_t dst_size, uint64_t maxblk)
{
	uint64_t at = rnd() % 4096;
	uint32_t n = 0;

	while (n < max) {
		int bits = (int)(rnd() % 25);	/* 2^0 .. 2^24 = 16 MiB */
		uint64_t len = 1 + rnd() % (1ULL << bits);

		if (len > maxblk)
			len = maxblk;
		at += rnd() % 64;
		if (at + len > dst_size || len > src_size)
			break;
		e[n].remote_off = at;
		e[n].local_off = rnd() % (src_size - len + 1);
		e[n].len = len;
		at += len;
		n++;
	}
	shuffle_entries(e, n);
	return n;
}

/* ---------------------------------------------------------------------------
 * Integrity between two processes, for each combination of memory kinds.
 */
#define INT_DST		(48 * MiB)
#define INT_SRC		(40 * MiB)
#define INT_ROUNDS	6

static void integrity_child(int src_shm, uint64_t seed)
{
	struct kcoll *k = connect_or_die();
	struct kcoll_xfer_entry *e = calloc(KCOLL_XFER_MAX_ENTRIES, sizeof(*e));
	uint8_t *src = buf_alloc(k, INT_SRC, src_shm), *back = buf_alloc(k, INT_SRC, src_shm);
	uint8_t *image = calloc(1, INT_DST);	/* what the target must hold */
	struct kcoll_seg *ls, *lb;
	struct kcoll_rseg *rs;
	struct kcoll_req *rq;
	int r;

	rng_state = seed;
	if (!e || !src || !back || !image)
		CH_FAIL("allocation failed");
	fill_random(src, INT_SRC);
	if ((r = kcoll_seg_register(k, src, INT_SRC, NULL, &ls)) ||
	    (r = kcoll_seg_register(k, back, INT_SRC, NULL, &lb)))
		CH_FAIL("register: %s", kcoll_strerror(r));
	r = kcoll_seg_import(k, &B->desc[0], &rs);
	if (r)
		CH_FAIL("import: %s", kcoll_strerror(r));
	if (kcoll_rseg_size(rs) != INT_DST)
		CH_FAIL("imported size %llu", (unsigned long long)kcoll_rseg_size(rs));
	for (int round = 0; round < INT_ROUNDS; round++) {
		/* small blocks in half the rounds: hundreds of entries per batch */
		uint64_t maxblk = round & 1 ? 16 * MiB : 64 * 1024;
		uint32_t n = make_batch(e, round & 1 ? 64 : 1000, INT_SRC, INT_DST, maxblk);

		r = kcoll_xfer_write(ls, rs, e, n, 0, &rq);
		if (!r)
			r = kcoll_wait(rq, 60000);
		if (r)
			CH_FAIL("write round %d (%u entries): %s", round, n, kcoll_strerror(r));
		for (uint32_t i = 0; i < n; i++)
			memcpy(image + e[i].remote_off, src + e[i].local_off, e[i].len);
		/* Read the same blocks back, packed from 0 in the local segment
		 * (as many as fit), and compare with what the target must hold. */
		{
			uint64_t at = 0;
			uint32_t fit = 0;

			while (fit < n && at + e[fit].len <= INT_SRC) {
				e[fit].local_off = at;
				at += e[fit++].len;
			}
			n = fit;
		}
		memset(back, 0, INT_SRC);
		r = kcoll_xfer_read(lb, rs, e, n, KCOLL_NOTIFY_NONE, &rq);
		if (!r)
			r = kcoll_wait(rq, 60000);
		if (r)
			CH_FAIL("read round %d (%u entries): %s", round, n, kcoll_strerror(r));
		for (uint32_t i = 0; i < n; i++)
			if (memcmp(back + e[i].local_off, image + e[i].remote_off, e[i].len))
				CH_FAIL("read round %d: block %u (%llu bytes at %llu) differs", round, i,
					(unsigned long long)e[i].len, (unsigned long long)e[i].remote_off);
	}
	B->expect_hash = fnv(image, INT_DST);
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(ls);
	kcoll_seg_unregister(lb);
	buf_free(k, src, src_shm);
	buf_free(k, back, src_shm);
	kcoll_disconnect(k);
	free(image);
	free(e);
	_exit(0);
}

static void test_integrity(struct kcoll *k)
{
	static const char *kind[2] = { "malloc", "kcoll_mem_alloc" };

	for (int dst_shm = 0; dst_shm < 2; dst_shm++) {
		for (int src_shm = 0; src_shm < 2; src_shm++) {
			struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 1 };
			uint8_t *dst = buf_alloc(k, INT_DST, dst_shm);
			struct kcoll_seg *seg;
			uint32_t cnt = 0;
			pid_t pid;
			int r, st;

			if (!dst) {
				tap_ok(0, "integrity: cannot allocate the target");
				continue;
			}
			memset(dst, 0, INT_DST);
			r = kcoll_seg_register(k, dst, INT_DST, &o, &seg);
			if (!tap_ok(r == 0, "integrity: register %s target (%s)", kind[dst_shm],
				    kcoll_strerror(r))) {
				buf_free(k, dst, dst_shm);
				continue;
			}
			kcoll_seg_export(seg, &B->desc[0]);
			B->bad = 0;
			B->why[0] = 0;
			pid = fork();
			if (pid == 0)
				integrity_child(src_shm, 0x1234567ULL + dst_shm * 7 + src_shm);
			st = wait_child(pid, 240000);
			tap_ok(st == 0 && !B->bad, "integrity: %s -> %s, %d rounds of write + read-back "
			       "(%s)", kind[src_shm], kind[dst_shm], INT_ROUNDS,
			       st ? (B->why[0] ? B->why : "child failed") : "ok");
			tap_ok(st == 0 && fnv(dst, INT_DST) == B->expect_hash,
			       "integrity: %s -> %s, checksum of the whole 48 MiB target", kind[src_shm],
			       kind[dst_shm]);
			kcoll_seg_notify_get(seg, 0, &cnt);
			tap_ok(cnt == INT_ROUNDS, "integrity: notify counter = %u writes (got %u)",
			       INT_ROUNDS, cnt);
			kcoll_seg_unregister(seg);
			buf_free(k, dst, dst_shm);
		}
	}
}

/* ---------------------------------------------------------------------------
 * Many clients at once; notify counters exact.
 */
#define MC_CLIENTS	8
#define MC_BATCHES	40
#define MC_BLOCKS	64
#define MC_BLK		512
#define MC_NOTIFY	4

static void many_child(int me)
{
	struct kcoll *k = connect_or_die();
	struct kcoll_xfer_entry e[MC_BLOCKS];
	uint8_t *src = malloc(MC_BLOCKS * MC_BLK);
	struct kcoll_seg *ls;
	struct kcoll_rseg *rs;
	struct kcoll_req *rq[4];
	int r;

	if (!src)
		CH_FAIL("malloc");
	if ((r = kcoll_seg_register(k, src, MC_BLOCKS * MC_BLK, NULL, &ls)) ||
	    (r = kcoll_seg_import(k, &B->desc[0], &rs)))
		CH_FAIL("client %d: register/import: %s", me, kcoll_strerror(r));
	/* Client me owns the strided blocks b * MC_CLIENTS + me of the target. */
	for (int b = 0; b < MC_BLOCKS; b++)
		e[b] = (struct kcoll_xfer_entry){ (uint64_t)b * MC_BLK,
			((uint64_t)b * MC_CLIENTS + me) * MC_BLK, MC_BLK };
	for (int i = 0; i < MC_BATCHES; i++) {
		/* the last batch carries the final pattern */
		memset(src, (uint8_t)(me * 16 + (i == MC_BATCHES - 1 ? 15 : i % 15)), MC_BLOCKS * MC_BLK);
		r = kcoll_xfer_write(ls, rs, e, MC_BLOCKS, (uint32_t)(me % MC_NOTIFY), &rq[0]);
		if (!r)
			r = kcoll_wait(rq[0], 30000);
		if (r)
			CH_FAIL("client %d batch %d: %s", me, i, kcoll_strerror(r));
	}
	/* Pure notifications: empty batches, several in flight at once. */
	for (int i = 0; i < 4; i++) {
		r = kcoll_xfer_write(ls, rs, e, 0, (uint32_t)(me % MC_NOTIFY), &rq[i]);
		if (r)
			CH_FAIL("client %d: empty batch: %s", me, kcoll_strerror(r));
	}
	for (int i = 0; i < 4; i++)
		if ((r = kcoll_wait(rq[i], 30000)))
			CH_FAIL("client %d: empty batch: %s", me, kcoll_strerror(r));
	kcoll_disconnect(k);	/* without closing: the daemon cleans up */
	free(src);
	_exit(0);
}

static void test_many_clients(struct kcoll *k)
{
	size_t size = (size_t)MC_BLOCKS * MC_CLIENTS * MC_BLK;
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = MC_NOTIFY };
	uint8_t *dst = calloc(1, size);
	struct kcoll_seg *seg;
	pid_t pid[MC_CLIENTS];
	int r, bad = 0, wrong = 0;

	r = kcoll_seg_register(k, dst, size, &o, &seg);
	if (!tap_ok(r == 0, "many clients: register (%s)", kcoll_strerror(r)))
		return;
	kcoll_seg_export(seg, &B->desc[0]);
	B->bad = 0;
	for (int i = 0; i < MC_CLIENTS; i++) {
		pid[i] = fork();
		if (pid[i] == 0)
			many_child(i);
	}
	/* Counter c gets (MC_BATCHES + 4) from each client i with i % 4 == c. */
	for (uint32_t c = 0; c < MC_NOTIFY; c++) {
		uint32_t want = (MC_CLIENTS / MC_NOTIFY) * (MC_BATCHES + 4);

		r = kcoll_seg_notify_wait(seg, c, want, 60000);
		tap_ok(r == 0, "many clients: counter %u reaches %u (%s)", c, want, kcoll_strerror(r));
	}
	for (int i = 0; i < MC_CLIENTS; i++)
		if (wait_child(pid[i], 60000))
			bad++;
	tap_ok(!bad && !B->bad, "many clients: %d processes x %d batches x %d blocks (%s)", MC_CLIENTS,
	       MC_BATCHES, MC_BLOCKS, B->bad ? B->why : "ok");
	for (uint32_t c = 0; c < MC_NOTIFY; c++) {
		uint32_t v = 0;

		kcoll_seg_notify_get(seg, c, &v);
		if (v != (MC_CLIENTS / MC_NOTIFY) * (MC_BATCHES + 4))
			wrong++;
	}
	tap_ok(!wrong, "many clients: every counter exactly %d after all finished",
	       (MC_CLIENTS / MC_NOTIFY) * (MC_BATCHES + 4));
	for (size_t b = 0; b < size / MC_BLK; b++) {
		uint8_t want = (uint8_t)((b % MC_CLIENTS) * 16 + 15);

		for (size_t j = 0; j < MC_BLK; j++)
			if (dst[b * MC_BLK + j] != want) {
				wrong++;
				break;
			}
	}
	tap_ok(!wrong, "many clients: every block holds its client's last batch");
	kcoll_seg_unregister(seg);
	free(dst);
}

/* ---------------------------------------------------------------------------
 * Validation: one broken rule at a time; nothing written, no notify.
 */
#define BV_SIZE		(256 * 1024)

static int xfer_sync(int write, struct kcoll_seg *l, struct kcoll_rseg *rs,
		     const struct kcoll_xfer_entry *e, uint32_t n, uint32_t notify)
{
	struct kcoll_req *rq;
	int r = (write ? kcoll_xfer_write : kcoll_xfer_read)(l, rs, e, n, notify, &rq);

	return r ? r : kcoll_wait(rq, 30000);
}

static void test_validation(struct kcoll *owner)
{
	struct kcoll *k = connect_or_die();
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 2 };
	uint8_t *dst = malloc(BV_SIZE), *src = malloc(BV_SIZE);
	struct kcoll_xfer_entry *e = calloc(KCOLL_XFER_MAX_ENTRIES + 1, sizeof(*e));
	struct kcoll_seg *tseg, *lseg, *gone;
	struct kcoll_rseg *rs, *rself, *rgone;
	struct kcoll_seg_wire w;
	kcoll_seg_desc_t d;
	uint32_t cnt;
	int r;

	memset(dst, 0xaa, BV_SIZE);
	memset(src, 0x55, BV_SIZE);
	if (kcoll_seg_register(owner, dst, BV_SIZE, &o, &tseg) ||
	    kcoll_seg_register(k, src, BV_SIZE, &o, &lseg)) {
		tap_ok(0, "validation: register");
		return;
	}
	kcoll_seg_export(tseg, &d);
	r = kcoll_seg_import(k, &d, &rs);
	tap_ok(r == 0, "validation: import of a good descriptor (%s)", kcoll_strerror(r));

#define BAD(write, n, notify, want, what)                                                  \
	do {                                                                               \
		r = xfer_sync(write, lseg, rs, e, n, notify);                              \
		cnt = 99;                                                                  \
		kcoll_seg_notify_get(tseg, 0, &cnt);                                       \
		tap_ok(r == (want) && all_bytes(dst, BV_SIZE, 0xaa) &&                     \
		       all_bytes(src, BV_SIZE, 0x55) && cnt == 0,                          \
		       "validation: %s -> %s, nothing written, no notify (got %s)", what,   \
		       #want, kcoll_strerror(r));                                          \
	} while (0)

	/* every bad batch starts with a good entry: it must not land either */
	e[0] = (struct kcoll_xfer_entry){ 0, 0, 4096 };
	e[1] = (struct kcoll_xfer_entry){ 0, BV_SIZE - 100, 101 };
	BAD(1, 2, 0, -ERANGE, "remote range one byte past the end");
	e[1] = (struct kcoll_xfer_entry){ BV_SIZE - 100, 8192, 101 };
	BAD(1, 2, 0, -ERANGE, "local range one byte past the end");
	e[1] = (struct kcoll_xfer_entry){ 0, UINT64_MAX - 10, 100 };
	BAD(1, 2, 0, -ERANGE, "remote offset that wraps");
	e[1] = (struct kcoll_xfer_entry){ 8192, BV_SIZE, 1 };
	BAD(1, 2, 0, -ERANGE, "remote offset = segment size");
	e[1] = (struct kcoll_xfer_entry){ 0, 8192, 0 };
	BAD(1, 2, 0, -EINVAL, "zero-length entry");
	e[1] = (struct kcoll_xfer_entry){ 8192, 4095, 10 };
	BAD(1, 2, 0, -EINVAL, "destinations overlap by one byte");
	e[1] = (struct kcoll_xfer_entry){ 4095, 100000, 10 };
	BAD(0, 2, 0, -EINVAL, "read: local destinations overlap");
	BAD(1, 2, 2, -EINVAL, "notify_id past the remote segment's counters");
	for (uint32_t i = 0; i <= KCOLL_XFER_MAX_ENTRIES; i++)
		e[i] = (struct kcoll_xfer_entry){ i * 8ULL, i * 8ULL, 8 };
	BAD(1, KCOLL_XFER_MAX_ENTRIES + 1, 0, -E2BIG, "batch of KCOLL_XFER_MAX_ENTRIES + 1");
	{
		struct kcoll_req *rq;

		r = kcoll_xfer_write(lseg, rs, (const void *)(uintptr_t)8, 1, 0, &rq);
		if (!r)
			r = kcoll_wait(rq, 30000);
		tap_ok(r == -EFAULT && all_bytes(dst, BV_SIZE, 0xaa),
		       "validation: entry array at an unmapped address -> -EFAULT (got %s)",
		       kcoll_strerror(r));
	}
	/* the limit itself is fine */
	r = xfer_sync(1, lseg, rs, e, KCOLL_XFER_MAX_ENTRIES, KCOLL_NOTIFY_NONE);
	tap_ok(r == 0 && dst[0] == 0x55 && dst[KCOLL_XFER_MAX_ENTRIES * 8 - 1] == 0x55 &&
	       dst[KCOLL_XFER_MAX_ENTRIES * 8] == 0xaa,
	       "validation: a batch of exactly KCOLL_XFER_MAX_ENTRIES is served (%s)",
	       kcoll_strerror(r));
	memset(dst, 0xaa, BV_SIZE);

	/* descriptors */
	memcpy(&w, d.bytes, sizeof(w));
	w.token[5] ^= 1;
	memcpy(d.bytes, &w, sizeof(w));
	r = kcoll_seg_import(k, &d, &rself);
	tap_ok(r == -EACCES, "validation: import with a wrong token -> -EACCES (got %s)",
	       kcoll_strerror(r));
	w.token[5] ^= 1;
	w.seg_id = 0x7fffffff;
	memcpy(d.bytes, &w, sizeof(w));
	r = kcoll_seg_import(k, &d, &rself);
	tap_ok(r == -ENOENT, "validation: import of a segment id never issued -> -ENOENT (got %s)",
	       kcoll_strerror(r));
	kcoll_seg_export(tseg, &d);
	memcpy(&w, d.bytes, sizeof(w));
	w.nonce ^= 1;
	memcpy(d.bytes, &w, sizeof(w));
	r = kcoll_seg_import(k, &d, &rself);
	tap_ok(r == -ESTALE, "validation: descriptor from this kcolld before a restart -> -ESTALE "
	       "(got %s)", kcoll_strerror(r));
	/* another kcolld's, at an address where nobody listens: the import is
	 * lazy, the transfer fails and writes nothing */
	w.port = 1;
	w.addrs[0] = htonl(0x7f000001);
	w.naddrs = 1;
	memcpy(d.bytes, &w, sizeof(w));
	r = kcoll_seg_import(k, &d, &rself);
	if (tap_ok(r == 0, "validation: descriptor of another kcolld is imported (%s)",
		   kcoll_strerror(r))) {
		e[0] = (struct kcoll_xfer_entry){ 0, 0, 4096 };
		r = xfer_sync(1, lseg, rself, e, 1, 0);
		tap_ok(r == -ECONNREFUSED && all_bytes(dst, BV_SIZE, 0xaa),
		       "validation: transfer to a kcolld that does not answer -> -ECONNREFUSED (got %s)",
		       kcoll_strerror(r));
		kcoll_rseg_close(rself);
	}
	w.naddrs = 0;
	memcpy(d.bytes, &w, sizeof(w));
	r = kcoll_seg_import(k, &d, &rself);
	tap_ok(r == -EREMOTE, "validation: descriptor of another kcolld without an address -> -EREMOTE "
	       "(got %s)", kcoll_strerror(r));
	memset(&d, 0x33, sizeof(d));
	r = kcoll_seg_import(k, &d, &rself);
	tap_ok(r == -EINVAL, "validation: garbage descriptor -> -EINVAL (got %s)", kcoll_strerror(r));

	/* an expired descriptor: its segment was unregistered */
	r = kcoll_seg_register(owner, dst, 4096, NULL, &gone);
	kcoll_seg_export(gone, &d);
	r = r ? r : kcoll_seg_import(k, &d, &rgone);
	if (tap_ok(r == 0, "validation: import a segment that is then unregistered (%s)",
		   kcoll_strerror(r))) {
		kcoll_seg_unregister(gone);
		e[0] = (struct kcoll_xfer_entry){ 0, 0, 64 };
		r = xfer_sync(1, lseg, rgone, e, 1, KCOLL_NOTIFY_NONE);
		tap_ok(r == -EIDRM && all_bytes(dst, BV_SIZE, 0xaa),
		       "validation: write to an unregistered segment -> -EIDRM, nothing written (got %s)",
		       kcoll_strerror(r));
		r = kcoll_seg_import(k, &d, &rself);
		tap_ok(r == -EIDRM, "validation: import of the expired descriptor -> -EIDRM (got %s)",
		       kcoll_strerror(r));
		kcoll_rseg_close(rgone);
	}

	/* the same segment on both sides: sources must not hit destinations */
	kcoll_seg_export(lseg, &d);
	r = kcoll_seg_import(k, &d, &rself);
	if (tap_ok(r == 0, "validation: a process may import its own segment (%s)",
		   kcoll_strerror(r))) {
		e[0] = (struct kcoll_xfer_entry){ 0, 30, 50 };
		r = xfer_sync(1, lseg, rself, e, 1, KCOLL_NOTIFY_NONE);
		tap_ok(r == -EINVAL && all_bytes(src, BV_SIZE, 0x55),
		       "validation: same segment, source overlaps destination -> -EINVAL (got %s)",
		       kcoll_strerror(r));
		src[0] = 1;
		e[0] = (struct kcoll_xfer_entry){ 0, 100, 1 };
		r = xfer_sync(1, lseg, rself, e, 1, KCOLL_NOTIFY_NONE);
		tap_ok(r == 0 && src[100] == 1, "validation: same segment, disjoint ranges served (%s)",
		       kcoll_strerror(r));
		memset(src, 0x55, BV_SIZE);
		kcoll_rseg_close(rself);
	}
	r = kcoll_seg_notify_wait(tseg, 0, 1, 50);
	tap_ok(r == -ETIMEDOUT, "validation: waiting on a counter nobody bumps times out (%s)",
	       kcoll_strerror(r));
	r = kcoll_seg_register(k, src, 4096, &(struct kcoll_seg_opts){ .size = sizeof(o),
			       .nr_notify = KCOLL_SEG_MAX_NOTIFY + 1 }, &gone);
	tap_ok(r == -E2BIG, "validation: more than KCOLL_SEG_MAX_NOTIFY counters -> -E2BIG (got %s)",
	       kcoll_strerror(r));
#undef BAD
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(lseg);
	kcoll_seg_unregister(tseg);
	kcoll_disconnect(k);
	free(e);
	free(src);
	free(dst);
}

/* ---------------------------------------------------------------------------
 * Another uid.
 */
static void uid_child(void)
{
	struct kcoll_rseg *rs;
	struct kcoll_seg *ls;
	struct kcoll_xfer_entry e = { 0, 0, 4096 };
	uint8_t *src = malloc(4096);
	struct kcoll_seg_wire w;
	kcoll_seg_desc_t d;
	struct kcoll *k;
	int r;

	if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY))
		CH_FAIL("cannot become uid %d: %s", NOBODY, strerror(errno));
	k = connect_or_die();
	r = kcoll_seg_import(k, &B->desc[0], &rs);
	if (r != -EPERM)
		CH_FAIL("import of a segment not granted: %s, want -EPERM", kcoll_strerror(r));
	memset(src, 0x77, 4096);
	if ((r = kcoll_seg_register(k, src, 4096, NULL, &ls)))
		CH_FAIL("register: %s", kcoll_strerror(r));
	/* The same descriptor dressed up as another kcolld's (other nonce, a
	 * loopback address, the real port): this kcolld would connect to
	 * itself, where only the token is checked. It must not get in. */
	memcpy(&w, B->desc[0].bytes, sizeof(w));
	if (w.port) {
		w.nonce ^= 1;
		w.addrs[0] = htonl(w.addrs[0] == htonl(0x7f000001) ? 0x7f000002 : 0x7f000001);
		w.naddrs = 1;
		memcpy(d.bytes, &w, sizeof(w));
		r = kcoll_seg_import(k, &d, &rs);
		if (!r && !(r = xfer_sync(1, ls, rs, &e, 1, KCOLL_NOTIFY_NONE)))
			CH_FAIL("segment not granted written through a loopback descriptor");
		if (!r)
			kcoll_rseg_close(rs);
	}
	r = kcoll_seg_import(k, &B->desc[1], &rs);
	if (r)
		CH_FAIL("import of a granted segment: %s", kcoll_strerror(r));
	if ((r = xfer_sync(1, ls, rs, &e, 1, KCOLL_NOTIFY_NONE)))
		CH_FAIL("write to the granted segment: %s", kcoll_strerror(r));
	_exit(0);
}

static void test_other_uid(struct kcoll *k)
{
	uint8_t *a = calloc(1, 4096), *b = calloc(1, 4096);
	struct kcoll_seg *sa, *sb;
	int r, st;
	pid_t pid;

	if (getuid() != 0) {
		tap_skip("other uid: needs root to setuid(%d)", NOBODY);
		return;
	}
	r = kcoll_seg_register(k, a, 4096, NULL, &sa);
	r = r ? r : kcoll_seg_register(k, b, 4096, &(struct kcoll_seg_opts){ .size = sizeof(struct kcoll_seg_opts),
				       .flags = KCOLL_SEG_F_GRANT_UID, .grant_uid = NOBODY }, &sb);
	if (!tap_ok(r == 0, "other uid: register (%s)", kcoll_strerror(r)))
		return;
	kcoll_seg_export(sa, &B->desc[0]);
	kcoll_seg_export(sb, &B->desc[1]);
	B->bad = 0;
	pid = fork();
	if (pid == 0)
		uid_child();
	st = wait_child(pid, 30000);
	tap_ok(st == 0 && all_bytes(a, 4096, 0), "other uid: segment not granted -> -EPERM, untouched (%s)",
	       B->bad ? B->why : "ok");
	tap_ok(st == 0 && all_bytes(b, 4096, 0x77), "other uid: granted segment written");
	kcoll_seg_unregister(sa);
	kcoll_seg_unregister(sb);
	free(a);
	free(b);
}

/* ---------------------------------------------------------------------------
 * Unregister / death while transfers are in flight.
 */
#define FL_SIZE		(32 * MiB)
#define FL_INFLIGHT	24

/* Initiator: keep FL_INFLIGHT whole-segment writes queued until one fails;
 * report the first error. */
static void flood_child(int fd)
{
	struct kcoll *k = connect_or_die();
	uint8_t *src = malloc(FL_SIZE);
	struct kcoll_xfer_entry e[32];
	struct kcoll_req *rq[FL_INFLIGHT];
	struct kcoll_seg *ls;
	struct kcoll_rseg *rs;
	int r, first = 0;

	memset(src, 0x5a, FL_SIZE);
	for (int i = 0; i < 32; i++)
		e[i] = (struct kcoll_xfer_entry){ i * (FL_SIZE / 32), i * (FL_SIZE / 32), FL_SIZE / 32 };
	if ((r = kcoll_seg_register(k, src, FL_SIZE, NULL, &ls)) ||
	    (r = kcoll_seg_import(k, &B->desc[0], &rs)))
		CH_FAIL("flood: %s", kcoll_strerror(r));
	for (int i = 0; i < FL_INFLIGHT; i++)
		if ((r = kcoll_xfer_write(ls, rs, e, 32, KCOLL_NOTIFY_NONE, &rq[i])))
			CH_FAIL("flood: submit: %s", kcoll_strerror(r));
	if (write(fd, "g", 1) != 1)
		CH_FAIL("pipe");
	for (int i = 0; i < FL_INFLIGHT; i++) {
		r = kcoll_wait(rq[i], 60000);
		if (r == -ETIMEDOUT)
			CH_FAIL("flood: request %d hangs", i);
		if (r && !first)
			first = r;
	}
	B->err = first;
	_exit(0);
}

/*
 * The in-flight tests' start: buf (FL_SIZE, filled with fill) and its 1 MiB
 * neighbour other (0xee, which must never change) registered, the pipe the
 * child reports on made. Non-zero when any of it failed.
 */
static int inflight_setup(struct kcoll *k, uint8_t *buf, int fill, uint8_t *other, int p[2],
			  struct kcoll_seg **seg, struct kcoll_seg **oseg)
{
	memset(buf, fill, FL_SIZE);
	memset(other, 0xee, 1 << 20);
	return pipe(p) || kcoll_seg_register(k, buf, FL_SIZE, NULL, seg) ||
	       kcoll_seg_register(k, other, 1 << 20, NULL, oseg);
}

static void test_unregister_inflight(struct kcoll *k)
{
	uint8_t *dst = malloc(FL_SIZE), *other = malloc(1 << 20);
	struct kcoll_seg *seg, *oseg;
	uint64_t h1, h2;
	int p[2], r, st;
	char c;
	pid_t pid;

	if (inflight_setup(k, dst, 0, other, p, &seg, &oseg)) {
		tap_ok(0, "unregister in flight: setup");
		return;
	}
	kcoll_seg_export(seg, &B->desc[0]);
	B->bad = 0;
	B->err = 0;
	pid = fork();
	if (pid == 0)
		flood_child(p[1]);
	r = read(p[0], &c, 1) == 1;
	usleep(30000);	/* let a few batches land */
	r = kcoll_seg_unregister(seg);
	h1 = fnv(dst, FL_SIZE);
	st = wait_child(pid, 120000);
	usleep(20000);
	h2 = fnv(dst, FL_SIZE);
	tap_ok(r == 0, "unregister in flight: unregister returns (%s)", kcoll_strerror(r));
	tap_ok(st == 0 && B->err == -EIDRM, "unregister in flight: initiator's requests end, with "
	       "-EIDRM (got %s; %s)", kcoll_strerror(B->err), B->bad ? B->why : "no hang");
	tap_ok(h1 == h2, "unregister in flight: nothing written after unregister returned");
	tap_ok(all_bytes(other, 1 << 20, 0xee), "unregister in flight: another segment untouched");
	kcoll_seg_unregister(oseg);
	close(p[0]);
	close(p[1]);
	free(dst);
	free(other);
}

/* Target process killed mid-transfer; then the initiator killed mid-transfer. */
static void test_death_inflight(struct kcoll *k)
{
	uint8_t *src = malloc(FL_SIZE), *other = malloc(1 << 20);
	struct kcoll_xfer_entry e[32];
	struct kcoll_req *rq[FL_INFLIGHT];
	struct kcoll_seg *ls, *oseg;
	struct kcoll_rseg *rs;
	int p[2], r, first = 0, hung = 0, st;
	char c;
	pid_t pid;

	if (inflight_setup(k, src, 0x11, other, p, &ls, &oseg)) {
		tap_ok(0, "target dies: setup");
		return;
	}
	pid = fork();
	if (pid == 0)
		target_child(p[1], FL_SIZE);
	r = read(p[0], &c, 1) == 1 ? kcoll_seg_import(k, &B->desc[0], &rs) : -EIO;
	if (!tap_ok(r == 0, "target dies: import (%s)", kcoll_strerror(r))) {
		kill(pid, SIGKILL);
		wait_child(pid, 1000);
		return;
	}
	for (int i = 0; i < 32; i++)
		e[i] = (struct kcoll_xfer_entry){ i * (FL_SIZE / 32), i * (FL_SIZE / 32), FL_SIZE / 32 };
	for (int i = 0; i < FL_INFLIGHT; i++)
		if ((r = kcoll_xfer_write(ls, rs, e, 32, KCOLL_NOTIFY_NONE, &rq[i])))
			rq[i] = NULL;
	usleep(20000);
	kill(pid, SIGKILL);
	for (int i = 0; i < FL_INFLIGHT; i++) {
		if (!rq[i])
			continue;
		r = kcoll_wait(rq[i], 60000);
		if (r == -ETIMEDOUT)
			hung++;
		else if (r && !first)
			first = r;
	}
	st = wait_child(pid, 10000);
	tap_ok(!hung && (first == -EIDRM || first == -ECONNRESET),
	       "target dies: initiator's requests end with -EIDRM or -ECONNRESET (got %s, %d hung)",
	       kcoll_strerror(first), hung);
	tap_ok(st == 128 + SIGKILL && all_bytes(src, FL_SIZE, 0x11) && all_bytes(other, 1 << 20, 0xee),
	       "target dies: the initiator's own segments untouched");
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(ls);

	/* Now the initiator dies with its writes queued; the target lives on. */
	{
		uint8_t *dst = calloc(1, FL_SIZE);
		struct kcoll_seg *seg;

		r = kcoll_seg_register(k, dst, FL_SIZE, NULL, &seg);
		kcoll_seg_export(seg, &B->desc[0]);
		B->bad = 0;
		pid = fork();
		if (pid == 0)
			flood_child(p[1]);
		r = read(p[0], &c, 1) == 1 ? 0 : -EIO;
		usleep(20000);
		kill(pid, SIGKILL);
		wait_child(pid, 10000);
		usleep(50000);
		{
			struct kcoll *k2 = connect_or_die();
			struct kcoll_seg *ls2;
			struct kcoll_rseg *rs2;
			struct kcoll_xfer_entry one = { 0, 0, 4096 };
			uint8_t *s2 = malloc(4096);

			memset(s2, 0x99, 4096);
			/* the daemon still serves the segment after its peer's death */
			r = kcoll_seg_register(k2, s2, 4096, NULL, &ls2);
			kcoll_seg_export(seg, &B->desc[1]);
			r = r ? r : kcoll_seg_import(k2, &B->desc[1], &rs2);
			r = r ? r : xfer_sync(1, ls2, rs2, &one, 1, KCOLL_NOTIFY_NONE);
			tap_ok(r == 0 && dst[0] == 0x99 && dst[4095] == 0x99,
			       "initiator dies: the target segment still serves others (%s)",
			       kcoll_strerror(r));
			if (!r) {
				kcoll_rseg_close(rs2);
				kcoll_seg_unregister(ls2);
			}
			kcoll_disconnect(k2);
			free(s2);
		}
		tap_ok(all_bytes(other, 1 << 20, 0xee), "initiator dies: another segment untouched");
		r = kcoll_seg_unregister(seg);
		tap_ok(r == 0, "initiator dies: the target unregisters normally (%s)", kcoll_strerror(r));
		free(dst);
	}
	kcoll_seg_unregister(oseg);
	close(p[0]);
	close(p[1]);
	free(src);
	free(other);
}

/* Close what a test opened: the imported rs, the local ls and target ts (each may be NULL). */
static void close_segs(struct kcoll_rseg *rs, struct kcoll_seg *ls, struct kcoll_seg *ts)
{
	if (rs)
		kcoll_rseg_close(rs);
	if (ls)
		kcoll_seg_unregister(ls);
	if (ts)
		kcoll_seg_unregister(ts);
}

/* ---------------------------------------------------------------------------
 * A batch whose sources overlap (allowed) adds up to more than a segment can
 * hold: kcolld would cut it into frames in memory first (24 bytes per 4 MiB
 * moved, gigabytes for petabytes), so it is refused before anything else.
 * The local segment claims 1 TiB (kcolld touches none of it), the target is
 * a descriptor of a kcolld that does not answer.
 */
static void test_batch_total(struct kcoll *k)
{
	struct kcoll_xfer_entry e[4];
	uint8_t *buf = malloc(4096);
	struct kcoll_seg *ls = NULL, *ts = NULL;
	struct kcoll_rseg *rs = NULL;
	struct kcoll_seg_wire w;
	kcoll_seg_desc_t d;
	int r;

	if ((r = kcoll_seg_register(k, buf, 1ULL << 40, NULL, &ls)) ||
	    (r = kcoll_seg_register(k, buf, 4096, NULL, &ts))) {
		tap_ok(0, "batch total: register (%s)", kcoll_strerror(r));
		goto out;
	}
	kcoll_seg_export(ts, &d);
	memcpy(&w, d.bytes, sizeof(w));
	w.nonce ^= 1;
	w.port = 1;
	w.addrs[0] = htonl(0x7f000001);
	w.naddrs = 1;
	w.size = 1ULL << 62;
	memcpy(d.bytes, &w, sizeof(w));
	if ((r = kcoll_seg_import(k, &d, &rs))) {
		tap_ok(0, "batch total: import (%s)", kcoll_strerror(r));
		goto out;
	}
	for (int i = 0; i < 4; i++)
		e[i] = (struct kcoll_xfer_entry){ 0, (uint64_t)i << 40, 1ULL << 39 };
	r = xfer_sync(1, ls, rs, e, 4, KCOLL_NOTIFY_NONE);
	tap_ok(r == -E2BIG, "batch total: 4 x 512 GiB (overlapping sources) -> -E2BIG (got %s)",
	       kcoll_strerror(r));
out:
	close_segs(rs, ls, ts);
	free(buf);
}

/* ---------------------------------------------------------------------------
 * Another kcolld on this host (its own nonce: the cross-host path over
 * loopback) that drops idle KV streams after KCOLL_TIMEOUT_MS = 1 s: a
 * transfer after a pause longer than that must still succeed.
 */
static void test_idle_stream(struct kcoll *k)
{
	const char *bin = getenv("KCOLL_BUILD"), *tmp = getenv("KCOLL_TEST_TMP");
	char exe[512], sock[512], log[512];
	struct kcoll_connect_opts co = { .size = sizeof(co) };
	struct kcoll_xfer_entry e = { 0, 0, 4096 };
	uint8_t *src = malloc(4096), *dst = calloc(1, 4096);
	struct kcoll_seg *ls = NULL, *ts = NULL;
	struct kcoll_rseg *rs = NULL;
	struct kcoll *k2 = NULL;
	kcoll_seg_desc_t d;
	int r = -1, r2 = -1;
	pid_t pid;

	snprintf(exe, sizeof(exe), "%s/bin/kcolld", bin ? bin : "build");
	snprintf(sock, sizeof(sock), "%s/kv-idle.%d.sock", tmp ? tmp : "/tmp", (int)getpid());
	snprintf(log, sizeof(log), "%s/kv-idle.%d.log", tmp ? tmp : "/tmp", (int)getpid());
	pid = fork();
	if (pid == 0) {
		setenv("KCOLL_TIMEOUT_MS", "1000", 1);
		setenv("KCOLL_LISTEN", "127.0.0.1:0", 1);
		setenv("KCOLL_ADDRS", "127.0.0.1", 1);
		if (!freopen(log, "a", stderr))
			_exit(127);
		execl(exe, exe, "-f", "-s", sock, "-l", log, (char *)NULL);
		_exit(127);
	}
	co.socket_path = sock;
	for (int i = 0; i < 200 && pid > 0; i++) {
		if (access(sock, F_OK) == 0 && kcoll_connect(&co, &k2) == 0)
			break;
		usleep(25000);
	}
	if (!k2) {
		tap_skip("idle stream: cannot start a second kcolld (%s)", exe);
		goto out;
	}
	memset(src, 0x31, 4096);
	if ((r = kcoll_seg_register(k2, dst, 4096, NULL, &ts)) ||
	    (r = kcoll_seg_register(k, src, 4096, NULL, &ls)))
		goto report;
	kcoll_seg_export(ts, &d);
	if ((r = kcoll_seg_import(k, &d, &rs)) || (r = xfer_sync(1, ls, rs, &e, 1, KCOLL_NOTIFY_NONE)))
		goto report;
	usleep(1600 * 1000);	/* the owner's kcolld drops the idle stream */
	memset(src, 0x32, 4096);
	r2 = xfer_sync(1, ls, rs, &e, 1, KCOLL_NOTIFY_NONE);
report:
	tap_ok(r == 0 && r2 == 0 && all_bytes(dst, 4096, 0x32),
	       "idle stream: a transfer after the owner's kcolld dropped an idle stream succeeds "
	       "(first %s, after the pause %s)", kcoll_strerror(r), kcoll_strerror(r2));
out:
	close_segs(rs, ls, ts);
	if (k2)
		kcoll_disconnect(k2);
	if (pid > 0) {
		kill(pid, SIGTERM);
		wait_child(pid, 10000);	/* SIGKILLs it past that */
	}
	unlink(sock);
	free(src);
	free(dst);
}

int main(void)
{
	struct kcoll *k;

	setvbuf(stdout, NULL, _IOLBF, 0);
	board_map();
	k = connect_or_die();
	test_validation(k);
	test_integrity(k);
	test_many_clients(k);
	test_other_uid(k);
	test_unregister_inflight(k);
	test_death_inflight(k);
	test_idle_stream(k);
	test_batch_total(k);
	kcoll_disconnect(k);
	return tap_done();
}
