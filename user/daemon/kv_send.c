// SPDX-License-Identifier: MIT
/*
 * KV batches across hosts, the initiator's side (docs/kv.md "Across
 * hosts"): the batch logic over the one-sided interface of kv_xport.h. The
 * initiator's kcolld talks to the owner's (kv_serve.c) over TCP streams
 * (KD_CONN_KV connections, opened on the first transfer of an import), or
 * over RDMA where both sides can; which one, each session's open decides
 * (kv_xport_rdma first, then kv_xport_tcp).
 *
 *   initiator -> owner   HELLO {kind KV, token, from_host = seg_id, stream}
 *   owner -> initiator   KV_ACK {status}: 0, -ENOENT, -EIDRM or -EACCES
 *   then the transport's posts and their answers (kv_io.c, kv_rdma.c)
 *
 * A batch is validated whole first (kv_local.c), then cut into posts of
 * the transport's size (TCP: frames of 1..2 MiB and at most
 * KV_FRAME_ENTRIES blocks, small blocks coalesce, large ones are split;
 * RDMA: one block of at most 4 MiB). On the ring thread a batch runs on
 * channel 0 with up to the transport's depth of posts unanswered: over
 * RDMA always, over TCP a one-frame batch while nothing is in flight. Any
 * other TCP batch joins the import's queue, and each stream's thread takes
 * the oldest frame nobody took whenever its last one was answered: the
 * streams stay busy across a client's batches (up to KV_QUEUE_MAX in
 * flight) and a slow stream carries fewer frames. The notify is the
 * transport's write_notify once every post of the batch was answered.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kv_int.h"
#include "log.h"
#include "config.h"
#include "metrics.h"
#include "kv_wire.h"

#define KV_QUEUE_MAX		4	/* batches in flight per import */
#define KV_NOTIFY_FRAME		UINT32_MAX	/* a flight entry for the batch's notify */

int kv_remote_import(const struct kcoll_seg_wire *w, struct kd_seg **out)
{
	struct kd_seg *s;
	struct kv_remote *rm;
	int64_t streams = kcoll_knob_ll("KCOLL_KV_STREAMS");

	if (!w->port || !w->naddrs || w->naddrs > KCOLL_ID_MAX_ADDRS)
		return -EREMOTE;
	s = calloc(1, sizeof(*s));
	rm = calloc(1, sizeof(*rm));
	if (!s || !rm) {
		free(s);
		free(rm);
		return -ENOMEM;
	}
	rm->w = *w;
	rm->nstreams = streams < 1 ? 1 : streams > KV_MAX_STREAMS ? KV_MAX_STREAMS : (int)streams;
	for (int i = 0; i < KV_MAX_STREAMS; i++)
		rm->fd[i] = -1;
	pthread_mutex_init(&rm->lock, NULL);
	pthread_mutex_init(&rm->wlock, NULL);
	pthread_cond_init(&rm->go, NULL);
	pthread_cond_init(&rm->space, NULL);
	s->rm = rm;
	s->rm_free = kv_remote_free;
	s->size = w->size;
	s->nr_notify = w->nr_notify;
	pthread_rwlock_init(&s->lock, NULL);
	pthread_mutex_init(&s->conns_lock, NULL);
	atomic_init(&s->refs, 1);
	*out = s;
	return 0;
}

void kv_remote_free(struct kv_remote *rm)
{
	pthread_mutex_lock(&rm->wlock);
	while (rm->nq)	/* the batches in flight end first (their clients may be gone) */
		pthread_cond_wait(&rm->space, &rm->wlock);
	rm->quit = true;
	pthread_cond_broadcast(&rm->go);
	pthread_mutex_unlock(&rm->wlock);
	for (int i = 0; i < KV_MAX_STREAMS; i++) {
		if (rm->started[i])
			pthread_join(rm->tid[i], NULL);
		free(rm->ch[i].fe);
		free(rm->ch[i].iov);
		free(rm->ch[i].buf);
	}
	if (rm->xo)
		rm->xo->close(rm);
	kv_remote_close_streams(rm);
	pthread_cond_destroy(&rm->go);
	pthread_cond_destroy(&rm->space);
	pthread_mutex_destroy(&rm->wlock);
	pthread_mutex_destroy(&rm->lock);
	free(rm);
}

