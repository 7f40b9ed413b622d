// SPDX-License-Identifier: MIT
/*
 * KV batches across hosts, the owner's side (docs/kv.md "Across hosts"):
 * a peer kcolld's KD_CONN_KV connection to one of our segments, from its
 * HELLO (kd_kv_accept checks the token) to the frames a serving thread
 * applies (kv_serve), and the RDMA session it may ask for (serve_rdma).
 * The initiator's side and the frame layout are in kv_send.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <kcoll/futex.h>

#include "kv_int.h"
#include "log.h"
#include "net.h"
#include "kv_rdma.h"
#include "kv_wire.h"

/* Apply one frame to the segment; entries already range-checked. */
static int frame_apply(struct kd_seg *s, uint32_t op, const struct kv_fent *fe, uint32_t nr,
		       uint8_t *buf, uint32_t notify_id)
{
	struct kv_side side = { .seg = s };
	struct iovec liov[1], riov[KV_ROUND_IOVS];
	uint64_t at = 0;
	int r = lock_sides(&side, &side);

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
	kd_buf_resolve(s->owner, s->addr, s->size, &side.buf);
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
		r = vm_err(op == KV_OP_WRITE ? process_vm_writev(s->pid, liov, 1, riov, k, 0) :
			   process_vm_readv(s->pid, liov, 1, riov, k, 0), bytes);
	}
	kd_buf_release(&side.buf);
out:
	unlock_sides(&side, &side);
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

	if (lock_sides(&side, &side))
		return 0;
	kd_buf_resolve(cn->seg->owner, cn->seg->addr, cn->seg->size, &side.buf);
	if (side.buf.direct) {
		for (uint32_t i = 0; i < nr; i++)
			iov[i] = (struct iovec){ side.buf.direct + fe[i].off, fe[i].len };
		r = io_iovs(cn->fd, iov, nr, false) ? -1 : 1;
	}
	kd_buf_release(&side.buf);
	unlock_sides(&side, &side);
	if (r < 0 && atomic_load(&cn->seg->dead)) {
		/* Unregistered under us: say so before the connection goes. */
		struct kv_resp rs = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
					      .len = sizeof(rs) }, .status = -EIDRM, .tag = UINT64_MAX };

		send(cn->fd, &rs, sizeof(rs), MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	return r;
}

/*
 * A MSG frame (header rq already read): its notification and counter, under
 * the segment's reader lock unless the caller holds it (an RDMA session).
 * Nonzero: the stream broke or broke the framing.
 */
static int serve_msg(struct kv_conn *cn, const struct kv_req *rq, bool locked)
{
	struct kd_seg *s = cn->seg;
	struct kv_side side = { .seg = s };
	struct kv_resp rs = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
				      .len = sizeof(rs) }, .tag = rq->tag };
	uint8_t data[KCOLL_NOTIF_MAX_BYTES];
	struct kv_msg km;

	if (rq->nr || rq->hdr.len < sizeof(*rq) + sizeof(km) ||
	    io_full(cn->fd, &km, sizeof(km), false) || !km.len || km.len > KCOLL_NOTIF_MAX_BYTES ||
	    rq->hdr.len != sizeof(*rq) + sizeof(km) + km.len || io_full(cn->fd, data, km.len, false))
		return -EPROTO;
	if (locked)
		rs.status = notif_deliver(s, km.sender, rq->notify_id, data, km.len);
	else if (lock_sides(&side, &side))
		rs.status = -EIDRM;
	else {
		rs.status = notif_deliver(s, km.sender, rq->notify_id, data, km.len);
		unlock_sides(&side, &side);
	}
	return io_full(cn->fd, &rs, sizeof(rs), true);
}

/*
 * The owner's side of an RDMA session (peer asked with KV_OP_RDMA on a
 * stream whose token was checked): register the segment in a PD of this
 * connection only, answer our address, base and rkey, then serve notifies
 * (WRITE_WITH_IMM, immediate = counter) until the peer closes or the
 * segment is unregistered. The reader lock is held for the whole session:
 * the peer writes into the segment at any time. seg_kill shuts the stream
 * down (SHUT_RD); this thread wakes, moves the QP to error and deregisters
 * the region (the rkey is dead), and only then lets seg_kill return.
 * 0: refused (answered; the stream goes on over TCP); 1: session over.
 */
