// SPDX-License-Identifier: MIT
/*
 * KV batches across hosts, the initiator's side (docs/kv.md "Across
 * hosts"): the initiator's kcolld talks to the owner's (kv_serve.c) over TCP
 * streams (KD_CONN_KV connections, opened on the first transfer of an
 * import), or over RDMA where both sides can.
 *
 *   initiator -> owner   HELLO {kind KV, token, from_host = seg_id, stream}
 *   owner -> initiator   KV_ACK {status}: 0, -ENOENT, -EIDRM or -EACCES
 *   initiator -> owner   KV_REQ {op, nr, notify_id, tag} kv_fent[nr] [payload]
 *   owner -> initiator   KV_RESP {status, tag} [payload of a read]
 *
 * A batch is validated whole first (kv_local.c), then cut into frames of
 * KV_FRAME_MIN..KV_FRAME_CUT and at most KV_FRAME_ENTRIES blocks (small
 * blocks coalesce, large ones are split). A one-frame batch with nothing
 * in flight goes out on stream 0 from the ring thread; any other joins the
 * import's queue, and each stream's thread takes the oldest frame nobody
 * took whenever its last one was answered: the streams stay busy across a
 * client's batches (up to KV_QUEUE_MAX in flight) and a slow stream
 * carries fewer frames. The notify is one last NOTIFY frame once every
 * data frame of the batch was answered. The owner receives a frame in
 * place under the segment's reader lock (into a buffer first when the
 * segment is not mapped); unregistering shuts the connections down rather
 * than wait for a slow peer.
 * Another transport (RDMA, kv_rdma.c) replaces the frame exchange of
 * frame_xchg() and the connection set of kv_remote_connect() (kv_io.c); the batch logic
 * stays.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kv_int.h"
#include "iov.h"
#include "log.h"
#include "config.h"
#include "metrics.h"
#include "net.h"
#include "kv_rdma.h"
#include "kv_wire.h"

#define KV_FRAME_CUT		(2u << 20)	/* the largest an initiator sends */
#define KV_FRAME_MIN		(1u << 20)	/* and so a stream per MiB of a batch at most */
#define KV_QUEUE_MAX		4	/* batches in flight per import */
#define KV_NOTIFY_FRAME		UINT32_MAX	/* a flight entry for the batch's notify */

struct kv_stream;

struct kv_batch;

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
		free(rm->fe[i]);
		free(rm->iov[i]);
	}
	kv_rdma_drop(rm);
	kv_remote_close_streams(rm);
	pthread_cond_destroy(&rm->go);
	pthread_cond_destroy(&rm->space);
	pthread_mutex_destroy(&rm->wlock);
	pthread_mutex_destroy(&rm->lock);
	free(rm);
}

/* Between batches a healthy stream has nothing to read. */
static bool fd_idle(int fd)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN | POLLRDHUP };

	return fd >= 0 && poll(&pf, 1, 0) == 0;
}

struct kv_frame {
	uint32_t first, n;	/* sub-pieces */
	uint64_t bytes;
};

/* One stream's view of a batch, for sending its frames and reading their answers. */
struct kv_stream {
	struct kv_side *local;
	const struct kv_piece *sp;	/* sub-pieces: src/dst in the batch's direction */
	const struct kv_frame *frames;
	bool write;
	int fd;
	uint64_t tag;			/* frame fi's tag: tag | fi */
	uint64_t moved;
	struct iovec *iov;		/* KV_FRAME_ENTRIES + 2: a frame sent from the mapping */
	struct kv_fent *fe;		/* KV_FRAME_ENTRIES: a frame's entries */
};