/* A batch handed to the stream threads (kv_run_remote), until its last answer. */
struct kv_batch {
	struct kd_client *c;		/* held */
	const struct kv_xport_ops *xo;
	uint64_t user_data;
	struct kv_side local;		/* held: the segment and its mapping */
	bool write;
	uint32_t notify_id;
	struct kv_msgout msg;		/* the notification, sent with the notify */
	struct kv_piece *sp;
	struct kv_frame *fr;
	uint32_t nfr;
	uint64_t tag;			/* its frames' tags: tag | frame */
	int64_t t0;			/* taken off the ring (metrics) */
	/* under the import's wlock: */
	uint32_t next;			/* the first frame no stream took */
	uint32_t left;			/* answers due: frames, and the notify or msg */
	bool notify_sent;
	int err;			/* the first error */
	uint64_t moved;
	struct kv_batch *qnext;
	struct kv_conn node[KV_MAX_STREAMS];	/* in local's conns: seg_kill shuts the streams */
};

/* Nothing came for a while: may the batch wait on? */
static int batch_stalled(struct kd_client *c, struct kv_side *local, int64_t deadline)
{
	if (atomic_load(&local->seg->dead))
		return -EIDRM;
	if (atomic_load(&c->stop) || atomic_load(&c->dead))
		return -ECANCELED;
	return kd_now_ns() > deadline ? -ETIMEDOUT : 0;
}

/* A batch's last frame, once all its data landed: NOTIFY, or MSG when it
 * carries a notification (which bumps the counter too). */
static bool has_final(uint32_t notify_id, const struct kv_msgout *m)
{
	return notify_id != KCOLL_NOTIFY_NONE || m->len;
}

/* n of b's answers came (or never will: err). Under wlock. true: b is
 * over and out of the queue: batch_end it once wlock is dropped. */
static bool batch_account(struct kv_remote *rm, struct kv_batch *b, int err, uint32_t n)
{
	struct kv_batch **pp;

	if (err && !b->err)
		b->err = err;
	b->left -= n;
	if (b->left == 1 && b->err && !b->notify_sent && has_final(b->notify_id, &b->msg)) {
		b->notify_sent = true;	/* only the notify is due: it will not be sent */
		b->left = 0;
	}
	if (b->left)
		return false;
	for (pp = &rm->q_head; *pp != b; pp = &(*pp)->qnext)
		;
	*pp = b->qnext;
	if (rm->q_tail == b)
		rm->q_tail = NULL;
	for (struct kv_batch *q = rm->q_head; q; q = q->qnext)
		rm->q_tail = q;
	rm->nq--;
	pthread_cond_broadcast(&rm->space);
	return true;
}

/* No stream takes b's frames any more (an error, or its client left): the
 * untaken frames and an unsent notify are counted out. */
static bool batch_stop(struct kv_remote *rm, struct kv_batch *b, int err)
{
	uint32_t untaken = b->nfr - b->next;

	b->next = b->nfr;
	if (!b->notify_sent && has_final(b->notify_id, &b->msg)) {
		b->notify_sent = true;
		untaken++;
	}
	return batch_account(rm, b, err, untaken);
}

static void batch_free(struct kv_batch *b)
{
	free(b->sp);
	free(b->fr);
	free(b);
}

/* Post b's completion and let go of what it held (not under wlock). */
static void batch_end(struct kv_remote *rm, struct kv_batch *b)
{
	struct kd_seg *ls = b->local.seg;

	for (int s = 0; s < rm->nstreams; s++)
		kv_conn_unlink(ls, &b->node[s]);
	atomic_fetch_add(b->err ? &kv_state.xfers_failed : &kv_state.xfers_ok, 1);
	atomic_fetch_add(&kv_state.bytes, b->moved);
	kd_metrics_kv(b->write, b->err, b->moved, kd_now_ns() - b->t0);
	if (b->err)
		kc_dbg("client %u (pid %d): transfer failed: transfer to another kcolld failed (%s)",
		       b->c->id, b->c->pid, strerror(-b->err));
	kd_client_post(b->c, b->user_data, b->err, b->moved, KCOLL_RANK_NONE, 0);
	kd_buf_release(&b->local.buf);
	kv_seg_put(ls);
	kd_client_put(b->c);
	batch_free(b);
}

