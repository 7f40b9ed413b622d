// SPDX-License-Identifier: MIT
/*
 * The RDMA transport: pieces over RC queue pairs, behind the narrow
 * interface of xport.h (docs/rdma.md has the long form). It moves bytes
 * only: the step engine (step.c) runs the steps, reduces, checks what the
 * piece headers mean and observes the links for C4, as for TCP.
 *
 * Each pair of daemons of a communicator connects lazily, on the first
 * send or receive between them (xport_rdma_conn.c): both sides create
 * KCOLL_IB_QPS RC QPs and, per stream, NSLOT receive slots (one piece plus
 * a header each, registered for remote write), and exchange QP numbers,
 * GIDs, the slots' address and rkey over the pair's first TCP data stream,
 * which the daemons already connected. The exchange never blocks: poll()
 * advances it, so pairs set up in any order.
 *
 * A piece travels as one RDMA WRITE_WITH_IMM (slot header, piece header,
 * payload) into a free slot of its stream at the receiver; the immediate
 * names the stream and the slot. The sender holds one credit per remote
 * slot; the receiver, once the engine released the piece (reduced or
 * copied out), returns the credit with a zero-length WRITE_WITH_IMM with
 * IMM_CREDIT set. A stream's pieces are spread over the QPs round robin and
 * numbered: the receiver hands them over in that order. Small pieces are
 * copied into a send slot, large ones (KCOLL_IB_ZC_BYTES) written straight
 * from the buffer the engine names (registered through rdma/'s cache). A
 * send's TX event comes when its write completed, in the stream's order:
 * the engine keeps up to NSLOT sends per stream in flight (send_depth), and
 * its C4 busy time is the link's, not a memcpy's.
 *
 * A peer that dies closes its TCP streams (EOF), a QP fails (work
 * completion error) or our port goes down (async event): every piece to or
 * from that peer then fails with -ECONNRESET, and the engine closes the
 * context; the next op opens a fresh one.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "kcolld.h"
#include "log.h"
#include "rdma.h"
#include "xport.h"
#include "xport_rdma.h"
#include "xport_rdma_int.h"

/* ---- starting ----------------------------------------------------------- */

/*
 * Peers of a closed context that were not left clean: a failed op, a peer
 * that stopped answering (its NIC down) while our writes to it were still
 * being retried. Tearing their QPs down in close(), on the comm's net
 * thread, held the failed op's result back past the client's wait (the
 * two-guest pair test saw 59 s), and rxe in Linux 6.1 has crashed the
 * kernel freeing a QP whose packets were still queued. So close() only
 * stops their QPs (kcoll_rdma_ep_quiesce) and leaves endpoint, slots and
 * registrations here; the reaper destroys them GRAVE_NS later, or at its
 * next round when their device is being removed (which waits for that).
 */
struct grave {
	struct grave *next;
	int64_t due;			/* kd_now_ns() from which it may go */
	struct rpeer p;
};

static pthread_mutex_t grave_lock = PTHREAD_MUTEX_INITIALIZER;
static struct grave *graves;

static void cq_drain(struct rctx *x, uint32_t h, bool *moved);

/*
 * Stop peer h's QPs and take the flushed completions of every write still
 * posted: once they are in, the NIC reads none of the op's buffers any more
 * (they go back to the ranks when the op returns). Then bury it.
 */
static void bury(struct rctx *x, uint32_t h)
{
	struct rpeer *p = &x->peer[h];
	struct grave *g = p->ep ? malloc(sizeof(*g)) : NULL;
	int64_t end = kd_now_ns() + FLUSH_NS;
	bool moved = false;

	if (!g) {
		kd_rdma_peer_free(p);	/* no endpoint (or no memory): at once */
		return;
	}
	kcoll_rdma_ep_quiesce(p->ep);
	if (p->state >= 0)
		p->state = -ECONNRESET;	/* closing: the flushed writes are no news */
	while (p->sq_out && kd_now_ns() < end) {
		uint32_t before = p->sq_out;

		cq_drain(x, h, &moved);
		if (p->sq_out == before)
			usleep(100);
	}
	if (p->sq_out)
		kc_warn("comm %s: %u writes to host %u (%s) not flushed %d ms after their QPs were stopped", x->name,
			p->sq_out, h, p->name, (int)(FLUSH_NS / 1000000));
	g->p = *p;
	g->due = kd_now_ns() + GRAVE_NS;
	pthread_mutex_lock(&grave_lock);
	g->next = graves;
	graves = g;
	pthread_mutex_unlock(&grave_lock);
}

