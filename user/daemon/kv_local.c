// SPDX-License-Identifier: MIT
/*
 * One KV batch (docs/kv.md): an XFER SQE names one of the submitter's own
 * segments and one import handle. The ring thread validates the whole batch
 * (every range, the limit, overlaps) before it moves a byte. A batch with
 * another kcolld's import goes to kv_send.c; on the same host it is copied
 * here in rounds of at most KV_ROUND_BYTES / KV_ROUND_IOVS pieces:
 *
 *   both sides mapped (kcoll_mem_alloc / kcoll_mem_register)  memcpy
 *   both in GPU memory                    the driver's device-to-device copy
 *   one side mapped                       process_vm_readv/writev (or the GPU's
 *                                          staged copies, kv_side_vm) straight
 *                                          between the mapping and the other
 *   neither                               read into a per-thread stage, write
 *
 * Each round holds both segments' rwlocks as a reader (kv_seg.c), and the
 * notify counter is bumped only after the last round of a batch succeeded.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "kv_int.h"
#include "log.h"
#include "metrics.h"

static __thread uint8_t *kv_stage;

void kd_kv_thread_done(void)
{
	free(kv_stage);
	kv_stage = NULL;
}

static int cmp_range(const void *a, const void *b)
{
	const struct kv_piece *x = a, *y = b;

	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

/* Does [off, off+len) overlap a destination range of the sorted array? */
static bool hits_dst(const struct kv_piece *sorted, uint32_t n, uint64_t off, uint64_t len)
{
	uint32_t lo = 0, hi = n;

	while (lo < hi) {	/* first range ending after off */
		uint32_t mid = lo + (hi - lo) / 2;

		if (sorted[mid].dst + sorted[mid].len <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && sorted[lo].dst < off + len;
}

static int check_batch(const struct kv_piece *p, uint32_t n, const struct kv_side *src,
		       const struct kv_side *dst, const char **why)
{
	struct kv_piece *sorted;
	uint64_t total = 0;
	int r = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (!p[i].len) {
			*why = "zero-length entry";
			return -EINVAL;
		}
		if (p[i].src > src->seg->size || p[i].len > src->seg->size - p[i].src ||
		    p[i].dst > dst->seg->size || p[i].len > dst->seg->size - p[i].dst) {
			*why = "entry beyond the end of a segment";
			return -ERANGE;
		}
		total += p[i].len;	/* <= 4096 x KD_MAX_BYTES: no wrap */
	}
	/* Sources may overlap, so a batch could name petabytes; the remote
	 * path cuts it into frames in memory first. */
	if (total > KD_MAX_BYTES) {
		*why = "the batch moves more bytes than a segment can hold (KD_MAX_BYTES): split it";
		return -E2BIG;
	}
	if (n < 2 && src->seg != dst->seg)
		return 0;
	sorted = malloc((size_t)n * sizeof(*sorted));
	if (!sorted)
		return -ENOMEM;
	memcpy(sorted, p, (size_t)n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_range);
	for (uint32_t i = 1; i < n; i++) {
		if (sorted[i - 1].dst + sorted[i - 1].len > sorted[i].dst) {
			*why = "entries overlap at the destination";
			r = -EINVAL;
			goto out;
		}
	}
	/* Within one segment a source must not be another entry's destination:
	 * the result would depend on the copy order. */
	if (src->seg == dst->seg) {
		for (uint32_t i = 0; i < n; i++) {
			if (hits_dst(sorted, n, p[i].src, p[i].len)) {
				*why = "a source range overlaps a destination range in the same segment";
				r = -EINVAL;
				goto out;
			}
		}
	}
out:
	free(sorted);
	return r;
}

static int copy_round(const struct kv_piece *p, uint32_t n, const struct kv_side *src,
		      const struct kv_side *dst)
{
	struct iovec liov[KV_ROUND_IOVS], riov[KV_ROUND_IOVS];
	size_t total = 0;
	int r = 0;

	if (src->buf.direct && dst->buf.direct) {
		for (uint32_t i = 0; i < n; i++)
			memmove(dst->buf.direct + p[i].dst, src->buf.direct + p[i].src, p[i].len);
		return 0;
	}
	for (uint32_t i = 0; i < n; i++)
		total += p[i].len;
	if (src->seg->dev && dst->seg->dev) {	/* GPU to GPU: the driver's copies */
		for (uint32_t i = 0; i < n && !r; i++)
			r = kd_buf_copy_dev(&dst->buf, p[i].dst, &src->buf, p[i].src, p[i].len);
		if (!r)
			kd_metrics_kv_dev(total);
		return r;
	}
	if (src->buf.direct) {	/* mapping -> process or GPU */
		for (uint32_t i = 0; i < n; i++) {
			liov[i] = (struct iovec){ src->buf.direct + p[i].src, p[i].len };
			riov[i] = (struct iovec){ (void *)(uintptr_t)(dst->seg->addr + p[i].dst), p[i].len };
		}
		return kv_side_vm(dst, liov, n, riov, n, total, true);
	}
	if (dst->buf.direct) {	/* process or GPU -> mapping */
		for (uint32_t i = 0; i < n; i++) {
			liov[i] = (struct iovec){ dst->buf.direct + p[i].dst, p[i].len };
			riov[i] = (struct iovec){ (void *)(uintptr_t)(src->seg->addr + p[i].src), p[i].len };
		}
		return kv_side_vm(src, liov, n, riov, n, total, false);
	}
	/* process or GPU -> stage -> process or GPU; the stage stays in cache
	 * between the two */
	if (!kv_stage && !(kv_stage = malloc(KV_ROUND_BYTES)))
		return -ENOMEM;
	liov[0] = (struct iovec){ kv_stage, total };
	for (uint32_t i = 0; i < n; i++)
		riov[i] = (struct iovec){ (void *)(uintptr_t)(src->seg->addr + p[i].src), p[i].len };
	r = kv_side_vm(src, liov, 1, riov, n, total, false);
	if (r)
		return r;
	for (uint32_t i = 0; i < n; i++)
		riov[i] = (struct iovec){ (void *)(uintptr_t)(dst->seg->addr + p[i].dst), p[i].len };
	return kv_side_vm(dst, liov, 1, riov, n, total, true);
}

static int run_batch(struct kd_client *c, const struct kv_piece *p, uint32_t n,
		     struct kv_side *src, struct kv_side *dst, uint64_t *moved)
{
	struct kv_piece round[KV_ROUND_IOVS];
	uint32_t i = 0;
	uint64_t off = 0;
	int r = 0;

	while (i < n && !r) {
		uint32_t k = 0;
		size_t bytes = 0;

		while (i < n && k < KV_ROUND_IOVS && bytes < KV_ROUND_BYTES) {
			uint64_t take = p[i].len - off;

			if (take > KV_ROUND_BYTES - bytes)
				take = KV_ROUND_BYTES - bytes;
			round[k++] = (struct kv_piece){ p[i].src + off, p[i].dst + off, take };
			bytes += take;
			off += take;
			if (off == p[i].len) {
				i++;
				off = 0;
			}
		}
		if (atomic_load(&c->stop) || atomic_load(&c->dead))
			return -ECANCELED;
		r = kv_lock_sides(src, dst);
		if (r)
			break;
		r = copy_round(round, k, src, dst);
		kv_unlock_sides(src, dst);
		if (!r)
			*moved += bytes;
	}
	return r;
}

void kd_kv_submit(struct kd_client *c, const struct kcoll_sqe *sqe, int err, const char *why)
{
	const struct kcoll_sqe_xfer *x = &sqe->xfer;
	bool write = sqe->opcode == KCOLL_OP_XFER_WRITE;
	struct kv_side local = { 0 }, remote = { 0 }, *src, *dst;
	struct kcoll_xfer_entry *e = NULL;
	struct kv_piece *p = NULL;
	struct kv_msgout msg;
	uint64_t moved = 0;
	int64_t t0 = kd_now_ns();
	int r = err;

	msg.len = 0;
	if (r)
		goto out;
	local.seg = kv_seg_find(x->local_seg);
	if (!local.seg || local.seg->owner != c) {
		why = "local_seg is not a segment this client registered";
		r = -ENOENT;
		goto out;
	}
	pthread_mutex_lock(&c->lock);
	if (c->kv && x->remote_seg >= 1 && x->remote_seg <= KV_MAX_IMPORTS &&
	    (remote.seg = c->kv->imports[x->remote_seg - 1])) {
		atomic_fetch_add(&remote.seg->refs, 1);
		msg.sender = c->kv->sender[x->remote_seg - 1];
	}
	pthread_mutex_unlock(&c->lock);
	if (!remote.seg) {
		why = "remote_seg is not an import handle of this client";
		r = -ENOENT;
		goto out;
	}
	if (x->notify_id != KCOLL_NOTIFY_NONE && x->notify_id >= remote.seg->nr_notify) {
		why = "notify_id beyond the remote segment's counters";
		r = -EINVAL;
		goto out;
	}
	if (x->nr_entries) {
		struct iovec l, rv;
		size_t bytes = (size_t)x->nr_entries * sizeof(*e);

		e = malloc(bytes);
		p = malloc((size_t)x->nr_entries * sizeof(*p));
		if (!e || !p) {
			r = -ENOMEM;
			goto out;
		}
		l = (struct iovec){ e, bytes };
		rv = (struct iovec){ (void *)(uintptr_t)x->entries_addr, bytes };
		if (process_vm_readv(c->pid, &l, 1, &rv, 1, 0) != (ssize_t)bytes) {
			why = "cannot read the entry array from the client";
			r = -EFAULT;
			goto out;
		}
	}
	if (x->msg_len) {
		struct iovec l = { msg.data, x->msg_len };
		struct iovec rv = { (void *)(uintptr_t)x->msg_addr, x->msg_len };

		if (process_vm_readv(c->pid, &l, 1, &rv, 1, 0) != (ssize_t)x->msg_len) {
			why = "cannot read the notification from the client";
			r = -EFAULT;
			goto out;
		}
		msg.len = x->msg_len;
	}
	src = write ? &local : &remote;
	dst = write ? &remote : &local;
	for (uint32_t i = 0; i < x->nr_entries; i++)
		p[i] = write ? (struct kv_piece){ e[i].local_off, e[i].remote_off, e[i].len } :
			       (struct kv_piece){ e[i].remote_off, e[i].local_off, e[i].len };
	r = check_batch(p, x->nr_entries, src, dst, &why);
	if (r)
		goto out;
	if (remote.seg->rm) {
		r = kv_side_resolve(&local);
		if (!r)
			r = kv_run_remote(c, sqe->user_data, p, x->nr_entries, write, &local, remote.seg,
					  x->notify_id, &msg, t0, &moved);
		if (r == 1) {	/* in flight: the stream threads complete it */
			kv_seg_put(remote.seg);
			free(e);
			free(p);
			return;
		}
		if (r)
			why = "transfer to another kcolld failed";
		goto out;
	}
	r = kv_side_resolve(&local);
	if (!r)
		r = kv_side_resolve(&remote);
	if (r) {
		why = "a segment was unregistered";
		goto out;
	}
	r = run_batch(c, p, x->nr_entries, src, dst, &moved);
	if (r) {
		why = r == -EIDRM ? "a segment was unregistered during the transfer" :
		      "copy failed (a process died or unmapped its buffer)";
		goto out;
	}
	if (x->notify_id != KCOLL_NOTIFY_NONE || msg.len) {
		/* Under the reader lock: the counters cannot be unmapped below us,
		 * and a segment unregistered meanwhile gets no late increment. */
		if (kv_lock_sides(&remote, &remote) == 0) {
			r = kv_notif_deliver(remote.seg, msg.sender, x->notify_id, msg.data, msg.len);
			kv_unlock_sides(&remote, &remote);
			if (r)
				why = r == -ENOBUFS ? "the owner's notification queue is full" :
				      "the remote segment was unregistered before the notify";
		} else {
			r = -EIDRM;
			why = "the remote segment was unregistered before the notify";
		}
	}
out:
	kd_buf_release(&local.buf);
	kd_buf_release(&remote.buf);
	if (local.seg)
		kv_seg_put(local.seg);
	if (remote.seg)
		kv_seg_put(remote.seg);
	free(e);
	free(p);
	atomic_fetch_add(r ? &kv_state.xfers_failed : &kv_state.xfers_ok, 1);
	atomic_fetch_add(&kv_state.bytes, moved);
	kd_metrics_kv(write, r, moved, kd_now_ns() - t0);
	if (r)
		kc_dbg("client %u (pid %d): transfer failed: %s (%s)", c->id, c->pid,
		       why ? why : "", strerror(-r));
	kd_client_post(c, sqe->user_data, r, moved, KCOLL_RANK_NONE, 0);
}

/* What the KV engine does in a client's life (main.c registers it with
 * client.c): XFER SQEs and ring-thread exit here, the client's end in
 * kv_seg.c. */
const struct kd_client_ops kd_kv_client_ops = {
	.name = "kv",
	.op_first = KCOLL_OP_XFER_WRITE,
	.op_last = KCOLL_OP_XFER_READ,
	.submit = kd_kv_submit,
	.closed = kd_kv_client_gone,
	.thread_done = kd_kv_thread_done,
};
