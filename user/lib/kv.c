// SPDX-License-Identifier: MIT
/* libkcoll: KV-cache segments and batched transfers (docs/kv.md). */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/barrier.h>
#include <kcoll/futex.h>
#include <kcoll/kcoll.h>
#include <kcoll/proto.h>

#include "lib.h"
#include "log.h"

_Static_assert(sizeof(struct kcoll_seg_wire) <= KCOLL_SEG_DESC_BYTES, "descriptor too large");

struct kcoll_seg {
	struct kcoll *k;
	uint32_t id;
	uint32_t nr_notify;
	const uint32_t *counters;	/* read-only mapping; kcolld increments */
	size_t counters_len;
	const uint32_t *notif_word;	/* in the same mapping: notifications queued */
	struct kcoll_seg_wire desc;
};

struct kcoll_rseg {
	struct kcoll *k;
	uint32_t handle;
	uint32_t nr_notify;
	uint64_t size;
};

int kcoll_seg_register(struct kcoll *k, void *ptr, size_t len, const struct kcoll_seg_opts *opts,
		       struct kcoll_seg **out)
{
	struct kcoll_msg_seg_reg req = { .hdr.type = KCOLL_MSG_SEG_REG };
	struct kcoll_msg_seg_reg_reply rep;
	struct kcoll_seg_opts o = { 0 };
	struct kcoll_seg *s;
	uint8_t kind;
	int fd = -1, r;