/* A batch handed to the stream threads (kv_run_remote), until its last answer. */
struct kv_batch {
	struct kd_client *c;		/* held */
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

/* Copy between a frame buffer and the local segment (under its lock). */
static int local_io(struct kv_stream *st, const struct kv_frame *f, uint8_t *buf)
{
	struct kv_side *l = st->local;
	struct iovec liov[KV_ROUND_IOVS], riov[KV_ROUND_IOVS];
	uint64_t at = 0;
	int r = kv_lock_sides(l, l);

	if (r)
		return r;
	for (uint32_t i = 0; i < f->n && !r;) {
		uint32_t k = 0;
		size_t bytes = 0;

		for (; i < f->n && k < KV_ROUND_IOVS; i++, k++) {
			const struct kv_piece *p = &st->sp[f->first + i];
			/* write: the local side is the source; read: the destination */
			uint64_t off = st->write ? p->src : p->dst;

			if (l->buf.direct) {
				if (st->write)
					memcpy(buf + at, l->buf.direct + off, p->len);
				else
					memcpy(l->buf.direct + off, buf + at, p->len);
			}
			riov[k] = (struct iovec){ (void *)(uintptr_t)(l->seg->addr + off), p->len };
			at += p->len;
			bytes += p->len;
		}
		if (l->buf.direct)
			continue;
		liov[0] = (struct iovec){ buf + at - bytes, bytes };
		r = kv_vm_err(st->write ? process_vm_readv(l->seg->pid, liov, 1, riov, k, 0) :
			      process_vm_writev(l->seg->pid, liov, 1, riov, k, 0), bytes);
	}
	kv_unlock_sides(l, l);
	return r;
}

/* A write frame straight from the mapped local segment, under its reader
 * lock: seg_kill shuts this stream down instead of waiting for the peer. */
static int frame_send_mapped(struct kv_stream *st, const struct kv_frame *f, struct kv_req *rq,
			     struct kv_fent *fe)
{
	struct kv_side *l = st->local;
	size_t n = 2;
	int r = kv_lock_sides(l, l);

	if (r)
		return r;
	st->iov[0] = (struct iovec){ rq, sizeof(*rq) };
	st->iov[1] = (struct iovec){ fe, f->n * sizeof(*fe) };
	for (uint32_t i = 0; i < f->n; i++) {
		const struct kv_piece *p = &st->sp[f->first + i];

		st->iov[n++] = (struct iovec){ l->buf.direct + p->src, p->len };
	}
	r = kv_io_iovs(st->fd, st->iov, n, true);
	kv_unlock_sides(l, l);
	return r;
}

static int frame_send(struct kv_stream *st, uint32_t fi, uint8_t *buf, struct kv_fent *fe)
{
	const struct kv_frame *f = &st->frames[fi];
	struct kv_req rq = { 0 };
	struct iovec iov[3];
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = st->write ? 3 : 2 };
	size_t total;
	int r;

	for (uint32_t i = 0; i < f->n; i++) {
		const struct kv_piece *p = &st->sp[f->first + i];

		fe[i] = (struct kv_fent){ st->write ? p->dst : p->src, p->len };
	}
	rq.op = st->write ? KV_OP_WRITE : KV_OP_READ;
	rq.nr = f->n;
	rq.tag = st->tag | fi;
	total = sizeof(rq) + f->n * sizeof(*fe) + (st->write ? f->bytes : 0);
	rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ, .len = (uint32_t)total };
	if (st->write && st->local->buf.direct)
		return frame_send_mapped(st, f, &rq, fe);
	if (st->write && (r = local_io(st, f, buf)))
		return r;
	iov[0] = (struct iovec){ &rq, sizeof(rq) };
	iov[1] = (struct iovec){ fe, f->n * sizeof(*fe) };
	iov[2] = (struct iovec){ buf, f->bytes };
	while (total) {
		ssize_t k = sendmsg(st->fd, &mh, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 && errno == EAGAIN ? -ETIMEDOUT : -ECONNRESET;
		total -= k;
		while (k && (size_t)k >= mh.msg_iov->iov_len) {
			k -= mh.msg_iov->iov_len;
			mh.msg_iov++;
			mh.msg_iovlen--;
		}
		if (k) {
			mh.msg_iov->iov_base = (uint8_t *)mh.msg_iov->iov_base + k;
			mh.msg_iov->iov_len -= k;
		}
	}
	return 0;
}

/* A read frame's payload straight into the mapped local segment, under its
 * reader lock (seg_kill shuts this stream down rather than wait). */