/* Under wlock: the oldest frame no stream took, skipping (and ending)
 * batches that may not go on; NULL: none. */
static struct kv_batch *frame_take(struct kv_remote *rm, uint32_t *fi)
{
	struct kv_batch *b = rm->q_head;

	while (b) {
		if (b->next == b->nfr) {
			b = b->qnext;
			continue;
		}
		if (!b->err && !atomic_load(&b->c->stop) && !atomic_load(&b->c->dead)) {
			*fi = b->next++;
			return b;
		}
		if (batch_stop(rm, b, b->err ? b->err : -ECANCELED)) {
			pthread_mutex_unlock(&rm->wlock);
			batch_end(rm, b);
			pthread_mutex_lock(&rm->wlock);
		}
		b = rm->q_head;	/* the queue may have changed */
	}
	return NULL;
}

/* Under wlock: stream failed with err: fail the n batches of what it carried
 * and every batch with frames nobody took; no stream takes another. */
static void stream_broke(struct kv_remote *rm, struct kv_batch **carried, uint32_t n, int err)
{
	rm->broken = err;
	for (uint32_t k = 0; k < n; k++)
		if (batch_account(rm, carried[k], err, 1)) {
			pthread_mutex_unlock(&rm->wlock);
			batch_end(rm, carried[k]);
			pthread_mutex_lock(&rm->wlock);
		}
	for (struct kv_batch *q = rm->q_head; q;) {
		if (q->next < q->nfr && batch_stop(rm, q, err)) {
			pthread_mutex_unlock(&rm->wlock);
			batch_end(rm, q);
			pthread_mutex_lock(&rm->wlock);
			q = rm->q_head;
			continue;
		}
		q = q->qnext;
	}
}

/*
 * One post on channel s and its event: frame fi of b, or (KV_NOTIFY_FRAME)
 * b's final step. 0 with the event's status in *ans, or the channel's error.
 */
static int chan_xchg(struct kv_remote *rm, int s, struct kv_batch *b, uint32_t fi, int *ans)
{
	const struct kv_xport_ops *xo = b->xo;
	int64_t deadline = kd_now_ns() + kd.timeout_ns;
	struct kv_xev ev;
	int r;

	if (fi == KV_NOTIFY_FRAME) {
		r = xo->write_notify(rm, s, b->notify_id, &b->msg, b->tag | fi);
	} else {
		struct kv_xfer x = { .local = &b->local, .p = b->sp + b->fr[fi].first, .n = b->fr[fi].n,
				     .bytes = b->fr[fi].bytes, .write = b->write };

		r = (b->write ? xo->write : xo->read)(rm, s, &x, b->tag | fi);
	}
	while (!r) {
		int got = xo->poll(rm, s, &ev, 1);

		if (got > 0) {
			*ans = ev.status;
			return 0;
		}
		r = got < 0 ? got : batch_stalled(b->c, &b->local, deadline);
	}
	return r;
}

/*
 * Stream s's thread: take the oldest frame no stream took yet (of any
 * queued batch), post it, wait for its answer, and again: each stream has
 * one frame unanswered at a time, so every stream carries a batch's frames
 * as soon as it is free, a stream the kernel serves slower takes fewer, and
 * at most streams x frame bytes are in flight (docs/perf/kv.md section 6a:
 * more in flight moved less here). The thread reading a batch's last
 * answer posts its notify on its own stream (all its data landed), or ends
 * it. A stream that fails marks the import broken (stream_broke); frames
 * other streams carry are still answered, and the next batch after the
 * queue drained opens the streams afresh.
 */
