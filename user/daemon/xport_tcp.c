// SPDX-License-Identifier: MIT
/*
 * The TCP transport: one step of an inter-host algorithm over non-blocking
 * streams. Each transfer is cut into pieces (ranges cut at mh->piece
 * bytes); piece i of a transfer travels on stream i % nstreams of that peer,
 * so the receiver knows what comes next on every stream without asking.
 * Every piece carries a header (op seq, step, piece, the op's parameter
 * signature): a peer out of step or disagreeing about the op is caught on
 * the first piece, not by corrupt results.
 *
 * All sends and receives of the step progress together in one loop, and a
 * received piece is reduced as soon as it is complete, while the kernel
 * keeps moving the following pieces: network transfer, reduction and the
 * next send overlap. The loop sleeps in poll() on the streams and the
 * comm's abort eventfd.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "xport.h"
#include "reduce.h"

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

struct cursor {
	int fd;
	uint32_t host;
	bool send;
	const uint8_t *base;	/* send: source */
	uint8_t *dst;		/* receive without reduction: destination */
	const uint8_t *src;	/* receive with reduction: our operand (result: acc) */
	struct kd_piece *pieces;	/* this transfer's, all streams */
	uint32_t npieces;
	uint32_t next;		/* next piece index (this stream's: s, s + S, ...) */
	uint32_t stride;
	size_t hdone, pdone;	/* bytes of header / payload done for piece 'next' */
	struct kd_p_data hdr;
	uint8_t *rx;		/* receive with reduction: staging */
	uint32_t step;
	struct cursor *prev;	/* same stream, previous step: finishes first */
	struct cursor *dep;	/* chained send: piece j waits for piece j of the previous
				 * step's receive, whose cursors start at dep */
	const struct smap *dmap;	/* ... and whose pieces map to streams so */
	bool done;
	uint32_t stream;
	int64_t t0;		/* C4: when piece 'next' started moving */
};

/* Chained send: does piece 'next' still wait for the previous step's? */
static bool dep_wait(const struct cursor *c)
{
	const struct cursor *d;

	if (!c->dep)
		return false;
	d = &c->dep[c->dmap->u[c->next % c->dmap->nu]];
	return !d->done && d->next <= c->next;
}

/* C4 link observation: a large piece moved on stream s in 'now - t0'. */
static void observe(struct kd_mh *mh, const struct cursor *c, uint64_t len)
{
	struct kd_mh_host *hh = &mh->hosts[c->host];

	if (len < KD_C4_OBS_MIN)
		return;
	atomic_fetch_add_explicit(&hh->obs_bytes[c->stream][c->send], len, memory_order_relaxed);
	atomic_fetch_add_explicit(&hh->obs_busy[c->stream][c->send], kd_now_ns() - c->t0,
				  memory_order_relaxed);
}

static void hdr_fill(struct kd_p_data *h, const struct kd_op *op, uint32_t sig, uint32_t step,
		     uint32_t idx, uint64_t len)
{
	h->hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_DATA,
				   .len = (uint32_t)(sizeof(*h) + len), .reserved = sig };
	h->seq = op->seq;
	h->step = step;
	h->piece = idx;
}

static int try_send(struct kd_mh *mh, struct kd_op *op, struct cursor *c, uint32_t step, bool *progress)
{
	for (;;) {
		if (c->next >= c->npieces)
			break;
		/* Chained: piece j goes out once the previous step's piece j is in. */
		if (dep_wait(c))
			return 0;
		const struct kd_piece *p = &c->pieces[c->next];
		struct iovec iov[2];
		int nio = 0;
		ssize_t n;

		if (!c->hdone && !c->pdone) {
			hdr_fill(&c->hdr, op, mh->sig, step, c->next, p->len);
			if (p->len >= KD_C4_OBS_MIN)
				c->t0 = kd_now_ns();
		}
		if (c->hdone < sizeof(c->hdr))
			iov[nio++] = (struct iovec){ (uint8_t *)&c->hdr + c->hdone, sizeof(c->hdr) - c->hdone };
		if (p->len > c->pdone)
			iov[nio++] = (struct iovec){ (void *)(c->base + p->off + c->pdone), p->len - c->pdone };
		struct msghdr mhdr = { .msg_iov = iov, .msg_iovlen = nio };

		n = sendmsg(c->fd, &mhdr, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			return -ECONNRESET;
		}
		*progress = true;
		if (c->hdone < sizeof(c->hdr)) {
			size_t h = sizeof(c->hdr) - c->hdone < (size_t)n ? sizeof(c->hdr) - c->hdone : (size_t)n;

			c->hdone += h;
			n -= h;
		}
		c->pdone += n;
		if (c->hdone == sizeof(c->hdr) && c->pdone == p->len) {
			atomic_fetch_add(&mh->bytes_sent, p->len + sizeof(c->hdr));
			observe(mh, c, p->len);
			c->next += c->stride;
			c->hdone = c->pdone = 0;
		}
	}
	c->done = true;
	return 0;
}

