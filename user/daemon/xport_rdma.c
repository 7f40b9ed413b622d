// SPDX-License-Identifier: MIT
/*
 * The RDMA transport: one step of an inter-host algorithm over RC queue
 * pairs (docs/rdma.md has the long form).
 *
 * Each pair of daemons of a communicator connects lazily, on the first step
 * that moves bytes between them: both sides create KCOLL_IB_QPS RC QPs and
 * NSLOT receive slots (one piece plus a header each, registered for remote
 * write) and exchange QP numbers, GIDs, the slots' address and rkey over the
 * pair's first TCP data stream, which the daemons already connected.
 *
 * A piece travels as one RDMA WRITE_WITH_IMM (header + payload) into a free
 * slot of the receiver; the immediate names the slot. The sender holds one
 * credit per remote slot; the receiver, having reduced or copied the piece
 * out, returns the credit with a zero-length WRITE_WITH_IMM whose immediate
 * has IMM_CREDIT set. Pieces are spread over the QPs round robin, so nothing
 * assumes that they arrive in order: each slot's header says which op, step
 * and piece it holds, and a transfer is complete when it counted all its
 * pieces. As over TCP, the transfers to (and from) one host run in step
 * order, and a chained send's piece j waits for the previous step's piece j.
 *
 * The loop polls the CQs; when nothing moves it arms them and sleeps in
 * poll() on their completion channels, the abort eventfd and the TCP
 * streams (a peer that dies closes them).
 *
 * Why one file of over 1000 lines: it still holds its own step loop (the
 * legacy entry of xport.h) beside the verbs connection setup and the slot
 * and credit protocol. Porting it onto the narrow interface moves the loop
 * into step.c, which the TCP and loopback transports already use, and
 * leaves the byte mover here well under 1000 lines.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "xport.h"
#include "rdma.h"
#include "reduce.h"
#include "xport_rdma.h"

#define NSLOT		8
#define IMM_CREDIT	0x80000000u
#define HDR_BYTES	64u		/* slot header, keeps payloads aligned */
#define SETUP_MAGIC	0x6b637264u	/* "kcrd" */
#define SLOT_MAGIC	0x6b637370u
#define FLUSH_NS	2000000000LL	/* rdma_close waits this long for acknowledgements */

enum { WR_RECV = 1, WR_DATA = 2, WR_CREDIT = 3, WR_ZC = 4 };
/* In the kind byte: the write carries a piece C4 observes (see obs_tx). */
#define WR_OBS		0x40u
#define WR_KIND(wr_id)	((uint32_t)(wr_id) & 0x3fu)
#define WRID(host, qp, kind)	(((uint64_t)(host) << 16) | ((uint64_t)(qp) << 8) | (kind))
/* A zero-copy write also carries the run_steps call it belongs to: its
 * completion releases the application buffer (see zc_span). */
#define WRID_ZC(gen, host, qp)	(((uint64_t)(gen) << 32) | WRID(host, qp, WR_ZC))

struct slot_hdr {
	uint32_t magic;
	uint32_t sig;
	uint64_t seq;
	uint32_t step;
	uint32_t piece;
	uint64_t len;
};

struct setup_msg {
	uint32_t magic;
	int32_t ok;			/* 1, or 0 and why says why not */
	struct kcoll_rdma_addr addr;
	uint64_t slots;			/* address of the receive slots */
	uint32_t rkey;
	uint32_t slot_bytes;
	char why[KCOLL_RDMA_WHY];
};

struct rpeer {
	int state;			/* 0: not set up, 1: up, < 0: failed with this error */
	struct kcoll_rdma_ep *ep;
	uint8_t *rbuf, *sbuf;		/* NSLOT slots each */
	struct ibv_mr *rmr, *smr;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t sfree;			/* send slots holding a credit */
	uint32_t arrived;		/* receive slots holding an unconsumed piece */
	uint32_t rr;			/* next QP, round robin */
	uint64_t pieces_out, pieces_in;
	uint64_t pieces_zc;		/* of pieces_out: written from the buffer itself */
	uint32_t zc_out;		/* zero-copy writes of this call not completed yet */
	uint32_t sq_out;		/* writes posted, not completed yet (all kinds) */
	uint32_t obs_out;		/* of them, observed pieces (WR_OBS) */
	int64_t obs_t;			/* C4: tx busy time counted up to here */
	bool eof;			/* its TCP stream closed: it left or died */
};

struct rstate {
	struct rpeer *peer;		/* [nhosts] */
	size_t slot_bytes;
	size_t piece;			/* min(KCOLL_IB_PIECE_BYTES, the comm's piece) */
	uint32_t nqp;
	uint32_t gen;			/* run_steps calls, for WRID_ZC */
	int64_t call_t;			/* when this run_steps call began */
	size_t zc_min;			/* KCOLL_IB_ZC_BYTES: pieces this large go zero-copy */
};

/* ---- starting ----------------------------------------------------------- */

/*
 * A device being removed must be closed by every process before the kernel
 * lets it go (rdma_rxe, docs/rdma.md): transfers notice it themselves, this
 * closes it in a daemon that has no communicator on it (every second).
 */
static void *reaper(void *arg)
{
	(void)arg;
	for (;;) {
		sleep(1);
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

/* ---- the TCP side channel (setup) ------------------------------------ */

static int fd_io(int fd, void *buf, size_t len, bool out, int64_t deadline)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = out ? send(fd, (uint8_t *)buf + done, len - done, MSG_DONTWAIT | MSG_NOSIGNAL) :
				  recv(fd, (uint8_t *)buf + done, len - done, MSG_DONTWAIT);

		if (n > 0) {
			done += n;
			continue;
		}
		if (!n)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return -ECONNRESET;
		int64_t left = (deadline - kd_now_ns()) / 1000000;
		struct pollfd p = { .fd = fd, .events = out ? POLLOUT : POLLIN };

		if (left <= 0)
			return -ETIMEDOUT;
		poll(&p, 1, left < 100 ? (int)left : 100);
	}
	return 0;
}