static int frame_recv_mapped(struct kv_stream *st, const struct kv_frame *f)
{
	struct kv_side *l = st->local;
	int r = kv_lock_sides(l, l);

	if (r)
		return r;
	for (uint32_t i = 0; i < f->n; i++) {
		const struct kv_piece *p = &st->sp[f->first + i];

		st->iov[i] = (struct iovec){ l->buf.direct + p->dst, p->len };
	}
	r = kv_io_iovs(st->fd, st->iov, f->n, false);
	kv_unlock_sides(l, l);
	return r;
}

static int frame_recv(struct kv_stream *st, uint32_t fi, uint8_t *buf)
{
	const struct kv_frame *f = &st->frames[fi];
	struct kv_resp rs;
	int r = kv_io_full(st->fd, &rs, sizeof(rs), false);

	if (r)
		return r;
	if (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP)
		return -EPROTO;
	if (rs.status)	/* an error may answer an earlier frame or none (tag ~0) */
		return rs.status > 0 ? -EPROTO : rs.status;
	if (rs.tag != (st->tag | fi) || rs.hdr.len != sizeof(rs) + (!st->write ? f->bytes : 0))
		return -EPROTO;
	if (!st->write && st->local->buf.direct) {
		r = frame_recv_mapped(st, f);
	} else if (!st->write) {
		r = kv_io_full(st->fd, buf, f->bytes, false);
		if (!r)
			r = local_io(st, f, buf);
	}
	if (!r)
		st->moved += f->bytes;
	return r;
}

/*
 * Frame fi out on st's stream and its answer in. A mapped local segment is
 * sent from and received into in place; other memory needs a frame buffer
 * (*buf, made on first need: a write's frame is staged before it is sent,
 * a read's answer received before it is copied out).
 */
static int frame_xchg(struct kv_stream *st, uint32_t fi, uint8_t **buf)
{
	int r;

	if (!st->local->buf.direct && !*buf && !(*buf = malloc(KV_FRAME_BYTES)))
		return -ENOMEM;
	r = frame_send(st, fi, *buf, st->fe);
	return r ? r : frame_recv(st, fi, *buf);
}

/* A stream broke (-ECONNRESET): say why when we can, the local segment
 * unregistered under it or the owner's last word. */
static int stream_err(const struct kv_stream *st, int r)
{
	if (r != -ECONNRESET)
		return r;
	return atomic_load(&st->local->seg->dead) ? -EIDRM : kv_last_word(st->fd, r);
}

/* A batch's last frame, once all its data landed: NOTIFY, or MSG when it
 * carries a notification (which bumps the counter too). */
static bool has_final(uint32_t notify_id, const struct kv_msgout *m)
{
	return notify_id != KCOLL_NOTIFY_NONE || m->len;
}

/* Stream s's view of batch b for frame_send / frame_recv. */
static struct kv_stream batch_stream(struct kv_remote *rm, struct kv_batch *b, int s)
{
	return (struct kv_stream){ .local = &b->local, .sp = b->sp, .frames = b->fr,
				   .write = b->write, .fd = rm->fd[s], .tag = b->tag,
				   .iov = rm->iov[s], .fe = rm->fe[s] };
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
 * Stream s's thread: take the oldest frame no stream took yet (of any
 * queued batch), send it, read its answer, and again: each stream has one
 * frame unanswered at a time, so every stream carries a batch's frames as
 * soon as it is free, a stream the kernel serves slower takes fewer, and
 * at most streams x frame bytes are in flight (docs/perf/kv.md section 6a:
 * more in flight moved less here). The thread reading a batch's last
 * answer sends its notify on its own stream (all its data landed), or ends
 * it. A stream that fails marks the import broken (stream_broke); frames
 * other streams carry are still answered, and the next batch after the
 * queue drained opens the streams afresh.
 */
static void *stream_worker(void *arg)
{
	struct kv_remote *rm = ((struct kv_worker *)arg)->rm;
	int s = ((struct kv_worker *)arg)->idx;
	uint8_t *buf = NULL;	/* frames of unmapped memory, made on first need */

	pthread_mutex_lock(&rm->wlock);
	for (;;) {
		struct kv_batch *b = NULL;
		struct kv_stream st;
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
		st = batch_stream(rm, b, s);
		r = frame_xchg(&st, fi, &buf);
		while (!r) {	/* answered: count it; the batch's notify, if its turn */
			bool notify, ended;

			pthread_mutex_lock(&rm->wlock);
			b->moved += st.moved;
			st.moved = 0;
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
			r = kv_final_xchg(st.fd, b->notify_id, &b->msg, b->tag | KV_NOTIFY_FRAME, &ans);
		}
		r = stream_err(&st, r);
		pthread_mutex_lock(&rm->wlock);
		if (r)
			stream_broke(rm, &b, 1, r);
	}
	pthread_mutex_unlock(&rm->wlock);
	free(buf);
	return NULL;
}