/* Destroy the peers that are due, or whose device is gone. */
static void graves_take(void)
{
	struct grave *due = NULL, *g, **pp;
	int64_t now = kd_now_ns();

	pthread_mutex_lock(&grave_lock);
	for (pp = &graves; (g = *pp);) {
		if (now >= g->due || kcoll_rdma_dev_gone(g->p.ep->port.dev)) {
			*pp = g->next;
			g->next = due;
			due = g;
		} else {
			pp = &g->next;
		}
	}
	pthread_mutex_unlock(&grave_lock);
	while ((g = due)) {
		due = g->next;
		kd_rdma_peer_free(&g->p);
		free(g);
	}
}

/*
 * A device being removed must be closed by every process before the kernel
 * lets it go (rdma_rxe, docs/rdma.md): transfers notice it themselves, this
 * closes it in a daemon that has no communicator on it (every second),
 * after destroying the closed peers that are due.
 */
static void *reaper(void *arg)
{
	(void)arg;
	for (;;) {
		sleep(1);
		graves_take();
		kcoll_rdma_reap();
	}
	return NULL;
}

/* Usable when a device is (user/daemon/xport.c chooses). */
static int rdma_init(char *why, size_t cap)
{
	pthread_t t;
	int r = kcoll_rdma_init();

	if (r) {
		snprintf(why, cap, "%s", kcoll_rdma_why());
		return r;
	}
	if (!pthread_create(&t, NULL, reaper, NULL))
		pthread_detach(t);
	for (int d = 0; d < kcoll_rdma_ndevs(); d++)
		kc_info("transport between daemons: rdma, device %s", kcoll_rdma_dev_name(d));
	return 0;
}

static int rdma_open(const struct kd_xport_env *env, void **ctxp, size_t *piece)
{
	struct rctx *x = calloc(1, sizeof(*x));

	if (!x)
		return -ENOMEM;
	x->name = env->name ? env->name : "?";
	x->nhosts = env->nhosts;
	x->self = env->self;
	x->nstreams = env->nstreams ? env->nstreams : 1;
	x->timeout_ns = env->timeout_ns;
	/* Pieces no larger than KCOLL_IB_PIECE_BYTES: a message of a few of
	 * them keeps the QPs busy and overlaps the writes with the receiver's
	 * copy-out (docs/perf/rdma.md §7). */
	x->piece = (size_t)kcoll_knob_ll("KCOLL_IB_PIECE_BYTES") & ~(size_t)4095;
	if (!x->piece || x->piece > env->piece)
		x->piece = env->piece;
	x->slot_bytes = HDR_BYTES + x->piece;
	x->zc_min = (size_t)kcoll_knob_ll("KCOLL_IB_ZC_BYTES");
	x->nqp = (uint32_t)kcoll_knob_ll("KCOLL_IB_QPS");
	if (x->nqp < 1 || x->nqp > KCOLL_RDMA_MAX_QPS)
		x->nqp = 2;
	x->kick = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	x->peer = calloc(x->nhosts, sizeof(*x->peer));
	if (x->kick < 0 || !x->peer)
		goto err;
	for (uint32_t h = 0; h < x->nhosts; h++) {
		struct rpeer *p = &x->peer[h];

		p->fd = env->fds[h * KD_MAX_STREAMS];
		snprintf(p->name, sizeof(p->name), "%s", env->host_names ? env->host_names[h] : "?");
		p->st = calloc(x->nstreams, sizeof(*p->st));
		if (!p->st)
			goto err;
		for (uint32_t s = 0; s < x->nstreams; s++)
			for (uint32_t k = 0; k < NSLOT; k++)
				p->st[s].h[k] = (struct rxh){ h, s, k };
	}
	*piece = x->piece;
	*ctxp = x;
	return 0;
err:
	for (uint32_t h = 0; x->peer && h < x->nhosts; h++)
		free(x->peer[h].st);
	free(x->peer);
	if (x->kick >= 0)
		close(x->kick);
	free(x);
	return -ENOMEM;
}

/* ---- sends -------------------------------------------------------------- */

