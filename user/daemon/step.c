// SPDX-License-Identifier: MIT
/*
 * The step engine: runs the steps of an inter-host algorithm over any
 * transport of the narrow interface (xport.h), which only moves pieces.
 * Each transfer is cut into pieces (ranges cut at mh->piece bytes); piece i
 * of a transfer travels on stream u[i % nu] of that peer, u being the
 * streams the C4 plan leaves in use toward it, so the receiver knows what
 * comes next on every stream without asking. Every piece carries a header
 * (op seq, step, piece, the op's parameter signature): a peer out of step
 * or disagreeing about the op is caught on its first piece, not by corrupt
 * results.
 *
 * All sends and receives of the steps progress together, one cursor per
 * transfer and stream; a received piece is reduced as soon as it is in,
 * while the transport keeps moving the following ones: network transfer,
 * reduction and the next send overlap. A send cursor keeps up to the
 * transport's send_depth pieces posted per stream (the next to post runs
 * ahead of the next to complete), so a transport whose TX event comes only
 * when the peer has the piece (RDMA) still keeps its link full. Here too:
 * chaining (a ring step's piece j leaves once the previous step's piece j
 * is in), cancellation (the comm's limit_seq, woken through its abort
 * eventfd), the watchdog's fields (mh->last_progress, wait_host) and the C4
 * link observation (bytes and busy time per stream, for c4d.c). The loop
 * sleeps in poll(2) on what the transport names and the abort eventfd.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pthread.h>

#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "reduce.h"
#include "step.h"
#include "xport.h"

/* Transport contexts open and close on the net thread while kcollctl status
 * renders them from another: this keeps a context alive while it renders. */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;

/* Close mh's context (net thread). */
static void ctx_close(struct kd_mh *mh)
{
	void *ctx;

	pthread_mutex_lock(&ctx_lock);
	ctx = mh->xpriv;
	mh->xpriv = NULL;
	pthread_mutex_unlock(&ctx_lock);
	if (ctx && mh->xport->close)
		mh->xport->close(ctx);
}

struct kd_piece *kd_xfer_cut(const struct kd_xfer *x, size_t piece, uint32_t *n)
{
	uint32_t cnt = 0, i = 0;
	struct kd_piece *p;

	for (uint32_t k = 0; k < x->nr; k++)
		cnt += (x->r[k].len + piece - 1) / piece;
	p = malloc((cnt ? cnt : 1) * sizeof(*p));
	if (!p)
		return NULL;
	for (uint32_t k = 0; k < x->nr; k++)
		for (uint64_t o = 0; o < x->r[k].len; o += piece)
			p[i++] = (struct kd_piece){ x->r[k].off + o,
						    x->r[k].len - o < piece ? x->r[k].len - o : piece };
	if (!cnt)
		p[0] = (struct kd_piece){ 0, 0 };
	*n = cnt ? cnt : 1;
	return p;
}

/* Which streams a transfer's pieces use: piece j goes on u[j % nu]. Both ends
 * of a host pair use the same (the C4 plan they agreed leaves some unused). */
struct smap {
	uint8_t u[KD_MAX_STREAMS];
	uint32_t nu;
};

static void smap_of(const struct kd_mh *mh, uint32_t host, struct smap *m)
{
	uint32_t avoid;

	pthread_mutex_lock((pthread_mutex_t *)&mh->plan_lock);
	avoid = mh->hosts[host].avoid;
	pthread_mutex_unlock((pthread_mutex_t *)&mh->plan_lock);
	m->nu = 0;
	for (uint32_t s = 0; s < mh->nstreams; s++)
		if (!(avoid & (1u << s)))
			m->u[m->nu++] = (uint8_t)s;
	if (!m->nu)
		for (uint32_t s = 0; s < mh->nstreams; s++)
			m->u[m->nu++] = (uint8_t)s;
}

/* The most sends in flight per stream the engine keeps (a larger send_depth
 * is taken as this). */
#define KD_STEP_MAX_DEPTH	16

/* Cookies name the cursor and the piece, so that a transport completing out
 * of order or twice is caught, not taken for the piece due. */
