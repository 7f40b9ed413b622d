// SPDX-License-Identifier: MIT
/*
 * KV batches across hosts, the owner's side (docs/kv.md "Across hosts"):
 * a peer kcolld's KD_CONN_KV connection to one of our segments, from its
 * HELLO (kd_kv_accept checks the token) to the frames a serving thread
 * applies (kv_serve); the RDMA session it may ask for is kv_rdma.c's
 * kv_serve_rdma.
 * The initiator's side and the frame layout are in kv_send.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <kcoll/futex.h>

#include "kv_int.h"
#include "log.h"
#include "wire.h"
#include "kv_rdma.h"
#include "kv_wire.h"

/* Apply one frame to the segment; entries already range-checked. */
static int frame_apply(struct kd_seg *s, uint32_t op, const struct kv_fent *fe, uint32_t nr,
		       uint8_t *buf, uint32_t notify_id)
{
	struct kv_side side = { .seg = s };
	struct iovec liov[1], riov[KV_ROUND_IOVS];
	uint64_t at = 0;
	int r = kv_lock_sides(&side, &side);

	if (r)
		return r;
	if (op == KV_OP_NOTIFY) {
		if (notify_id >= s->nr_notify) {
			r = -EINVAL;
		} else {
			__atomic_fetch_add(&s->counters[notify_id], 1, __ATOMIC_SEQ_CST);
			kcoll_futex_wake(&s->counters[notify_id], INT_MAX);
		}
		goto out;
	}
	kv_seg_buf(s, &side.buf);
	for (uint32_t i = 0; i < nr && !r;) {
		uint32_t k = 0;
		size_t bytes = 0;

		for (; i < nr && k < KV_ROUND_IOVS; i++, k++) {
			if (side.buf.direct) {
				if (op == KV_OP_WRITE)
					memcpy(side.buf.direct + fe[i].off, buf + at, fe[i].len);
				else
					memcpy(buf + at, side.buf.direct + fe[i].off, fe[i].len);
			}
			riov[k] = (struct iovec){ (void *)(uintptr_t)(s->addr + fe[i].off), fe[i].len };
			at += fe[i].len;
			bytes += fe[i].len;
		}
		if (side.buf.direct)
			continue;
		liov[0] = (struct iovec){ buf + at - bytes, bytes };
		r = kv_side_vm(&side, liov, 1, riov, k, bytes, op == KV_OP_WRITE);
	}
	kd_buf_release(&side.buf);
out:
	kv_unlock_sides(&side, &side);
	return r;
}

/*
 * A write frame into a mapped segment: receive it in place, under the reader
 * lock (seg_kill shuts the connection down rather than wait for a slow
 * peer). 1: done; 0: not mapped or dead, receive into the buffer instead;
 * -1: the connection failed (the frame may be partly written: the
 * initiator gets an error for the batch).
 */
static int recv_direct(struct kv_conn *cn, const struct kv_fent *fe, uint32_t nr,
		       struct iovec *iov)
{
	struct kv_side side = { .seg = cn->seg };
	int r = 0;

	if (kv_lock_sides(&side, &side))
		return 0;
	kv_seg_buf(cn->seg, &side.buf);
	if (side.buf.direct) {
		for (uint32_t i = 0; i < nr; i++)
			iov[i] = (struct iovec){ side.buf.direct + fe[i].off, fe[i].len };
		r = kv_io_iovs(cn->fd, iov, nr, false) ? -1 : 1;
	}
	kd_buf_release(&side.buf);
	kv_unlock_sides(&side, &side);
	if (r < 0 && atomic_load(&cn->seg->dead)) {
		/* Unregistered under us: say so before the connection goes. */
		struct kv_resp rs = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
					      .len = sizeof(rs) }, .status = -EIDRM, .tag = UINT64_MAX };

		send(cn->fd, &rs, sizeof(rs), MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	return r;
}

