// SPDX-License-Identifier: MIT
/*
 * The KV session's wire (docs/kv.md "Across hosts"): blocking socket I/O
 * on a KD_CONN_KV connection and the exchanges that end a batch, both ends
 * of them. The TCP frames (kv_send.c, kv_serve.c) and the RDMA sessions
 * (kv_rdma.c, whose first TCP stream carries the same final NOTIFY or MSG)
 * speak them, and both open a session's streams with kv_remote_connect, so
 * they live below all three: this file calls only the registry (kv_reg.c)
 * and the daemon's connect (net.c).
 */
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <string.h>

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

static int notify_send(int fd, uint32_t id, uint64_t tag)
{
	struct kv_req rq = { .op = KV_OP_NOTIFY, .notify_id = id, .tag = tag };

	rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ, .len = sizeof(rq) };
	return kv_io_full(fd, &rq, sizeof(rq), true);
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

/*
 * Send the final frame and read its answer: 0 with the owner's verdict on a
 * MSG in *ans (-ENOBUFS, -EIDRM: the stream stays in step, the batch fails
 * and the streams go on), or the stream's error. A NOTIFY's refusal is the
 * stream's error, as it always was.
 */
int kv_final_xchg(int fd, uint32_t id, const struct kv_msgout *m, uint64_t tag, int *ans)
{
	struct kv_req rq = { .op = KV_OP_MSG, .notify_id = id, .tag = tag };
	struct kv_msg km = { .sender = m->sender, .len = m->len };
	struct iovec iov[3] = { { &rq, sizeof(rq) }, { &km, sizeof(km) },
				{ (void *)m->data, m->len } };
	struct kv_resp rs;
	int r;

	*ans = 0;
	if (!m->len) {
		r = notify_send(fd, id, tag);
		return r ? r : notify_recv(fd, tag);
	}
	rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ,
				   .len = sizeof(rq) + sizeof(km) + m->len };
	r = kcoll_io_iovs(fd, iov, 3, true, false);
	if (!r)
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
