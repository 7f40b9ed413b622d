// SPDX-License-Identifier: MIT
/*
 * KV notifications against the running kcolld (docs/kv.md "Notifications"):
 * alone and with a batch, exactly once and in order per sender, the bounded
 * queue (-ENOBUFS), bad input, a dead owner; waiting on several segments
 * at once (kcoll_seg_notif_wait_any). The KV transfers themselves are
 * test_kv.c's; test_kv.h has what both share.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "kv_util.h"
#include "test_kv.h"

#define NT_SIZE		(64 * 1024)
#define NT_SENDERS	3
#define NT_PER_SENDER	80	/* 3 x 80 < KCOLL_SEG_NOTIF_QUEUE: never full here */
#define NT_WINDOW	16

static int notif_sync(struct kcoll_seg *l, struct kcoll_rseg *rs, const struct kcoll_xfer_entry *e,
		      uint32_t n, uint32_t notify, const void *msg, uint32_t len)
{
	struct kcoll_req *rq;
	int r = kcoll_xfer_write_notif(l, rs, e, n, notify, msg, len, &rq);

	return r ? r : kcoll_wait(rq, 30000);
}

/* Take every queued notification (at most max) into out. */
static uint32_t notif_drain(struct kcoll_seg *seg, struct kcoll_notif *out, uint32_t max)
{
	uint32_t got = 0, nr;

	while (got < max) {
		out[got].size = sizeof(out[got]);
		if (kcoll_seg_get_notifs(seg, out + got, max - got, &nr) || !nr)
			break;
		got += nr;
	}
	return got;
}

/* Sender i: its own connection and import, NT_PER_SENDER messages "i:seq"
 * with NT_WINDOW requests in flight, each also writing 8 bytes. */
static void notif_sender(int i)
{
	struct kcoll *k = connect_or_die();
	uint8_t *src = malloc(4096);
	char msg[NT_WINDOW][32];
	struct kcoll_req *rq[NT_WINDOW];
	struct kcoll_xfer_entry e[NT_WINDOW];
	struct kcoll_seg *ls;
	struct kcoll_rseg *rs;
	int r;

	memset(src, 0x40 + i, 4096);
	if ((r = kcoll_seg_register(k, src, 4096, NULL, &ls)) ||
	    (r = kcoll_seg_import(k, &B->desc[0], &rs)))
		CH_FAIL("sender %d: %s", i, kcoll_strerror(r));
	while (!B->go)
		usleep(1000);
	for (int seq = 0; seq < NT_PER_SENDER; seq += NT_WINDOW) {
		for (int w = 0; w < NT_WINDOW; w++) {
			snprintf(msg[w], sizeof(msg[w]), "%d:%d", i, seq + w);
			e[w] = (struct kcoll_xfer_entry){ 0, (uint64_t)(i * NT_PER_SENDER + seq + w) * 8, 8 };
			r = kcoll_xfer_write_notif(ls, rs, &e[w], 1, 0, msg[w], strlen(msg[w]) + 1, &rq[w]);
			if (r)
				CH_FAIL("sender %d: submit: %s", i, kcoll_strerror(r));
		}
		for (int w = 0; w < NT_WINDOW; w++)
			if ((r = kcoll_wait(rq[w], 30000)))
				CH_FAIL("sender %d: message %d: %s", i, seq + w, kcoll_strerror(r));
	}
	kcoll_disconnect(k);
	_exit(0);
}

