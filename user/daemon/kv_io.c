// SPDX-License-Identifier: MIT
/*
 * The KV session's wire (docs/kv.md "Across hosts"): blocking socket I/O
 * on a KD_CONN_KV connection and the exchanges that end a batch, both ends
 * of them, and the initiator's TCP transport (kv_xport_tcp, kv_xport.h):
 * a post is one KV_REQ frame on a stream, its event the KV_RESP. The owner's
 * side of the frames is kv_serve.c; the RDMA sessions (kv_rdma.c, whose
 * first TCP stream carries the same final NOTIFY or MSG) open a session's
 * streams with kv_remote_connect too, so this file lives below kv_send.c,
 * kv_serve.c and kv_rdma.c: it calls only the registry (kv_reg.c) and the
 * daemon's connect (net.c).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kv_int.h"
#include "iov.h"
#include "kv_wire.h"
#include "net.h"

int kv_io_full(int fd, void *buf, size_t n, bool out)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, MSG_WAITALL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k == 0 || errno != EAGAIN ? -ECONNRESET : -ETIMEDOUT;
		p += k;
		n -= k;
	}
	return 0;
}

void kv_sock_timeouts(int fd, int64_t ns)
{
	struct timeval tv = { .tv_sec = ns / 1000000000, .tv_usec = ns % 1000000000 / 1000 };

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void kv_remote_close_streams(struct kv_remote *rm)
{
	for (int i = 0; i < KV_MAX_STREAMS; i++) {
		if (rm->fd[i] >= 0)
			close(rm->fd[i]);
		rm->fd[i] = -1;
	}
}

/* kcoll_io_iovs with MSG_MORE: 0, -ETIMEDOUT (the socket's timeout) or
 * -ECONNRESET. */
int kv_io_iovs(int fd, struct iovec *iov, size_t n, bool out)
{
	int r = kcoll_io_iovs(fd, iov, n, out, true);

	return !r ? 0 : r == -EAGAIN ? -ETIMEDOUT : -ECONNRESET;
}

/* A stream broke: the owner may have said why first (-EIDRM, tag ~0). */
int kv_last_word(int fd, int err)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct kv_resp rs;

	if (poll(&p, 1, 100) != 1 || recv(fd, &rs, sizeof(rs), MSG_DONTWAIT) != sizeof(rs))
		return err;
	/* Unread answers of earlier frames may come first: those are fine. */
	while (rs.hdr.magic == KD_PEER_MAGIC && rs.hdr.type == KD_P_KV_RESP && rs.tag != UINT64_MAX &&
	       !rs.status && rs.hdr.len == sizeof(rs))
		if (recv(fd, &rs, sizeof(rs), MSG_DONTWAIT) != sizeof(rs))
			return err;
	return rs.hdr.magic == KD_PEER_MAGIC && rs.hdr.type == KD_P_KV_RESP && rs.status < 0 ?
	       rs.status : err;
}

static int notify_recv(int fd, uint64_t tag)
{
	struct kv_resp rs;
	int r = kv_io_full(fd, &rs, sizeof(rs), false);

	if (!r && (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP ||
		   rs.hdr.len != sizeof(rs) || (rs.tag != tag && !rs.status)))
		r = -EPROTO;
	return r ? r : rs.status > 0 ? -EPROTO : rs.status;
}

/* A batch's final frame out: NOTIFY, or MSG when m carries a notification. */
static int final_send(int fd, uint32_t id, const struct kv_msgout *m, uint64_t tag)
{
	struct kv_req rq = { .op = m->len ? KV_OP_MSG : KV_OP_NOTIFY, .notify_id = id, .tag = tag };
	struct kv_msg km = { .sender = m->sender, .len = m->len };
	struct iovec iov[3] = { { &rq, sizeof(rq) }, { &km, sizeof(km) },
				{ (void *)m->data, m->len } };

	if (!m->len) {
		rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ, .len = sizeof(rq) };
		return kv_io_full(fd, &rq, sizeof(rq), true);
	}
	rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ,
				   .len = sizeof(rq) + sizeof(km) + m->len };
	return kcoll_io_iovs(fd, iov, 3, true, false);
}

/* Its answer: 0 with the owner's verdict on a MSG in *ans, or the stream's
 * error (a NOTIFY's refusal is one, as it always was). */