#define COOKIE(idx, piece)	(((uint64_t)(idx) << 32) | (piece))

struct cursor {
	uint32_t host, stream;
	bool send;
	bool done;		/* every piece completed */
	const uint8_t *base;	/* send: source */
	uint8_t *dst;		/* receive without reduction: destination */
	const uint8_t *src;	/* receive with reduction: our operand (result: acc) */
	struct kd_piece *pieces;	/* this transfer's, all streams */
	uint32_t npieces;
	uint32_t next;		/* next piece to post (this stream's: s, s + S, ...) */
	uint32_t cnext;		/* next piece to complete; next - cnext are posted */
	uint32_t stride;
	uint32_t step;
	uint8_t *rx;		/* receive with reduction: staging */
	struct kd_p_data hdr[KD_STEP_MAX_DEPTH];	/* send: the posted pieces' headers */
	struct kd_xmem mem;	/* send, KD_XPORT_F_MEM: the buffer base lies in */
	int8_t mem_known;	/* 0: not looked up yet, 1: mem, -1: none */
	struct cursor *prev;	/* same stream, previous step: goes first (gated) */
	struct cursor *dep;	/* chained send: piece j waits for piece j of the previous
				 * step's receive, whose cursors start at dep */
	const struct smap *dmap;	/* ... and whose pieces map to streams so */
	uint8_t *inflight;	/* the stream's sends posted, over all cursors */
};

/* Chained send: does piece 'next' still wait for the previous step's? */
static bool dep_wait(const struct cursor *c)
{
	const struct cursor *d;

	if (!c->dep)
		return false;
	d = &c->dep[c->dmap->u[c->next % c->dmap->nu]];
	return !d->done && d->cnext <= c->next;
}

/* Earlier cursors on the same stream go first (a step may have no piece on
 * a stream: look past them): a receive waits until they are done; a send
 * until they posted all their pieces, since one stream's sends complete in
 * order. */
static bool gated(const struct cursor *c)
{
	for (const struct cursor *p = c->prev; p; p = p->prev)
		if (c->send ? p->next < p->npieces : !p->done)
			return true;
	return false;
}

/*
 * C4 link observation: a large piece moved on its stream from t0 to now.
 * The busy time is the union of the pieces' intervals per (host, stream,
 * direction): with several sends in flight they overlap, and adding each
 * would count the same time several times (a link looking slower than it
 * is). Pieces complete in order, so the union grows at its end only.
 */
static void observe(struct kd_mh *mh, const struct cursor *c, int64_t t0, uint64_t len)
{
	struct kd_mh_host *hh = &mh->hosts[c->host];
	int64_t now = kd_now_ns(), *end = &hh->obs_end[c->stream][c->send];
	int64_t from = t0 > *end ? t0 : *end;

	if (len < KD_C4_OBS_MIN)
		return;
	atomic_fetch_add_explicit(&hh->obs_bytes[c->stream][c->send], len, memory_order_relaxed);
	if (now > from)
		atomic_fetch_add_explicit(&hh->obs_busy[c->stream][c->send], (uint64_t)(now - from),
					  memory_order_relaxed);
	if (now > *end)
		*end = now;
}

/* The header of piece 'cnext' that arrived on c: the one expected? */
static int check_hdr(const struct kd_mh *mh, const struct kd_op *op, const struct cursor *c,
		     const struct kd_p_data *h)
{
	uint64_t len = c->pieces[c->cnext].len;

	if (h->hdr.magic != KD_PEER_MAGIC || h->hdr.type != KD_P_DATA) {
		kc_warn("comm %s: host %u sent garbage on a data stream", op->comm->name, c->host);
		return -EPROTO;
	}
	if (h->hdr.reserved != mh->sig) {
		kc_warn("comm %s: op %llu: host %u runs a different operation (type, count, dtype, op or "
			"root differ)", op->comm->name, (unsigned long long)op->seq, c->host);
		return -EBADMSG;
	}
	if (h->seq != op->seq || h->step != c->step || h->piece != c->cnext || h->hdr.len != sizeof(*h) + len) {
		kc_warn("comm %s: host %u is out of step (op %llu step %u piece %u, expected op %llu step %u "
			"piece %u)", op->comm->name, c->host, (unsigned long long)h->seq, h->step, h->piece,
			(unsigned long long)op->seq, c->step, c->cnext);
		return -EPROTO;
	}
	return 0;
}