static void *stream_worker(void *arg)
{
	struct kv_remote *rm = ((struct kv_worker *)arg)->rm;
	int s = ((struct kv_worker *)arg)->idx;

	pthread_mutex_lock(&rm->wlock);
	for (;;) {
		struct kv_batch *b = NULL;
		uint32_t fi = 0;
		int r, ans = 0;	/* ans: the owner's verdict on a MSG frame */

		if (!rm->broken)
			b = frame_take(rm, &fi);
		if (!b) {
			if (rm->quit)
				break;
			pthread_cond_wait(&rm->go, &rm->wlock);
			continue;
		}
		pthread_mutex_unlock(&rm->wlock);
		r = chan_xchg(rm, s, b, fi, &ans);
		r = r ? r : ans;	/* a data post's failure breaks the stream */
		ans = 0;
		while (!r) {	/* answered: count it; the batch's notify, if its turn */
			bool notify, ended;

			pthread_mutex_lock(&rm->wlock);
			if (fi != KV_NOTIFY_FRAME)
				b->moved += b->fr[fi].bytes;
			fi = KV_NOTIFY_FRAME;
			ended = batch_account(rm, b, ans, 1);
			notify = !ended && b->left == 1 && !b->notify_sent &&
				 has_final(b->notify_id, &b->msg);
			if (notify)
				b->notify_sent = true;	/* left's last 1 is its answer */
			pthread_mutex_unlock(&rm->wlock);
			if (ended)
				batch_end(rm, b);
			if (!notify)
				break;
			r = chan_xchg(rm, s, b, KV_NOTIFY_FRAME, &ans);
		}
		if (r)
			r = b->xo->why(rm, s, &b->local, r);
		pthread_mutex_lock(&rm->wlock);
		if (r)
			stream_broke(rm, &b, 1, r);
	}
	pthread_mutex_unlock(&rm->wlock);
	return NULL;
}

/* The queue's threads, one per channel (kept with the import). */
static int stream_threads(struct kv_remote *rm, const struct kv_xport_ops *xo)
{
	int r = 0;

	for (int s = 0; !r && s < xo->nchan(rm); s++) {
		if (rm->started[s])
			continue;
		rm->wk[s] = (struct kv_worker){ rm, s };
		r = -pthread_create(&rm->tid[s], NULL, stream_worker, &rm->wk[s]);
		rm->started[s] = !r;
	}
	return r;
}

/*
 * Cut a batch into posts of xo's size: a share of the batch per channel
 * twice over (a batch of a few MiB gives every stream two frames, a slow
 * stream takes fewer, and little is in flight), clamped to the
 * transport's bounds; what exceeds a post is split, then posts are filled
 * in order with up to max_pieces pieces.
 */
int kv_batch_cut(const struct kv_xport_ops *xo, int nchan, const struct kv_piece *p, uint32_t n,
		 struct kv_piece **psp, struct kv_frame **pfr, uint32_t *pnfr)
{
	struct kv_piece *sp;
	struct kv_frame *fr;
	uint64_t nsp = 0, total = 0, fb;
	uint32_t nfr = 0;

	for (uint32_t i = 0; i < n; i++)
		total += p[i].len;
	fb = (total / (2 * (uint64_t)nchan) + 4095) & ~4095ULL;
	fb = fb < xo->frame_min ? xo->frame_min : fb > xo->frame_max ? xo->frame_max : fb;
	for (uint32_t i = 0; i < n; i++)
		nsp += (p[i].len + fb - 1) / fb;
	sp = malloc((nsp ? nsp : 1) * sizeof(*sp));
	fr = malloc((nsp ? nsp : 1) * sizeof(*fr));
	if (!sp || !fr) {
		free(sp);
		free(fr);
		return -ENOMEM;
	}
	nsp = 0;
	for (uint32_t i = 0; i < n; i++)
		for (uint64_t off = 0; off < p[i].len; off += fb) {
			uint64_t len = p[i].len - off < fb ? p[i].len - off : fb;

			sp[nsp++] = (struct kv_piece){ p[i].src + off, p[i].dst + off, len };
		}
	for (uint32_t i = 0; i < nsp; i++) {
		if (!nfr || fr[nfr - 1].n == xo->max_pieces || fr[nfr - 1].bytes + sp[i].len > fb)
			fr[nfr++] = (struct kv_frame){ i, 0, 0 };
		fr[nfr - 1].n++;
		fr[nfr - 1].bytes += sp[i].len;
	}
	*psp = sp;
	*pfr = fr;
	*pnfr = nfr;
	return 0;
}