/* ---- per-peer setup --------------------------------------------------- */

static void peer_free(struct rpeer *p)
{
	kcoll_rdma_ep_destroy(p->ep);	/* QPs first: nothing writes the slots after */
	if (p->rmr)
		ibv_dereg_mr(p->rmr);
	if (p->smr)
		ibv_dereg_mr(p->smr);
	free(p->rbuf);
	free(p->sbuf);
	*p = (struct rpeer){ .state = p->state };
}

static int peer_prepare(struct kd_mh *mh, struct rstate *rs, uint32_t h, struct setup_msg *m)
{
	struct rpeer *p = &rs->peer[h];
	struct kcoll_rdma_port port;
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	/* aligned_alloc wants a multiple of the alignment */
	size_t bytes = (NSLOT * rs->slot_bytes + 4095) & ~(size_t)4095;
	uint32_t depth = 2 * NSLOT + 2;
	int r;

	memset(m, 0, sizeof(*m));
	m->magic = SETUP_MAGIC;
	if (getsockname(mh->hosts[h].data[0], (struct sockaddr *)&sa, &sl) || sa.sin_family != AF_INET) {
		snprintf(m->why, sizeof(m->why), "no IPv4 address on the data stream to host %u", h);
		return -EADDRNOTAVAIL;
	}
	r = kcoll_rdma_pick_gid(sa.sin_addr.s_addr, &port, m->why, sizeof(m->why));
	/* A device re-added since (after 'rdma link delete'): open it. */
	if (r == -EADDRNOTAVAIL && kcoll_rdma_rescan() > 0)
		r = kcoll_rdma_pick_gid(sa.sin_addr.s_addr, &port, m->why, sizeof(m->why));
	if (r)
		return r;
	r = kcoll_rdma_ep_create(&port, rs->nqp, NULL, depth, depth, &p->ep);
	if (r) {
		snprintf(m->why, sizeof(m->why), "cannot create %u RC QPs on %s: %s", rs->nqp,
			 kcoll_rdma_dev_name(port.dev), strerror(-r));
		return r;
	}
	fcntl(p->ep->ch->fd, F_SETFL, fcntl(p->ep->ch->fd, F_GETFL) | O_NONBLOCK);
	for (uint32_t i = 0; i < rs->nqp; i++) {
		struct kcoll_rdma_path path = kd_rdma_path_for(mh, h, i);

		r = kcoll_rdma_ep_set_path(p->ep, i, &path, m->why, sizeof(m->why));
		if (r)
			return r;
	}
	p->rbuf = aligned_alloc(4096, bytes);
	p->sbuf = aligned_alloc(4096, bytes);
	if (!p->rbuf || !p->sbuf) {
		snprintf(m->why, sizeof(m->why), "out of memory for %zu-byte slots", bytes);
		return -ENOMEM;
	}
	p->rmr = ibv_reg_mr(kcoll_rdma_pd(port.dev), p->rbuf, bytes,
			    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	p->smr = ibv_reg_mr(kcoll_rdma_pd(port.dev), p->sbuf, bytes, IBV_ACCESS_LOCAL_WRITE);
	if (!p->rmr || !p->smr) {
		r = -errno;
		snprintf(m->why, sizeof(m->why), "cannot register %zu bytes on %s: %s (RLIMIT_MEMLOCK?)",
			 bytes, kcoll_rdma_dev_name(port.dev), strerror(errno));
		return r;
	}
	for (uint32_t i = 0; i < rs->nqp; i++)
		for (uint32_t k = 0; k < depth; k++)
			if ((r = kcoll_rdma_post_recv(p->ep, i, WRID(h, i, WR_RECV)))) {
				snprintf(m->why, sizeof(m->why), "post_recv: %s", strerror(-r));
				return r;
			}
	m->ok = 1;
	m->addr = p->ep->local;
	m->slots = (uintptr_t)p->rbuf;
	m->rkey = p->rmr->rkey;
	m->slot_bytes = (uint32_t)rs->slot_bytes;
	return 0;
}

/*
 * Connect to every host in want[] not yet connected: send our setup message
 * to all of them first, then read theirs (a pair's two sides reach their
 * first common step together; writing first cannot deadlock), connect the
 * QPs, and swap one byte so that neither side writes before the other's
 * QPs can receive.
 */
static int connect_peers(struct kd_mh *mh, struct rstate *rs, const uint32_t *want, uint32_t n,
			 uint32_t *bad_host)
{
	struct setup_msg *mine = calloc(n ? n : 1, sizeof(*mine)), rem;
	int64_t deadline = kd_now_ns() + mh->comm->timeout_ns;
	int r = 0, prep[KD_MAX_HOSTS];

	if (!mine)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		prep[i] = peer_prepare(mh, rs, want[i], &mine[i]);
		if (prep[i])
			kc_warn("comm %s: rdma to host %u (%s): %s", mh->comm->name, want[i],
				mh->hosts[want[i]].info.name, mine[i].why);
		mine[i].ok = !prep[i];
		r = fd_io(mh->hosts[want[i]].data[0], &mine[i], sizeof(mine[i]), true, deadline);
		if (r) {
			*bad_host = want[i];
			goto out;
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t h = want[i];
		struct rpeer *p = &rs->peer[h];
		char why[KCOLL_RDMA_WHY];
		uint8_t b = 1;

		*bad_host = h;
		r = fd_io(mh->hosts[h].data[0], &rem, sizeof(rem), false, deadline);
		if (r)
			goto out;
		rem.why[sizeof(rem.why) - 1] = 0;
		if (rem.magic != SETUP_MAGIC || rem.slot_bytes != rs->slot_bytes) {
			kc_warn("comm %s: host %u sent a bad RDMA setup (magic %#x, slot %u bytes, ours %zu): "
				"is it running the same kcolld, with the same KCOLL_IB_PIECE_BYTES and "
				"KCOLL_NET_CHUNK_BYTES?", mh->comm->name, h, rem.magic, rem.slot_bytes, rs->slot_bytes);
			r = -EPROTO;
			goto out;
		}
		if (prep[i]) {
			r = prep[i];
			goto out;
		}
		if (rem.ok != 1) {
			kc_warn("comm %s: host %u (%s) cannot use RDMA: %s; set KCOLL_NET_XPORT=tcp on every "
				"host to use TCP", mh->comm->name, h, mh->hosts[h].info.name, rem.why);
			r = -EPROTONOSUPPORT;
			goto out;
		}
		r = kcoll_rdma_ep_connect(p->ep, &rem.addr, why, sizeof(why));
		if (r) {
			kc_warn("comm %s: rdma to host %u: %s", mh->comm->name, h, why);
			goto out;
		}
		p->raddr = rem.slots;
		p->rkey = rem.rkey;
		p->sfree = (1u << NSLOT) - 1;
		r = fd_io(mh->hosts[h].data[0], &b, 1, true, deadline);
		if (r)
			goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint8_t b;

		*bad_host = want[i];
		r = fd_io(mh->hosts[want[i]].data[0], &b, 1, false, deadline);
		if (r)
			goto out;
		rs->peer[want[i]].state = 1;
		kc_dbg("comm %s: rdma to host %u up: %s port %u GID index %d, %u QPs", mh->comm->name,
		       want[i], kcoll_rdma_dev_name(rs->peer[want[i]].ep->port.dev),
		       rs->peer[want[i]].ep->port.port, rs->peer[want[i]].ep->port.gid_index, rs->nqp);
	}
	*bad_host = KCOLL_RANK_NONE;
out:
	if (r)
		for (uint32_t i = 0; i < n; i++)
			if (rs->peer[want[i]].state != 1)
				rs->peer[want[i]].state = r;
	free(mine);
	return r;
}

/* ---- the step loop ------------------------------------------------------ */

struct cursor {
	uint32_t host;
	bool send;
	const uint8_t *base;
	uint8_t *dst;
	const uint8_t *src;
	bool reduce;
	struct kd_piece *pieces;
	uint32_t npieces;
	uint32_t next;		/* send: next piece to post */
	uint32_t ndone;		/* receive: pieces consumed */
	bool *pdone;		/* receive: which */
	uint32_t step;
	struct cursor *prev;	/* same host and direction, earlier step: finishes first */
	struct cursor *dep;	/* chained send: piece j waits for dep's piece j */
	bool done;
	int zc;			/* send: 0 not looked yet, 1 zero-copy from zmr, < 0 copy */
	struct ibv_mr *zmr;	/* the registration covering the buffer under base */
	const uint8_t *zlo, *zhi;	/* the span zmr covers */
	int64_t obs_t;		/* receive: C4 busy time counted up to here, 0 before */
};

/*
 * C4 link observation, as step.c's observe() does it (c4d.c reads
 * hh->obs_* every tick). The QPs to a peer use the address of its first
 * data stream (peer_prepare), so their traffic counts for stream 0's link.
 * Only pieces of KD_C4_OBS_MIN bytes or more count: smaller ones measure
 * latency, not rate.
 *   tx: busy while an observed write is outstanding (posted, not yet
 *       acknowledged by the peer's NIC). Writes a call left outstanding
 *       complete during the next call: the time between calls is the
 *       application's, so busy time restarts at the call's start.
 *   rx: busy from when the receive cursor started waiting to each piece's
 *       arrival, interval after interval. A piece that arrived before its
 *       cursor started counts as fast: over TCP, buffered data does too.
 */
static void obs_add(struct kd_mh *mh, uint32_t h, uint32_t dir, uint64_t bytes, int64_t busy_ns)
{
	struct kd_mh_host *hh = &mh->hosts[h];

	atomic_fetch_add_explicit(&hh->obs_bytes[0][dir], bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&hh->obs_busy[0][dir], (uint64_t)busy_ns, memory_order_relaxed);
}

/* The flag for a write of a piece of len bytes: WR_OBS when C4 observes it. */
static uint64_t obs_flag(uint64_t len)
{
	return len >= KD_C4_OBS_MIN ? WR_OBS : 0;
}

/* A piece of len bytes was posted to host h with obs_flag(len). */
static void obs_tx_posted(struct kd_mh *mh, struct rpeer *p, uint32_t h, uint64_t len)
{
	if (!obs_flag(len))
		return;
	if (!p->obs_out++)
		p->obs_t = kd_now_ns();
	obs_add(mh, h, 1, len, 0);
}

static void obs_tx_done(struct kd_mh *mh, const struct rstate *rs, struct rpeer *p, uint32_t h)
{
	int64_t now = kd_now_ns(), from = p->obs_t > rs->call_t ? p->obs_t : rs->call_t;

	if (!p->obs_out)
		return;
	p->obs_out--;
	obs_add(mh, h, 1, 0, now > from ? now - from : 0);
	p->obs_t = now;
}

static void obs_rx(struct kd_mh *mh, struct cursor *c, uint64_t len)
{
	int64_t now = kd_now_ns();

	if (len < KD_C4_OBS_MIN)
		return;
	obs_add(mh, c->host, 0, len, now - c->obs_t);
	c->obs_t = now;
}

static bool gated(const struct cursor *c)
{
	for (const struct cursor *p = c->prev; p; p = p->prev)
		if (!p->done)
			return true;
	return false;
}

static int wc_fail(struct kd_mh *mh, uint32_t h, const struct ibv_wc *wc)
{
	int r = wc->status == IBV_WC_RETRY_EXC_ERR || wc->status == IBV_WC_RNR_RETRY_EXC_ERR ?
		-EHOSTUNREACH : -EIO;

	kc_warn("comm %s: rdma to host %u (%s): %s on QP %u (the peer died, or a link or device on "
		"either side went away: check 'rdma link' on both hosts and the peer's kcolld)",
		mh->comm->name, h, mh->hosts[h].info.name, ibv_wc_status_str(wc->status), wc->qp_num);
	return r;
}

/* A port of ours that went down fails every peer on it. */
static int ports_ok(struct kd_mh *mh, struct rstate *rs, uint32_t *bad_host)
{
	char why[KCOLL_RDMA_WHY];

	for (uint32_t h = 0; h < mh->nhosts; h++) {
		struct rpeer *p = &rs->peer[h];
		int r;

		if (p->state != 1)
			continue;
		r = kcoll_rdma_port_check(p->ep->port.dev, p->ep->port.port, why, sizeof(why));
		if (r) {
			kc_warn("comm %s: rdma to host %u (%s): %s", mh->comm->name, h, mh->hosts[h].info.name,
				why);
			*bad_host = h;
			return p->state = r;
		}
	}
	return 0;
}

/* Take what the CQs of the peers in use hold. */
static int drain(struct kd_mh *mh, struct rstate *rs, bool *progress, uint32_t *bad_host)
{
	struct ibv_wc wc[16];

	for (uint32_t h = 0; h < mh->nhosts; h++) {
		struct rpeer *p = &rs->peer[h];
		int n;

		if (p->state != 1)
			continue;
		while (p->state == 1 && (n = ibv_poll_cq(p->ep->cq, 16, wc)) > 0) {
			for (int i = 0; i < n; i++) {
				uint32_t kind = WR_KIND(wc[i].wr_id), qpi = (wc[i].wr_id >> 8) & 0xff;

				if (kind != WR_RECV && p->sq_out)
					p->sq_out--;
				if (wc[i].status != IBV_WC_SUCCESS && p->eof) {
					/* Our credit to a peer that left: its QP is
					 * gone. Fatal only to a call that needs it. */
					p->state = -ECONNRESET;
					break;
				}
				if (wc[i].status != IBV_WC_SUCCESS) {
					*bad_host = h;
					p->state = wc_fail(mh, h, &wc[i]);
					return p->state;
				}
				if (wc[i].wr_id & WR_OBS)
					obs_tx_done(mh, rs, p, h);
				if (kind == WR_ZC && (uint32_t)(wc[i].wr_id >> 32) == rs->gen && p->zc_out) {
					p->zc_out--;
					*progress = true;
				}
				if (kind != WR_RECV)
					continue;
				uint32_t imm = ntohl(wc[i].imm_data), slot = imm & ~IMM_CREDIT;
				int r;

				if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM || slot >= NSLOT) {
					kc_warn("comm %s: host %u sent an unexpected RDMA message (opcode %d, "
						"immediate %#x)", mh->comm->name, h, wc[i].opcode, imm);
					*bad_host = h;
					return p->state = -EPROTO;
				}
				r = kcoll_rdma_post_recv(p->ep, qpi, wc[i].wr_id);
				if (r) {
					*bad_host = h;
					return p->state = r;
				}
				if (imm & IMM_CREDIT)
					p->sfree |= 1u << slot;
				else
					p->arrived |= 1u << slot;
				*progress = true;
			}
		}
		if (n < 0) {
			*bad_host = h;
			return p->state = -EIO;
		}
	}
	return 0;
}