/* Piece 'cnext' of receive cursor c is in (at data): reduce or store it. */
static int piece_in(struct kd_mh *mh, const struct cursor *c, const uint8_t *data)
{
	const struct kd_piece *p = &c->pieces[c->cnext];

	if (!p->len)
		return 0;
	if (c->rx) {
		/* The same order on every host: the lower host's data first. */
		const void *in[2];
		const uint8_t *mine = c->src + p->off;

		in[0] = c->host < mh->self ? (const void *)data : mine;
		in[1] = c->host < mh->self ? (const void *)mine : data;
		return kcoll_reduce_n(mh->dtype, mh->redop, mh->acc + p->off, in, 2, p->len / mh->esz);
	}
	if (data != c->dst + p->off)
		memcpy(c->dst + p->off, data, p->len);
	return 0;
}


/*
 * The buffer a send cursor reads from, as a whole, for a transport that
 * sends from registered memory: the comm's accumulator or snapshot, or a
 * client region one of the op's buffers lies in (a kcoll.ko region with its
 * dma-buf, when kcoll.ko exports one). None: the transport copies.
 */
static const struct kd_xmem *mem_of(struct kd_mh *mh, const struct kd_op *op, struct cursor *c)
{
	const uint8_t *b = c->base;

	if (c->mem_known)
		return c->mem_known > 0 ? &c->mem : NULL;
	c->mem_known = 1;
	c->mem.dmabuf_fd = -1;
	if (mh->own && b >= mh->own && b < mh->own + mh->acc_size) {
		c->mem.lo = mh->own;
		c->mem.len = mh->acc_size;
		return &c->mem;
	}
	if (mh->snap && b >= mh->snap && b < mh->snap + mh->snap_size) {
		c->mem.lo = mh->snap;
		c->mem.len = mh->snap_size;
		return &c->mem;
	}
	for (uint32_t rk = 0; rk < op->comm->nranks; rk++) {
		const struct kd_contrib *ct = &op->c[rk];
		struct kd_region *rg[2] = { ct->sbuf.rg, ct->rbuf.rg };

		for (int i = 0; ct->present && i < 2; i++) {
			if (!rg[i] || b < rg[i]->map || b >= rg[i]->map + rg[i]->size)
				continue;
			if (!rg[i]->pinned) {
				c->mem.lo = rg[i]->map;
				c->mem.len = rg[i]->size;
				return &c->mem;
			}
			/* kcoll.ko pages: a NIC reaches them through the dma-buf only. */
			c->mem.dmabuf_fd = kd_region_dmabuf(rg[i]);
			if (c->mem.dmabuf_fd < 0)
				goto none;
			c->mem.lo = rg[i]->kmap.map_base;
			c->mem.len = rg[i]->kmap.map_len;
			return &c->mem;
		}
	}
none:
	c->mem_known = -1;
	return NULL;
}

/* Hand piece 'next' of c to the transport. */
static int post(struct kd_mh *mh, const struct kd_op *op, struct cursor *c, uint32_t idx)
{
	const struct kd_xport_ops *x = mh->xport;
	const struct kd_piece *p = &c->pieces[c->next];
	int r;

	if (c->send) {
		/* Its header lives until its TX event: at most depth are posted. */
		struct kd_p_data *h = &c->hdr[(c->next / c->stride) % KD_STEP_MAX_DEPTH];

		*h = (struct kd_p_data){
			.hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_DATA,
				 .len = (uint32_t)(sizeof(*h) + p->len), .reserved = mh->sig },
			.seq = op->seq, .step = c->step, .piece = c->next,
		};
		r = x->send(mh->xpriv, c->host, c->stream, h, c->base + p->off, p->len,
			    x->flags & KD_XPORT_F_MEM ? mem_of(mh, op, c) : NULL, COOKIE(idx, c->next));
		if (!r)
			(*c->inflight)++;
	} else {
		r = x->recv(mh->xpriv, c->host, c->stream, c->rx ? c->rx : c->dst + p->off, p->len,
			    COOKIE(idx, c->next));
	}
	if (!r)
		c->next += c->stride;
	return r;
}