	if (!k || !ptr || !len || !out)
		return -EINVAL;
	if (opts) {
		if (opts->size < sizeof(o) || opts->flags & ~KCOLL_SEG_F_GRANT_UID)
			return -EINVAL;
		o = *opts;
	}
	/* Device memory reaches kcolld the way collectives' buffers do: its
	 * allocation is registered (CUDA IPC) first, and the segment says so.
	 * A kcolld without a GPU refuses that with -EOPNOTSUPP. */
	r = kc_mem_kind(k, ptr, len, &kind);
	if (r) {
		if (r == -EOPNOTSUPP)
			kc_warn("segment %p of %zu bytes is device memory and kcolld cannot map it "
				"(no GPU in kcolld: 'kcollctl gpu' says why)", ptr, len);
		return r;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	req.addr = (uintptr_t)ptr;
	req.size = len;
	req.nr_notify = o.nr_notify;
	req.flags = o.flags & KCOLL_SEG_F_GRANT_UID ? KCOLL_MSG_SEG_F_GRANT_UID : 0;
	if (kind == KCOLL_MEM_DEVICE)
		req.flags |= KCOLL_MSG_SEG_F_DEVICE;
	req.grant_uid = o.grant_uid;
	memset(&rep, 0, sizeof(rep));
	r = kcoll_priv_ctl(k, &req, sizeof(req), -1, &rep, sizeof(rep), &fd, 5000);
	if (r) {
		if (rep.hdr.magic == KCOLL_PROTO_MAGIC && rep.error[0])
			fprintf(stderr, "libkcoll: segment not registered: %.*s\n",
				(int)sizeof(rep.error), rep.error);
		goto err_free;
	}
	s->k = k;
	s->id = rep.desc.seg_id;
	s->nr_notify = rep.desc.nr_notify;
	s->desc = rep.desc;
	{
		void *p;

		s->counters_len = kcoll_seg_counters_len(s->nr_notify);
		p = fd < 0 ? MAP_FAILED : mmap(NULL, s->counters_len, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) {
			r = fd < 0 ? -EPROTO : -errno;
			goto err_unreg;
		}
		s->counters = p;
		s->notif_word = (const uint32_t *)((const uint8_t *)p +
						   kcoll_seg_notif_word_off(s->nr_notify));
	}
	if (fd >= 0)
		close(fd);
	*out = s;
	return 0;

err_unreg:
	{
		struct kcoll_msg_seg_id u = { .hdr.type = KCOLL_MSG_SEG_UNREG, .id = s->id };
		struct kcoll_msg_hdr urep;

		kcoll_priv_ctl(k, &u, sizeof(u), -1, &urep, sizeof(urep), NULL, 5000);
	}
err_free:
	if (fd >= 0)
		close(fd);
	free(s);
	return r;
}

int kcoll_seg_unregister(struct kcoll_seg *s)
{
	struct kcoll_msg_seg_id req = { .hdr.type = KCOLL_MSG_SEG_UNREG };
	struct kcoll_msg_hdr rep;
	int r;

	if (!s)
		return -EINVAL;
	req.id = s->id;
	r = kcoll_priv_ctl(s->k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 30000);
	if (s->counters)
		munmap((void *)s->counters, s->counters_len);
	free(s);
	/* A daemon that is gone has forgotten the segment anyway. */
	return r == -ENOTCONN ? 0 : r;
}

int kcoll_seg_export(const struct kcoll_seg *s, kcoll_seg_desc_t *desc)
{
	if (!s || !desc)
		return -EINVAL;
	memset(desc, 0, sizeof(*desc));
	memcpy(desc->bytes, &s->desc, sizeof(s->desc));
	return 0;
}

int kcoll_seg_import(struct kcoll *k, const kcoll_seg_desc_t *desc, struct kcoll_rseg **out)
{
	struct kcoll_msg_seg_import req = { .hdr.type = KCOLL_MSG_SEG_IMPORT };
	struct kcoll_msg_seg_import_reply rep;
	struct kcoll_rseg *rs;
	int r;

	if (!k || !desc || !out)
		return -EINVAL;
	rs = calloc(1, sizeof(*rs));
	if (!rs)
		return -ENOMEM;
	memcpy(&req.desc, desc->bytes, sizeof(req.desc));
	memset(&rep, 0, sizeof(rep));
	r = kcoll_priv_ctl(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);
	if (r) {
		free(rs);
		return r;
	}
	rs->k = k;
	rs->handle = rep.handle;
	rs->nr_notify = rep.nr_notify;
	rs->size = rep.size;
	*out = rs;
	return 0;
}

int kcoll_rseg_close(struct kcoll_rseg *rs)
{
	struct kcoll_msg_seg_id req = { .hdr.type = KCOLL_MSG_SEG_CLOSE };
	struct kcoll_msg_hdr rep;
	int r;

	if (!rs)
		return -EINVAL;
	req.id = rs->handle;
	r = kcoll_priv_ctl(rs->k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);
	free(rs);
	return r == -ENOTCONN ? 0 : r;
}

uint64_t kcoll_rseg_size(const struct kcoll_rseg *rs)
{
	return rs ? rs->size : 0;
}

static int xfer(uint8_t opcode, struct kcoll_seg *l, struct kcoll_rseg *rs,
		const struct kcoll_xfer_entry *e, uint32_t n, uint32_t notify_id,
		const void *msg, uint32_t msg_len, struct kcoll_req **req)
{
	struct kcoll_sqe sqe = { .opcode = opcode };

	/* Only what the SQE cannot express is checked here: kcolld validates
	 * the batch (ranges, limit, overlaps) against the segments it knows. */
	if (!l || !rs || !req || l->k != rs->k)
		return -EINVAL;
	sqe.xfer.entries_addr = (uintptr_t)e;
	sqe.xfer.nr_entries = n;
	sqe.xfer.local_seg = l->id;
	sqe.xfer.remote_seg = rs->handle;
	sqe.xfer.notify_id = notify_id;
	sqe.xfer.msg_addr = (uintptr_t)msg;
	sqe.xfer.msg_len = msg_len;
	return kcoll_priv_submit(l->k, &sqe, req);
}

int kcoll_xfer_write(struct kcoll_seg *l, struct kcoll_rseg *rs, const struct kcoll_xfer_entry *e,
		     uint32_t n, uint32_t notify_id, struct kcoll_req **req)
{
	return xfer(KCOLL_OP_XFER_WRITE, l, rs, e, n, notify_id, NULL, 0, req);
}

int kcoll_xfer_read(struct kcoll_seg *l, struct kcoll_rseg *rs, const struct kcoll_xfer_entry *e,
		    uint32_t n, uint32_t notify_id, struct kcoll_req **req)
{
	return xfer(KCOLL_OP_XFER_READ, l, rs, e, n, notify_id, NULL, 0, req);
}

/* The message is read by kcolld when it takes the SQE; like the entries it
 * must stay valid until the request completes. */
static int xfer_notif(uint8_t opcode, struct kcoll_seg *l, struct kcoll_rseg *rs,
		      const struct kcoll_xfer_entry *e, uint32_t n, uint32_t notify_id,
		      const void *msg, uint32_t msg_len, struct kcoll_req **req)
{
	if (msg_len > KCOLL_NOTIF_MAX_BYTES)
		return -EMSGSIZE;
	if (!msg || !msg_len)
		return -EINVAL;
	return xfer(opcode, l, rs, e, n, notify_id, msg, msg_len, req);
}

int kcoll_xfer_write_notif(struct kcoll_seg *l, struct kcoll_rseg *rs,
			   const struct kcoll_xfer_entry *e, uint32_t n, uint32_t notify_id,
			   const void *msg, uint32_t msg_len, struct kcoll_req **req)
{
	return xfer_notif(KCOLL_OP_XFER_WRITE, l, rs, e, n, notify_id, msg, msg_len, req);
}

int kcoll_xfer_read_notif(struct kcoll_seg *l, struct kcoll_rseg *rs,
			  const struct kcoll_xfer_entry *e, uint32_t n, uint32_t notify_id,
			  const void *msg, uint32_t msg_len, struct kcoll_req **req)
{
	return xfer_notif(KCOLL_OP_XFER_READ, l, rs, e, n, notify_id, msg, msg_len, req);
}

int kcoll_seg_get_notifs(struct kcoll_seg *s, struct kcoll_notif *out, uint32_t max, uint32_t *nr)
{
	struct kcoll_msg_seg_notifs req = { .hdr.type = KCOLL_MSG_SEG_NOTIFS };
	struct kcoll_msg_seg_notifs_reply *rep;
	uint32_t got = 0;
	int r = 0;

	if (!s || !nr || (max && (!out || out[0].size != sizeof(*out))))
		return -EINVAL;
	*nr = 0;
	if (!max)
		return 0;
	rep = malloc(sizeof(*rep));
	if (!rep)
		return -ENOMEM;
	req.id = s->id;
	while (got < max) {
		req.max = max - got < KCOLL_SEG_NOTIFS_PER_MSG ? max - got : KCOLL_SEG_NOTIFS_PER_MSG;
		rep->nr = 0;
		r = kcoll_priv_ctl(s->k, &req, sizeof(req), -1, rep, sizeof(*rep), NULL, 5000);
		if (r)
			break;
		if (rep->nr > req.max) {
			r = -EPROTO;
			break;
		}
		for (uint32_t i = 0; i < rep->nr; i++, got++) {
			struct kcoll_notif *o = &out[got];

			memset(o, 0, sizeof(*o));
			o->size = sizeof(*o);
			o->sender = rep->rec[i].sender;
			o->notify_id = rep->rec[i].notify_id;
			o->len = rep->rec[i].len > KCOLL_NOTIF_MAX_BYTES ? KCOLL_NOTIF_MAX_BYTES :
				 rep->rec[i].len;
			memcpy(o->data, rep->rec[i].data, o->len);
		}
		if (!rep->left || rep->nr < req.max)
			break;
	}
	free(rep);
	*nr = got;
	/* What was taken is the caller's even if a later round failed. */
	return got ? 0 : r;
}


int kcoll_seg_notify_get(const struct kcoll_seg *s, uint32_t id, uint32_t *value)
{
	if (!s || !value || id >= s->nr_notify)
		return -EINVAL;
	*value = __atomic_load_n(&s->counters[id], __ATOMIC_ACQUIRE);
	return 0;
}

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int kcoll_seg_notify_wait(struct kcoll_seg *s, uint32_t id, uint32_t value, int timeout_ms)
{
	const int64_t slice_ns = 100 * 1000000LL;
	int64_t deadline;

	if (!s || id >= s->nr_notify)
		return -EINVAL;
	deadline = timeout_ms < 0 ? INT64_MAX : mono_ns() + (int64_t)timeout_ms * 1000000;
	for (;;) {
		uint32_t v = __atomic_load_n(&s->counters[id], __ATOMIC_ACQUIRE);
		int64_t left;

		if ((int32_t)(v - value) >= 0)
			return 0;
		left = deadline - mono_ns();
		if (left <= 0)
			return -ETIMEDOUT;
		/* kcolld wakes every waiter after each increment; the slice
		 * bounds how long a dead daemon goes unnoticed. */
		kcoll_futex_wait((uint32_t *)&s->counters[id], v, left < slice_ns ? left : slice_ns);
		if (!kcoll_priv_alive(s->k))
			return -ENOTCONN;
	}
}

int kcoll_seg_notif_wait(struct kcoll_seg *s, int timeout_ms)
{
	const int64_t slice_ns = 100 * 1000000LL;
	int64_t deadline;

	if (!s || !s->notif_word)
		return -EINVAL;
	deadline = timeout_ms < 0 ? INT64_MAX : mono_ns() + (int64_t)timeout_ms * 1000000;
	for (;;) {
		uint32_t v = __atomic_load_n(s->notif_word, __ATOMIC_ACQUIRE);
		int64_t left;

		if (v)
			return 0;
		left = deadline - mono_ns();
		if (left <= 0)
			return -ETIMEDOUT;
		kcoll_futex_wait((uint32_t *)s->notif_word, 0, left < slice_ns ? left : slice_ns);
		if (!kcoll_priv_alive(s->k))
			return -ENOTCONN;
	}
}

/*
 * Waiting on several segments' notification words at once: one
 * futex_waitv (Linux 5.16) sleeps on all of them, in slices like the
 * single wait (a dead daemon is noticed within one). The words are in
 * memory shared with kcolld, so the waiters are shared futexes (no
 * FUTEX_PRIVATE_FLAG), as kcolld's FUTEX_WAKE expects. Where the kernel or
 * the headers lack it, the words are polled every millisecond.
 */
struct kc_waitv {		/* the kernel's struct futex_waitv */
	uint64_t val;
	uint64_t uaddr;
	uint32_t flags;
	uint32_t reserved;
};

#define KC_FUTEX_32 2		/* FUTEX2_SIZE_U32 */

/* Sleep on the words until one is woken or changes, or until until_ns
 * (CLOCK_MONOTONIC); -ENOSYS at once where futex_waitv is missing. */
static int waitv_until(const struct kc_waitv *w, uint32_t n, int64_t until_ns)
{
#ifdef __NR_futex_waitv
	struct timespec ts = { until_ns / 1000000000, until_ns % 1000000000 };

	if (syscall(__NR_futex_waitv, w, n, 0, &ts, CLOCK_MONOTONIC) >= 0 || errno != ENOSYS)
		return 0;	/* woken, a word changed (EAGAIN), timed out or a signal */
#else
	(void)w;
	(void)n;
	(void)until_ns;
#endif
	return -ENOSYS;
}

int kcoll_seg_notif_wait_any(struct kcoll_seg *const *segs, uint32_t n, int timeout_ms)
{
	const int64_t slice_ns = 100 * 1000000LL;
	struct kc_waitv w[KCOLL_NOTIF_WAIT_MAX];
	int64_t deadline;
	bool poll = false;

	if (!segs || !n || n > KCOLL_NOTIF_WAIT_MAX)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		if (!segs[i] || !segs[i]->notif_word)
			return -EINVAL;
		w[i] = (struct kc_waitv){ .val = 0, .uaddr = (uintptr_t)segs[i]->notif_word,
					  .flags = KC_FUTEX_32 };
	}
	deadline = timeout_ms < 0 ? INT64_MAX : mono_ns() + (int64_t)timeout_ms * 1000000;
	for (;;) {
		int64_t now, left;

		for (uint32_t i = 0; i < n; i++)
			if (__atomic_load_n(segs[i]->notif_word, __ATOMIC_ACQUIRE))
				return (int)i;
		now = mono_ns();
		left = deadline - now;
		if (left <= 0)
			return -ETIMEDOUT;
		if (!poll)
			poll = waitv_until(w, n, now + (left < slice_ns ? left : slice_ns)) == -ENOSYS;
		if (poll) {
			struct timespec ms = { 0, left < 1000000 ? left : 1000000 };

			nanosleep(&ms, NULL);
		}
		for (uint32_t i = 0; i < n; i++)
			if (!kcoll_priv_alive(segs[i]->k))
				return -ENOTCONN;
	}
}

