// SPDX-License-Identifier: MIT
/*
 * Everything RDMA of the KV engine (kv_rdma.h, docs/kv.md "Across hosts over
 * RDMA"), in three parts:
 *
 *   the verbs connection  built on the verbs layer (rdma/rdma.h): its device
 *                         table, GID choice and endpoint connect; the PD is
 *                         this file's own, one per connection, so that an
 *                         rkey handed to one peer for one segment reaches
 *                         nothing else
 *   the initiator's       kv_xport_rdma (kv_xport.h): WRITEs/READs and the
 *   transport             notify over an import's connection, set up over
 *                         the import's first TCP stream; kv_send.c's batch
 *                         logic drives it
 *   the owner's session   kv_serve_rdma, asked for on a stream that
 *                         kv_serve.c serves
 *
 * The TCP frames both sides fall back to are kv_io.c's (kv_xport_tcp) and
 * kv_serve.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kcoll/futex.h>

#include "config.h"
#include "kv_int.h"
#include "kv_rdma.h"
#include "kv_wire.h"
#include "log.h"

/* ---- the verbs connection ------------------------------------------------ */

#define KV_RDMA_SQ	256
#define KV_RDMA_RQ	16

struct kv_rdma {
	struct kcoll_rdma_ep *ep;	/* one QP, its own CQ and channel */
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	uint8_t *base;
	bool remote;
	/* the initiator's batch (kv_xport_rdma) */
	uint32_t inflight;		/* posted, not completed */
	bool armed, locked;
	bool imm_out;			/* the notify's WRITE_WITH_IMM is posted */
	bool msg_due;			/* a MSG's verdict waits for poll */
	int msg_ans;
	uint64_t imm_cookie;
};

bool kv_rdma_wanted(char *why, size_t whylen, bool *loud)
{
	const char *want = kcoll_knob_str("KCOLL_NET_XPORT");

	*loud = !strcmp(want, "rdma");
	if (!strcmp(want, "tcp")) {
		snprintf(why, whylen, "KCOLL_NET_XPORT=tcp");
		return false;
	}
	if (!*loud && strcmp(want, "auto")) {
		snprintf(why, whylen, "KCOLL_NET_XPORT='%s' is not auto, rdma or tcp", want);
		return false;
	}
	if (kcoll_rdma_init()) {
		snprintf(why, whylen, "%s", kcoll_rdma_why());
		return false;
	}
	return true;
}

static int mr_reg(struct kv_rdma *k, void *base, size_t len)
{
	int acc = IBV_ACCESS_LOCAL_WRITE;

	if (k->remote)
		acc |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	k->mr = ibv_reg_mr(k->pd, base, len, acc);
	if (!k->mr)
		return errno ? -errno : -EIO;
	k->base = base;
	return 0;
}

int kv_rdma_set_mr(struct kv_rdma *k, void *base, size_t len)
{
	if (k->mr)
		ibv_dereg_mr(k->mr);
	k->mr = NULL;
	return mr_reg(k, base, len);
}