static int serve_rdma(struct kv_conn *cn, const struct kv_rdma_hello *peer, uint64_t tag)
{
	struct kd_seg *s = cn->seg;
	struct kv_side side = { .seg = s };
	struct kv_rdma_hello me = { 0 };
	struct kv_resp rs = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
				      .len = sizeof(rs) + sizeof(me) }, .tag = tag };
	struct kv_rdma *k = NULL;
	bool loud, locked = false, armed = false;
	int status = 0, one = 1;

	if (!kv_rdma_wanted(me.why, sizeof(me.why), &loud)) {
		status = -EOPNOTSUPP;
	} else if (lock_sides(&side, &side)) {
		status = -EIDRM;
		snprintf(me.why, sizeof(me.why), "the segment was unregistered");
	} else {
		locked = true;
		kd_buf_resolve(s->owner, s->addr, s->size, &side.buf);
		if (!side.buf.direct) {
			status = -EOPNOTSUPP;
			snprintf(me.why, sizeof(me.why), "the owner's segment is not memory kcolld maps "
				 "(register kcoll_mem_alloc'd or kcoll_mem_register'ed memory for RDMA)");
		} else {
			status = kv_rdma_create(cn->fd, side.buf.direct, s->size, true, &k, me.why,
						sizeof(me.why));
		}
		if (!status)
			status = kv_rdma_connect(k, peer, 16, me.why, sizeof(me.why));
	}
	if (status) {
		kv_rdma_destroy(k);
		kd_buf_release(&side.buf);
		if (locked)
			unlock_sides(&side, &side);
		kc_dbg("kv: segment %u: rdma refused to a peer: %s", s->id, me.why);
		rs.status = status;
		return io_full(cn->fd, &rs, sizeof(rs), true) || io_full(cn->fd, &me, sizeof(me), true);
	}
	kv_rdma_hello_fill(k, &me);
	atomic_fetch_add(&kv.rdma_sessions, 1);
	setsockopt(cn->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	if (io_full(cn->fd, &rs, sizeof(rs), true) || io_full(cn->fd, &me, sizeof(me), true))
		goto out;
	for (;;) {
		struct ibv_wc wc[16];
		int got = kv_rdma_poll(k, wc, 16);
		struct pollfd pf[2] = { { .fd = cn->fd, .events = POLLIN },
					{ .fd = kv_rdma_fd(k), .events = POLLIN } };

		if (got < 0)
			goto out;
		for (int i = 0; i < got; i++) {
			struct kv_resp nr = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
						      .len = sizeof(nr) }, .tag = UINT32_MAX };
			uint32_t id = ntohl(wc[i].imm_data);

			if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM)
				goto out;	/* the peer's QP failed: the session is over */
			if (atomic_load(&s->dead)) {
				nr.status = -EIDRM;
			} else if (id >= s->nr_notify) {
				nr.status = -EINVAL;
			} else {
				__atomic_fetch_add(&s->counters[id], 1, __ATOMIC_SEQ_CST);
				kcoll_futex_wake(&s->counters[id], INT_MAX);
			}
			if (kv_rdma_post_recv(k, wc[i].wr_id) || io_full(cn->fd, &nr, sizeof(nr), true))
				goto out;
		}
		if (got)
			continue;
		if (!armed) {	/* arm, then poll once more for what came before */
			if (kv_rdma_arm(k))
				goto out;
			armed = true;
			continue;
		}
		armed = false;
		if (poll(pf, 2, -1) < 0 && errno != EINTR)
			goto out;
		if (pf[1].revents)
			kv_rdma_ack_event(k);
		/* A notification; else the peer closed, sent what an RDMA
		 * session does not carry, or seg_kill shut the stream down:
		 * the session is over. */
		if (pf[0].revents) {
			struct kv_req rq;

			if (!(pf[0].revents & POLLIN) || io_full(cn->fd, &rq, sizeof(rq), false) ||
			    rq.hdr.magic != KD_PEER_MAGIC || rq.hdr.type != KD_P_KV_REQ ||
			    rq.op != KV_OP_MSG || serve_msg(cn, &rq, true))
				goto out;
		}
	}