/* The entry and iovec arrays of streams 0..used-1, kept with the import. */
static int stream_bufs(struct kv_remote *rm, uint32_t used)
{
	for (uint32_t s = 0; s < used; s++) {
		if (!rm->fe[s])
			rm->fe[s] = malloc(KV_FRAME_ENTRIES * sizeof(*rm->fe[s]));
		if (!rm->iov[s])
			rm->iov[s] = malloc((KV_FRAME_ENTRIES + 2) * sizeof(*rm->iov[s]));
		if (!rm->fe[s] || !rm->iov[s])
			return -ENOMEM;
	}
	return 0;
}

/* Streams 0..nstreams-1: their buffers and threads (kept with the import). */
static int stream_threads(struct kv_remote *rm)
{
	int r = stream_bufs(rm, (uint32_t)rm->nstreams);

	for (int s = 0; !r && s < rm->nstreams; s++) {
		if (rm->started[s])
			continue;
		rm->wk[s] = (struct kv_worker){ rm, s };
		r = -pthread_create(&rm->tid[s], NULL, stream_worker, &rm->wk[s]);
		rm->started[s] = !r;
	}
	return r;
}

/*
 * A batch with one import. Over RDMA, or as a single frame while no batch is
 * in flight, it runs here (0 or an error); otherwise it joins the import's
 * queue for the stream threads (1: the batch posts its own completion and
 * now holds local's segment and mapping).
 */
