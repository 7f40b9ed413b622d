// SPDX-License-Identifier: MIT
/*
 * The TCP transport: pieces over the non-blocking data streams net.c
 * connected to each peer (KCOLL_NET_STREAMS per host pair). A piece is its
 * header and payload back to back on one stream; the stream's order is the
 * pieces' order. Sends go out with one sendmsg of header and payload; a
 * receive lands straight in the buffer the step engine posted, header and
 * payload in one recvmsg, with no copy. The only check here is the framing
 * (magic, type, length): what the header means is step.c's to judge.
 *
 * At most one send and one receive per stream are in flight (xport.h's
 * contract); poll() walks them in the order they were posted, moving what
 * the kernel takes, and wait_fds() names their streams for poll(2).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "kcolld.h"
#include "xport.h"

/* One direction of one stream. */
struct tcp_io {
	int fd;
	uint32_t host, stream;
	bool tx;
	bool active;
	uint64_t cookie;
	struct kd_p_data hdr;	/* tx: a copy of the caller's; rx: what arrives */
	uint8_t *buf;		/* payload */
	size_t len;
	size_t hdone, pdone;	/* bytes of header / payload done */
	int64_t t0;
};

struct tcp_ctx {
	uint32_t nhosts;
	struct tcp_io *io;	/* [host][KD_MAX_STREAMS][tx] */
	struct tcp_io **act;	/* in flight, in the order posted */
	uint32_t nact;
};

static int tcp_open(const struct kd_xport_env *env, void **ctxp, size_t *piece)
{
	uint32_t nio = env->nhosts * KD_MAX_STREAMS * 2;
	struct tcp_ctx *x = calloc(1, sizeof(*x));

	(void)piece;	/* any size: a piece is bytes on a stream */
	if (!x)
		return -ENOMEM;
	x->nhosts = env->nhosts;
	x->io = calloc(nio, sizeof(*x->io));
	x->act = calloc(nio, sizeof(*x->act));
	if (!x->io || !x->act) {
		free(x->io);
		free(x->act);
		free(x);
		return -ENOMEM;
	}
	for (uint32_t h = 0; h < env->nhosts; h++)
		for (uint32_t s = 0; s < KD_MAX_STREAMS; s++)
			for (int tx = 0; tx < 2; tx++) {
				struct tcp_io *io = &x->io[(h * KD_MAX_STREAMS + s) * 2 + tx];

				io->fd = env->fds[h * KD_MAX_STREAMS + s];
				io->host = h;
				io->stream = s;
				io->tx = tx;
			}
	*ctxp = x;
	return 0;
}

static void tcp_close(void *ctx)
{
	struct tcp_ctx *x = ctx;

	free(x->io);
	free(x->act);
	free(x);
}

static struct tcp_io *io_of(struct tcp_ctx *x, uint32_t host, uint32_t stream, bool tx)
{
	if (host >= x->nhosts || stream >= KD_MAX_STREAMS)
		return NULL;
	return &x->io[(host * KD_MAX_STREAMS + stream) * 2 + tx];
}

static int start(struct tcp_ctx *x, struct tcp_io *io, void *buf, size_t len, uint64_t cookie)
{
	if (!io || io->fd < 0)
		return -ENOTCONN;
	if (io->active)
		return -EBUSY;
	io->active = true;
	io->cookie = cookie;
	io->buf = buf;
	io->len = len;
	io->hdone = io->pdone = 0;
	x->act[x->nact++] = io;
	return 0;
}

static int tcp_send(void *ctx, uint32_t host, uint32_t stream, const struct kd_p_data *hdr, const void *buf,
		    size_t len, const struct kd_xmem *mem, uint64_t cookie)
{
	struct tcp_ctx *x = ctx;
	struct tcp_io *io = io_of(x, host, stream, true);
	int r = start(x, io, (void *)buf, len, cookie);

	if (!r) {
		io->hdr = *hdr;
		io->t0 = kd_now_ns();
	}
	return r;
}

static int tcp_recv(void *ctx, uint32_t host, uint32_t stream, void *buf, size_t len, uint64_t cookie)
{
	struct tcp_ctx *x = ctx;

	return start(x, io_of(x, host, stream, false), buf, len, cookie);
}

/* Move what the kernel takes: 1 when the piece is through, 0 when the
 * stream would block, -errno. */