out:
	kv_rdma_revoke(k);	/* the rkey is dead before the lock is released */
	kd_buf_release(&side.buf);
	unlock_sides(&side, &side);
	if (atomic_load(&s->dead)) {
		rs = (struct kv_resp){ .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
					       .len = sizeof(rs) }, .status = -EIDRM, .tag = UINT64_MAX };
		send(cn->fd, &rs, sizeof(rs), MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	kv_rdma_destroy(k);
	return 1;
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

		if (io_full(cn->fd, &rq, sizeof(rq), false))
			break;
		if (rq.hdr.magic == KD_PEER_MAGIC && rq.hdr.type == KD_P_KV_REQ && rq.op == KV_OP_RDMA) {
			struct kv_rdma_hello h;

			if (rq.nr || rq.hdr.len != sizeof(rq) + sizeof(h) ||
			    io_full(cn->fd, &h, sizeof(h), false) || serve_rdma(cn, &h, rq.tag))
				break;	/* the RDMA session ended, or the stream broke */
			continue;	/* refused: the peer goes on over TCP */
		}
		if (rq.hdr.magic == KD_PEER_MAGIC && rq.hdr.type == KD_P_KV_REQ && rq.op == KV_OP_MSG) {
			if (serve_msg(cn, &rq, false))
				break;
			continue;
		}
		if (rq.hdr.magic != KD_PEER_MAGIC || rq.hdr.type != KD_P_KV_REQ ||
		    rq.op > KV_OP_NOTIFY || rq.nr > KV_FRAME_ENTRIES ||
		    io_full(cn->fd, fe, rq.nr * sizeof(*fe), false))
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
		if (rq.op == KV_OP_WRITE && io_full(cn->fd, buf, bytes, false))
			break;
		if (!status)
			status = frame_apply(s, rq.op, fe, rq.nr, buf, rq.notify_id);
answer:
		rs.status = status;
		rs.tag = rq.tag;
		rs.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
					   .len = sizeof(rs) + (rq.op == KV_OP_READ && !status ? bytes : 0) };
		if (io_full(cn->fd, &rs, sizeof(rs), true) ||
		    (rs.hdr.len > sizeof(rs) && io_full(cn->fd, buf, bytes, true)))
			break;
		if (!status && rq.op != KV_OP_NOTIFY)
			atomic_fetch_add(&kv.bytes, bytes);
	}
	free(buf);
	free(fe);
	free(iov);
	conn_unlink(s, cn);
	close(cn->fd);	/* only now: seg_kill must not shut down a reused number */
	seg_put(s);
	free(cn);
	return NULL;
}

void kd_kv_accept(int fd, const struct kd_p_hello *m)
{
	struct kv_ack ack = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_ACK, .len = sizeof(ack) },
			      .features = KV_ACK_F_MSG };
	struct kd_seg *s = seg_find(m->from_host);
	struct kv_conn *cn = NULL;
	pthread_attr_t attr;
	pthread_t tid;
	uint32_t next;

	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	sock_timeouts(fd, kd.timeout_ns);
	pthread_mutex_lock(&kv.lock);
	next = kv.next_id;
	pthread_mutex_unlock(&kv.lock);
	/* Our own nonce: a local client's import dressed up as another
	 * kcolld's loops back here, where only the token would be checked;
	 * same-host importers go through seg_import's uid check. */
	if (m->nonce == kd.nonce)
		ack.status = -EPERM;
	else if (!s)
		ack.status = m->from_host && m->from_host < next ? -EIDRM : -ENOENT;
	else if (!token_eq(s->token, m->token))
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
		conn_link(s, cn);
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&tid, &attr, kv_serve, cn)) {
			ack.status = -EAGAIN;	/* the peer sees the connection close */
			/* Not necessarily the head any more: a batch of ours may
			 * have added its streams meanwhile. */
			conn_unlink(s, cn);
		}
		pthread_attr_destroy(&attr);
	}
	if (!ack.status)
		return;
	kc_dbg("kv: refused a peer's connection to segment %u: %s", m->from_host,
	       strerror(-ack.status));
	close(fd);
	free(cn);
	if (s)
		seg_put(s);
}
