// SPDX-License-Identifier: MIT
/*
 * The KV segment registry's core (docs/kv.md), beneath every KV file: the
 * table (kv_state), a segment's references, its reader lock over a copy
 * round (kv_lock_sides), the peers' connections that unregistering shuts
 * down, and delivering a notification to one of our segments. It calls no
 * other KV file: a remote import is torn down through the function its
 * creator left in it (kd_seg.rm_free, kv_send.c's), so the registry sits
 * below the senders that use it. The client requests that create and drop
 * segments are kv_seg.c's.
 *
 * Lock order: kv_state.lock (table) is never held while taking a segment
 * rwlock.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <kcoll/futex.h>

#include "kv_int.h"
#include "metrics.h"

struct kv_state kv_state = { .lock = PTHREAD_MUTEX_INITIALIZER, .next_id = 1 };

void kv_seg_put(struct kd_seg *s)
{
	if (atomic_fetch_sub(&s->refs, 1) != 1)
		return;
	if (s->rm)
		s->rm_free(s->rm);
	if (s->counters) {
		kv_notifq_destroy(&s->notifs);
		munmap(s->counters, s->counters_len);
	}
	pthread_rwlock_destroy(&s->lock);
	pthread_mutex_destroy(&s->conns_lock);
	free(s);
}

/* kv_seg.c's seg_kill shuts cn down while it is in s's conns. */
void kv_conn_link(struct kd_seg *s, struct kv_conn *cn)
{
	pthread_mutex_lock(&s->conns_lock);
	cn->next = s->conns;
	s->conns = cn;
	pthread_mutex_unlock(&s->conns_lock);
}

void kv_conn_unlink(struct kd_seg *s, struct kv_conn *cn)
{
	pthread_mutex_lock(&s->conns_lock);
	for (struct kv_conn **pp = &s->conns; *pp; pp = &(*pp)->next) {
		if (*pp == cn) {
			*pp = cn->next;
			break;
		}
	}
	pthread_mutex_unlock(&s->conns_lock);
}

/* A live segment by id, referenced. */
struct kd_seg *kv_seg_find(uint32_t id)
{
	struct kd_seg *s;

	pthread_mutex_lock(&kv_state.lock);
	for (s = kv_state.segs; s; s = s->next)
		if (s->id == id)
			break;
	if (s)
		atomic_fetch_add(&s->refs, 1);
	pthread_mutex_unlock(&kv_state.lock);
	return s;
}

int kv_token_eq(const uint8_t *a, const uint8_t *b)
{
	uint8_t d = 0;

	for (size_t i = 0; i < KCOLL_SEG_TOKEN_BYTES; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

/*
 * Deliver notification msg (and bump counter notify_id unless NONE) to our
 * segment s, under its reader lock: -EIDRM dead, -EINVAL no such counter,
 * -ENOBUFS its queue is full (then the counter is not bumped either).
 */
int kv_notif_deliver(struct kd_seg *s, uint64_t sender, uint32_t notify_id,
		     const uint8_t *data, uint32_t len)
{
	int r = 0;

	if (atomic_load(&s->dead))
		return -EIDRM;
	if (notify_id != KCOLL_NOTIFY_NONE && notify_id >= s->nr_notify)
		return -EINVAL;
	if (len) {
		r = kv_notifq_post(&s->notifs, sender, notify_id, data, len);
		if (r)
			return r;
		atomic_fetch_add(&kv_state.notifs, 1);
	}
	if (notify_id != KCOLL_NOTIFY_NONE) {
		__atomic_fetch_add(&s->counters[notify_id], 1, __ATOMIC_SEQ_CST);
		kcoll_futex_wake(&s->counters[notify_id], INT_MAX);
	}
	return 0;
}

int kv_vm_err(ssize_t got, size_t want)
{
	if (got == (ssize_t)want)
		return 0;
	if (got < 0 && errno == ESRCH)
		return -ECONNRESET;	/* a process died */
	return got < 0 && errno == EPERM ? -EPERM : -EFAULT;
}

void kv_seg_buf(struct kd_seg *s, struct kd_buf *b)
{
	kd_buf_resolve_kind(s->owner, s->addr, s->size, s->dev ? KCOLL_MEM_DEVICE : KCOLL_MEM_HOST, b);
}

int kv_side_vm(const struct kv_side *s, const struct iovec *liov, unsigned long nl,
	       const struct iovec *riov, unsigned long nr, size_t total, bool to_seg)
{
	size_t lo = 0, ro = 0, done = 0;
	unsigned long li = 0, ri = 0;
	int r = 0;

	if (!s->seg->dev)
		return kv_vm_err(to_seg ? process_vm_writev(s->seg->pid, liov, nl, riov, nr, 0) :
				 process_vm_readv(s->seg->pid, liov, nl, riov, nr, 0), total);
	/* Both lists hold total bytes; walk them in step, one copy per run
	 * that is contiguous on both sides. */
	while (!r && li < nl && ri < nr) {
		size_t n = liov[li].iov_len - lo;
		uint8_t *h = (uint8_t *)liov[li].iov_base + lo;
		uint64_t off = (uintptr_t)riov[ri].iov_base + ro - s->seg->addr;
		const uint8_t *p;

		if (n > riov[ri].iov_len - ro)
			n = riov[ri].iov_len - ro;
		if (n)
			r = to_seg ? kd_buf_write(s->seg->owner, &s->buf, off, h, n) :
			     kd_buf_read(s->seg->owner, &s->buf, off, n, h, &p);
		done += n;
		lo += n;
		ro += n;
		if (lo == liov[li].iov_len) {
			li++;
			lo = 0;
		}
		if (ro == riov[ri].iov_len) {
			ri++;
			ro = 0;
		}
	}
	if (!r && done != total)
		r = -EFAULT;
	if (!r)
		kd_metrics_kv_dev(done);
	return r;
}

/* Both sides' reader locks (one when they are the same segment): -EIDRM
 * when either is dead, then holding neither. */
int kv_lock_sides(struct kv_side *a, struct kv_side *b)
{
	pthread_rwlock_rdlock(&a->seg->lock);
	if (b->seg != a->seg)
		pthread_rwlock_rdlock(&b->seg->lock);
	if (atomic_load(&a->seg->dead) || atomic_load(&b->seg->dead)) {
		if (b->seg != a->seg)
			pthread_rwlock_unlock(&b->seg->lock);
		pthread_rwlock_unlock(&a->seg->lock);
		return -EIDRM;
	}
	return 0;
}

void kv_unlock_sides(struct kv_side *a, struct kv_side *b)
{
	if (b->seg != a->seg)
		pthread_rwlock_unlock(&b->seg->lock);
	pthread_rwlock_unlock(&a->seg->lock);
}

/* Resolve a segment's memory in its owner: mapped (zero copy) or by pid. */
int kv_side_resolve(struct kv_side *s)
{
	int r = kv_lock_sides(s, s);

	if (r)
		return r;
	kv_seg_buf(s->seg, &s->buf);
	kv_unlock_sides(s, s);
	return 0;
}