static int consume(struct kd_mh *mh, struct kd_op *op, struct rstate *rs, struct cursor *c, uint32_t first,
		   bool *progress)
{
	struct rpeer *p = &rs->peer[c->host];

	if (!c->obs_t)
		c->obs_t = kd_now_ns();
	for (uint32_t k = 0; k < NSLOT && !c->done; k++) {
		if (!(p->arrived & (1u << k)))
			continue;
		uint8_t *slot = p->rbuf + k * rs->slot_bytes;
		struct slot_hdr h;
		const struct kd_piece *pc;
		int r = 0;

		memcpy(&h, slot, sizeof(h));
		if (h.magic != SLOT_MAGIC) {
			kc_warn("comm %s: host %u wrote garbage into an RDMA slot", op->comm->name, c->host);
			return -EPROTO;
		}
		if (h.seq == op->seq && h.sig != mh->sig) {
			kc_warn("comm %s: op %llu: host %u runs a different operation (type, count, dtype, op "
				"or root differ)", op->comm->name, (unsigned long long)op->seq, c->host);
			return -EBADMSG;
		}
		if (h.seq < op->seq || (h.seq == op->seq && h.step < first)) {
			kc_warn("comm %s: host %u is out of step (op %llu step %u, we run op %llu from step %u)",
				op->comm->name, c->host, (unsigned long long)h.seq, h.step,
				(unsigned long long)op->seq, first);
			return -EPROTO;
		}
		if (h.seq != op->seq || h.step != c->step)
			continue;	/* a later step's: stays until its cursor runs */
		if (h.piece >= c->npieces || c->pdone[h.piece] || h.len != c->pieces[h.piece].len) {
			kc_warn("comm %s: host %u sent piece %u of step %u twice or with a wrong length",
				op->comm->name, c->host, h.piece, h.step);
			return -EPROTO;
		}
		pc = &c->pieces[h.piece];
		if (pc->len) {
			const uint8_t *data = slot + HDR_BYTES;

			if (c->reduce) {
				/* The same order on every host: the lower host's data first. */
				const uint8_t *mine = c->src + pc->off;
				const void *in[2] = { c->host < mh->self ? (const void *)data : mine,
						      c->host < mh->self ? (const void *)mine : data };

				r = kcoll_reduce_n(mh->dtype, mh->redop, mh->acc + pc->off, in, 2,
						   pc->len / mh->esz);
				if (r)
					return r;
			} else {
				memcpy(c->dst + pc->off, data, pc->len);
			}
		}
		p->arrived &= ~(1u << k);
		uint32_t imm = IMM_CREDIT | k;

		r = kcoll_rdma_write(p->ep, k % rs->nqp, NULL, NULL, 0, p->raddr, p->rkey, &imm,
				     WRID(c->host, k % rs->nqp, WR_CREDIT));
		if (r)
			return r;
		p->sq_out++;
		c->pdone[h.piece] = true;
		obs_rx(mh, c, pc->len);
		p->pieces_in++;
		atomic_fetch_add(&mh->bytes_recv, pc->len + HDR_BYTES);
		*progress = true;
		if (++c->ndone == c->npieces)
			c->done = true;
	}
	return 0;
}

