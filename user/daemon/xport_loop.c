// SPDX-License-Identifier: MIT
/*
 * The loopback transport: the hosts of a communicator as threads of one
 * process, so that the step engine (step.c) and the algorithms over it
 * (schedule.c) run in one test program (tests/test_step.c). A "fabric"
 * holds one queue per (sender, receiver, stream); a send copies the piece
 * into a message on its queue and completes (its TX event) once the
 * receiver took it, as an RDMA write completes when the peer has it; a
 * receive hands the message itself over (the engine reads it in place and
 * releases it), as a transport with buffers of its own (RDMA slots) does.
 * Each host has an eventfd that a new message or a taken one writes, for
 * poll(2). kd_xport_loop holds one send per stream in flight,
 * kd_xport_loop_deep KD_LOOP_DEPTH.
 *
 * For tests only (xport.c does not offer it): kd_loop_fabric_corrupt()
 * damages one piece on the way, kd_loop_fabric_fault() its TX events.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kcolld.h"
#include "xport.h"

struct lmsg {
	struct lmsg *next;
	struct kd_p_data hdr;
	size_t len;
	uint8_t data[];
};

struct kd_loop_fabric {
	pthread_mutex_t lock;
	uint32_t nhosts, nstreams;
	struct lmsg **head, ***tail;	/* [(from * nhosts + to) * nstreams + stream] */
	int *efd;			/* [host]: a message for it arrived */
	uint64_t *sent, *taken;		/* [queue]: messages queued, taken out */
	uint32_t corrupt_nth;		/* 0: none */
	bool corrupt_payload;
	uint32_t fault;			/* enum kd_loop_fault, once */
};

struct loop_io {
	bool active;
	uint64_t cookie;
	size_t len;
	int64_t t0;
	uint64_t seq;		/* tx: its message's number on the queue */
};

/* One stream's sends in flight, oldest first. */
struct loop_tx {
	struct loop_io io[KD_LOOP_DEPTH];
	uint32_t n;
};

struct loop_ctx {
	struct kd_loop_fabric *f;
	uint32_t self, nhosts, nstreams, depth;
	struct loop_tx *tx;		/* [host * nstreams + stream] */
	struct loop_io *rx;
	bool dup;			/* KD_LOOP_TX_DUP: the next TX event goes twice */
};

struct kd_loop_fabric *kd_loop_fabric_new(uint32_t nhosts, uint32_t nstreams)
{
	struct kd_loop_fabric *f = calloc(1, sizeof(*f));
	size_t nq = (size_t)nhosts * nhosts * nstreams;

	if (!f)
		return NULL;
	pthread_mutex_init(&f->lock, NULL);
	f->nhosts = nhosts;
	f->nstreams = nstreams;
	f->head = calloc(nq, sizeof(*f->head));
	f->tail = calloc(nq, sizeof(*f->tail));
	f->efd = calloc(nhosts, sizeof(*f->efd));
	f->sent = calloc(nq, sizeof(*f->sent));
	f->taken = calloc(nq, sizeof(*f->taken));
	if (!f->head || !f->tail || !f->efd || !f->sent || !f->taken)
		goto err;
	for (size_t q = 0; q < nq; q++)
		f->tail[q] = &f->head[q];
	for (uint32_t h = 0; h < nhosts; h++)
		f->efd[h] = -1;
	for (uint32_t h = 0; h < nhosts; h++) {
		f->efd[h] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (f->efd[h] < 0)
			goto err;
	}
	return f;
err:
	kd_loop_fabric_free(f);
	return NULL;
}

void kd_loop_fabric_free(struct kd_loop_fabric *f)
{
	if (!f)
		return;
	for (size_t q = 0; f->head && q < (size_t)f->nhosts * f->nhosts * f->nstreams; q++)
		while (f->head[q]) {
			struct lmsg *m = f->head[q];

			f->head[q] = m->next;
			free(m);
		}
	for (uint32_t h = 0; f->efd && h < f->nhosts; h++)
		if (f->efd[h] >= 0)
			close(f->efd[h]);
	pthread_mutex_destroy(&f->lock);
	free(f->head);
	free(f->tail);
	free(f->efd);
	free(f->sent);
	free(f->taken);
	free(f);
}

uint32_t kd_loop_fabric_pending(struct kd_loop_fabric *f)
{
	uint32_t n = 0;

	pthread_mutex_lock(&f->lock);
	for (size_t q = 0; q < (size_t)f->nhosts * f->nhosts * f->nstreams; q++)
		for (struct lmsg *m = f->head[q]; m; m = m->next)
			n++;
	pthread_mutex_unlock(&f->lock);
	return n;
}