/*
 * A batch on the ring thread, on channel 0: posts up to the transport's
 * depth unanswered, then, once every one was answered, the final step. On
 * error the session is closed (mid-exchange state unknown), except for the
 * owner's verdict on a notification (-ENOBUFS: the session goes on).
 */
static int batch_here(struct kv_remote *rm, const struct kv_xport_ops *xo, struct kd_client *c,
		      struct kv_side *local, bool write, const struct kv_piece *sp,
		      const struct kv_frame *fr, uint32_t nfr, uint32_t notify_id,
		      const struct kv_msgout *msg, uint64_t *moved)
{
	/* seg_kill of the local segment shuts fd[0] down: a wait on it wakes. */
	struct kv_conn node = { .fd = rm->fd[0], .how = SHUT_RDWR, .seg = local->seg };
	int64_t deadline = kd_now_ns() + kd.timeout_ns;
	uint64_t tag = ++rm->seq << 32, bytes = 0;
	uint32_t next = 0, out = 0;
	int r, ans = 0;

	kv_conn_link(local->seg, &node);
	r = xo->begin(rm, local);
	while (!r && (next < nfr || out)) {
		struct kv_xev ev[32];
		int got;

		while (!r && next < nfr && out < xo->depth) {
			struct kv_xfer x = { .local = local, .p = sp + fr[next].first, .n = fr[next].n,
					     .bytes = fr[next].bytes, .write = write };

			r = atomic_load(&c->stop) || atomic_load(&c->dead) ? -ECANCELED :
			    (write ? xo->write : xo->read)(rm, 0, &x, tag | next);
			out += !r;
			next++;
		}
		if (r)
			break;
		got = xo->poll(rm, 0, ev, 32);
		if (got < 0)
			r = got;
		for (int k = 0; k < got; k++) {
			out--;
			if (!ev[k].status)
				bytes += fr[(uint32_t)ev[k].cookie].bytes;
			else if (!r)
				r = ev[k].status;
		}
		if (got > 0)
			deadline = kd_now_ns() + kd.timeout_ns;
		else if (!r)
			r = batch_stalled(c, local, deadline);
	}
	r = xo->end(rm, local, r, bytes);
	kv_conn_unlink(local->seg, &node);
	*moved += bytes;
	if (!r && has_final(notify_id, msg)) {
		struct kv_xev ev;

		deadline = kd_now_ns() + kd.timeout_ns;
		r = xo->write_notify(rm, 0, notify_id, msg, tag | KV_NOTIFY_FRAME);
		while (!r) {
			int got = xo->poll(rm, 0, &ev, 1);

			if (got > 0) {
				ans = ev.status;
				break;
			}
			r = got < 0 ? got : batch_stalled(c, local, deadline);
		}
	}
	if (r) {
		r = xo->why(rm, 0, local, r);
		xo->close(rm);
	}
	return r ? r : ans;
}

/* The transports in the order a session's open asks them. */
static const struct kv_xport_ops *const kv_xports[] = { &kv_xport_rdma, &kv_xport_tcp };

/*
 * A batch with one import. On the ring thread (over RDMA, or as a single
 * TCP frame while no batch is in flight) it runs here (0 or an error);
 * otherwise it joins the import's queue for the stream threads (1: the
 * batch posts its own completion and now holds local's segment and
 * mapping).
 */