/*
 * Batch planning (kcoll_xfer_plan): what kcoll.kv's Agent does to every
 * batch before it is submitted, in one call instead of a dozen numpy
 * passes. Batches are usually given in destination order already: that is
 * one pass; short ones out of order are insertion-sorted (stable), long
 * ones go to qsort, whose instability cannot show: two entries with the
 * same destination overlap and are refused.
 */
static inline uint64_t plan_dst(const struct kcoll_xfer_entry *e, int write)
{
	return write ? e->remote_off : e->local_off;
}

static int plan_cmp_write(const void *a, const void *b)
{
	uint64_t x = ((const struct kcoll_xfer_entry *)a)->remote_off;
	uint64_t y = ((const struct kcoll_xfer_entry *)b)->remote_off;

	return (x > y) - (x < y);
}

static int plan_cmp_read(const void *a, const void *b)
{
	uint64_t x = ((const struct kcoll_xfer_entry *)a)->local_off;
	uint64_t y = ((const struct kcoll_xfer_entry *)b)->local_off;

	return (x > y) - (x < y);
}

static void plan_sort(struct kcoll_xfer_entry *e, size_t n, int write)
{
	size_t i, j;

	for (i = 1; i < n; i++)
		if (plan_dst(&e[i], write) < plan_dst(&e[i - 1], write))
			break;
	if (i >= n)
		return;
	if (n > 64) {
		qsort(e, n, sizeof(*e), write ? plan_cmp_write : plan_cmp_read);
		return;
	}
	for (; i < n; i++) {
		struct kcoll_xfer_entry x = e[i];
		uint64_t k = plan_dst(&x, write);

		for (j = i; j > 0 && plan_dst(&e[j - 1], write) > k; j--)
			e[j] = e[j - 1];
		e[j] = x;
	}
}