static void test_notifs(struct kcoll *k)
{
	struct kcoll *k2 = connect_or_die();
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 2 };
	uint8_t *dst = calloc(1, NT_SIZE), *src = malloc(NT_SIZE);
	struct kcoll_notif *nt = calloc(2 * KCOLL_SEG_NOTIF_QUEUE, sizeof(*nt));
	struct kcoll_xfer_entry e[2] = { { 0, 1000, 5000 }, { 8192, 40000, 3000 } };
	char big[KCOLL_NOTIF_MAX_BYTES + 1];
	struct kcoll_seg *tseg, *lseg;
	struct kcoll_rseg *rs;
	kcoll_seg_desc_t d;
	uint32_t nr = 0, cnt = 0, got;
	int r, ok;
	int64_t t0;

	fill_random(src, NT_SIZE);
	if (kcoll_seg_register(k, dst, NT_SIZE, &o, &tseg) ||
	    kcoll_seg_register(k2, src, NT_SIZE, NULL, &lseg) || kcoll_seg_export(tseg, &d) ||
	    kcoll_seg_import(k2, &d, &rs)) {
		tap_ok(0, "notifs: setup");
		return;
	}

	/* Nothing queued: get returns none, wait times out. */
	nt[0].size = sizeof(nt[0]);
	r = kcoll_seg_get_notifs(tseg, nt, 4, &nr);
	t0 = now_ms();
	tap_ok(r == 0 && nr == 0 && kcoll_seg_notif_wait(tseg, 50) == -ETIMEDOUT &&
	       now_ms() - t0 >= 45, "notifs: none queued: 0 taken, wait times out");

	/* Alone (no entries): queued with its counter. */
	r = notif_sync(lseg, rs, NULL, 0, 1, "alone", 6);
	kcoll_seg_notify_get(tseg, 1, &cnt);
	ok = r == 0 && kcoll_seg_notif_wait(tseg, 0) == 0 && notif_drain(tseg, nt, 8) == 1;
	tap_ok(ok && nt[0].len == 6 && !memcmp(nt[0].data, "alone", 6) && nt[0].notify_id == 1 &&
	       nt[0].size == sizeof(nt[0]) && cnt == 1,
	       "notifs: a message alone arrives once with its counter (%s)", kcoll_strerror(r));

	/* With a batch: the bytes have landed when the message is taken. */
	r = notif_sync(lseg, rs, e, 2, KCOLL_NOTIFY_NONE, "req-42", 7);
	ok = r == 0 && notif_drain(tseg, nt + 1, 8) == 1 && nt[1].len == 7 &&
	     !strcmp((char *)nt[1].data, "req-42") && nt[1].notify_id == KCOLL_NOTIFY_NONE &&
	     nt[1].sender == nt[0].sender && !memcmp(dst + 1000, src, 5000) &&
	     !memcmp(dst + 40000, src + 8192, 3000);
	tap_ok(ok, "notifs: with a batch: bytes landed, message once, same sender (%s)",
	       kcoll_strerror(r));

	/* With a read batch: the owner hears of the read. */
	{
		struct kcoll_req *rq;
		struct kcoll_xfer_entry re = { 0, 1000, 64 };

		r = kcoll_xfer_read_notif(lseg, rs, &re, 1, KCOLL_NOTIFY_NONE, "read", 5, &rq);
		r = r ? r : kcoll_wait(rq, 30000);
		tap_ok(r == 0 && notif_drain(tseg, nt, 8) == 1 && !strcmp((char *)nt[0].data, "read") &&
		       !memcmp(src, dst + 1000, 64), "notifs: with a read batch (%s)", kcoll_strerror(r));
	}

	/* Bad input: nothing queued, no counter, nothing written. */
	memset(big, 'x', sizeof(big));
	memset(dst + 1000, 0xaa, 5000);	/* e[0]'s destination */
	kcoll_seg_notify_get(tseg, 1, &cnt);
	r = notif_sync(lseg, rs, e, 1, 1, big, sizeof(big));
	tap_ok(r == -EMSGSIZE, "notifs: %zu bytes -> -EMSGSIZE (%s)", sizeof(big), kcoll_strerror(r));
	r = notif_sync(lseg, rs, e, 1, 1, NULL, 8);
	tap_ok(r == -EINVAL, "notifs: NULL message -> -EINVAL (%s)", kcoll_strerror(r));
	{
		struct kcoll_xfer_entry far = { 0, NT_SIZE - 4, 8 };

		r = notif_sync(lseg, rs, &far, 1, 1, "range", 6);
		tap_ok(r == -ERANGE, "notifs: entry out of range -> -ERANGE (%s)", kcoll_strerror(r));
	}
	r = notif_sync(lseg, rs, e, 1, 2, "badctr", 7);
	tap_ok(r == -EINVAL, "notifs: notify_id beyond the counters -> -EINVAL (%s)", kcoll_strerror(r));
	r = notif_sync(lseg, rs, NULL, 0, KCOLL_NOTIFY_NONE, (void *)16, 8);
	tap_ok(r == -EFAULT, "notifs: unreadable message -> -EFAULT (%s)", kcoll_strerror(r));
	got = 1;
	kcoll_seg_notify_get(tseg, 1, &got);
	tap_ok(notif_drain(tseg, nt, 8) == 0 && got == cnt && all_bytes(dst + 1000, 5000, 0xaa),
	       "notifs: refused requests queued nothing, counted nothing, wrote nothing");
	nt[0].size = 8;
	r = kcoll_seg_get_notifs(tseg, nt, 1, &nr);
	tap_ok(r == -EINVAL, "notifs: get with a wrong struct size -> -EINVAL (%s)", kcoll_strerror(r));
	nt[0].size = sizeof(nt[0]);
	{
		struct kcoll_seg *ls2;

		kcoll_seg_register(k2, src, 64, NULL, &ls2);
		r = ls2 ? kcoll_seg_get_notifs(ls2, nt, 1, &nr) : -1;
		tap_ok(r == 0 && nr == 0, "notifs: another segment's queue is its own (%s)",
		       kcoll_strerror(r));
		kcoll_seg_unregister(ls2);
	}

	/* The bounded queue: KCOLL_SEG_NOTIF_QUEUE fit, the next is refused
	 * with -ENOBUFS and no counter; once one is taken it fits again. */
	kcoll_seg_notify_get(tseg, 1, &cnt);
	ok = 1;
	for (uint32_t i = 0; i < KCOLL_SEG_NOTIF_QUEUE && ok; i++) {
		char m[16];

		snprintf(m, sizeof(m), "q%u", i);
		ok = notif_sync(lseg, rs, NULL, 0, 1, m, strlen(m) + 1) == 0;
	}
	r = notif_sync(lseg, rs, NULL, 0, 1, "over", 5);
	kcoll_seg_notify_get(tseg, 1, &got);
	tap_ok(ok && r == -ENOBUFS && got == cnt + KCOLL_SEG_NOTIF_QUEUE,
	       "notifs: queue full after %u -> -ENOBUFS, not counted (%s)", KCOLL_SEG_NOTIF_QUEUE,
	       kcoll_strerror(r));
	nt[0].size = sizeof(nt[0]);
	kcoll_seg_get_notifs(tseg, nt, 1, &nr);
	r = notif_sync(lseg, rs, NULL, 0, 1, "again", 6);
	got = notif_drain(tseg, nt + 1, 2 * KCOLL_SEG_NOTIF_QUEUE);
	ok = nr == 1 && !strcmp((char *)nt[0].data, "q0") && got == KCOLL_SEG_NOTIF_QUEUE &&
	     !strcmp((char *)nt[got].data, "again");
	for (uint32_t i = 1; ok && i < KCOLL_SEG_NOTIF_QUEUE; i++) {
		char m[16];

		snprintf(m, sizeof(m), "q%u", i);
		ok = !strcmp((char *)nt[i].data, m);
	}
	tap_ok(r == 0 && ok, "notifs: after one was taken the next fits; %u taken in order, "
	       "the refused one never", got + 1);

	/* Several senders at once, NT_WINDOW requests each in flight: every
	 * message exactly once, in order per sender, senders distinct. */
	{
		pid_t pid[NT_SENDERS];
		int next[NT_SENDERS], bad = 0, total = 0, st = 0;
		uint64_t sender[NT_SENDERS] = { 0 };

		B->desc[0] = d;
		B->go = 0;
		B->bad = 0;
		for (int i = 0; i < NT_SENDERS; i++) {
			next[i] = 0;
			pid[i] = fork();
			if (pid[i] == 0)
				notif_sender(i);
		}
		B->go = 1;
		t0 = now_ms();
		while (total < NT_SENDERS * NT_PER_SENDER && now_ms() - t0 < 30000 && !bad) {
			if (kcoll_seg_notif_wait(tseg, 1000))
				continue;
			got = notif_drain(tseg, nt, 64);
			for (uint32_t j = 0; j < got; j++) {
				int i = -1, seq = -1;

				if (sscanf((char *)nt[j].data, "%d:%d", &i, &seq) != 2 || i < 0 ||
				    i >= NT_SENDERS || seq != next[i] ||
				    (sender[i] && sender[i] != nt[j].sender)) {
					bad = 1;
					printf("# notifs: unexpected '%.32s' (want %d:%d)\n",
					       (char *)nt[j].data, i, i >= 0 && i < NT_SENDERS ? next[i] : -1);
					break;
				}
				sender[i] = nt[j].sender;
				next[i]++;
				total++;
			}
		}
		for (int i = 0; i < NT_SENDERS; i++)
			st |= wait_child(pid[i], 30000);
		for (int i = 0; i < NT_SENDERS; i++)
			for (int j = 0; j < i; j++)
				bad |= sender[i] == sender[j];
		usleep(100000);
		bad |= notif_drain(tseg, nt, 8) != 0;	/* no duplicate came late */
		for (int i = 0; i < NT_SENDERS * NT_PER_SENDER && !bad; i++) {
			uint64_t v;

			memcpy(&v, dst + (uint64_t)i * 8, 8);
			bad = v != 0x4040404040404040ULL + (uint64_t)(i / NT_PER_SENDER) * 0x0101010101010101ULL;
		}
		tap_ok(!st && !bad && total == NT_SENDERS * NT_PER_SENDER,
		       "notifs: %d senders x %d with %d in flight: %d exactly once, in order per "
		       "sender, every batch's bytes landed (%s)", NT_SENDERS, NT_PER_SENDER, NT_WINDOW,
		       total, B->bad ? B->why : "");
	}

	/* A dead owner: its process exits with the segment imported. */
	{
		int pp[2];
		char c;
		pid_t pid;
		struct kcoll_rseg *rdead;

		B->bad = 0;
		if (pipe(pp)) {
			tap_ok(0, "notifs: pipe");
			goto out;
		}
		pid = fork();
		if (pid == 0)
			target_child(pp[1], 32 * 1024 * 1024);
		r = read(pp[0], &c, 1) == 1 ? kcoll_seg_import(k2, &B->desc[0], &rdead) : -EIO;
		kill(pid, SIGKILL);
		wait_child(pid, 10000);
		if (!r) {
			t0 = now_ms();
			do {	/* kcolld notices the death on its own time */
				r = notif_sync(lseg, rdead, NULL, 0, KCOLL_NOTIFY_NONE, "dead?", 6);
			} while (r == 0 && now_ms() - t0 < 5000 && !usleep(20000));
			kcoll_rseg_close(rdead);
		}
		tap_ok(r == -EIDRM, "notifs: owner died -> -EIDRM (%s)", kcoll_strerror(r));
		close(pp[0]);
		close(pp[1]);
	}