/* Piece 'cnext' of c is through (sent or taken in): count its bytes on the
 * mh's tx or rx counter, observe the link, move on. */
static void piece_done(struct kd_mh *mh, struct cursor *c, const struct kd_xev *ev, _Atomic uint64_t *bytes)
{
	const struct kd_piece *p = &c->pieces[c->cnext];

	atomic_fetch_add(bytes, p->len + sizeof(struct kd_p_data));
	observe(mh, c, ev->t0, p->len);
	c->cnext += c->stride;
	c->done = c->cnext >= c->npieces;
}

/* One completion: advance its cursor. */
static int complete(struct kd_mh *mh, const struct kd_op *op, struct cursor *c, const struct kd_xev *ev)
{
	int r = ev->err;

	if ((uint32_t)ev->cookie != c->cnext || c->cnext >= c->next) {
		/* A transport bug: the engine would count a piece twice or
		 * take one for another. */
		kc_err("comm %s: transport %s completed piece %u of step %u (host %u stream %u, %s) while "
		       "piece %u was due", op->comm->name, mh->xport->name, (uint32_t)ev->cookie, c->step, c->host,
		       c->stream, c->send ? "send" : "receive", c->cnext);
		if (ev->rx)
			mh->xport->release(mh->xpriv, ev->rx);
		return -EPROTO;
	}
	if (ev->kind == KD_XEV_TX) {
		(*c->inflight)--;
		if (!r)
			piece_done(mh, c, ev, &mh->bytes_sent);
		return r;
	}
	if (ev->hdr && (!r || r == -EPROTO)) {
		int h = check_hdr(mh, op, c, ev->hdr);

		r = h ? h : r;
	}
	if (!r)
		r = piece_in(mh, c, ev->data);
	if (ev->rx)
		mh->xport->release(mh->xpriv, ev->rx);
	if (!r)
		piece_done(mh, c, ev, &mh->bytes_recv);
	return r;
}

static int open_xport(struct kd_mh *mh, const struct kd_comm *comm)
{
	int fds[KD_MAX_HOSTS * KD_MAX_STREAMS];	/* open copies what it needs */
	const char *names[KD_MAX_HOSTS];
	struct kd_xport_env env = { .nhosts = mh->nhosts, .self = mh->self, .nstreams = mh->nstreams,
				    .piece = mh->piece, .fds = fds, .fabric = mh->xfabric, .name = comm->name,
				    .host_names = names, .timeout_ns = comm->timeout_ns };
	size_t piece = mh->piece;
	void *ctx = NULL;
	int r;

	for (uint32_t h = 0; h < mh->nhosts; h++)
		for (uint32_t s = 0; s < KD_MAX_STREAMS; s++)
			fds[h * KD_MAX_STREAMS + s] = mh->hosts[h].data[s];
	for (uint32_t h = 0; h < mh->nhosts; h++)
		names[h] = mh->hosts[h].info.name;
	r = mh->xport->open(&env, &ctx, &piece);
	if (r)
		return r;
	pthread_mutex_lock(&ctx_lock);
	mh->xpriv = ctx;
	pthread_mutex_unlock(&ctx_lock);
	mh->xpiece = piece && piece < mh->piece ? piece : mh->piece;
	return 0;
}