static struct rpeer *peer_of(struct rctx *x, uint32_t host, uint32_t stream)
{
	if (host >= x->nhosts || host == x->self || stream >= x->nstreams)
		return NULL;
	if (x->peer[host].state == P_IDLE)
		kd_rdma_peer_start(x, host);
	return &x->peer[host];
}

static int rdma_send(void *ctx, uint32_t host, uint32_t stream, const struct kd_p_data *hdr, const void *buf,
		     size_t len, const struct kd_xmem *mem, uint64_t cookie)
{
	struct rctx *x = ctx;
	struct rpeer *p = peer_of(x, host, stream);
	struct rstream *st;
	struct rtx *t;

	if (!p || len > x->piece)
		return -EINVAL;
	st = &p->st[stream];
	if (st->txn >= NSLOT)
		return -EBUSY;
	t = &st->tx[(st->txh + st->txn++) % NSLOT];
	*t = (struct rtx){ .cookie = cookie, .t0 = kd_now_ns(), .hdr = *hdr, .buf = buf, .len = len, .slot = -1 };
	/* Large pieces from the buffer itself, registered through the cache
	 * (local access only: no peer can use its rkey). A kcoll.ko region is
	 * a PFN map: the NIC reaches it through its dma-buf only. Whatever
	 * cannot be registered is copied. */
	if (mem && x->zc_min && len >= x->zc_min && p->ep) {
		int dev = p->ep->port.dev, r;

		if (mem->dmabuf_fd >= 0)
			r = kcoll_rdma_dmabuf_refused(dev) ? -EOPNOTSUPP :
			    kcoll_rdma_mr_get_local_fd(dev, (void *)mem->lo, mem->len, mem->dmabuf_fd, &t->zmr);
		else
			r = kcoll_rdma_mr_get_local(dev, (void *)mem->lo, mem->len, &t->zmr);
		if (r) {
			kc_dbg("comm %s: cannot register %zu bytes for zero-copy sends (%s): copying", x->name,
			       mem->len, strerror(-r));
			t->zmr = NULL;
		}
	}
	return 0;
}

/* Post the sends of stream s to h that have a credit now. */
static void tx_post(struct rctx *x, uint32_t h, uint32_t s, bool *moved)
{
	struct rpeer *p = &x->peer[h];
	struct rstream *st = &p->st[s];

	while (p->state == P_UP && st->txposted < st->txn && st->sfree) {
		struct rtx *t = &st->tx[(st->txh + st->txposted) % NSLOT];
		uint32_t k = (uint32_t)__builtin_ctz(st->sfree), qpi = p->rr++ % x->nqp, imm = IMM(s, k);
		uint8_t *slot = slot_at(x, p->sbuf, s, k);
		uint64_t raddr = p->raddr + ((uint64_t)s * NSLOT + k) * x->slot_bytes;
		struct slot_hdr sh = { .magic = SLOT_MAGIC, .seq = st->tx_seq };
		int r;

		memcpy(slot, &sh, sizeof(sh));
		memcpy(slot + sizeof(sh), &t->hdr, sizeof(t->hdr));
		if (t->zmr) {
			/* The headers from the slot, the payload straight from the
			 * buffer: one WRITE_WITH_IMM, the same bytes at the
			 * receiver as the copy path's. */
			struct ibv_sge sg[2] = {
				{ .addr = (uintptr_t)slot, .length = HDR_BYTES, .lkey = p->smr->lkey },
				{ .addr = (uintptr_t)t->buf, .length = (uint32_t)t->len, .lkey = t->zmr->lkey },
			};

			r = kcoll_rdma_write_sg(p->ep, qpi, sg, 2, raddr, p->rkey, &imm, WRID(WR_DATA, s, k));
		} else {
			if (t->len)
				memcpy(slot + HDR_BYTES, t->buf, t->len);
			r = kcoll_rdma_write(p->ep, qpi, p->smr, slot, HDR_BYTES + t->len, raddr, p->rkey, &imm,
					     WRID(WR_DATA, s, k));
		}
		if (r) {
			char why[96];

			snprintf(why, sizeof(why), "posting a write failed: %s", strerror(-r));
			kd_rdma_peer_fail(x, h, -ECONNRESET, why);
			return;
		}
		st->sfree &= ~(1u << k);
		st->tx_seq++;
		t->slot = (int)k;
		st->txposted++;
		p->sq_out++;
		p->pieces_out++;
		p->pieces_zc += t->zmr != NULL;
		*moved = true;
	}
}