static int tx_more(struct tcp_io *io, bool *moved)
{
	for (;;) {
		struct iovec iov[2];
		int nio = 0;
		ssize_t n;

		if (io->hdone < sizeof(io->hdr))
			iov[nio++] = (struct iovec){ (uint8_t *)&io->hdr + io->hdone, sizeof(io->hdr) - io->hdone };
		if (io->len > io->pdone)
			iov[nio++] = (struct iovec){ io->buf + io->pdone, io->len - io->pdone };
		struct msghdr mhdr = { .msg_iov = iov, .msg_iovlen = nio };

		n = sendmsg(io->fd, &mhdr, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			return -ECONNRESET;
		}
		*moved = true;
		if (io->hdone < sizeof(io->hdr)) {
			size_t h = sizeof(io->hdr) - io->hdone < (size_t)n ? sizeof(io->hdr) - io->hdone : (size_t)n;

			io->hdone += h;
			n -= h;
		}
		io->pdone += n;
		if (io->hdone == sizeof(io->hdr) && io->pdone == io->len)
			return 1;
	}
}

/* As tx_more; -EPROTO when the header that came does not frame the piece
 * posted (the caller reports it with the header). */
static int rx_more(struct tcp_io *io, bool *moved)
{
	for (;;) {
		ssize_t n;

		if (io->hdone < sizeof(io->hdr)) {
			/* Header and payload in one call: a small piece then costs one
			 * recvmsg. The payload bytes land before the header is checked;
			 * a bad header fails the op, whose buffers are then undefined. */
			struct iovec iov[2] = {
				{ (uint8_t *)&io->hdr + io->hdone, sizeof(io->hdr) - io->hdone },
				{ io->buf, io->len },
			};
			struct msghdr mhdr = { .msg_iov = iov, .msg_iovlen = io->len ? 2 : 1 };

			n = recvmsg(io->fd, &mhdr, MSG_DONTWAIT);
			if (n > 0) {
				*moved = true;
				if (!io->hdone)
					io->t0 = kd_now_ns();
				if ((size_t)n > iov[0].iov_len) {
					io->pdone = n - iov[0].iov_len;
					n = iov[0].iov_len;
				}
				io->hdone += n;
				if (io->hdone < sizeof(io->hdr))
					continue;
				if (io->hdr.hdr.magic != KD_PEER_MAGIC || io->hdr.hdr.type != KD_P_DATA ||
				    io->hdr.hdr.len != sizeof(io->hdr) + io->len)
					return -EPROTO;
				if (io->pdone == io->len)
					return 1;
				continue;
			}
		} else {
			n = recv(io->fd, io->buf + io->pdone, io->len - io->pdone, MSG_DONTWAIT);
			if (n > 0) {
				*moved = true;
				io->pdone += n;
				if (io->pdone == io->len)
					return 1;
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
}

static int tcp_poll(void *ctx, struct kd_xev *ev, uint32_t max, bool *moved)
{
	struct tcp_ctx *x = ctx;
	uint32_t ne = 0, keep = 0, i;

	for (i = 0; i < x->nact && ne < max; i++) {
		struct tcp_io *io = x->act[i];
		int r = io->tx ? tx_more(io, moved) : rx_more(io, moved);

		if (!r) {
			x->act[keep++] = io;
			continue;
		}
		io->active = false;
		ev[ne++] = (struct kd_xev){
			.kind = io->tx ? KD_XEV_TX : KD_XEV_RX,
			.err = r < 0 ? r : 0,
			.host = io->host,
			.stream = io->stream,
			.cookie = io->cookie,
			.t0 = io->t0,
			.hdr = !io->tx && io->hdone == sizeof(io->hdr) ? &io->hdr : NULL,
			.data = io->buf,
		};
	}
	while (i < x->nact)
		x->act[keep++] = x->act[i++];
	x->nact = keep;
	return (int)ne;
}

static uint32_t tcp_wait_fds(void *ctx, struct pollfd *pfd, uint32_t cap)
{
	struct tcp_ctx *x = ctx;
	uint32_t n = 0;

	for (uint32_t i = 0; i < x->nact && n < cap; i++)
		pfd[n++] = (struct pollfd){ .fd = x->act[i]->fd, .events = x->act[i]->tx ? POLLOUT : POLLIN };
	return n;
}

const struct kd_xport_ops kd_xport_tcp = {
	.size = sizeof(struct kd_xport_ops),
	.version = KD_XPORT_VERSION,
	.name = "tcp",
	.open = tcp_open,
	.send = tcp_send,
	.recv = tcp_recv,
	.poll = tcp_poll,
	.wait_fds = tcp_wait_fds,
	.close = tcp_close,
};
