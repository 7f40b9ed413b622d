// SPDX-License-Identifier: MIT
/*
 * Lanes: small all-reduces run by the ranks themselves (docs/multihost.md
 * "Lanes").
 *
 * A small op handed to kcolld costs two hand-offs per host (rank -> daemon,
 * daemon -> rank) on top of the network exchange; on hosts whose cores are
 * shared that is most of a 1 KiB all-reduce. With one rank per host the
 * daemons therefore connect one TCP socket per host pair for the
 * communicator, check the token as for their own streams, and give each end
 * to the local rank (COMM_LANE). The rank then does the exchange itself:
 *
 *   H = 2^k    recursive doubling: in step s, send the partial result to
 *              host self ^ 2^s and reduce what it sent into it (the lower
 *              host's data first, so both compute the same bits)
 *   otherwise  one exchange: send our input to every other host, reduce the
 *              H inputs in host order once all are in (kcoll_reduce_n)
 *
 * Sends never block (what the socket does not take goes out on the next
 * pass), so kc_lanes_start returns at once and the op moves on in
 * kc_lanes_progress (from kcoll_wait/kcoll_test). Every message carries the
 * op's sequence number, count, dtype, op and step: a header that does not
 * match our op is -EBADMSG. A closed lane is that rank gone (-ECONNRESET), no
 * byte for the communicator's timeout is -ETIMEDOUT naming the host waited
 * for. A rank that fails sends an ABORT naming the culprit on every lane, so
 * the ranks waiting for it fail the same way instead of blaming it; in
 * recursive doubling each later step waits a grace period longer
 * (lane_deadline), so that ABORT arrives before they would time out. A rank
 * that comes after the others gave up finds their data in its sockets and
 * could complete alone; before it calls an op done it looks for an ABORT of
 * that op behind the data (lanes_aborted), and fails as they did. Errors
 * are sticky: the lanes are out of step after one, and every later lane op
 * fails the same way until the communicator is destroyed. When our daemon
 * dies we shut the lanes down, so the other ranks see this rank gone.
 *
 * Which ops take a lane is decided by values every rank shares (the root's
 * lane size, the op's size), never by local state: the ranks must agree.
 * The caller serializes calls on one kc_lanes.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <kcoll/kcoll.h>

#include "lib.h"
#include "reduce.h"

#define LANE_MAGIC	0x4e4c434bu	/* "KCLN": an op's data */
#define LANE_ABORT	0x4142434bu	/* "KCBA": the sender failed; seq = -err, count = culprit */
#define LANE_ABORT_OP	0xff		/* an ABORT's step: its bytes are the op's seq */
#define LANE_SLICE_MS	100		/* poll slice: the daemon's death is seen within it */
#define LANE_GRACE_NS	(250 * 1000000LL)	/* per step of recursive doubling, see lane_deadline */

struct lane_hdr {
	uint32_t magic;
	uint32_t seq;		/* ops started on these lanes */
	uint64_t count;
	uint16_t dtype;
	uint8_t op;
	uint8_t step;
	uint32_t bytes;
};

struct lane_peer {
	int fd;
	bool tx, rx;		/* we send to / receive from it in this step */
	size_t sent, got;	/* of header + payload, this step */
	struct lane_hdr rx_hdr;
	uint8_t *slot;		/* what it sent (scratch) */
};

struct kc_lanes {
	uint32_t nhosts, self;
	uint32_t max_bytes;
	int64_t timeout_ns, spin_ns;
	bool rd;		/* recursive doubling (H a power of two), else one exchange */
	uint32_t nsteps;	/* log2 H, or 1 */
	struct lane_peer *peer;	/* [nhosts]; peer[self].fd = -1 */
	uint8_t *scratch;
	size_t scratch_per;	/* bytes per slot */
	uint32_t seq;		/* ops started */
	int err;		/* sticky */
	uint32_t err_host;