/* ---- receives ----------------------------------------------------------- */

static int rdma_recv(void *ctx, uint32_t host, uint32_t stream, void *buf, size_t len, uint64_t cookie)
{
	struct rctx *x = ctx;
	struct rpeer *p = peer_of(x, host, stream);
	struct rstream *st;

	(void)buf;	/* the slot is handed over instead */
	if (!p || len > x->piece)
		return -EINVAL;
	st = &p->st[stream];
	if (st->rx_on)
		return -EBUSY;
	st->rx_on = true;
	st->rx_cookie = cookie;
	st->rx_len = len;
	st->rx_t0 = kd_now_ns();
	return 0;
}

static void rdma_release(void *ctx, void *rx)
{
	struct rctx *x = ctx;
	const struct rxh *hd = rx;
	struct rpeer *p = &x->peer[hd->host];
	uint32_t imm = IMM_CREDIT | IMM(hd->stream, hd->slot), qpi = hd->slot % x->nqp;
	int r;

	p->st[hd->stream].held &= ~(1u << hd->slot);
	if (p->state != P_UP)
		return;
	/* The slot is free again: its credit goes back to the sender. */
	r = kcoll_rdma_write(p->ep, qpi, NULL, NULL, 0, p->raddr, p->rkey, &imm,
			     WRID(WR_CREDIT, hd->stream, hd->slot));
	if (r)
		kd_rdma_peer_fail(x, hd->host, -ECONNRESET, "posting a credit failed");
	else
		p->sq_out++;
}

/* ---- completions -------------------------------------------------------- */

static void wc_take(struct rctx *x, uint32_t h, const struct ibv_wc *wc, bool *moved)
{
	struct rpeer *p = &x->peer[h];
	uint32_t kind = wc->wr_id & 0xff, s = (wc->wr_id >> 8) & 0xff, k = (uint32_t)(wc->wr_id >> 16);
	char why[KCOLL_RDMA_WHY];

	if (kind != WR_RECV && p->sq_out)
		p->sq_out--;
	if (wc->status != IBV_WC_SUCCESS) {
		snprintf(why, sizeof(why), "%s on QP %u (the peer died, or a link or device on either side went "
			 "away: check 'rdma link' on both hosts and the peer's kcolld)",
			 ibv_wc_status_str(wc->status), wc->qp_num);
		if (p->eof)
			p->state = p->state < 0 ? p->state : -ECONNRESET;	/* it left: said so */
		else
			kd_rdma_peer_fail(x, h, -ECONNRESET, why);
		*moved = true;
		return;
	}
	*moved = true;
	if (kind == WR_DATA) {
		struct rstream *st = &p->st[s];

		/* The oldest posted send in that slot (a slot is reused only
		 * once the receiver had its piece). */
		for (uint32_t i = 0; s < x->nstreams && i < st->txposted; i++) {
			struct rtx *t = &st->tx[(st->txh + i) % NSLOT];

			if (t->slot == (int)k && !t->done) {
				t->done = true;
				break;
			}
		}
		return;
	}
	if (kind != WR_RECV)
		return;
	uint32_t imm = ntohl(wc->imm_data), rs = (imm >> 8) & 0xff, rk = imm & 0xff;
	int r;

	if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || rs >= x->nstreams || rk >= NSLOT ||
	    (imm & ~(IMM_CREDIT | 0xffffu))) {
		snprintf(why, sizeof(why), "an unexpected RDMA message came (opcode %d, immediate %#x)",
			 wc->opcode, imm);
		kd_rdma_peer_fail(x, h, -EPROTO, why);
		return;
	}
	r = kcoll_rdma_post_recv(p->ep, k, wc->wr_id);
	if (r) {
		kd_rdma_peer_fail(x, h, -ECONNRESET, "reposting a receive failed");
		return;
	}
	if (imm & IMM_CREDIT)
		p->st[rs].sfree |= 1u << rk;
	else
		p->st[rs].arrived |= 1u << rk;
}