out:
	/* Unregistered with messages queued (ASan: nothing leaks). */
	notif_sync(lseg, rs, NULL, 0, KCOLL_NOTIFY_NONE, "left", 5);
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(lseg);
	kcoll_seg_unregister(tseg);
	kcoll_disconnect(k2);
	free(nt);
	free(dst);
	free(src);
}

/* A process of its own that sends msg to the segment of desc after
 * delay_ms, through its own connection and import. */
static pid_t late_sender(const kcoll_seg_desc_t *desc, int delay_ms, const char *msg)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct kcoll *k = connect_or_die();
		static uint8_t buf[4096];
		struct kcoll_seg *l;
		struct kcoll_rseg *rs;

		usleep(delay_ms * 1000);
		if (kcoll_seg_register(k, buf, sizeof(buf), NULL, &l) || kcoll_seg_import(k, desc, &rs) ||
		    notif_sync(l, rs, NULL, 0, KCOLL_NOTIFY_NONE, msg, (uint32_t)strlen(msg) + 1))
			_exit(1);
		_exit(0);
	}
	return pid;
}

/* kcoll_seg_notif_wait_any: several segments (of two connections) at once. */
static void test_wait_any(struct kcoll *k)
{
	struct kcoll *k2 = connect_or_die();
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 1 };
	struct kcoll_seg *seg[3] = { NULL, NULL, NULL }, *many[KCOLL_NOTIF_WAIT_MAX + 1];
	uint8_t *mem = calloc(3, NT_SIZE);
	struct kcoll_notif nt[4];
	kcoll_seg_desc_t d[3];
	int64_t t0;
	pid_t pid;
	int r, ok;

	for (int i = 0; i < 3; i++)
		if (kcoll_seg_register(i == 1 ? k2 : k, mem + (size_t)i * NT_SIZE, NT_SIZE, &o, &seg[i]) ||
		    kcoll_seg_export(seg[i], &d[i])) {
			tap_ok(0, "wait_any: setup");
			goto out;
		}

	/* Nothing queued anywhere: the whole timeout passes. */
	t0 = now_ms();
	r = kcoll_seg_notif_wait_any(seg, 3, 50);
	tap_ok(r == -ETIMEDOUT && now_ms() - t0 >= 45, "wait_any: none queued: -ETIMEDOUT after the timeout (%d)", r);

	/* A message arriving later for the second segment (the other
	 * connection's) wakes the wait, which names it. */
	pid = late_sender(&d[1], 100, "late");
	r = kcoll_seg_notif_wait_any(seg, 3, 20000);
	ok = wait_child(pid, 20000) == 0;
	tap_ok(r == 1 && ok && notif_drain(seg[1], nt, 4) == 1 && !strcmp((char *)nt[0].data, "late"),
	       "wait_any: a message sent 100 ms later for segment 1 wakes it: returns 1 (%d, sender %s)",
	       r, ok ? "ok" : "failed");

	/* Queued on two: the first of them is named; at once with timeout 0. */
	ok = wait_child(late_sender(&d[2], 0, "two"), 20000) == 0 &&
	     wait_child(late_sender(&d[0], 0, "zero"), 20000) == 0;
	r = kcoll_seg_notif_wait_any(seg, 3, 0);
	tap_ok(ok && r == 0 && kcoll_seg_notif_wait_any(seg + 1, 2, 0) == 1,
	       "wait_any: messages queued on segments 0 and 2: returns 0, and 1 for the list from segment 1 (%d)", r);
	notif_drain(seg[0], nt, 4);
	notif_drain(seg[2], nt, 4);

	/* Bad input, nothing waited for. */
	for (int i = 0; i <= KCOLL_NOTIF_WAIT_MAX; i++)
		many[i] = seg[i % 3];
	seg[2] = NULL;	/* (still registered: unregistered below through many[2]) */
	tap_ok(kcoll_seg_notif_wait_any(many, 0, -1) == -EINVAL &&
	       kcoll_seg_notif_wait_any(NULL, 1, -1) == -EINVAL &&
	       kcoll_seg_notif_wait_any(seg, 3, -1) == -EINVAL &&
	       kcoll_seg_notif_wait_any(many, KCOLL_NOTIF_WAIT_MAX + 1, -1) == -EINVAL &&
	       kcoll_seg_notif_wait_any(many, KCOLL_NOTIF_WAIT_MAX, 0) == -ETIMEDOUT,
	       "wait_any: no segments, a NULL list or segment, over %d: -EINVAL; %d: waits",
	       KCOLL_NOTIF_WAIT_MAX, KCOLL_NOTIF_WAIT_MAX);
	seg[2] = many[2];
out:
	for (int i = 0; i < 3; i++)
		if (seg[i])
			kcoll_seg_unregister(seg[i]);
	kcoll_disconnect(k2);
	free(mem);
}

int main(void)
{
	struct kcoll *k;

	setvbuf(stdout, NULL, _IOLBF, 0);
	board_map();
	k = connect_or_die();
	test_notifs(k);
	test_wait_any(k);
	kcoll_disconnect(k);
	return tap_done();
}