static int piece_done(struct kd_mh *mh, struct kd_op *op, struct cursor *c, const struct kd_piece *p)
{
	if (c->rx && p->len) {
		/* The same order on every host: the lower host's data first. */
		const void *in[2];
		uint8_t *acc = mh->acc + p->off;
		const uint8_t *mine = c->src + p->off;

		in[0] = c->host < mh->self ? (const void *)c->rx : mine;
		in[1] = c->host < mh->self ? (const void *)mine : c->rx;
		return kcoll_reduce_n(mh->dtype, mh->redop, acc, in, 2, p->len / mh->esz);
	}
	return 0;
}

static int try_recv(struct kd_mh *mh, struct kd_op *op, struct cursor *c, uint32_t step, bool *progress)
{
	while (c->next < c->npieces) {
		const struct kd_piece *p = &c->pieces[c->next];
		ssize_t n;

		if (c->hdone < sizeof(c->hdr)) {
			/* Header and payload in one call: a small piece then costs one
			 * recvmsg. The payload bytes land before the header is checked;
			 * a bad header fails the op, whose buffers are then undefined. */
			struct iovec iov[2] = {
				{ (uint8_t *)&c->hdr + c->hdone, sizeof(c->hdr) - c->hdone },
				{ c->rx ? c->rx : c->dst + p->off, p->len },
			};
			struct msghdr mhdr = { .msg_iov = iov, .msg_iovlen = p->len ? 2 : 1 };

			n = recvmsg(c->fd, &mhdr, MSG_DONTWAIT);
			if (n > 0) {
				*progress = true;
				if (!c->hdone && p->len >= KD_C4_OBS_MIN)
					c->t0 = kd_now_ns();
				if ((size_t)n > iov[0].iov_len) {
					c->pdone = n - iov[0].iov_len;
					n = iov[0].iov_len;
				}
				c->hdone += n;
				if (c->hdone < sizeof(c->hdr))
					continue;
				if (c->hdr.hdr.magic != KD_PEER_MAGIC || c->hdr.hdr.type != KD_P_DATA) {
					kc_warn("comm %s: host %u sent garbage on a data stream", op->comm->name,
						c->host);
					return -EPROTO;
				}
				if (c->hdr.hdr.reserved != mh->sig) {
					kc_warn("comm %s: op %llu: host %u runs a different operation (type, "
						"count, dtype, op or root differ)", op->comm->name,
						(unsigned long long)op->seq, c->host);
					return -EBADMSG;
				}
				if (c->hdr.seq != op->seq || c->hdr.step != step || c->hdr.piece != c->next ||
				    c->hdr.hdr.len != sizeof(c->hdr) + p->len) {
					kc_warn("comm %s: host %u is out of step (op %llu step %u piece %u, "
						"expected op %llu step %u piece %u)", op->comm->name, c->host,
						(unsigned long long)c->hdr.seq, c->hdr.step, c->hdr.piece,
						(unsigned long long)op->seq, step, c->next);
					return -EPROTO;
				}
				continue;
			}
		} else {
			uint8_t *dst = c->rx ? c->rx : c->dst + p->off;

			n = p->len > c->pdone ? recv(c->fd, dst + c->pdone, p->len - c->pdone, MSG_DONTWAIT) : 0;
			if (n >= 0 && c->pdone + n == p->len) {
				int r;

				c->pdone += n;
				*progress = true;
				r = piece_done(mh, op, c, p);
				if (r)
					return r;
				atomic_fetch_add(&mh->bytes_recv, p->len + sizeof(c->hdr));
				observe(mh, c, p->len);
				c->next += c->stride;
				c->hdone = c->pdone = 0;
				continue;
			}
			if (n > 0) {
				*progress = true;
				c->pdone += n;
				continue;
			}
		}
		if (n == 0)
			return -ECONNRESET;	/* the peer closed the stream mid-op */
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN)
			return 0;
		return -ECONNRESET;
	}
	c->done = true;
	return 0;
}

/* Every earlier cursor on the same stream must be done first (a step may
 * have no piece on a stream: look past it). */
static bool gated(const struct cursor *c)
{
	for (const struct cursor *p = c->prev; p; p = p->prev)
		if (!p->done)
			return true;
	return false;
}