static void *kv_serve(void *arg)
{
	struct kv_conn *cn = arg;
	struct kd_seg *s = cn->seg;
	uint8_t *buf = malloc(KV_FRAME_BYTES);
	struct kv_fent *fe = malloc(KV_FRAME_ENTRIES * sizeof(*fe));
	struct iovec *iov = malloc(KV_FRAME_ENTRIES * sizeof(*iov));

	while (buf && fe && iov) {
		struct kv_req rq;
		struct kv_resp rs = { 0 };
		uint64_t bytes = 0;
		int status = 0;

		if (kv_io_full(cn->fd, &rq, sizeof(rq), false))
			break;
		if (rq.hdr.magic == KD_PEER_MAGIC && rq.hdr.type == KD_P_KV_REQ && rq.op == KV_OP_RDMA) {
			struct kv_rdma_hello h;

			if (rq.nr || rq.hdr.len != sizeof(rq) + sizeof(h) ||
			    kv_io_full(cn->fd, &h, sizeof(h), false) || kv_serve_rdma(cn, &h, rq.tag))
				break;	/* the RDMA session ended, or the stream broke */
			continue;	/* refused: the peer goes on over TCP */
		}
		if (rq.hdr.magic == KD_PEER_MAGIC && rq.hdr.type == KD_P_KV_REQ && rq.op == KV_OP_MSG) {
			if (kv_serve_msg(cn, &rq, false))
				break;
			continue;
		}
		if (rq.hdr.magic != KD_PEER_MAGIC || rq.hdr.type != KD_P_KV_REQ ||
		    rq.op > KV_OP_NOTIFY || rq.nr > KV_FRAME_ENTRIES ||
		    kv_io_full(cn->fd, fe, rq.nr * sizeof(*fe), false))
			break;
		for (uint32_t i = 0; i < rq.nr; i++) {
			if (fe[i].off > s->size || fe[i].len > s->size - fe[i].off)
				status = -ERANGE;
			bytes += fe[i].len;
		}
		if (bytes > KV_FRAME_BYTES ||
		    rq.hdr.len != sizeof(rq) + rq.nr * sizeof(*fe) + (rq.op == KV_OP_WRITE ? bytes : 0))
			break;	/* not our protocol: drop the connection */
		if (rq.op == KV_OP_WRITE && !status) {
			int got = recv_direct(cn, fe, rq.nr, iov);

			if (got < 0)
				break;
			if (got)
				goto answer;	/* landed in place */
		}
		if (rq.op == KV_OP_WRITE && kv_io_full(cn->fd, buf, bytes, false))
			break;
		if (!status)
			status = frame_apply(s, rq.op, fe, rq.nr, buf, rq.notify_id);
answer:
		rs.status = status;
		rs.tag = rq.tag;
		rs.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
					   .len = sizeof(rs) + (rq.op == KV_OP_READ && !status ? bytes : 0) };
		if (kv_io_full(cn->fd, &rs, sizeof(rs), true) ||
		    (rs.hdr.len > sizeof(rs) && kv_io_full(cn->fd, buf, bytes, true)))
			break;
		if (!status && rq.op != KV_OP_NOTIFY)
			atomic_fetch_add(&kv_state.bytes, bytes);
	}
	free(buf);
	free(fe);
	free(iov);
	kv_conn_unlink(s, cn);
	close(cn->fd);	/* only now: seg_kill must not shut down a reused number */
	kv_seg_put(s);
	free(cn);
	return NULL;
}

int kd_kv_accept(int fd, const struct kd_p_hello *m, char *why, size_t len)
{
	struct kv_ack ack = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_ACK, .len = sizeof(ack) },
			      .features = KV_ACK_F_MSG };
	struct kd_seg *s = kv_seg_find(m->from_host);
	struct kv_conn *cn = NULL;
	pthread_attr_t attr;
	pthread_t tid;
	uint32_t next;

	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	kv_sock_timeouts(fd, kd.timeout_ns);
	pthread_mutex_lock(&kv_state.lock);
	next = kv_state.next_id;
	pthread_mutex_unlock(&kv_state.lock);
	/* Our own nonce: a local client's import dressed up as another
	 * kcolld's loops back here, where only the token would be checked;
	 * same-host importers go through seg_import's uid check. */
	if (m->nonce == kd.nonce)
		ack.status = -EPERM;
	else if (!s)
		ack.status = m->from_host && m->from_host < next ? -EIDRM : -ENOENT;
	else if (!kv_token_eq(s->token, m->token))
		ack.status = -EACCES;
	else if (!(cn = malloc(sizeof(*cn))))
		ack.status = -ENOMEM;
	/* Answer first (a fresh socket: it goes out without blocking), then
	 * the serving thread owns the fd. */
	if (send(fd, &ack, sizeof(ack), MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof(ack) && !ack.status)
		ack.status = -ECONNRESET;
	if (!ack.status) {
		cn->fd = fd;
		cn->how = SHUT_RD;	/* kv_serve may still answer -EIDRM */
		cn->seg = s;
		kv_conn_link(s, cn);
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&tid, &attr, kv_serve, cn)) {
			ack.status = -EAGAIN;	/* the peer sees the connection close */
			/* Not necessarily the head any more: a batch of ours may
			 * have added its streams meanwhile. */
			kv_conn_unlink(s, cn);
		}
		pthread_attr_destroy(&attr);
	}
	if (!ack.status)
		return 0;
	kc_dbg("kv: refused a peer's connection to segment %u: %s", m->from_host,
	       strerror(-ack.status));
	close(fd);
	free(cn);
	if (s)
		kv_seg_put(s);
	return 0;	/* answered with its own verdict (KD_P_KV_ACK) */
}