static int final_recv(int fd, bool msg, uint64_t tag, int *ans)
{
	struct kv_resp rs;
	int r;

	*ans = 0;
	if (!msg)
		return notify_recv(fd, tag);
	r = kv_io_full(fd, &rs, sizeof(rs), false);
	if (r)
		return r;
	if (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP || rs.hdr.len != sizeof(rs) ||
	    rs.status > 0)
		return -EPROTO;
	if (rs.tag != tag)	/* the owner's last word before it closes, or garbage */
		return rs.status ? rs.status : -EPROTO;
	*ans = rs.status;
	return 0;
}

/*
 * Send the final frame and read its answer: 0 with the owner's verdict on a
 * MSG in *ans (-ENOBUFS, -EIDRM: the stream stays in step, the batch fails
 * and the streams go on), or the stream's error. A NOTIFY's refusal is the
 * stream's error, as it always was.
 */
int kv_final_xchg(int fd, uint32_t id, const struct kv_msgout *m, uint64_t tag, int *ans)
{
	int r = final_send(fd, id, m, tag);

	*ans = 0;
	return r ? r : final_recv(fd, m->len, tag, ans);
}

/*
 * A MSG frame (header rq already read): its notification and counter, under
 * the segment's reader lock unless the caller holds it (an RDMA session).
 * Nonzero: the stream broke or broke the framing.
 */
int kv_serve_msg(struct kv_conn *cn, const struct kv_req *rq, bool locked)
{
	struct kd_seg *s = cn->seg;
	struct kv_side side = { .seg = s };
	struct kv_resp rs = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
				      .len = sizeof(rs) }, .tag = rq->tag };
	uint8_t data[KCOLL_NOTIF_MAX_BYTES];
	struct kv_msg km;

	if (rq->nr || rq->hdr.len < sizeof(*rq) + sizeof(km) ||
	    kv_io_full(cn->fd, &km, sizeof(km), false) || !km.len || km.len > KCOLL_NOTIF_MAX_BYTES ||
	    rq->hdr.len != sizeof(*rq) + sizeof(km) + km.len || kv_io_full(cn->fd, data, km.len, false))
		return -EPROTO;
	if (locked)
		rs.status = kv_notif_deliver(s, km.sender, rq->notify_id, data, km.len);
	else if (kv_lock_sides(&side, &side))
		rs.status = -EIDRM;
	else {
		rs.status = kv_notif_deliver(s, km.sender, rq->notify_id, data, km.len);
		kv_unlock_sides(&side, &side);
	}
	return kv_io_full(cn->fd, &rs, sizeof(rs), true);
}

/* Open the streams that are not open; the owner's verdict on the token. */
int kv_remote_connect(struct kv_remote *rm)
{
	struct kd_p_hostinfo me;

	kd_net_self(&me);
	for (int i = 0; i < rm->nstreams; i++) {
		struct kd_p_hello h = { 0 };
		struct kv_ack ack;
		int fd, r;

		if (rm->fd[i] >= 0) {
			/* Between batches a healthy stream has nothing to read:
			 * readable means the owner dropped it (idle past its
			 * KCOLL_TIMEOUT_MS, restart): reconnect, not fail. */
			struct pollfd pf = { .fd = rm->fd[i], .events = POLLIN | POLLRDHUP };

			if (poll(&pf, 1, 0) == 0)
				continue;
			close(rm->fd[i]);
			rm->fd[i] = -1;
		}
		fd = kd_net_connect(rm->w.addrs[i % rm->w.naddrs], rm->w.port);
		if (fd < 0)
			return fd == -ETIMEDOUT ? -EHOSTUNREACH : fd;
		kv_sock_timeouts(fd, kd.timeout_ns);
		h.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_HELLO, .len = sizeof(h) };
		h.version = KD_PEER_VERSION;
		h.kind = KD_CONN_KV;
		memcpy(h.token, rm->w.token, sizeof(h.token));
		h.from_host = rm->w.seg_id;
		h.stream = i;
		h.nonce = me.nonce;
		r = kv_io_full(fd, &h, sizeof(h), true);
		if (!r)
			r = kv_io_full(fd, &ack, sizeof(ack.hdr), false);
		/* A REJECT (older peer, bad version) is longer than an ACK: its
		 * header says so; either way the connection is over. */
		if (!r && (ack.hdr.magic != KD_PEER_MAGIC || ack.hdr.type != KD_P_KV_ACK ||
			   ack.hdr.len != sizeof(ack)))
			r = -EPROTO;
		if (!r)
			r = kv_io_full(fd, &ack.status, sizeof(ack) - sizeof(ack.hdr), false);
		if (!r)
			r = ack.status > 0 ? -EPROTO : ack.status;
		if (r) {
			close(fd);
			return r;
		}
		if (i == 0)
			rm->features = ack.features;
		rm->fd[i] = fd;
	}
	return 0;
}