/*
 * Zero-copy: the buffer a send cursor reads from, as a whole, registered
 * through the cache. It is the comm's own accumulator or snapshot (kd_mh),
 * or a client region kcolld maps (a sealed memfd, or kcoll.ko pages) that
 * one of the op's buffers lies in. Registering the whole span keeps the
 * cache to one entry per buffer; whoever unmaps or reallocates one calls
 * kcoll_rdma_mr_invalidate first (kd_region_put, mh.c's need/snap/close), and
 * an op holds its regions until it ends, after run_steps has waited for its
 * zero-copy writes. kcoll.ko regions are PFN maps that ibv_reg_mr cannot
 * pin: they (and any buffer the cache cannot register) stay on the copy path.
 */
static void zc_span(struct kd_mh *mh, struct kd_op *op, struct rstate *rs, struct cursor *c)
{
	const uint8_t *b = c->base, *lo = NULL;
	struct kd_region *kr = NULL;
	size_t len = 0;
	int r;

	c->zc = -1;
	if (!rs->zc_min)
		return;
	if (mh->own && b >= mh->own && b < mh->own + mh->acc_size) {
		lo = mh->own;
		len = mh->acc_size;
	} else if (mh->snap && b >= mh->snap && b < mh->snap + mh->snap_size) {
		lo = mh->snap;
		len = mh->snap_size;
	} else {
		for (uint32_t rk = 0; !lo && rk < op->comm->nranks; rk++) {
			const struct kd_contrib *ct = &op->c[rk];
			struct kd_region *rg[2] = { ct->sbuf.rg, ct->rbuf.rg };

			for (int i = 0; ct->present && i < 2; i++)
				if (rg[i] && b >= rg[i]->map && b < rg[i]->map + rg[i]->size) {
					kr = rg[i]->pinned ? rg[i] : NULL;
					lo = rg[i]->map;
					len = rg[i]->size;
					break;
				}
		}
	}
	if (kr) {
		/* A kcoll.ko region: ibv_reg_mr cannot pin its PFN map, the NIC
		 * takes kcoll.ko's dma-buf of the same pages (iova = the map).
		 * A device that refused one gets no more (no export, no fd). */
		int dev = rs->peer[c->host].ep->port.dev;
		int fd = kcoll_rdma_dmabuf_refused(dev) ? -1 : kd_region_dmabuf(kr);

		if (fd < 0)
			return;
		lo = kr->kmap.map_base;
		len = kr->kmap.map_len;
		r = kcoll_rdma_mr_get_local_fd(dev, (void *)lo, len, fd, &c->zmr);
	} else if (lo) {
		/* Local access only: no peer can use this registration's rkey. */
		r = kcoll_rdma_mr_get_local(rs->peer[c->host].ep->port.dev, (void *)lo, len, &c->zmr);
	} else {
		return;
	}
	if (r) {
		kc_dbg("comm %s: cannot register %zu bytes for zero-copy sends (%s): copying", op->comm->name,
		       len, strerror(-r));
		return;
	}
	c->zlo = lo;
	c->zhi = lo + len;
	c->zc = 1;
}

