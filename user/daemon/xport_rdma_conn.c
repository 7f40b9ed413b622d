// SPDX-License-Identifier: MIT
/*
 * The RDMA transport's connection to one peer (xport_rdma.c runs the data
 * path over it): on the first send or receive between two daemons, each
 * side creates its endpoint (KCOLL_IB_QPS RC QPs, their paths from
 * xport_rdma_path.c) and its receive slots, posts the receives, and sends
 * QP numbers, GIDs, the slots' address and rkey over the pair's first TCP
 * data stream. Then each connects its QPs and sends one byte, so that
 * neither writes before the other's QPs can receive. Every step is
 * non-blocking, advanced from poll(): pairs set up in any order, and a peer
 * that never answers fails after the comm's timeout.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kcolld.h"
#include "log.h"
#include "xport_rdma.h"
#include "xport_rdma_int.h"

/* Our half of the exchange in p->out: endpoint, slots, receives posted. */
static int peer_prepare(struct rctx *x, uint32_t h)
{
	struct rpeer *p = &x->peer[h];
	struct setup_msg *m = &p->out;
	struct kcoll_rdma_port port;
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	/* aligned_alloc wants a multiple of the alignment */
	size_t bytes = (x->nstreams * NSLOT * x->slot_bytes + 4095) & ~(size_t)4095;
	uint32_t depth = 2 * NSLOT * x->nstreams + 2;
	int r;

	if (getsockname(p->fd, (struct sockaddr *)&sa, &sl) || sa.sin_family != AF_INET) {
		snprintf(m->why, sizeof(m->why), "no IPv4 address on the data stream to host %u", h);
		return -EADDRNOTAVAIL;
	}
	r = kcoll_rdma_pick_gid(sa.sin_addr.s_addr, &port, m->why, sizeof(m->why));
	/* A device re-added since (after 'rdma link delete'): open it. */
	if (r == -EADDRNOTAVAIL && kcoll_rdma_rescan() > 0)
		r = kcoll_rdma_pick_gid(sa.sin_addr.s_addr, &port, m->why, sizeof(m->why));
	if (r)
		return r;
	r = kcoll_rdma_ep_create(&port, x->nqp, NULL, depth, depth, &p->ep);
	if (r) {
		snprintf(m->why, sizeof(m->why), "cannot create %u RC QPs on %s: %s", x->nqp,
			 kcoll_rdma_dev_name(port.dev), strerror(-r));
		return r;
	}
	fcntl(p->ep->ch->fd, F_SETFL, fcntl(p->ep->ch->fd, F_GETFL) | O_NONBLOCK);
	for (uint32_t i = 0; i < x->nqp; i++) {
		struct kcoll_rdma_path path = kd_rdma_path_for(x->name, h, i);

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
	for (uint32_t i = 0; i < x->nqp; i++)
		for (uint32_t k = 0; k < depth; k++)
			if ((r = kcoll_rdma_post_recv(p->ep, i, WRID(WR_RECV, 0, i)))) {
				snprintf(m->why, sizeof(m->why), "post_recv: %s", strerror(-r));
				return r;
			}
	m->ok = 1;
	m->addr = p->ep->local;
	m->slots = (uintptr_t)p->rbuf;
	m->rkey = p->rmr->rkey;
	return 0;
}

/* A peer is lost: log why once; its pieces fail in poll(). */
void kd_rdma_peer_fail(struct rctx *x, uint32_t h, int err, const char *why)
{
	struct rpeer *p = &x->peer[h];

	if (p->state < 0)
		return;
	kc_warn("comm %s: rdma to host %u (%s): %s", x->name, h, p->name, why);
	p->state = err;
}

/* Non-blocking I/O of the exchange on the TCP stream: 1 when all of
 * [*done, len) moved, 0 when it would block, -ECONNRESET. */
static int fd_more(int fd, void *buf, size_t len, size_t *done, bool out)
{
	while (*done < len) {
		ssize_t n = out ? send(fd, (uint8_t *)buf + *done, len - *done, MSG_DONTWAIT | MSG_NOSIGNAL) :
				  recv(fd, (uint8_t *)buf + *done, len - *done, MSG_DONTWAIT);

		if (n > 0) {
			*done += n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return 0;
		return -ECONNRESET;
	}
	return 1;
}

/* Send out, then receive in, on peer h's stream: 1 when both are through,
 * 0 when it would block, -1 when the peer closed it (h failed). */
static int exchange(struct rctx *x, uint32_t h, void *out, size_t olen, void *in, size_t ilen)
{
	struct rpeer *p = &x->peer[h];
	int r = fd_more(p->fd, out, olen, &p->out_done, true);

	if (r > 0)
		r = fd_more(p->fd, in, ilen, &p->in_done, false);
	if (r < 0) {
		p->eof = true;
		kd_rdma_peer_fail(x, h, -ECONNRESET, "its kcolld closed the connection during the RDMA setup");
		return -1;
	}
	return r;
}

/* First use of peer h: start the exchange (our message goes out first,
 * both sides do so, so no order of setups can deadlock). */
void kd_rdma_peer_start(struct rctx *x, uint32_t h)
{
	struct rpeer *p = &x->peer[h];
	int r;

	memset(&p->out, 0, sizeof(p->out));
	p->out.magic = SETUP_MAGIC;
	p->out.slot_bytes = (uint32_t)x->slot_bytes;
	p->out.nstreams = x->nstreams;
	if (p->fd < 0)
		snprintf(p->out.why, sizeof(p->out.why), "no data stream to it");
	r = p->fd < 0 ? -ENOTCONN : peer_prepare(x, h);
	if (r)
		kc_warn("comm %s: rdma to host %u (%s): %s", x->name, h, p->name, p->out.why);
	p->out.ok = !r;
	p->state = P_SETUP;
	p->deadline = kd_now_ns() + x->timeout_ns;
	if (p->fd < 0)
		p->state = -ENOTCONN;
}

/* Advance the exchange with peer h; true when something moved. */
bool kd_rdma_peer_setup(struct rctx *x, uint32_t h)
{
	struct rpeer *p = &x->peer[h];
	char why[KCOLL_RDMA_WHY + 160];
	int r;

	if (p->state == P_SETUP) {
		r = exchange(x, h, &p->out, sizeof(p->out), &p->in, sizeof(p->in));
		if (r < 0)
			return true;
		if (!r)
			goto wait;
		p->in.why[sizeof(p->in.why) - 1] = 0;
		if (p->in.magic != SETUP_MAGIC || p->in.slot_bytes != x->slot_bytes ||
		    p->in.nstreams != x->nstreams) {
			snprintf(why, sizeof(why), "a bad RDMA setup came (magic %#x, slot %u bytes, %u streams; "
				 "ours %zu, %u): is it running the same kcolld, with the same KCOLL_IB_PIECE_BYTES "
				 "and KCOLL_NET_CHUNK_BYTES?", p->in.magic, p->in.slot_bytes, p->in.nstreams,
				 x->slot_bytes, x->nstreams);
			kd_rdma_peer_fail(x, h, -EPROTO, why);
			return true;
		}
		if (!p->out.ok) {
			kd_rdma_peer_fail(x, h, -EPROTONOSUPPORT, "this host cannot use RDMA (above)");
			return true;
		}
		if (p->in.ok != 1) {
			snprintf(why, sizeof(why), "it cannot use RDMA: %s; set KCOLL_NET_XPORT=tcp on every host "
				 "to use TCP", p->in.why);
			kd_rdma_peer_fail(x, h, -EPROTONOSUPPORT, why);
			return true;
		}
		r = kcoll_rdma_ep_connect(p->ep, &p->in.addr, why, sizeof(why));
		if (r) {
			kd_rdma_peer_fail(x, h, r, why);
			return true;
		}
		p->raddr = p->in.slots;
		p->rkey = p->in.rkey;
		for (uint32_t s = 0; s < x->nstreams; s++)
			p->st[s].sfree = (1u << NSLOT) - 1;
		p->state = P_READY;
		p->out_done = p->in_done = 0;
		p->ready_out = 1;
	}
	if (p->state == P_READY) {
		/* One byte each way: neither side writes before the other's QPs
		 * can receive. */
		r = exchange(x, h, &p->ready_out, 1, &p->ready_in, 1);
		if (r < 0)
			return true;
		if (!r)
			goto wait;
		p->state = P_UP;
		kc_dbg("comm %s: rdma to host %u up: %s port %u GID index %d, %u QPs", x->name, h,
		       kcoll_rdma_dev_name(p->ep->port.dev), p->ep->port.port, p->ep->port.gid_index, x->nqp);
		return true;
	}
	return false;
wait:
	if (kd_now_ns() > p->deadline) {
		kd_rdma_peer_fail(x, h, -ETIMEDOUT, "no answer to the RDMA setup within the comm's timeout");
		return true;
	}
	return false;
}

void kd_rdma_peer_free(struct rpeer *p)
{
	kcoll_rdma_ep_destroy(p->ep);	/* QPs first: nothing writes the slots after */
	if (p->rmr)
		ibv_dereg_mr(p->rmr);
	if (p->smr)
		ibv_dereg_mr(p->smr);
	free(p->rbuf);
	free(p->sbuf);
	free(p->st);
}