/* ---- kv_xport_tcp: the initiator's frames ---------------------------------
 *
 * A post is one frame: KV_REQ {op WRITE|READ, nr, tag = cookie} kv_fent[nr]
 * [payload of a write], its event the owner's KV_RESP {status, tag}
 * [payload of a read]; one post unanswered per stream. A mapped local
 * segment is sent from and received into in place, under its reader lock
 * (seg_kill shuts the stream down instead of waiting for the peer); other
 * memory goes through the stream's frame buffer and process_vm_* (GPU
 * memory: the GPU's staged copies, kv_side_vm).
 */

/* Copy between a frame buffer and the local segment (under its lock). */
static int local_io(const struct kv_xfer *x, uint8_t *buf)
{
	struct kv_side *l = x->local;
	struct iovec liov[KV_ROUND_IOVS], riov[KV_ROUND_IOVS];
	uint64_t at = 0;
	int r = kv_lock_sides(l, l);

	if (r)
		return r;
	for (uint32_t i = 0; i < x->n && !r;) {
		uint32_t k = 0;
		size_t bytes = 0;

		for (; i < x->n && k < KV_ROUND_IOVS; i++, k++) {
			const struct kv_piece *p = &x->p[i];
			/* write: the local side is the source; read: the destination */
			uint64_t off = x->write ? p->src : p->dst;

			if (l->buf.direct) {
				if (x->write)
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
		r = kv_side_vm(l, liov, 1, riov, k, bytes, !x->write);
	}
	kv_unlock_sides(l, l);
	return r;
}

/* A write frame straight from the mapped local segment, under its reader
 * lock: seg_kill shuts this stream down instead of waiting for the peer. */
static int frame_send_mapped(int fd, struct kv_chan *ch, struct kv_req *rq)
{
	const struct kv_xfer *x = &ch->x;
	struct kv_side *l = x->local;
	size_t n = 2;
	int r = kv_lock_sides(l, l);

	if (r)
		return r;
	ch->iov[0] = (struct iovec){ rq, sizeof(*rq) };
	ch->iov[1] = (struct iovec){ ch->fe, x->n * sizeof(*ch->fe) };
	for (uint32_t i = 0; i < x->n; i++)
		ch->iov[n++] = (struct iovec){ l->buf.direct + x->p[i].src, x->p[i].len };
	r = kv_io_iovs(fd, ch->iov, n, true);
	kv_unlock_sides(l, l);
	return r;
}

/* The stream's entry and iovec arrays, and a frame buffer for unmapped
 * memory, made on first need and kept with the import. */
static int chan_bufs(struct kv_chan *ch, bool mapped)
{
	if (!ch->fe)
		ch->fe = malloc(KV_FRAME_ENTRIES * sizeof(*ch->fe));
	if (!ch->iov)
		ch->iov = malloc((KV_FRAME_ENTRIES + 2) * sizeof(*ch->iov));
	if (!mapped && !ch->buf)
		ch->buf = malloc(KV_FRAME_BYTES);
	return ch->fe && ch->iov && (mapped || ch->buf) ? 0 : -ENOMEM;
}

static int tcp_post(struct kv_remote *rm, int s, const struct kv_xfer *x, uint64_t cookie)
{
	struct kv_chan *ch = &rm->ch[s];
	struct kv_req rq = { 0 };
	struct iovec iov[3];
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = x->write ? 3 : 2 };
	size_t total;
	int r = chan_bufs(ch, x->local->buf.direct);

	if (r)
		return r;
	ch->x = *x;
	ch->cookie = cookie;
	ch->final = 0;
	for (uint32_t i = 0; i < x->n; i++)
		ch->fe[i] = (struct kv_fent){ x->write ? x->p[i].dst : x->p[i].src, x->p[i].len };
	rq.op = x->write ? KV_OP_WRITE : KV_OP_READ;
	rq.nr = x->n;
	rq.tag = cookie;
	total = sizeof(rq) + x->n * sizeof(*ch->fe) + (x->write ? x->bytes : 0);
	rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ, .len = (uint32_t)total };
	if (x->write && x->local->buf.direct)
		return frame_send_mapped(rm->fd[s], ch, &rq);
	if (x->write && (r = local_io(x, ch->buf)))
		return r;
	iov[0] = (struct iovec){ &rq, sizeof(rq) };
	iov[1] = (struct iovec){ ch->fe, x->n * sizeof(*ch->fe) };
	iov[2] = (struct iovec){ ch->buf, x->bytes };
	while (total) {
		ssize_t k = sendmsg(rm->fd[s], &mh, MSG_NOSIGNAL);

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
static int frame_recv_mapped(int fd, struct kv_chan *ch)
{
	const struct kv_xfer *x = &ch->x;
	struct kv_side *l = x->local;
	int r = kv_lock_sides(l, l);

	if (r)
		return r;
	for (uint32_t i = 0; i < x->n; i++)
		ch->iov[i] = (struct iovec){ l->buf.direct + x->p[i].dst, x->p[i].len };
	r = kv_io_iovs(fd, ch->iov, x->n, false);
	kv_unlock_sides(l, l);
	return r;
}

static int frame_recv(int fd, struct kv_chan *ch)
{
	const struct kv_xfer *x = &ch->x;
	struct kv_resp rs;
	int r = kv_io_full(fd, &rs, sizeof(rs), false);

	if (r)
		return r;
	if (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP)
		return -EPROTO;
	if (rs.status)	/* an error may answer an earlier frame or none (tag ~0) */
		return rs.status > 0 ? -EPROTO : rs.status;
	if (rs.tag != ch->cookie || rs.hdr.len != sizeof(rs) + (!x->write ? x->bytes : 0))
		return -EPROTO;
	if (!x->write && x->local->buf.direct)
		return frame_recv_mapped(fd, ch);
	if (!x->write) {
		r = kv_io_full(fd, ch->buf, x->bytes, false);
		if (!r)
			r = local_io(x, ch->buf);
	}
	return r;
}

static int tcp_write_notify(struct kv_remote *rm, int s, uint32_t notify_id, const struct kv_msgout *m,
			    uint64_t cookie)
{
	struct kv_chan *ch = &rm->ch[s];

	ch->cookie = cookie;
	ch->final = m->len ? 2 : 1;
	return final_send(rm->fd[s], notify_id, m, cookie);
}

/* The answer of the stream's post: blocks (the socket's timeout). A frame's
 * refusal, like a NOTIFY's, is the stream's error; a MSG's is the event's. */
static int tcp_poll(struct kv_remote *rm, int s, struct kv_xev *ev, int n)
{
	struct kv_chan *ch = &rm->ch[s];
	int r, ans = 0;

	(void)n;
	r = ch->final ? final_recv(rm->fd[s], ch->final == 2, ch->cookie, &ans) : frame_recv(rm->fd[s], ch);
	if (r)
		return r;
	*ev = (struct kv_xev){ .cookie = ch->cookie, .status = ans };
	return 1;
}

/* A stream broke (-ECONNRESET): say why when we can, the local segment
 * unregistered under it or the owner's last word. */
static int tcp_why(struct kv_remote *rm, int s, struct kv_side *local, int err)
{
	if (err != -ECONNRESET)
		return err;
	return atomic_load(&local->seg->dead) ? -EIDRM : kv_last_word(rm->fd[s], err);
}

static int tcp_nchan(const struct kv_remote *rm)
{
	return rm->nstreams;
}

static int tcp_open(struct kv_remote *rm, struct kv_side *local)
{
	(void)local;
	return kv_remote_connect(rm);
}

static int tcp_begin(struct kv_remote *rm, struct kv_side *local)
{
	(void)rm;
	(void)local;
	return 0;
}

static int tcp_end(struct kv_remote *rm, struct kv_side *local, int err, uint64_t moved)
{
	(void)rm;
	(void)local;
	(void)moved;
	return err;
}

/* Frames small enough that a batch of a few MiB gives every stream two (a
 * slow stream takes fewer) and little is in flight, large enough to keep
 * per-frame costs low (docs/perf/kv.md section 6a). */
const struct kv_xport_ops kv_xport_tcp = {
	.name = "tcp",
	.depth = 1,
	.max_pieces = KV_FRAME_ENTRIES,
	.frame_min = 1u << 20,
	.frame_max = 2u << 20,	/* an owner takes up to KV_FRAME_BYTES */
	.queued = true,
	.nchan = tcp_nchan,
	.open = tcp_open,
	.close = kv_remote_close_streams,
	.begin = tcp_begin,
	.end = tcp_end,
	.write = tcp_post,
	.read = tcp_post,
	.write_notify = tcp_write_notify,
	.poll = tcp_poll,
	.why = tcp_why,
};