static int post_sends(struct kd_mh *mh, struct kd_op *op, struct rstate *rs, struct cursor *c, bool *progress)
{
	struct rpeer *p = &rs->peer[c->host];

	while (c->next < c->npieces && p->sfree) {
		if (c->dep && !c->dep->done && !c->dep->pdone[c->next])
			return 0;
		uint32_t k = (uint32_t)__builtin_ctz(p->sfree), qpi = p->rr++ % rs->nqp;
		const struct kd_piece *pc = &c->pieces[c->next];
		uint8_t *slot = p->sbuf + k * rs->slot_bytes;
		struct slot_hdr h = { .magic = SLOT_MAGIC, .sig = mh->sig, .seq = op->seq, .step = c->step,
				      .piece = c->next, .len = pc->len };
		int r;

		const uint8_t *src = c->base + pc->off;

		memcpy(slot, &h, sizeof(h));
		if (pc->len >= rs->zc_min && rs->zc_min && !c->zc)
			zc_span(mh, op, rs, c);
		if (pc->len >= rs->zc_min && c->zc > 0 && src >= c->zlo && src + pc->len <= c->zhi) {
			/* The header from the slot, the payload straight from
			 * the buffer: one WRITE_WITH_IMM, the same bytes at
			 * the receiver as the copy path's. */
			struct ibv_sge sg[2] = {
				{ .addr = (uintptr_t)slot, .length = HDR_BYTES, .lkey = p->smr->lkey },
				{ .addr = (uintptr_t)src, .length = (uint32_t)pc->len, .lkey = c->zmr->lkey },
			};

			r = kcoll_rdma_write_sg(p->ep, qpi, sg, 2, p->raddr + k * rs->slot_bytes, p->rkey, &k,
						WRID_ZC(rs->gen, c->host, qpi) | obs_flag(pc->len));
			if (r)
				return r;
			p->sq_out++;
			p->zc_out++;
			p->pieces_zc++;
		} else {
			if (pc->len)
				memcpy(slot + HDR_BYTES, src, pc->len);
			r = kcoll_rdma_write(p->ep, qpi, p->smr, slot, HDR_BYTES + pc->len,
					     p->raddr + k * rs->slot_bytes, p->rkey, &k,
					     WRID(c->host, qpi, WR_DATA) | obs_flag(pc->len));
			if (r)
				return r;
			p->sq_out++;
		}
		obs_tx_posted(mh, p, c->host, pc->len);
		p->sfree &= ~(1u << k);
		p->pieces_out++;
		atomic_fetch_add(&mh->bytes_sent, pc->len + HDR_BYTES);
		c->next++;
		*progress = true;
	}
	if (c->next == c->npieces)
		c->done = true;
	return 0;
}