int kv_run_remote(struct kd_client *c, uint64_t user_data, const struct kv_piece *p, uint32_t n,
		  bool write, struct kv_side *local, struct kd_seg *rs, uint32_t notify_id,
		  const struct kv_msgout *msg, int64_t t0, uint64_t *moved)
{
	struct kv_remote *rm = rs->rm;
	struct kv_piece *sp = NULL;
	struct kv_frame *fr = NULL;
	struct kv_batch *b;
	uint64_t nsp = 0, total = 0, fb;
	uint32_t nfr = 0;
	bool busy;
	int r;

	/* Frames small enough that a batch of a few MiB gives every stream
	 * two (a slow stream takes fewer) and little is in flight, large
	 * enough to keep per-frame costs low. A batch of up to 1 MiB is one
	 * frame: with no batch in flight and no request behind it in the
	 * ring it runs right here on stream 0 (handing a few hundred KiB to
	 * a stream thread costs more than it wins when the client waits for
	 * each batch: docs/perf/kv.md section 6). With requests behind it, it
	 * joins the queue, and so do they: run here, it would hold them in
	 * the ring until its answer, one batch at a time for good. */
	for (uint32_t i = 0; i < n; i++)
		total += p[i].len;
	fb = (total / (2 * rm->nstreams) + 4095) & ~4095ULL;
	fb = fb < KV_FRAME_MIN ? KV_FRAME_MIN : fb > KV_FRAME_CUT ? KV_FRAME_CUT : fb;
	for (uint32_t i = 0; i < n; i++)
		nsp += (p[i].len + fb - 1) / fb;
	sp = malloc((nsp ? nsp : 1) * sizeof(*sp));
	fr = malloc((nsp ? nsp : 1) * sizeof(*fr));
	if (!sp || !fr) {
		r = -ENOMEM;
		goto out;
	}
	/* Split what exceeds a frame; then fill frames in order. */
	nsp = 0;
	for (uint32_t i = 0; i < n; i++)
		for (uint64_t off = 0; off < p[i].len; off += fb) {
			uint64_t len = p[i].len - off < fb ? p[i].len - off : fb;

			sp[nsp++] = (struct kv_piece){ p[i].src + off, p[i].dst + off, len };
		}
	for (uint32_t i = 0; i < nsp; i++) {
		if (!nfr || fr[nfr - 1].n == KV_FRAME_ENTRIES ||
		    fr[nfr - 1].bytes + sp[i].len > fb)
			fr[nfr++] = (struct kv_frame){ i, 0, 0 };
		fr[nfr - 1].n++;
		fr[nfr - 1].bytes += sp[i].len;
	}
	pthread_mutex_lock(&rm->lock);
	/* Join the batches in flight if they are healthy, few enough and use
	 * the same local segment (unregistering one shuts the streams down:
	 * that must not fail another segment's batch). */
	pthread_mutex_lock(&rm->wlock);
	/* A notification waits for the queue to drain: then the batch's
	 * final frame cannot overtake an earlier batch's (in order per
	 * import). */
	while (rm->nq && (rm->broken || !nfr || msg->len || rm->nq >= KV_QUEUE_MAX ||
			  rm->q_tail->local.seg != local->seg))
		pthread_cond_wait(&rm->space, &rm->wlock);
	busy = rm->nq;
	if (!busy && rm->broken) {
		kv_remote_close_streams(rm);	/* mid-frame state unknown: start afresh */
		rm->broken = 0;
	}
	pthread_mutex_unlock(&rm->wlock);
	if (!busy) {
		if (rm->rd && (!local->buf.direct || !fd_idle(rm->fd[0]))) {
			/* A batch from unmapped memory goes over TCP, and fd[0]
			 * is in RDMA mode on the owner's side; or the owner
			 * ended the session: start afresh either way. */
			kv_rdma_drop(rm);
			kv_remote_close_streams(rm);
		}
		r = kv_remote_connect(rm);
		if (!r && msg->len && !(rm->features & KV_ACK_F_MSG))
			r = -EOPNOTSUPP;	/* an older kcolld: tell before any byte moves */
		if (!r && local->buf.direct) {
			r = kv_rdma_ready(rm, local);
			if (r == 0) {
				r = kv_run_rdma(c, p, n, write, local, rm, notify_id, msg, moved);
				/* A full queue is the owner's answer: the session goes on. */
				if (r && r != -ENOBUFS) {
					kv_rdma_drop(rm);
					kv_remote_close_streams(rm);
				}
				goto out_unlock;
			}
			r = r == 1 ? 0 : r;
		}
		if (r)
			goto out_unlock;
		/* An empty batch has nothing for the streams: here, always. */
		if (!nfr || (nfr == 1 && !c->sq_behind)) {
			struct kv_stream st = { .local = local, .sp = sp, .frames = fr, .write = write,
						.fd = rm->fd[0], .tag = ++rm->seq << 32 };
			struct kv_conn node = { .fd = rm->fd[0], .how = SHUT_RDWR, .seg = local->seg };
			uint8_t *buf = NULL;
			int ans = 0;

			r = stream_bufs(rm, 1);
			if (r)
				goto out_unlock;
			st.iov = rm->iov[0];
			st.fe = rm->fe[0];
			kv_conn_link(local->seg, &node);
			r = !nfr ? 0 : atomic_load(&c->stop) || atomic_load(&c->dead) ? -ECANCELED :
			    stream_err(&st, frame_xchg(&st, 0, &buf));
			kv_conn_unlink(local->seg, &node);
			free(buf);
			*moved += st.moved;
			if (!r && has_final(notify_id, msg))
				r = kv_final_xchg(rm->fd[0], notify_id, msg, UINT32_MAX, &ans);
			if (r)
				kv_remote_close_streams(rm);	/* mid-frame state unknown */
			r = r ? r : ans;
			goto out_unlock;
		}
	}
	r = stream_threads(rm);
	b = r ? NULL : calloc(1, sizeof(*b));
	if (!b) {
		r = r ? r : -ENOMEM;
		goto out_unlock;
	}
	*b = (struct kv_batch){ .c = c, .user_data = user_data, .local = *local, .write = write,
				.t0 = t0, .notify_id = notify_id, .sp = sp, .fr = fr, .nfr = nfr,
				.tag = ++rm->seq << 32,
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
out:
	free(sp);
	free(fr);
	return r;
}