int kcoll_xfer_plan(struct kcoll_xfer_entry *e, size_t n, uint64_t local_size,
		    uint64_t remote_size, int write, size_t *out_n)
{
	int zero = 0, range = 0;
	size_t i, m;

	if (!out_n || (n && !e))
		return -EINVAL;
	*out_n = 0;
	for (i = 0; i < n; i++) {
		const struct kcoll_xfer_entry *x = &e[i];

		zero |= !x->len;
		/* offset inside, and the length within what is left: no wrap */
		range |= x->local_off >= local_size || x->len > local_size - x->local_off ||
			 x->remote_off >= remote_size || x->len > remote_size - x->remote_off;
	}
	if (zero)
		return -EINVAL;
	if (range)
		return -ERANGE;
	if (!n)
		return 0;
	plan_sort(e, n, write);
	/* Every end is within a segment now: dst + len cannot wrap. */
	for (i = 1; i < n; i++)
		if (plan_dst(&e[i - 1], write) + e[i - 1].len > plan_dst(&e[i], write))
			return -EINVAL;
	for (i = 1, m = 0; i < n; i++) {
		struct kcoll_xfer_entry *p = &e[m];

		if (p->local_off + p->len == e[i].local_off &&
		    p->remote_off + p->len == e[i].remote_off)
			p->len += e[i].len;
		else
			e[++m] = e[i];
	}
	*out_n = m + 1;
	return 0;
}