void kd_loop_fabric_corrupt(struct kd_loop_fabric *f, uint32_t nth, bool payload)
{
	pthread_mutex_lock(&f->lock);
	f->corrupt_nth = nth;
	f->corrupt_payload = payload;
	pthread_mutex_unlock(&f->lock);
}

void kd_loop_fabric_fault(struct kd_loop_fabric *f, enum kd_loop_fault fault)
{
	pthread_mutex_lock(&f->lock);
	f->fault = fault;
	pthread_mutex_unlock(&f->lock);
}

static int open_depth(const struct kd_xport_env *env, void **ctxp, uint32_t depth)
{
	struct kd_loop_fabric *f = env->fabric;
	struct loop_ctx *x;

	if (!f || env->nhosts != f->nhosts || env->nstreams > f->nstreams || env->self >= f->nhosts)
		return -EINVAL;
	x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	x->f = f;
	x->self = env->self;
	x->nhosts = env->nhosts;
	x->nstreams = env->nstreams;
	x->depth = depth;
	x->tx = calloc((size_t)x->nhosts * x->nstreams, sizeof(*x->tx));
	x->rx = calloc((size_t)x->nhosts * x->nstreams, sizeof(*x->rx));
	if (!x->tx || !x->rx) {
		free(x->tx);
		free(x->rx);
		free(x);
		return -ENOMEM;
	}
	*ctxp = x;
	return 0;
}

static int loop_open(const struct kd_xport_env *env, void **ctxp, size_t *piece)
{
	(void)piece;
	return open_depth(env, ctxp, 1);
}

static int loop_open_deep(const struct kd_xport_env *env, void **ctxp, size_t *piece)
{
	(void)piece;
	return open_depth(env, ctxp, KD_LOOP_DEPTH);
}

static void loop_close(void *ctx)
{
	struct loop_ctx *x = ctx;

	free(x->tx);
	free(x->rx);
	free(x);
}

static bool bad_peer(const struct loop_ctx *x, uint32_t host, uint32_t stream)
{
	return host >= x->nhosts || host == x->self || stream >= x->nstreams;
}

static int loop_send(void *ctx, uint32_t host, uint32_t stream, const struct kd_p_data *hdr, const void *buf,
		     size_t len, const struct kd_xmem *mem, uint64_t cookie)
{
	struct loop_ctx *x = ctx;
	struct kd_loop_fabric *f = x->f;
	struct loop_tx *t;
	struct lmsg *m;
	uint64_t seq;
	size_t q;
	uint64_t one = 1;

	if (bad_peer(x, host, stream))
		return -EINVAL;
	t = &x->tx[host * x->nstreams + stream];
	if (t->n >= x->depth)
		return -EBUSY;
	/* It copies, but checks what a zero-copy transport would rely on. */
	if (mem && (mem->dmabuf_fd < -1 || (const uint8_t *)buf < mem->lo ||
		    (const uint8_t *)buf + len > mem->lo + mem->len))
		return -EINVAL;
	m = malloc(sizeof(*m) + len);
	if (!m)
		return -ENOMEM;
	m->next = NULL;
	m->hdr = *hdr;
	m->len = len;
	if (len)
		memcpy(m->data, buf, len);
	q = ((size_t)x->self * f->nhosts + host) * f->nstreams + stream;
	pthread_mutex_lock(&f->lock);
	if (f->corrupt_nth && (len || !f->corrupt_payload) && !--f->corrupt_nth) {
		if (f->corrupt_payload)
			m->data[len / 2] ^= 0x40;
		else
			m->hdr.step += 1;
	}
	*f->tail[q] = m;
	f->tail[q] = &m->next;
	seq = f->sent[q]++;
	t->io[t->n++] = (struct loop_io){ .active = true, .cookie = cookie, .len = len, .t0 = kd_now_ns(),
					  .seq = seq };
	if (t->n == 2 && (f->fault & KD_LOOP_TX_SWAP)) {
		uint64_t c = t->io[0].cookie;

		t->io[0].cookie = t->io[1].cookie;
		t->io[1].cookie = c;
		f->fault &= ~KD_LOOP_TX_SWAP;
	}
	if (f->fault & KD_LOOP_TX_DUP) {
		x->dup = true;
		f->fault &= ~KD_LOOP_TX_DUP;
	}
	pthread_mutex_unlock(&f->lock);
	if (write(f->efd[host], &one, sizeof(one)) < 0)
		return -errno;
	return 0;
}