int kv_rdma_create(int fd, void *base, size_t len, bool remote, struct kv_rdma **out, char *why,
		   size_t whylen)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	struct kcoll_rdma_port port;
	struct ibv_context *ctx;
	struct kv_rdma *k;
	struct kcoll_rdma_ep *ep;
	int r;

	if (getsockname(fd, (struct sockaddr *)&sa, &sl) || sa.sin_family != AF_INET) {
		snprintf(why, whylen, "the connection to the peer is not IPv4");
		return -EAFNOSUPPORT;
	}
	r = kcoll_rdma_pick_gid(sa.sin_addr.s_addr, &port, why, whylen);
	if (r)
		return r;
	k = calloc(1, sizeof(*k));
	ep = calloc(1, sizeof(*ep));
	if (!k || !ep) {
		free(k);
		free(ep);
		return -ENOMEM;
	}
	k->ep = ep;
	k->remote = remote;
	ctx = kcoll_rdma_ctx(port.dev);
	ep->port = port;
	ep->nqp = 1;
	ep->send_depth = KV_RDMA_SQ;
	ep->recv_depth = KV_RDMA_RQ;
	r = -EIO;
	k->pd = ibv_alloc_pd(ctx);
	if (!k->pd)
		goto err;
	ep->ch = ibv_create_comp_channel(ctx);
	if (!ep->ch)
		goto err;
	fcntl(ep->ch->fd, F_SETFL, fcntl(ep->ch->fd, F_GETFL) | O_NONBLOCK);
	ep->cq = ibv_create_cq(ctx, KV_RDMA_SQ + KV_RDMA_RQ, NULL, ep->ch, 0);
	if (!ep->cq)
		goto err;
	ep->own_cq = true;
	{
		struct ibv_qp_init_attr qa = {
			.send_cq = ep->cq, .recv_cq = ep->cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = KV_RDMA_SQ, .max_recv_wr = KV_RDMA_RQ,
				 .max_send_sge = 1, .max_recv_sge = 1 },
		};
		/* The initiator's QP accepts no remote access at all. */
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = port.port,
			.qp_access_flags = remote ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ : 0,
		};

		ep->qp[0] = ibv_create_qp(k->pd, &qa);
		if (!ep->qp[0])
			goto err;
		if (ibv_modify_qp(ep->qp[0], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS))
			goto err;
	}
	ep->local.version = KCOLL_RDMA_ADDR_VERSION;
	ep->local.nqp = 1;
	ep->local.gid = port.gid;
	ep->local.qgid[0] = port.gid;	/* the QP's own GID (address version 2) */
	ep->local.mtu = port.mtu;
	ep->local.qpn[0] = ep->qp[0]->qp_num;
	ep->local.psn[0] = (uint32_t)(random() & 0xffffff);
	r = mr_reg(k, base, len);
	if (r)
		goto err;
	*out = k;
	return 0;
err:
	snprintf(why, whylen, "cannot set up an RDMA connection on %s: %s", kcoll_rdma_dev_name(port.dev),
		 strerror(r == -EIO && errno ? errno : -r));
	kv_rdma_destroy(k);
	return r;
}

void kv_rdma_hello_fill(struct kv_rdma *k, struct kv_rdma_hello *h)
{
	memset(h, 0, sizeof(*h));
	h->addr = k->ep->local;
	if (k->remote && k->mr) {
		h->base = (uintptr_t)k->base;
		h->rkey = k->mr->rkey;
	}
}

int kv_rdma_connect(struct kv_rdma *k, const struct kv_rdma_hello *peer, uint32_t nrecv, char *why,
		    size_t whylen)
{
	int r;

	for (uint32_t i = 0; i < nrecv && i < KV_RDMA_RQ; i++) {
		r = kcoll_rdma_post_recv(k->ep, 0, i);
		if (r) {
			snprintf(why, whylen, "cannot post a receive: %s", strerror(-r));
			return r;
		}
	}
	return kcoll_rdma_ep_connect(k->ep, &peer->addr, why, whylen);
}

void kv_rdma_fail(struct kv_rdma *k)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	if (k && k->ep && k->ep->qp[0])
		ibv_modify_qp(k->ep->qp[0], &a, IBV_QP_STATE);
}

void kv_rdma_revoke(struct kv_rdma *k)
{
	if (!k)
		return;
	kv_rdma_fail(k);
	if (k->mr)
		ibv_dereg_mr(k->mr);
	k->mr = NULL;
}

void kv_rdma_destroy(struct kv_rdma *k)
{
	if (!k)
		return;
	/* QP, then its CQ and channel (every event was acknowledged). */
	kcoll_rdma_ep_destroy(k->ep);
	if (k->mr)
		ibv_dereg_mr(k->mr);
	if (k->pd)
		ibv_dealloc_pd(k->pd);
	free(k);
}

int kv_rdma_post(struct kv_rdma *k, bool write, uint64_t loff, uint64_t len, uint64_t raddr,
		 uint32_t rkey, const uint32_t *imm, uint64_t wr_id)
{
	if (!k->mr && len)
		return -EIDRM;
	if (write)
		return kcoll_rdma_write(k->ep, 0, k->mr, k->base + loff, len, raddr, rkey, imm, wr_id);
	return kcoll_rdma_read(k->ep, 0, k->mr, k->base + loff, len, raddr, rkey, wr_id);
}

int kv_rdma_post_recv(struct kv_rdma *k, uint64_t wr_id)
{
	return kcoll_rdma_post_recv(k->ep, 0, wr_id);
}

int kv_rdma_poll(struct kv_rdma *k, struct ibv_wc *wc, int n)
{
	int got = ibv_poll_cq(k->ep->cq, n, wc);

	return got < 0 ? -EIO : got;
}