int kv_run_remote(struct kd_client *c, uint64_t user_data, const struct kv_piece *p, uint32_t n,
		  bool write, struct kv_side *local, struct kd_seg *rs, uint32_t notify_id,
		  const struct kv_msgout *msg, int64_t t0, uint64_t *moved)
{
	struct kv_remote *rm = rs->rm;
	const struct kv_xport_ops *xo;
	struct kv_piece *sp = NULL;
	struct kv_frame *fr = NULL;
	struct kv_batch *b;
	uint32_t nfr = 0;
	bool busy;
	int r = 1;

	pthread_mutex_lock(&rm->lock);
	/* Join the batches in flight if they are healthy, few enough and use
	 * the same local segment (unregistering one shuts the streams down:
	 * that must not fail another segment's batch). */
	pthread_mutex_lock(&rm->wlock);
	/* A notification waits for the queue to drain: then the batch's
	 * final frame cannot overtake an earlier batch's (in order per
	 * import). */
	while (rm->nq && (rm->broken || !n || msg->len || rm->nq >= KV_QUEUE_MAX ||
			  rm->q_tail->local.seg != local->seg))
		pthread_cond_wait(&rm->space, &rm->wlock);
	busy = rm->nq;
	if (!busy && rm->broken) {
		rm->xo->close(rm);	/* mid-frame state unknown: start afresh */
		rm->broken = 0;
	}
	pthread_mutex_unlock(&rm->wlock);
	/* Nothing in flight: the session's transport for this batch, the
	 * first whose open takes it (RDMA needs mapped memory both sides). */
	for (size_t i = 0; !busy && r == 1 && i < sizeof(kv_xports) / sizeof(kv_xports[0]); i++) {
		r = kv_xports[i]->open(rm, local);
		if (!r)
			rm->xo = kv_xports[i];
	}
	if (!busy && !r && msg->len && !(rm->features & KV_ACK_F_MSG))
		r = -EOPNOTSUPP;	/* an older kcolld: tell before any byte moves */
	if (!busy && r)
		goto out_unlock;
	xo = rm->xo;
	r = kv_batch_cut(xo, xo->nchan(rm), p, n, &sp, &fr, &nfr);
	if (r)
		goto out_unlock;
	/* A one-frame TCP batch with no batch in flight and no request behind
	 * it in the ring runs right here on stream 0 (handing a few hundred
	 * KiB to a stream thread costs more than it wins when the client
	 * waits for each batch: docs/perf/kv.md section 6). With requests
	 * behind it, it joins the queue, and so do they: run here, it would
	 * hold them in the ring until its answer, one batch at a time for
	 * good. An empty batch has nothing for the streams: here, always. */
	if (!busy && (!xo->queued || !nfr || (nfr == 1 && !c->sq_behind))) {
		r = batch_here(rm, xo, c, local, write, sp, fr, nfr, notify_id, msg, moved);
		goto out_unlock;
	}
	r = stream_threads(rm, xo);
	b = r ? NULL : calloc(1, sizeof(*b));
	if (!b) {
		r = r ? r : -ENOMEM;
		goto out_unlock;
	}
	*b = (struct kv_batch){ .c = c, .xo = xo, .user_data = user_data, .local = *local,
				.write = write, .t0 = t0, .notify_id = notify_id, .sp = sp, .fr = fr,
				.nfr = nfr, .tag = ++rm->seq << 32,
				.left = nfr + has_final(notify_id, msg) };
	b->msg.sender = msg->sender;
	b->msg.len = msg->len;
	memcpy(b->msg.data, msg->data, msg->len);
	kd_client_get(c);
	local->seg = NULL;	/* the batch's now */
	local->buf = (struct kd_buf){ 0 };
	for (int s = 0; s < rm->nstreams; s++) {
		b->node[s] = (struct kv_conn){ .fd = rm->fd[s], .how = SHUT_RDWR, .seg = b->local.seg };
		kv_conn_link(b->local.seg, &b->node[s]);
	}
	pthread_mutex_lock(&rm->wlock);
	if (rm->q_tail)
		rm->q_tail->qnext = b;
	else
		rm->q_head = b;
	rm->q_tail = b;
	rm->nq++;
	pthread_cond_broadcast(&rm->go);
	pthread_mutex_unlock(&rm->wlock);
	pthread_mutex_unlock(&rm->lock);
	return 1;
out_unlock:
	pthread_mutex_unlock(&rm->lock);
	free(sp);
	free(fr);
	return r;
}