/*
 * Run n steps. Unchained (n == 1 in practice): every transfer of the step at
 * once. Chained (ring phases: one send and one receive per step, the send of
 * step t being the segment received in step t - 1): piece j of step t leaves
 * as soon as piece j of step t - 1 has arrived and been reduced, so the
 * steps overlap instead of draining the pipeline between them.
 */
static int tcp_run_steps(struct kd_mh *mh, struct kd_op *op, const struct kd_step *st, uint32_t n,
			 uint32_t first, bool chain, uint32_t *bad_host)
{
	struct kd_comm *comm = op->comm;
	uint32_t S = mh->nstreams, nc = 0, k = 0, nl = 0;
	struct cursor *cs;
	struct kd_piece **lists;
	struct smap *maps;
	struct pollfd *pfd;
	/* Backstop only: the watchdog's query round normally ends a hang first. */
	int64_t slack = comm->timeout_ns + 2000000000LL;
	int64_t idle_since = 0;
	bool spin = true;
	int r = 0;

	*bad_host = KCOLL_RANK_NONE;
	for (uint32_t t = 0; t < n; t++)
		nc += (st[t].nsend + st[t].nrecv) * S;
	cs = calloc(nc ? nc : 1, sizeof(*cs));
	lists = calloc(nc ? nc : 1, sizeof(*lists));
	maps = calloc(nc ? nc : 1, sizeof(*maps));
	pfd = calloc(nc + 1, sizeof(*pfd));
	if (!cs || !pfd || !lists || !maps) {
		r = -ENOMEM;
		goto out;
	}
	if (mh->rx_size < mh->piece) {
		for (uint32_t i = 0; i < KD_MAX_HOSTS * KD_MAX_STREAMS; i++) {
			free(mh->rx[i]);
			mh->rx[i] = NULL;
		}
		mh->rx_size = mh->piece;
	}
	for (uint32_t t = 0; t < n; t++) {
		for (uint32_t x = 0; x < st[t].nsend + st[t].nrecv; x++) {
			bool send = x < st[t].nsend;
			const struct kd_xfer *xf = send ? &st[t].send[x] : &st[t].recv[x - st[t].nsend];
			uint32_t np = 0;

			lists[nl] = kd_xfer_cut(xf, mh->piece, &np);
			smap_of(mh, xf->host, &maps[nl]);
			if (np > S)
				spin = false;	/* more than one piece per stream: large */
			if (!lists[nl]) {
				r = -ENOMEM;
				goto out;
			}
			for (uint32_t s = 0; s < S; s++, k++) {
				struct cursor *c = &cs[k];

				c->fd = mh->hosts[xf->host].data[s];
				c->host = xf->host;
				c->send = send;
				c->base = xf->base ? xf->base : mh->acc;
				c->dst = xf->dst ? xf->dst : mh->acc;
				c->src = xf->src ? xf->src : mh->acc;
				c->pieces = lists[nl];
				c->npieces = np;
				uint32_t idx = UINT32_MAX;	/* a stream this transfer leaves unused */

				for (uint32_t i = 0; i < maps[nl].nu; i++)
					if (maps[nl].u[i] == s)
						idx = i;
				c->next = idx == UINT32_MAX ? np : idx;
				c->stride = maps[nl].nu;
				c->step = first + t;
				c->stream = s;
				c->done = c->next >= np;
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
		uint32_t pending = 0, np = 0;

		for (uint32_t i = 0; i < nc; i++) {
			struct cursor *c = &cs[i];

			if (c->done)
				continue;
			pending++;
			if (gated(c))
				continue;
			r = c->send ? try_send(mh, op, c, c->step, &progress) :
				      try_recv(mh, op, c, c->step, &progress);
			if (r) {
				*bad_host = c->host;
				goto out;
			}
		}
		if (!pending)
			break;
		if (op->seq >= __atomic_load_n(&comm->limit_seq, __ATOMIC_RELAXED)) {
			r = -ECANCELED;	/* the comm was aborted: its error is the op's */
			goto out;
		}
		if (progress) {
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
			struct cursor *c = &cs[i];

			/* Sleep on what can move: not gated, not waiting for a dependency. */
			if (c->done || gated(c) || dep_wait(c))
				continue;
			pfd[np++] = (struct pollfd){ .fd = c->fd, .events = c->send ? POLLOUT : POLLIN };
			if (!c->send) {
				mh->wait_host = c->host;
				mh->wait_stream = c->stream;
			}
		}
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
	for (uint32_t x = 0; lists && x < nl; x++)
		free(lists[x]);
	free(lists);
	free(maps);
	free(cs);
	free(pfd);
	return r;
}

const struct kd_xport_ops kd_xport_tcp = {
	.name = "tcp",
	.run_steps = tcp_run_steps,
};