int kv_rdma_arm(struct kv_rdma *k)
{
	return ibv_req_notify_cq(k->ep->cq, 0) ? -EIO : 0;
}

int kv_rdma_fd(struct kv_rdma *k)
{
	return k->ep->ch->fd;
}

void kv_rdma_ack_event(struct kv_rdma *k)
{
	struct ibv_cq *cq;
	void *ctx;

	if (!ibv_get_cq_event(k->ep->ch, &cq, &ctx))
		ibv_ack_cq_events(cq, 1);
}

const char *kv_rdma_dev(struct kv_rdma *k)
{
	return kcoll_rdma_dev_name(k->ep->port.dev);
}

int kv_rdma_wc_err(const struct ibv_wc *wc)
{
	switch (wc->status) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_LOC_PROT_ERR:
		return -EACCES;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return -EHOSTUNREACH;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECONNRESET;
	default:
		return -EIO;
	}
}

/* ---- the initiator's transport (kv_xport_rdma) ----------------------------
 *
 * With a device on both sides and both segments mapped, a batch moves as
 * RDMA WRITEs (or READs) from the local segment's region straight into the
 * owner's, one per piece of at most KV_RDMA_CHUNK, and its notify is a
 * WRITE_WITH_IMM the owner answers on fd[0] (a notification: a MSG frame on
 * fd[0]). Otherwise open says 1 and the session is kv_xport_tcp's, with the
 * reason logged once per import.
 */
#define KV_RDMA_CHUNK		(4u << 20)	/* one work request at most */
#define KV_RDMA_INFLIGHT	128

static void rdma_drop(struct kv_remote *rm)
{
	kv_rdma_destroy(rm->rd);
	rm->rd = NULL;
	kd_buf_release(&rm->rd_buf);
}

static void rdma_close(struct kv_remote *rm)
{
	rdma_drop(rm);
	kv_remote_close_streams(rm);
}

static void rdma_refuse(struct kv_remote *rm, bool loud, const char *why)
{
	char host[sizeof(rm->w.host) + 1];

	rm->rd_off = true;
	snprintf(host, sizeof(host), "%.*s", (int)sizeof(rm->w.host), rm->w.host);
	if (loud)
		kc_err("kv: segment %u of %s: KCOLL_NET_XPORT=rdma but RDMA is not usable (%s); using TCP",
		       rm->w.seg_id, host, why);
	else
		kc_info("kv: segment %u of %s: over TCP (RDMA not used: %s)", rm->w.seg_id, host, why);
}

/* Between batches a healthy stream has nothing to read. */
static bool fd_idle(int fd)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN | POLLRDHUP };

	return fd >= 0 && poll(&pf, 1, 0) == 0;
}

/*
 * Make rm's RDMA connection ready for a batch from local (held, mapped).
 * 0: use it; 1: use TCP (the streams are open); < 0: the streams broke.
 */