	/* the op in flight */
	bool busy;
	uint32_t step;
	struct lane_hdr tx;
	const void *send;	/* what this step sends */
	void *recv;
	size_t bytes;
	int64_t last_move;
};

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int kc_lanes_new(uint32_t nhosts, uint32_t self, int *fds, uint32_t max_bytes, int timeout_ms,
		 int64_t spin_ns, struct kc_lanes **out)
{
	struct kc_lanes *l;
	int one = 1;

	if (nhosts < 2 || self >= nhosts || !max_bytes)
		return -EINVAL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->peer = calloc(nhosts, sizeof(*l->peer));
	if (!l->peer) {
		free(l);
		return -ENOMEM;
	}
	l->nhosts = nhosts;
	l->self = self;
	l->rd = !(nhosts & (nhosts - 1));
	l->nsteps = 1;
	while (l->rd && (1u << l->nsteps) < nhosts)
		l->nsteps++;
	l->max_bytes = max_bytes;
	l->timeout_ns = (int64_t)(timeout_ms > 0 ? timeout_ms : 30000) * 1000000;
	l->spin_ns = spin_ns;
	for (uint32_t h = 0; h < nhosts; h++) {
		l->peer[h].fd = h == self ? -1 : fds[h];
		fds[h] = -1;
		if (l->peer[h].fd >= 0)
			setsockopt(l->peer[h].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	}
	*out = l;
	return 0;
}

void kc_lanes_free(struct kc_lanes *l)
{
	if (!l)
		return;
	for (uint32_t h = 0; h < l->nhosts; h++)
		if (l->peer[h].fd >= 0)
			close(l->peer[h].fd);
	free(l->scratch);
	free(l->peer);
	free(l);
}

/* Tell every other rank why we stop (best effort: 24 bytes fit any socket
 * buffer), except where a message of ours is half sent: that lane is shut
 * down instead. */
static void lanes_tell(struct kc_lanes *l, int err, uint32_t culprit)
{
	/* The op it is about: the one in flight, else the next one. */
	struct lane_hdr a = { .magic = LANE_ABORT, .seq = (uint32_t)-err, .count = culprit,
			      .step = LANE_ABORT_OP, .bytes = l->busy ? l->tx.seq : l->seq };

	for (uint32_t h = 0; h < l->nhosts; h++) {
		struct lane_peer *p = &l->peer[h];

		if (p->fd < 0)
			continue;
		if ((l->busy && p->tx && p->sent && p->sent < sizeof(l->tx) + l->bytes) ||
		    send(p->fd, &a, sizeof(a), MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof(a))
			shutdown(p->fd, SHUT_RDWR);
	}
}

static void lanes_fail(struct kc_lanes *l, int err, uint32_t host)
{
	if (!l->err) {
		l->err = err;
		l->err_host = host;
		lanes_tell(l, err, host);
	}
	l->busy = false;
}

void kc_lanes_kill(struct kc_lanes *l, int err)
{
	/* Our daemon is gone (err here): to the others this rank is gone,
	 * as if its host had failed. */
	if (!l->err) {
		lanes_tell(l, -ECONNRESET, l->self);
		l->err = err;
		l->err_host = KCOLL_RANK_NONE;
	}
	l->busy = false;
	for (uint32_t h = 0; h < l->nhosts; h++)
		if (l->peer[h].fd >= 0)
			shutdown(l->peer[h].fd, SHUT_RDWR);
}

int kc_lanes_fit(const struct kc_lanes *l, size_t bytes)
{
	return l && bytes <= l->max_bytes;
}

int kc_lanes_error(const struct kc_lanes *l, uint32_t *err_host)
{
	*err_host = l->err_host;
	return l->err;
}

/* Set the peers of step l->step up. */
static void step_begin(struct kc_lanes *l)
{
	for (uint32_t h = 0; h < l->nhosts; h++) {
		struct lane_peer *p = &l->peer[h];

		p->tx = p->rx = h != l->self && (!l->rd || h == (l->self ^ (1u << l->step)));
		p->sent = p->got = 0;
	}
	l->tx.step = (uint8_t)l->step;
}

int kc_lanes_start(struct kc_lanes *l, const void *send, void *recv, size_t count, int dtype, int op)
{
	size_t bytes = count * kcoll_dtype_size(dtype);

	if (l->err)
		return l->err;
	if (l->busy || bytes > l->max_bytes)
		return -EINVAL;
	if (bytes > l->scratch_per || !l->scratch) {
		/* Grows to the largest op seen, at most (H - 1) x the lane size. */
		uint8_t *sc = malloc((size_t)(l->nhosts - 1) * (bytes ? bytes : 1));

		if (!sc)
			return -ENOMEM;
		free(l->scratch);
		l->scratch = sc;
		l->scratch_per = bytes ? bytes : 1;
	}
	for (uint32_t h = 0, i = 0; h < l->nhosts; h++)
		if (h != l->self)
			l->peer[h].slot = l->scratch + (size_t)(l->rd ? 0 : i++) * l->scratch_per;
	l->tx = (struct lane_hdr){ .magic = LANE_MAGIC, .seq = l->seq++, .count = count,
				   .dtype = (uint16_t)dtype, .op = (uint8_t)op, .bytes = (uint32_t)bytes };
	l->recv = recv;
	l->bytes = bytes;
	l->step = 0;
	if (l->rd) {
		/* The partial result travels; it lives in recv from the start. */
		if (recv != send && bytes)
			memmove(recv, send, bytes);
		l->send = recv;
	} else {
		l->send = send;
	}
	step_begin(l);
	l->busy = true;
	l->last_move = mono_ns();
	return 0;
}

/* Push this step's header and data to p as far as the socket takes it:
 * 1 moved, 0 nothing to do or no room, < 0 the lane broke. */
static int peer_send(struct kc_lanes *l, struct lane_peer *p)
{
	size_t total = sizeof(l->tx) + l->bytes;
	struct iovec iov[2];
	struct msghdr mh = { .msg_iov = iov };
	ssize_t n;

	if (!p->tx || p->sent >= total)
		return 0;
	if (p->sent < sizeof(l->tx)) {
		iov[0] = (struct iovec){ (uint8_t *)&l->tx + p->sent, sizeof(l->tx) - p->sent };
		iov[1] = (struct iovec){ (void *)l->send, l->bytes };
		mh.msg_iovlen = l->bytes ? 2 : 1;
	} else {
		iov[0] = (struct iovec){ (uint8_t *)l->send + (p->sent - sizeof(l->tx)), total - p->sent };
		mh.msg_iovlen = 1;
	}
	n = sendmsg(p->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -ECONNRESET;
	p->sent += (size_t)n;
	return 1;
}

/* An ABORT's error, and the culprit it names. */
static int abort_err(const struct lane_hdr *h, uint32_t *culprit)
{
	*culprit = h->count < KCOLL_LANES_MAX_HOSTS ? (uint32_t)h->count : KCOLL_RANK_NONE;
	/* Not ours to say that our daemon is gone. */
	return h->seq == ENOTCONN ? -ECONNRESET : -(int)h->seq;
}

/* Take what p sent for this step: 1 moved, 0 nothing yet or done, < 0
 * failed; *culprit is the rank a peer's ABORT names. */
static int peer_recv(struct kc_lanes *l, struct lane_peer *p, uint32_t *culprit)
{
	size_t total = sizeof(p->rx_hdr) + l->bytes;
	int moved = 0;

	while (p->rx && p->got < total) {
		struct iovec iov;
		ssize_t n;

		/* The header alone first: an ABORT has no payload. */
		if (p->got < sizeof(p->rx_hdr))
			iov = (struct iovec){ (uint8_t *)&p->rx_hdr + p->got, sizeof(p->rx_hdr) - p->got };
		else
			iov = (struct iovec){ p->slot + (p->got - sizeof(p->rx_hdr)), total - p->got };
		n = recv(p->fd, iov.iov_base, iov.iov_len, MSG_DONTWAIT);
		if (n == 0)
			return -ECONNRESET;	/* the rank closed its end: it left or died */
		if (n < 0)
			return errno == EAGAIN || errno == EINTR ? moved : -ECONNRESET;
		moved = 1;
		p->got += (size_t)n;
		if (p->got == sizeof(p->rx_hdr)) {
			const struct lane_hdr *h = &p->rx_hdr;

			if (h->magic == LANE_ABORT && h->seq && h->seq < 4096)
				return abort_err(h, culprit);
			if (h->magic != LANE_MAGIC || h->seq != l->tx.seq || h->count != l->tx.count ||
			    h->dtype != l->tx.dtype || h->op != l->tx.op || h->step != l->tx.step ||
			    h->bytes != l->tx.bytes)
				return -EBADMSG;	/* another op on its side: a mismatched call */
		} else if ((size_t)n < iov.iov_len) {
			break;	/* the rest is not here yet */
		}
	}
	return moved;
}

/* This step's data is all in: reduce, and begin the next step. 1 when the
 * op is done, 0 when another step follows, < 0 failed. */
static int step_end(struct kc_lanes *l)
{
	const void *in[KCOLL_LANES_MAX_HOSTS];
	int r;

	if (l->rd) {
		uint32_t partner = l->self ^ (1u << l->step);
		/* Lower host first: both partners compute the same bits. */
		in[0] = partner < l->self ? l->peer[partner].slot : l->recv;
		in[1] = partner < l->self ? l->recv : l->peer[partner].slot;
		r = kcoll_reduce_n(l->tx.dtype, l->tx.op, l->recv, in, 2, l->tx.count);
	} else {
		for (uint32_t h = 0; h < l->nhosts; h++)
			in[h] = h == l->self ? l->send : l->peer[h].slot;
		r = kcoll_reduce_n(l->tx.dtype, l->tx.op, l->recv, in, l->nhosts, l->tx.count);
	}
	if (r)
		return r;
	if (++l->step < l->nsteps) {
		step_begin(l);
		return 0;
	}
	l->busy = false;
	return 1;
}

/*
 * The op's data is all in, but did the others give up on it? A rank that
 * comes after they timed out finds their data in its sockets, each
 * followed by the ABORT they sent then. Peek at what follows on every lane
 * (the next op's data stays where it is): 0, or the error of an ABORT of
 * this op (one without an op, from an older libkcoll, counts too). An ABORT
 * still on its way is the timeout's edge: the op completes here alone.
 */
static int lanes_aborted(struct kc_lanes *l, uint32_t *culprit)
{
	for (uint32_t h = 0; h < l->nhosts; h++) {
		struct lane_hdr a;

		if (l->peer[h].fd < 0 ||
		    recv(l->peer[h].fd, &a, sizeof(a), MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof(a))
			continue;
		if (a.magic != LANE_ABORT || !a.seq || a.seq >= 4096 ||
		    (a.step == LANE_ABORT_OP && a.bytes != l->tx.seq))
			continue;
		return abort_err(&a, culprit);
	}
	return 0;
}

/* One pass over this step's lanes: 1 if the op is done, 0 if not, < 0
 * failed (l->err set). */
static int lanes_pass(struct kc_lanes *l, bool *moved)
{
	size_t total = sizeof(struct lane_hdr) + l->bytes;
	bool all = true;
	int r;

	for (uint32_t h = 0; h < l->nhosts; h++) {
		struct lane_peer *p = &l->peer[h];
		uint32_t culprit = h;
		int s;

		if (!p->tx && !p->rx)
			continue;
		s = peer_send(l, p);
		r = s < 0 ? s : peer_recv(l, p, &culprit);
		if (r < 0) {
			lanes_fail(l, r, culprit);
			return r;
		}
		*moved |= s > 0 || r > 0;
		all &= (!p->tx || p->sent == total) && (!p->rx || p->got == total);
	}
	if (!all)
		return 0;
	if (l->step + 1 == l->nsteps) {
		uint32_t culprit;

		r = lanes_aborted(l, &culprit);
		if (r) {
			lanes_fail(l, r, culprit);
			return r;
		}
	}
	r = step_end(l);
	if (r < 0)
		lanes_fail(l, r, KCOLL_RANK_NONE);
	*moved = true;	/* the next step sends at once */
	return r;
}

/* The first host this step still waits for (the one a timeout names). */
static uint32_t first_missing(const struct kc_lanes *l)
{
	for (uint32_t h = 0; h < l->nhosts; h++)
		if (l->peer[h].rx && l->peer[h].got < sizeof(struct lane_hdr) + l->bytes)
			return h;
	return KCOLL_RANK_NONE;
}

/*
 * How long a step may wait without a byte moving. A rank that stops makes its
 * recursive-doubling partner wait one timeout; that partner's partners in
 * later steps wait for the partner, not for the culprit, so each later step
 * gets a grace period in which the ABORT naming the culprit arrives first
 * (the error names the rank that did not contribute, not one that waited).
 */
static int64_t lane_deadline(const struct kc_lanes *l)
{
	return l->last_move + l->timeout_ns + (int64_t)l->step * LANE_GRACE_NS;
}

int kc_lanes_progress(struct kc_lanes *l, int timeout_ms, int daemon_fd, int *res, uint32_t *err_host)
{
	int64_t start = mono_ns();
	int64_t until = timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000;
	struct pollfd pfd[KCOLL_LANES_MAX_HOSTS + 1];

	for (;;) {
		bool moved = false;
		int64_t now, wait_ns;
		uint32_t n = 0;
		int r = l->busy ? lanes_pass(l, &moved) : l->err ? l->err : -EINVAL;

		if (r != 0 || !l->busy) {
			*res = r == 1 ? 0 : r;
			*err_host = r < 0 && l->err ? l->err_host : KCOLL_RANK_NONE;
			return 1;
		}
		now = mono_ns();
		if (moved)
			l->last_move = now;
		else if (now >= lane_deadline(l)) {
			lanes_fail(l, -ETIMEDOUT, first_missing(l));
			*res = l->err;
			*err_host = l->err_host;
			return 1;
		}
		if (now >= until)
			return 0;
		if (moved || now - start < l->spin_ns) {
			if (!moved)
				sched_yield();
			continue;
		}
		for (uint32_t h = 0; h < l->nhosts; h++) {
			struct lane_peer *p = &l->peer[h];
			size_t total = sizeof(struct lane_hdr) + l->bytes;
			short ev = (p->rx && p->got < total ? POLLIN : 0) | (p->tx && p->sent < total ? POLLOUT : 0);

			if (ev)
				pfd[n++] = (struct pollfd){ .fd = p->fd, .events = ev };
		}
		pfd[n++] = (struct pollfd){ .fd = daemon_fd, .events = 0 };
		wait_ns = lane_deadline(l) - now;
		if (until - now < wait_ns)
			wait_ns = until - now;
		if (wait_ns > LANE_SLICE_MS * 1000000LL)
			wait_ns = LANE_SLICE_MS * 1000000LL;
		if (poll(pfd, n, (int)((wait_ns + 999999) / 1000000)) > 0 &&
		    (pfd[n - 1].revents & (POLLHUP | POLLERR))) {
			kc_lanes_kill(l, -ENOTCONN);
			*res = -ENOTCONN;
			*err_host = KCOLL_RANK_NONE;
			return 1;
		}
	}
}