static void cq_drain(struct rctx *x, uint32_t h, bool *moved)
{
	struct rpeer *p = &x->peer[h];
	struct ibv_wc wc[16];
	int n;

	if (p->armed) {
		struct ibv_cq *cq;
		void *cctx;

		/* Events of the armed CQ: acknowledged, else destroying it hangs. */
		while (!ibv_get_cq_event(p->ep->ch, &cq, &cctx))
			ibv_ack_cq_events(cq, 1);
		p->armed = false;
	}
	while (p->ep && (n = ibv_poll_cq(p->ep->cq, 16, wc)) > 0)
		for (int i = 0; i < n; i++)
			wc_take(x, h, &wc[i], moved);
}

/* ---- poll ----------------------------------------------------------------- */

/* The events of stream s of h that are due. */
static uint32_t stream_events(struct rctx *x, uint32_t h, uint32_t s, struct kd_xev *ev, uint32_t max)
{
	struct rpeer *p = &x->peer[h];
	struct rstream *st = &p->st[s];
	uint32_t ne = 0;

	while (ne < max && st->txn && (st->tx[st->txh].done || p->state < 0)) {
		struct rtx *t = &st->tx[st->txh];

		ev[ne++] = (struct kd_xev){ .kind = KD_XEV_TX, .err = t->done ? 0 : p->state, .host = h, .stream = s,
					    .cookie = t->cookie, .t0 = t->t0 };
		st->txh = (st->txh + 1) % NSLOT;
		st->txn--;
		if (st->txposted)
			st->txposted--;
	}
	if (ne >= max || !st->rx_on)
		return ne;
	for (uint32_t k = 0; k < NSLOT; k++) {
		uint8_t *slot = slot_at(x, p->rbuf, s, k);
		struct slot_hdr sh;
		const struct kd_p_data *ph = (const struct kd_p_data *)(slot + sizeof(sh));

		if (!(st->arrived & (1u << k)))
			continue;
		memcpy(&sh, slot, sizeof(sh));
		if (sh.magic == SLOT_MAGIC && sh.seq != st->rx_seq)
			continue;	/* a later piece of the stream, over another QP */
		st->arrived &= ~(1u << k);
		st->held |= 1u << k;
		st->rx_seq++;
		st->rx_on = false;
		p->pieces_in++;
		ev[ne++] = (struct kd_xev){
			.kind = KD_XEV_RX, .host = h, .stream = s, .cookie = st->rx_cookie, .t0 = st->rx_t0,
			.err = sh.magic != SLOT_MAGIC || ph->hdr.len != sizeof(*ph) + st->rx_len ? -EPROTO : 0,
			.hdr = ph, .data = slot + HDR_BYTES, .rx = &st->h[k],
		};
		return ne;
	}
	/* Nothing to hand over: from a peer that failed, nothing will come. */
	if (p->state < 0) {
		st->rx_on = false;
		ev[ne++] = (struct kd_xev){ .kind = KD_XEV_RX, .err = p->state, .host = h, .stream = s,
					    .cookie = st->rx_cookie, .t0 = st->rx_t0 };
	}
	return ne;
}

/* Idle: has a peer left (its TCP stream closed), or a port gone down? */
static void look_around(struct rctx *x)
{
	char why[KCOLL_RDMA_WHY];

	x->port_checked = kd_now_ns();
	for (uint32_t h = 0; h < x->nhosts; h++) {
		struct rpeer *p = &x->peer[h];
		uint8_t b;

		if (p->state != P_UP)
			continue;
		if (!p->eof) {
			ssize_t n = recv(p->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);

			/* It closes its streams only after its writes completed
			 * (close flushes), so all it sent is in our CQ: only what
			 * still waits for it fails. */
			p->eof = !n || (n < 0 && errno != EAGAIN && errno != EINTR);
		}
		if (kcoll_rdma_port_check(p->ep->port.dev, p->ep->port.port, why, sizeof(why)))
			kd_rdma_peer_fail(x, h, -ECONNRESET, why);
	}
}

/* A peer that left fails whatever still waits for it. */
static void left(struct rctx *x, uint32_t h)
{
	struct rpeer *p = &x->peer[h];

	for (uint32_t s = 0; p->eof && p->state == P_UP && s < x->nstreams; s++)
		if ((p->st[s].rx_on && !p->st[s].arrived) || p->st[s].txn) {
			kc_warn("comm %s: host %u (%s) closed its connection: its kcolld died or left", x->name, h,
				p->name);
			p->state = -ECONNRESET;
		}
}