static int rdma_ready(struct kv_remote *rm, struct kv_side *local)
{
	struct kv_req rq = { .op = KV_OP_RDMA, .tag = UINT32_MAX - 1 };
	struct kv_rdma_hello me, peer;
	struct kv_resp rs;
	char why[256];
	bool loud;
	int r;

	if (rm->rd) {
		if (rm->rd_seg == local->seg->id && rm->rd_buf.rg == local->buf.rg)
			return 0;
		/* Another local segment: register it in this connection's PD
		 * (the old region is deregistered before its mapping goes). */
		struct kd_buf nb = { 0 };

		if (kv_lock_sides(local, local))
			return -EIDRM;
		kv_seg_buf(local->seg, &nb);
		kv_unlock_sides(local, local);
		r = nb.direct ? kv_rdma_set_mr(rm->rd, nb.direct, local->seg->size) : -EIDRM;
		kd_buf_release(&rm->rd_buf);
		rm->rd_buf = nb;
		if (r) {
			/* The owner's side is in RDMA mode on fd[0]: start afresh. */
			rdma_close(rm);
			return r;
		}
		rm->rd_seg = local->seg->id;
		return 0;
	}
	if (rm->rd_off)
		return 1;
	if (!kv_rdma_wanted(why, sizeof(why), &loud)) {
		rdma_refuse(rm, loud, why);
		return 1;
	}
	if (kv_lock_sides(local, local))
		return -EIDRM;
	kv_seg_buf(local->seg, &rm->rd_buf);
	kv_unlock_sides(local, local);
	if (!rm->rd_buf.direct) {
		kd_buf_release(&rm->rd_buf);
		return 1;
	}
	r = kv_rdma_create(rm->fd[0], rm->rd_buf.direct, local->seg->size, false, &rm->rd, why, sizeof(why));
	if (r) {
		kd_buf_release(&rm->rd_buf);
		rdma_refuse(rm, loud, why);
		return 1;
	}
	kv_rdma_hello_fill(rm->rd, &me);
	rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ,
				   .len = sizeof(rq) + sizeof(me) };
	r = kv_io_full(rm->fd[0], &rq, sizeof(rq), true);
	if (!r)
		r = kv_io_full(rm->fd[0], &me, sizeof(me), true);
	if (!r)
		r = kv_io_full(rm->fd[0], &rs, sizeof(rs), false);
	if (!r && (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP ||
		   rs.hdr.len != sizeof(rs) + sizeof(peer) || rs.tag != rq.tag))
		r = rs.status < 0 ? rs.status : -EPROTO;
	if (!r)
		r = kv_io_full(rm->fd[0], &peer, sizeof(peer), false);
	if (r) {
		rdma_drop(rm);
		return r;
	}
	peer.why[sizeof(peer.why) - 1] = 0;
	if (rs.status) {
		rdma_drop(rm);
		if (rs.status == -EIDRM)
			return -EIDRM;
		rdma_refuse(rm, loud, peer.why);
		return 1;
	}
	r = kv_rdma_connect(rm->rd, &peer, 0, why, sizeof(why));
	if (r) {
		rdma_close(rm);	/* the owner's side is in RDMA mode */
		rdma_refuse(rm, loud, why);
		r = kv_remote_connect(rm);
		return r ? r : 1;
	}
	rm->peer = peer;
	rm->rd_seg = local->seg->id;
	kc_info("kv: segment %u of %.*s: over RDMA (%s)", rm->w.seg_id, (int)sizeof(rm->w.host), rm->w.host,
		kv_rdma_dev(rm->rd));
	return 0;
}

/*
 * A batch from unmapped memory goes over TCP, and fd[0] is in RDMA mode on
 * the owner's side; a stream with something to read means the owner ended
 * the session: either way start afresh. Then the streams (the setup goes
 * over stream 0), then the RDMA connection; an import refused once stays
 * on TCP without asking again.
 */
static int rdma_open(struct kv_remote *rm, struct kv_side *local)
{
	int r;

	if (rm->rd && (!local->buf.direct || !fd_idle(rm->fd[0])))
		rdma_close(rm);
	if (!local->buf.direct || (!rm->rd && rm->rd_off))
		return 1;
	r = kv_remote_connect(rm);
	return r ? r : rdma_ready(rm, local);
}

static int rdma_nchan(const struct kv_remote *rm)
{
	(void)rm;
	return 1;
}

/* The whole batch holds the local segment's reader lock: nothing is written
 * into it after its unregister returned. */
static int rdma_begin(struct kv_remote *rm, struct kv_side *local)
{
	int r = kv_lock_sides(local, local);

	rm->rd->inflight = 0;
	rm->rd->armed = false;
	rm->rd->locked = !r;
	return r;
}

/* Stop the rest: the QP in error flushes what is posted and nothing more
 * lands in either segment. */
static void rdma_flush(struct kv_rdma *k)
{
	int64_t until = kd_now_ns() + 2000000000LL;
	struct ibv_wc wc[32];

	kv_rdma_fail(k);
	while (k->inflight && kd_now_ns() < until) {
		int got = kv_rdma_poll(k, wc, 32);

		if (got < 0)
			break;
		k->inflight -= (uint32_t)got;
		if (!got)
			usleep(1000);
	}
}

static int rdma_end(struct kv_remote *rm, struct kv_side *local, int err, uint64_t moved)
{
	if (rm->rd->inflight)
		rdma_flush(rm->rd);
	if (rm->rd->locked)
		kv_unlock_sides(local, local);
	rm->rd->locked = false;
	atomic_fetch_add(&kv_state.rdma_bytes, moved);
	return err;
}