int kd_step_run(struct kd_mh *mh, struct kd_op *op, const struct kd_step *st, uint32_t n,
		uint32_t first, bool chain, uint32_t *bad_host)
{
	const struct kd_xport_ops *x = mh->xport;
	struct kd_comm *comm;
	uint32_t S = mh->nstreams, nc = 0, k = 0, nl = 0, nfd = 0;
	struct cursor *cs = NULL;
	struct kd_piece **lists = NULL;
	struct smap *maps = NULL;
	struct pollfd *pfd = NULL;
	struct kd_xev *ev = NULL;
	uint8_t *inflight = NULL;	/* [host * S + stream] */
	uint32_t depth = x->send_depth ? x->send_depth : 1;
	int64_t slack, idle_since = 0;
	size_t piece;
	bool spin = true;
	int r = 0;

	*bad_host = KCOLL_RANK_NONE;
	if (depth > KD_STEP_MAX_DEPTH)
		depth = KD_STEP_MAX_DEPTH;
	comm = op->comm;
	/* Backstop only: the watchdog's query round normally ends a hang first. */
	slack = comm->timeout_ns + 2000000000LL;
	if (!mh->xpriv) {
		r = open_xport(mh, comm);
		if (r)
			return r;
	}
	/* The transport's cap, fixed while it is open; mh->piece may not grow. */
	piece = mh->xpiece && mh->xpiece < mh->piece ? mh->xpiece : mh->piece;
	for (uint32_t t = 0; t < n; t++)
		nc += (st[t].nsend + st[t].nrecv) * S;
	nfd = (2 * S + 3) * mh->nhosts + 2;	/* a transport names up to 2S + 3 per host, +1 own */
	cs = calloc(nc ? nc : 1, sizeof(*cs));
	lists = calloc(nc ? nc : 1, sizeof(*lists));
	maps = calloc(nc ? nc : 1, sizeof(*maps));
	ev = calloc(nc ? nc : 1, sizeof(*ev));
	pfd = calloc(nfd, sizeof(*pfd));
	inflight = calloc((size_t)mh->nhosts * S, 1);
	if (!cs || !pfd || !lists || !maps || !ev || !inflight) {
		r = -ENOMEM;
		goto out;
	}
	if (mh->rx_size < piece) {
		for (uint32_t i = 0; i < KD_MAX_HOSTS * KD_MAX_STREAMS; i++) {
			free(mh->rx[i]);
			mh->rx[i] = NULL;
		}
		mh->rx_size = piece;
	}
	for (uint32_t t = 0; t < n; t++) {
		for (uint32_t i = 0; i < st[t].nsend + st[t].nrecv; i++) {
			bool send = i < st[t].nsend;
			const struct kd_xfer *xf = send ? &st[t].send[i] : &st[t].recv[i - st[t].nsend];
			uint32_t np = 0;

			lists[nl] = kd_xfer_cut(xf, piece, &np);
			smap_of(mh, xf->host, &maps[nl]);
			if (np > S)
				spin = false;	/* more than one piece per stream: large */
			if (!lists[nl]) {
				r = -ENOMEM;
				goto out;
			}
			for (uint32_t s = 0; s < S; s++, k++) {
				struct cursor *c = &cs[k];
				uint32_t idx = UINT32_MAX;	/* a stream this transfer leaves unused */

				c->host = xf->host;
				c->send = send;
				c->base = xf->base ? xf->base : mh->acc;
				c->dst = xf->dst ? xf->dst : mh->acc;
				c->src = xf->src ? xf->src : mh->acc;
				c->pieces = lists[nl];
				c->npieces = np;
				for (uint32_t u = 0; u < maps[nl].nu; u++)
					if (maps[nl].u[u] == s)
						idx = u;
				c->next = c->cnext = idx == UINT32_MAX ? np : idx;
				c->stride = maps[nl].nu;
				c->step = first + t;
				c->stream = s;
				c->done = c->next >= np;
				c->inflight = &inflight[xf->host * S + s];
				if (t && chain) {
					/* cursors of a chained step: send s, recv s (2S each) */
					c->prev = &cs[k - 2 * S];
					if (send) {
						c->dep = &cs[k - s - 2 * S + S];
						c->dmap = &maps[nl - 1];
					}
				}
				if (!send && st[t].reduce) {
					uint32_t slot = xf->host * KD_MAX_STREAMS + s;

					if (!mh->rx[slot])
						mh->rx[slot] = malloc(mh->rx_size);
					if (!mh->rx[slot]) {
						r = -ENOMEM;
						goto out;
					}
					c->rx = mh->rx[slot];
				}
			}
			nl++;
		}
	}
	for (;;) {
		bool progress = false;
		uint32_t pending = 0, np;
		int ne;

		for (uint32_t i = 0; i < nc; i++) {
			struct cursor *c = &cs[i];

			if (c->done)
				continue;
			pending++;
			/* A receive: one at a time; a send: up to depth per stream. */
			while (c->next < c->npieces && !gated(c) &&
			       (c->send ? *c->inflight < depth && !dep_wait(c) : c->next == c->cnext)) {
				r = post(mh, op, c, i);
				if (r) {
					*bad_host = c->host;
					goto out;
				}
			}
		}
		if (!pending)
			break;
		ne = x->poll(mh->xpriv, ev, nc, &progress);
		if (ne < 0) {
			r = ne;
			goto out;
		}
		for (int e = 0; e < ne; e++) {
			struct cursor *c = &cs[ev[e].cookie >> 32 < nc ? ev[e].cookie >> 32 : 0];

			r = complete(mh, op, c, &ev[e]);
			if (r) {
				*bad_host = c->host;
				/* the transport hands over no piece of the rest: drop them */
				for (int f = e + 1; f < ne; f++)
					if (ev[f].rx)
						x->release(mh->xpriv, ev[f].rx);
				goto out;
			}
		}
		if (op->seq >= __atomic_load_n(&comm->limit_seq, __ATOMIC_RELAXED)) {
			r = -ECANCELED;	/* the comm was aborted: its error is the op's */
			goto out;
		}
		if (progress || ne) {
			idle_since = 0;
			atomic_store(&mh->last_progress, kd_now_ns());
			continue;
		}
		/* Small transfers: poll a little before sleeping, yielding the CPU
		 * to whoever has work (KCOLL_SPIN_US, as the ring threads do). Large
		 * ones keep the pipes full anyway, and polling would only take CPU
		 * from the peers' copies on a shared machine. */
		if (!idle_since)
			idle_since = kd_now_ns();
		if (spin && kd_now_ns() - idle_since < kd.spin_ns) {
			sched_yield();
			continue;
		}
		for (uint32_t i = 0; i < nc; i++) {
			const struct cursor *c = &cs[i];

			/* The watchdog names the host we wait for. */
			if (!c->done && !c->send && c->next != c->cnext) {
				mh->wait_host = c->host;
				mh->wait_stream = c->stream;
			}
		}
		np = x->wait_fds(mh->xpriv, pfd, nfd - 1);
		pfd[np++] = (struct pollfd){ .fd = mh->abort_fd, .events = POLLIN };
		int64_t left = (atomic_load(&mh->last_progress) + slack - kd_now_ns()) / 1000000;

		if (left <= 0) {
			*bad_host = mh->wait_host;
			r = -ETIMEDOUT;
			goto out;
		}
		if (poll(pfd, np, left < 100 ? (int)left : 100) > 0 && (pfd[np - 1].revents & POLLIN)) {
			uint64_t v;

			if (read(mh->abort_fd, &v, sizeof(v)) < 0)
				v = 0;
		}
	}
out:
	for (uint32_t i = 0; lists && i < nl; i++)
		free(lists[i]);
	free(lists);
	free(maps);
	free(cs);
	free(ev);
	free(pfd);
	free(inflight);
	/* Pieces of the failed op may be in flight: a fresh context for the
	 * next op (the streams themselves belong to net.c). */
	if (r)
		ctx_close(mh);
	return r;
}

void kd_step_close(struct kd_mh *mh)
{
	ctx_close(mh);
}

size_t kd_step_render(struct kd_mh *mh, char *buf, size_t cap, int json)
{
	const struct kd_xport_ops *x = mh->xport;
	size_t n = 0;

	pthread_mutex_lock(&ctx_lock);
	if (x->render && mh->xpriv)
		n = x->render(mh->xpriv, buf, cap, json);
	pthread_mutex_unlock(&ctx_lock);
	return n;
}