static int peer_left(struct kd_mh *mh, uint32_t h, uint32_t *bad_host)
{
	kc_warn("comm %s: host %u (%s) closed its connection: its kcolld died or left", mh->comm->name, h,
		mh->hosts[h].info.name);
	*bad_host = h;
	return -ECONNRESET;
}

static int rdma_run_steps(struct kd_mh *mh, struct kd_op *op, const struct kd_step *st, uint32_t n,
			  uint32_t first, bool chain, uint32_t *bad_host)
{
	struct kd_comm *comm = op->comm;
	struct rstate *rs = mh->xpriv;
	uint32_t nc = 0, k = 0, nl = 0, nwant = 0, want[KD_MAX_HOSTS];
	struct cursor *cs = NULL;
	struct kd_piece **lists = NULL;
	struct pollfd pfd[3 * KD_MAX_HOSTS + 1];
	uint32_t pfd_host[3 * KD_MAX_HOSTS + 1];
	int64_t slack = comm->timeout_ns + 2000000000LL, idle_since = 0;
	int r = 0;

	*bad_host = KCOLL_RANK_NONE;
	if (!rs) {
		rs = calloc(1, sizeof(*rs));
		if (!rs || !(rs->peer = calloc(mh->nhosts, sizeof(*rs->peer)))) {
			free(rs);
			return -ENOMEM;
		}
		/* Pieces no larger than KCOLL_IB_PIECE_BYTES: a message of a
		 * few of them keeps both QPs busy and overlaps the writes with
		 * the receiver's copy-out (docs/perf/rdma.md §7). */
		rs->piece = (size_t)kcoll_knob_ll("KCOLL_IB_PIECE_BYTES") & ~(size_t)4095;
		if (!rs->piece || rs->piece > mh->piece)
			rs->piece = mh->piece;
		rs->slot_bytes = HDR_BYTES + rs->piece;
		rs->zc_min = (size_t)kcoll_knob_ll("KCOLL_IB_ZC_BYTES");
		rs->nqp = (uint32_t)kcoll_knob_ll("KCOLL_IB_QPS");
		if (rs->nqp < 1 || rs->nqp > KCOLL_RDMA_MAX_QPS)
			rs->nqp = 2;
		mh->xpriv = rs;
	}
	if (rs->piece > mh->piece)
		return -EINVAL;	/* the piece size is fixed per comm */
	/* Zero-copy writes still in flight from a call that failed are
	 * ignored by their generation. */
	rs->gen++;
	rs->call_t = kd_now_ns();
	for (uint32_t h = 0; h < mh->nhosts; h++)
		rs->peer[h].zc_out = 0;
	for (uint32_t t = 0; t < n; t++) {
		for (uint32_t x = 0; x < st[t].nsend + st[t].nrecv; x++) {
			uint32_t h = x < st[t].nsend ? st[t].send[x].host : st[t].recv[x - st[t].nsend].host;
			struct rpeer *p = &rs->peer[h];
			bool dup = false;

			if (p->state < 0) {
				*bad_host = h;
				return p->state;
			}
			for (uint32_t i = 0; i < nwant; i++)
				dup |= want[i] == h;
			if (!p->state && !dup)
				want[nwant++] = h;
		}
		nc += st[t].nsend + st[t].nrecv;
	}
	if (nwant && (r = connect_peers(mh, rs, want, nwant, bad_host)))
		return r;
	cs = calloc(nc ? nc : 1, sizeof(*cs));
	lists = calloc(nc ? nc : 1, sizeof(*lists));
	if (!cs || !lists) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t t = 0; t < n; t++) {
		for (uint32_t x = 0; x < st[t].nsend + st[t].nrecv; x++, k++) {
			bool send = x < st[t].nsend;
			const struct kd_xfer *xf = send ? &st[t].send[x] : &st[t].recv[x - st[t].nsend];
			struct cursor *c = &cs[k];

			lists[nl] = kd_xfer_cut(xf, rs->piece, &c->npieces);
			if (!lists[nl]) {
				r = -ENOMEM;
				goto out;
			}
			c->pieces = lists[nl++];
			c->host = xf->host;
			c->send = send;
			c->base = xf->base ? xf->base : mh->acc;
			c->dst = xf->dst ? xf->dst : mh->acc;
			c->src = xf->src ? xf->src : mh->acc;
			c->reduce = !send && st[t].reduce;
			c->step = first + t;
			if (!send && !(c->pdone = calloc(c->npieces, sizeof(bool)))) {
				r = -ENOMEM;
				goto out;
			}
			for (uint32_t j = k; j-- > 0;)
				if (cs[j].host == c->host && cs[j].send == send) {
					c->prev = &cs[j];
					break;
				}
			if (t && chain && send)
				c->dep = &cs[k - 2 + 1];	/* chained: send, recv per step */
		}
	}
	for (;;) {
		bool progress = false;
		uint32_t pending = 0, np = 0;

		r = drain(mh, rs, &progress, bad_host);
		if (r)
			goto out;
		for (uint32_t i = 0; i < nc; i++) {
			struct cursor *c = &cs[i];

			if (c->done)
				continue;
			pending++;
			if (gated(c))
				continue;
			if (rs->peer[c->host].state < 0) {
				r = peer_left(mh, c->host, bad_host);
				goto out;
			}
			r = c->send ? post_sends(mh, op, rs, c, &progress) :
				      consume(mh, op, rs, c, first, &progress);
			if (r) {
				*bad_host = c->host;
				goto out;
			}
		}
		if (!pending) {
			uint32_t zc = 0;

			/* The buffers the zero-copy writes read stay the
			 * caller's to change once we return: wait for them. */
			for (uint32_t h = 0; h < mh->nhosts; h++)
				zc += rs->peer[h].state == 1 ? rs->peer[h].zc_out : 0;
			if (!zc)
				break;
		}
		if (op->seq >= __atomic_load_n(&comm->limit_seq, __ATOMIC_RELAXED)) {
			r = -ECANCELED;
			goto out;
		}
		if (progress) {
			idle_since = 0;
			atomic_store(&mh->last_progress, kd_now_ns());
			continue;
		}
		if (!idle_since) {
			idle_since = kd_now_ns();
			r = ports_ok(mh, rs, bad_host);
			if (r)
				goto out;
		}
		if (kd_now_ns() - idle_since < kd.spin_ns) {
			sched_yield();
			continue;
		}
		/* Arm every CQ, then look once more: a completion that came
		 * before the arming raises no event. */
		for (uint32_t h = 0; h < mh->nhosts; h++)
			if (rs->peer[h].state == 1)
				ibv_req_notify_cq(rs->peer[h].ep->cq, 0);
		r = drain(mh, rs, &progress, bad_host);
		if (r)
			goto out;
		if (progress)
			continue;
		/* Nothing moved: a peer that left can no longer give what a
		 * cursor still needs. */
		for (uint32_t i = 0; i < nc; i++)
			if (!cs[i].done && rs->peer[cs[i].host].eof) {
				r = peer_left(mh, cs[i].host, bad_host);
				goto out;
			}
		for (uint32_t h = 0; h < mh->nhosts; h++) {
			if (rs->peer[h].state != 1)
				continue;
			pfd_host[np] = h;
			pfd[np++] = (struct pollfd){ .fd = rs->peer[h].ep->ch->fd, .events = POLLIN };
			/* A peer that dies closes its TCP streams: that wakes us. */
			if (!rs->peer[h].eof) {
				pfd_host[np] = h;
				pfd[np++] = (struct pollfd){ .fd = mh->hosts[h].data[0],
							     .events = POLLIN | POLLRDHUP };
			}
			/* A port going down raises an async event. */
			pfd_host[np] = h;
			pfd[np++] = (struct pollfd){ .fd = kcoll_rdma_async_fd(rs->peer[h].ep->port.dev),
						     .events = POLLIN };
		}
		for (uint32_t i = 0; i < nc; i++)
			if (!cs[i].done && !cs[i].send && !gated(&cs[i]))
				mh->wait_host = cs[i].host;
		pfd[np++] = (struct pollfd){ .fd = mh->abort_fd, .events = POLLIN };
		int64_t left = (atomic_load(&mh->last_progress) + slack - kd_now_ns()) / 1000000;

		if (left <= 0) {
			*bad_host = mh->wait_host;
			r = -ETIMEDOUT;
			goto out;
		}
		if (poll(pfd, np, left < 100 ? (int)left : 100) <= 0)
			continue;
		for (uint32_t i = 0; i + 1 < np; i++) {
			uint32_t h = pfd_host[i];

			if (!pfd[i].revents)
				continue;
			if (pfd[i].fd == rs->peer[h].ep->ch->fd) {
				struct ibv_cq *cq;
				void *ctx;

				if (!ibv_get_cq_event(rs->peer[h].ep->ch, &cq, &ctx))
					ibv_ack_cq_events(cq, 1);
			} else if (pfd[i].fd == mh->hosts[h].data[0]) {
				/* It closes its streams only after its writes
				 * completed (rdma_close), so all it sent is in
				 * our CQ: the call fails only if, once that is
				 * taken, it still needs this peer (above). */
				rs->peer[h].eof = true;
			} else {
				r = ports_ok(mh, rs, bad_host);
				if (r)
					goto out;
			}
		}
		if (pfd[np - 1].revents & POLLIN) {
			uint64_t v;

			if (read(mh->abort_fd, &v, sizeof(v)) < 0)
				v = 0;
		}
	}