static int rdma_post(struct kv_remote *rm, bool write, const struct kv_xfer *x, uint64_t cookie)
{
	const struct kv_piece *p = x->p;	/* max_pieces 1 */
	int r = kv_rdma_post(rm->rd, write, write ? p->src : p->dst, p->len,
			     rm->peer.base + (write ? p->dst : p->src), rm->peer.rkey, NULL, cookie);

	rm->rd->inflight += !r;
	return r;
}

static int rdma_write(struct kv_remote *rm, int ch, const struct kv_xfer *x, uint64_t cookie)
{
	(void)ch;
	return rdma_post(rm, true, x, cookie);
}

static int rdma_read(struct kv_remote *rm, int ch, const struct kv_xfer *x, uint64_t cookie)
{
	(void)ch;
	return rdma_post(rm, false, x, cookie);
}

/* The counter as one zero-length WRITE_WITH_IMM (every block landed: RC,
 * acknowledged by the owner's device), answered on fd[0]; a notification
 * as a MSG frame on fd[0], which bumps the counter too. */
static int rdma_write_notify(struct kv_remote *rm, int ch, uint32_t notify_id, const struct kv_msgout *m,
			     uint64_t cookie)
{
	struct kv_rdma *k = rm->rd;
	int r;

	(void)ch;
	k->imm_cookie = cookie;
	if (m->len) {
		r = kv_final_xchg(rm->fd[0], notify_id, m, UINT32_MAX, &k->msg_ans);
		k->msg_due = !r;
		return r;
	}
	r = kv_rdma_post(k, true, 0, 0, 0, 0, &notify_id, cookie);
	k->inflight += !r;
	k->imm_out = !r;
	return r;
}

/* Is the next thing on fd the answer to the batch's WRITE_WITH_IMM notify? */
static bool notify_answer_next(int fd)
{
	struct kv_resp rs;

	return recv(fd, &rs, sizeof(rs), MSG_PEEK | MSG_DONTWAIT) == sizeof(rs) &&
	       rs.hdr.magic == KD_PEER_MAGIC && rs.hdr.type == KD_P_KV_RESP &&
	       rs.hdr.len == sizeof(rs) && rs.tag == UINT32_MAX;
}

/* Sleep until a completion or fd[0] says something, 100 ms at most.
 * imm_out: the notify's WRITE_WITH_IMM is posted, so its answer may reach
 * fd[0] before the send's own completion: that is no error, only the
 * completion is then waited for. */
static int rdma_wait(struct kv_remote *rm, bool imm_out)
{
	struct pollfd pf[2] = { { .fd = kv_rdma_fd(rm->rd), .events = POLLIN },
				{ .fd = rm->fd[0], .events = POLLIN } };
	int r = poll(pf, 2, 100);

	if (r < 0)
		return errno == EINTR ? 0 : -errno;
	if (pf[0].revents)
		kv_rdma_ack_event(rm->rd);
	/* Nothing else is due on fd[0] before the notify: the owner's last
	 * word (-EIDRM) or its end. */
	if (pf[1].revents && imm_out && notify_answer_next(rm->fd[0])) {
		if (!pf[0].revents && poll(pf, 1, 100) == 1)
			kv_rdma_ack_event(rm->rd);
		return 0;
	}
	if (pf[1].revents)
		return kv_last_word(rm->fd[0], -ECONNRESET);
	return 0;
}

/* The owner's answer to the WRITE_WITH_IMM, on fd[0]. */
static int imm_answer(struct kv_remote *rm)
{
	struct kv_resp rs;
	int r = kv_io_full(rm->fd[0], &rs, sizeof(rs), false);

	if (!r && (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP ||
		   rs.hdr.len != sizeof(rs) || (rs.tag != UINT32_MAX && !rs.status)))
		r = -EPROTO;
	return r ? r : rs.status > 0 ? -EPROTO : rs.status;
}

/*
 * Completions as events; none: arm the CQ, poll once more (what came before
 * arming), then sleep on the channel and fd[0]. The notify's event comes
 * with the owner's answer on fd[0], after its completion.
 */