static int rdma_poll(void *ctx, struct kd_xev *ev, uint32_t max, bool *moved)
{
	struct rctx *x = ctx;
	uint32_t ne = 0;
	uint64_t v;

	if (x->nbacklog) {
		if (read(x->kick, &v, sizeof(v)) < 0)
			v = 0;
		for (uint32_t i = 0; i < x->nbacklog; i++)
			wc_take(x, x->backlog_host[i], &x->backlog[i], moved);
		x->nbacklog = 0;
	}
	for (uint32_t h = 0; h < x->nhosts; h++) {
		struct rpeer *p = &x->peer[h];

		if (p->state == P_SETUP || p->state == P_READY)
			*moved |= kd_rdma_peer_setup(x, h);
		if (p->state == P_UP)
			cq_drain(x, h, moved);
		for (uint32_t s = 0; p->state == P_UP && s < x->nstreams; s++)
			tx_post(x, h, s, moved);
	}
	if (!*moved && kd_now_ns() - x->port_checked > PORT_CHECK_NS)
		look_around(x);
	for (uint32_t h = 0; h < x->nhosts; h++) {
		left(x, h);
		for (uint32_t s = 0; x->peer[h].st && s < x->nstreams && ne < max; s++)
			ne += stream_events(x, h, s, ev + ne, max - ne);
	}
	if (ne)
		*moved = true;
	return (int)ne;
}

static uint32_t rdma_wait_fds(void *ctx, struct pollfd *pfd, uint32_t cap)
{
	struct rctx *x = ctx;
	uint32_t n = 0;
	uint64_t one = 1;

	for (uint32_t h = 0; h < x->nhosts; h++) {
		struct rpeer *p = &x->peer[h];
		int got;

		if (p->state != P_UP)
			continue;
		/* Arm, then look once more: a completion that came before the
		 * arming raises no event. What came is for the next poll(). */
		ibv_req_notify_cq(p->ep->cq, 0);
		p->armed = true;
		got = ibv_poll_cq(p->ep->cq, (int)(64 - x->nbacklog), x->backlog + x->nbacklog);
		for (int i = 0; i < got; i++)
			x->backlog_host[x->nbacklog++] = h;
	}
	/* Something to take: poll(2) must not sleep (an eventfd write fails
	 * only past 2^64 - 2). */
	if (x->nbacklog && write(x->kick, &one, sizeof(one)) < 0)
		kc_dbg("comm %s: eventfd write: %s", x->name, strerror(errno));
	if (n < cap)
		pfd[n++] = (struct pollfd){ .fd = x->kick, .events = POLLIN };
	for (uint32_t h = 0; h < x->nhosts; h++) {
		struct rpeer *p = &x->peer[h];

		if (p->state == P_SETUP || p->state == P_READY) {
			bool out = p->out_done < (p->state == P_SETUP ? sizeof(p->out) : 1);

			if (n < cap)
				pfd[n++] = (struct pollfd){ .fd = p->fd, .events = (short)(POLLIN | (out ? POLLOUT : 0)) };
			continue;
		}
		if (p->state != P_UP || n + 3 > cap)
			continue;
		pfd[n++] = (struct pollfd){ .fd = p->ep->ch->fd, .events = POLLIN };
		/* A peer that dies closes its TCP streams; a port going down
		 * raises an async event. */
		if (!p->eof)
			pfd[n++] = (struct pollfd){ .fd = p->fd, .events = POLLIN | POLLRDHUP };
		pfd[n++] = (struct pollfd){ .fd = kcoll_rdma_async_fd(p->ep->port.dev), .events = POLLIN };
	}
	return n;
}

/* ---- closing ------------------------------------------------------------ */

/*
 * The engine has every send's completion before an op ends, but the last
 * credits may still be on their way, and a peer still in the op may wait
 * for them. Wait (boundedly) until each live peer acknowledged every write;
 * only then do the QPs and, after them, the TCP streams close.
 */