out:
	for (uint32_t i = 0; i < nc && cs; i++)
		free(cs[i].pdone);
	for (uint32_t x = 0; x < nl; x++)
		free(lists[x]);
	free(lists);
	free(cs);
	return r;
}

/*
 * A call returns once its last writes are posted, not delivered: a rank
 * may destroy the communicator while the NIC still sends them. Destroying
 * the QPs then would lose them, and a peer still in that call would wait
 * for them in vain. Wait (boundedly) until each live peer acknowledged
 * every write; only then do the QPs and, after them, the TCP streams close.
 */
static void flush_sends(struct kd_mh *mh, struct rstate *rs)
{
	int64_t end = kd_now_ns() + FLUSH_NS;
	struct ibv_wc wc[16];

	for (uint32_t h = 0; h < mh->nhosts; h++) {
		struct rpeer *p = &rs->peer[h];

		while (p->state == 1 && !p->eof && p->sq_out && kd_now_ns() < end) {
			int n = ibv_poll_cq(p->ep->cq, 16, wc);

			for (int i = 0; i < n; i++)
				if (WR_KIND(wc[i].wr_id) != WR_RECV && p->sq_out)
					p->sq_out--;
			for (int i = 0; i < n; i++)
				if (wc[i].status != IBV_WC_SUCCESS)
					p->state = -EIO;
			if (n < 0)
				p->state = -EIO;
			if (!n)
				usleep(100);
		}
		if (p->state == 1 && !p->eof && p->sq_out)
			kc_warn("comm %s: closing with %u writes to host %u (%s) not acknowledged after %d ms",
				mh->comm->name, p->sq_out, h, mh->hosts[h].info.name,
				(int)(FLUSH_NS / 1000000));
	}
}