static int rdma_poll(struct kv_remote *rm, int ch, struct kv_xev *ev, int n)
{
	struct kv_rdma *k = rm->rd;
	struct ibv_wc wc[32];
	int got, r;

	(void)ch;
	if (k->msg_due) {
		k->msg_due = false;
		*ev = (struct kv_xev){ .cookie = k->imm_cookie, .status = k->msg_ans };
		return 1;
	}
	for (int pass = 0; pass < 3; pass++) {
		got = kv_rdma_poll(k, wc, n < 32 ? n : 32);
		if (got < 0)
			return got;
		if (got) {
			k->armed = false;
			break;
		}
		if (pass == 2)
			return 0;
		if (!k->armed) {
			r = kv_rdma_arm(k);
			if (r)
				return r;
			k->armed = true;
			continue;
		}
		k->armed = false;
		r = rdma_wait(rm, k->imm_out);
		if (r)
			return r;
	}
	for (int i = 0; i < got; i++) {
		k->inflight--;
		ev[i] = (struct kv_xev){ .cookie = wc[i].wr_id, .status = kv_rdma_wc_err(&wc[i]) };
		if (k->imm_out && wc[i].wr_id == k->imm_cookie) {
			k->imm_out = false;
			if (!ev[i].status)
				ev[i].status = imm_answer(rm);
		}
	}
	return got;
}

/* What a failed completion means: the owner's device refused the rkey or
 * gave up (the owner's last word says whether its segment went), or our
 * own segment was unregistered. */
static int rdma_why(struct kv_remote *rm, int ch, struct kv_side *local, int err)
{
	char c;

	(void)ch;
	if (err != -EACCES && err != -EHOSTUNREACH && err != -ECONNRESET && err != -EIO)
		return err;
	err = atomic_load(&local->seg->dead) ? -EIDRM : kv_last_word(rm->fd[0], err);
	/* The owner's device refused the rkey and its kcolld closed the
	 * stream without a word: it died (not a wrong token). */
	if (err == -EACCES && recv(rm->fd[0], &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
		err = -ECONNRESET;
	return err;
}

/* One QP, batches of an import serial on the ring thread; a piece is one
 * work request (no per-frame cost, so no coalescing). */
const struct kv_xport_ops kv_xport_rdma = {
	.name = "rdma",
	.depth = KV_RDMA_INFLIGHT,
	.max_pieces = 1,
	.frame_min = KV_RDMA_CHUNK,
	.frame_max = KV_RDMA_CHUNK,
	.queued = false,
	.nchan = rdma_nchan,
	.open = rdma_open,
	.close = rdma_close,
	.begin = rdma_begin,
	.end = rdma_end,
	.write = rdma_write,
	.read = rdma_read,
	.write_notify = rdma_write_notify,
	.poll = rdma_poll,
	.why = rdma_why,
};

/* ---- the owner's side ---------------------------------------------------- */

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
int kv_serve_rdma(struct kv_conn *cn, const struct kv_rdma_hello *peer, uint64_t tag)
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
	} else if (kv_lock_sides(&side, &side)) {
		status = -EIDRM;
		snprintf(me.why, sizeof(me.why), "the segment was unregistered");
	} else {
		locked = true;
		kv_seg_buf(s, &side.buf);
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
			kv_unlock_sides(&side, &side);
		kc_dbg("kv: segment %u: rdma refused to a peer: %s", s->id, me.why);
		rs.status = status;
		return kv_io_full(cn->fd, &rs, sizeof(rs), true) ||
		       kv_io_full(cn->fd, &me, sizeof(me), true);
	}
	kv_rdma_hello_fill(k, &me);
	atomic_fetch_add(&kv_state.rdma_sessions, 1);
	setsockopt(cn->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	if (kv_io_full(cn->fd, &rs, sizeof(rs), true) || kv_io_full(cn->fd, &me, sizeof(me), true))
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
			if (kv_rdma_post_recv(k, wc[i].wr_id) ||
			    kv_io_full(cn->fd, &nr, sizeof(nr), true))
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

			if (!(pf[0].revents & POLLIN) || kv_io_full(cn->fd, &rq, sizeof(rq), false) ||
			    rq.hdr.magic != KD_PEER_MAGIC || rq.hdr.type != KD_P_KV_REQ ||
			    rq.op != KV_OP_MSG || kv_serve_msg(cn, &rq, true))
				goto out;
		}
	}
out:
	kv_rdma_revoke(k);	/* the rkey is dead before the lock is released */
	kd_buf_release(&side.buf);
	kv_unlock_sides(&side, &side);
	if (atomic_load(&s->dead)) {
		rs = (struct kv_resp){ .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
					       .len = sizeof(rs) }, .status = -EIDRM, .tag = UINT64_MAX };
		send(cn->fd, &rs, sizeof(rs), MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	kv_rdma_destroy(k);
	return 1;
}