static void rdma_close(void *ctx)
{
	struct rctx *x = ctx;
	int64_t end = kd_now_ns() + FLUSH_NS;

	for (uint32_t h = 0; h < x->nhosts; h++) {
		struct rpeer *p = &x->peer[h];
		bool moved = false;

		while (p->state == P_UP && !p->eof && p->sq_out && kd_now_ns() < end) {
			int before = (int)p->sq_out;

			cq_drain(x, h, &moved);
			if ((int)p->sq_out == before)
				usleep(100);
		}
		if (p->state == P_UP && !p->eof && p->sq_out)
			kc_warn("comm %s: closing with %u writes to host %u not acknowledged after %d ms", x->name,
				p->sq_out, h, (int)(FLUSH_NS / 1000000));
		if (p->state == P_UP && !p->sq_out)
			kd_rdma_peer_free(p);	/* clean: nothing in flight */
		else
			bury(x, h);
	}
	free(x->peer);
	close(x->kick);
	free(x);
	/* A device being removed closes with its last endpoint. */
	kcoll_rdma_reap();
}

/* ---- status ------------------------------------------------------------ */

static size_t rdma_render(void *ctx, char *buf, size_t cap, int json)
{
	struct rctx *x = ctx;
	size_t n = 0;
	bool firstp = true;

#define PUT(...) do { if (n < cap) n += snprintf(buf + n, cap - n, __VA_ARGS__); } while (0)
	if (json)
		PUT("\"rdma\":[");
	for (uint32_t h = 0; h < x->nhosts; h++) {
		struct rpeer *p = &x->peer[h];
		char g[INET6_ADDRSTRLEN] = "";

		if (!p->ep || p->state < P_READY)
			continue;
		inet_ntop(AF_INET6, p->ep->port.gid.raw, g, sizeof(g));
		if (json)
			PUT("%s{\"host\":%u,\"dev\":\"%s\",\"port\":%u,\"gid_index\":%d,\"gid\":\"%s\","
			    "\"pieces_out\":%llu,\"pieces_in\":%llu,\"pieces_zc\":%llu,\"qps\":[", firstp ? "" : ",", h,
			    kcoll_rdma_dev_name(p->ep->port.dev), p->ep->port.port, p->ep->port.gid_index, g,
			    (unsigned long long)p->pieces_out, (unsigned long long)p->pieces_in,
			    (unsigned long long)p->pieces_zc);
		else
			PUT("    rdma host %u: %s port %u gid[%d] %s, pieces out %llu (zero-copy %llu) in %llu, QPs:",
			    h, kcoll_rdma_dev_name(p->ep->port.dev), p->ep->port.port, p->ep->port.gid_index, g,
			    (unsigned long long)p->pieces_out, (unsigned long long)p->pieces_zc,
			    (unsigned long long)p->pieces_in);
		for (uint32_t i = 0; i < p->ep->nqp; i++) {
			int s = kcoll_rdma_ep_qp_state(p->ep, i);
			const struct kcoll_rdma_port *lp = kcoll_rdma_ep_qp_port(p->ep, i);
			uint16_t us = kcoll_rdma_udp_sport(p->ep->path[i].flow_label, p->ep->qp[i]->qp_num,
							   p->ep->remote.qpn[i]);

			inet_ntop(AF_INET6, lp->gid.raw, g, sizeof(g));
			if (json)
				PUT("%s{\"qpn\":%u,\"state\":\"%s\",\"port\":%u,\"gid_index\":%d,\"gid\":\"%s\","
				    "\"flow_label\":%u,\"udp_sport\":%u}",
				    i ? "," : "", p->ep->qp[i]->qp_num, kcoll_rdma_qp_state_name(s), lp->port,
				    lp->gid_index, g, p->ep->path[i].flow_label, us);
			else
				PUT(" %u=%s(port %u gid[%d] %s sport %#x)", p->ep->qp[i]->qp_num,
				    kcoll_rdma_qp_state_name(s), lp->port, lp->gid_index, g, us);
		}
		PUT(json ? "]}" : "\n");
		firstp = false;
	}
	if (json)
		PUT("]");
#undef PUT
	return n < cap ? n : cap;
}

const struct kd_xport_ops kd_xport_rdma = {
	.size = sizeof(struct kd_xport_ops),
	.version = KD_XPORT_VERSION,
	.name = "rdma",
	.init = rdma_init,
	.open = rdma_open,
	.flags = KD_XPORT_F_MEM,
	.send_depth = NSLOT,
	.send = rdma_send,
	.recv = rdma_recv,
	.poll = rdma_poll,
	.release = rdma_release,
	.wait_fds = rdma_wait_fds,
	.render = rdma_render,
	.close = rdma_close,
};