static int loop_recv(void *ctx, uint32_t host, uint32_t stream, void *buf, size_t len, uint64_t cookie)
{
	struct loop_ctx *x = ctx;
	struct loop_io *io;

	(void)buf;	/* the message is handed over instead */
	if (bad_peer(x, host, stream))
		return -EINVAL;
	io = &x->rx[host * x->nstreams + stream];
	if (io->active)
		return -EBUSY;
	*io = (struct loop_io){ .active = true, .cookie = cookie, .len = len };
	return 0;
}

static int loop_poll(void *ctx, struct kd_xev *ev, uint32_t max, bool *moved)
{
	struct loop_ctx *x = ctx;
	struct kd_loop_fabric *f = x->f;
	uint32_t ne = 0, nio = x->nhosts * x->nstreams;
	uint64_t v, one = 1;

	/* Drained before looking: a message queued after this writes again. */
	if (read(f->efd[x->self], &v, sizeof(v)) < 0)
		v = 0;
	pthread_mutex_lock(&f->lock);
	for (uint32_t i = 0; i < nio; i++) {
		struct loop_tx *t = &x->tx[i];
		uint32_t host = i / x->nstreams, s = i % x->nstreams, k = 0;
		size_t q = ((size_t)x->self * f->nhosts + host) * f->nstreams + s;

		/* Done once the receiver took it, oldest first. */
		for (; k < t->n && ne < max && f->taken[q] > t->io[k].seq; k++) {
			ev[ne++] = (struct kd_xev){ .kind = KD_XEV_TX, .host = host, .stream = s,
						    .cookie = t->io[k].cookie, .t0 = t->io[k].t0 };
			if (x->dup && ne < max) {
				ev[ne] = ev[ne - 1];
				ne++;
				x->dup = false;
			}
		}
		memmove(t->io, t->io + k, (t->n - k) * sizeof(t->io[0]));
		t->n -= k;
	}
	pthread_mutex_unlock(&f->lock);
	for (uint32_t i = 0; i < nio && ne < max; i++) {
		struct loop_io *io = &x->rx[i];
		uint32_t host = i / x->nstreams, s = i % x->nstreams;
		size_t q = ((size_t)host * f->nhosts + x->self) * f->nstreams + s;
		struct lmsg *m;

		if (!io->active)
			continue;
		pthread_mutex_lock(&f->lock);
		m = f->head[q];
		if (m) {
			f->head[q] = m->next;
			if (!m->next)
				f->tail[q] = &f->head[q];
			f->taken[q]++;
		}
		pthread_mutex_unlock(&f->lock);
		if (!m)
			continue;
		/* The sender's TX event is due: wake it. */
		if (write(f->efd[host], &one, sizeof(one)) < 0)
			return -errno;
		io->active = false;
		ev[ne++] = (struct kd_xev){
			.kind = KD_XEV_RX, .host = host, .stream = s, .cookie = io->cookie,
			.err = m->len != io->len || m->hdr.hdr.len != sizeof(m->hdr) + io->len ? -EPROTO : 0,
			.t0 = kd_now_ns(), .hdr = &m->hdr, .data = m->data, .rx = m,
		};
	}
	if (ne)
		*moved = true;
	return (int)ne;
}

static void loop_release(void *ctx, void *rx)
{
	(void)ctx;
	free(rx);
}

static uint32_t loop_wait_fds(void *ctx, struct pollfd *pfd, uint32_t cap)
{
	struct loop_ctx *x = ctx;

	if (!cap)
		return 0;
	pfd[0] = (struct pollfd){ .fd = x->f->efd[x->self], .events = POLLIN };
	return 1;
}

const struct kd_xport_ops kd_xport_loop = {
	.size = sizeof(struct kd_xport_ops),
	.version = KD_XPORT_VERSION,
	.name = "loopback",
	.open = loop_open,
	.flags = KD_XPORT_F_MEM,
	.send_depth = 1,
	.send = loop_send,
	.recv = loop_recv,
	.poll = loop_poll,
	.release = loop_release,
	.wait_fds = loop_wait_fds,
	.close = loop_close,
};

const struct kd_xport_ops kd_xport_loop_deep = {
	.size = sizeof(struct kd_xport_ops),
	.version = KD_XPORT_VERSION,
	.name = "loopback-deep",
	.open = loop_open_deep,
	.flags = KD_XPORT_F_MEM,
	.send_depth = KD_LOOP_DEPTH,
	.send = loop_send,
	.recv = loop_recv,
	.poll = loop_poll,
	.release = loop_release,
	.wait_fds = loop_wait_fds,
	.close = loop_close,
};