static void rdma_close(struct kd_mh *mh)
{
	struct rstate *rs = mh->xpriv;

	if (!rs)
		return;
	flush_sends(mh, rs);
	for (uint32_t h = 0; h < mh->nhosts; h++)
		peer_free(&rs->peer[h]);
	free(rs->peer);
	free(rs);
	mh->xpriv = NULL;
	/* A device being removed closes with its last endpoint. */
	kcoll_rdma_reap();
}


/* ---- path control ------------------------------------------------------ */

/* Entry i % n of a comma-separated list, in out (empty when the list is). */
static void list_item(const char *list, uint32_t i, char *out, size_t cap)
{
	uint32_t n = 1;
	const char *s = list;

	*out = 0;
	if (!*list)
		return;
	for (const char *q = list; *q; q++)
		n += *q == ',';
	for (i %= n; i; i--)
		s = strchr(s, ',') + 1;
	size_t len = strcspn(s, ",");

	if (len < cap) {
		memcpy(out, s, len);
		out[len] = 0;
	}
}

struct kcoll_rdma_path kd_rdma_path_for(struct kd_mh *mh, uint32_t host, uint32_t qp)
{
	/*
	 * Default: spread a peer's QPs over distinct flow labels (and so UDP
	 * source ports where the device derives them from the label).
	 * KCOLL_IB_FLOW_LABEL gives the first label, KCOLL_IB_UDP_SPORT the
	 * first UDP source port instead (QP i: +i); KCOLL_IB_QP_ADDRS pins QP i
	 * to the port and GID of local address i (round robin over the list),
	 * else every QP uses the peer's (the GID of the address its data
	 * stream leaves from). A planner may override all of it per host.
	 */
	long long base = kcoll_knob_ll("KCOLL_IB_FLOW_LABEL"), sport = kcoll_knob_ll("KCOLL_IB_UDP_SPORT");
	struct kcoll_rdma_path p = { 0 };
	char a[64], why[KCOLL_RDMA_WHY];
	struct in_addr ip;

	if (sport >= 0xc000 && sport <= 0xffff)
		p.flow_label = kcoll_rdma_flow_label_for_sport((uint16_t)(0xc000 | ((sport + qp) & 0x3fff)));
	else if (base > 0)
		p.flow_label = (uint32_t)((base + qp) & 0xfffff);
	list_item(kcoll_knob_str("KCOLL_IB_QP_ADDRS"), qp, a, sizeof(a));
	if (!*a)
		return p;
	if (inet_pton(AF_INET, a, &ip) != 1)
		kc_warn("comm %s: KCOLL_IB_QP_ADDRS entry '%s' is not an IPv4 address: QP %u to host %u uses "
			"the peer's GID", mh->comm->name, a, qp, host);
	else if (kcoll_rdma_pick_gid_ip(ip.s_addr, &p.port, why, sizeof(why)))
		kc_warn("comm %s: KCOLL_IB_QP_ADDRS: QP %u to host %u: %s; it uses the peer's GID", mh->comm->name,
			qp, host, why);
	else
		p.own_port = true;
	return p;
}

/* ---- status ------------------------------------------------------------ */

static size_t rdma_render(struct kd_mh *mh, char *buf, size_t cap, int json)
{
	struct rstate *rs = mh->xpriv;
	size_t n = 0;
	bool firstp = true;

#define PUT(...) do { if (n < cap) n += snprintf(buf + n, cap - n, __VA_ARGS__); } while (0)
	if (json)
		PUT("\"rdma\":[");
	for (uint32_t h = 0; rs && h < mh->nhosts; h++) {
		struct rpeer *p = &rs->peer[h];
		char g[INET6_ADDRSTRLEN] = "";

		if (!p->ep)
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

/* The legacy entry (xport.h): RDMA runs its own step loop until it is
 * ported onto the narrow interface. */
const struct kd_xport_ops kd_xport_rdma = {
	.size = sizeof(struct kd_xport_ops),
	.version = KD_XPORT_VERSION,
	.name = "rdma",
	.init = rdma_init,
	.run_steps = rdma_run_steps,
	.legacy_close = rdma_close,
	.legacy_render = rdma_render,
};
