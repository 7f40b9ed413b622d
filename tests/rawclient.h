/* SPDX-License-Identifier: MIT */
/*
 * A raw kcoll client for tests: it speaks the control protocol itself (any
 * proto/ABI version, any bytes) and drives its ring by hand (any SQE, any
 * index), so a test can do whatever a hostile or buggy client could.
 * Header-only; needs kcoll_msg_send/recv (user/common/proto.c).
 *
 * Every call is bounded: waits take a timeout in milliseconds. Functions
 * return 0 (or a length) or a negative errno, like the rest of kcoll.
 */
#ifndef KCOLL_TESTS_RAWCLIENT_H
#define KCOLL_TESTS_RAWCLIENT_H

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/barrier.h>
#include <kcoll/futex.h>
#include <kcoll/kcoll.h>
#include <kcoll/proto.h>
#include <kcoll/ring.h>

struct kcoll_raw {
	int sock;
	uint32_t seq;			/* last control request's seq */
	uint32_t daemon_pid;		/* from the HELLO reply */
	struct kcoll_ring_hdr *ring;	/* NULL until a HELLO succeeded */
	size_t ring_size;
	struct kcoll_queue sq;		/* producer view */
	struct kcoll_queue cq;		/* consumer view */
};

static inline int64_t kcoll_raw_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Connect the control socket only (path NULL: $KCOLL_SOCKET). */
static inline int kcoll_raw_connect(struct kcoll_raw *rc, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	memset(rc, 0, sizeof(*rc));
	rc->sock = -1;
	if (!path)
		path = getenv("KCOLL_SOCKET");
	if (!path || strlen(path) >= sizeof(sa.sun_path))
		return -EINVAL;
	strcpy(sa.sun_path, path);
	rc->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (rc->sock < 0)
		return -errno;
	if (connect(rc->sock, (struct sockaddr *)&sa, sizeof(sa))) {
		int r = -errno;

		close(rc->sock);
		rc->sock = -1;
		return r;
	}
	return 0;
}

static inline void kcoll_raw_close(struct kcoll_raw *rc)
{
	if (rc->ring)
		munmap(rc->ring, rc->ring_size);
	if (rc->sock >= 0)
		close(rc->sock);
	rc->ring = NULL;
	rc->sock = -1;
}

/* Send len bytes exactly as given (garbage, truncated headers, ...). */
static inline int kcoll_raw_send_bytes(struct kcoll_raw *rc, const void *buf, size_t len)
{
	ssize_t n = send(rc->sock, buf, len, MSG_NOSIGNAL);

	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EMSGSIZE;
}

/* Send a well-framed message: magic, len and a fresh seq filled in. */
static inline int kcoll_raw_send_msg(struct kcoll_raw *rc, void *msg, size_t len, int fd)
{
	struct kcoll_msg_hdr *h = msg;

	h->magic = KCOLL_PROTO_MAGIC;
	h->len = len;
	h->seq = ++rc->seq;
	return kcoll_msg_send(rc->sock, msg, len, fd);
}

/*
 * Receive one message within timeout_ms: its length, 0 when the daemon
 * closed the connection, -ETIMEDOUT, or -EBADMSG etc. from kcoll_msg_recv.
 */
static inline ssize_t kcoll_raw_recv(struct kcoll_raw *rc, void *buf, size_t cap, int *fd,
				     int timeout_ms)
{
	struct pollfd p = { .fd = rc->sock, .events = POLLIN };
	ssize_t n;
	int r;

	if (fd)
		*fd = -1;
	do
		r = poll(&p, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (r == 0)
		return -ETIMEDOUT;
	n = kcoll_msg_recv(rc->sock, buf, cap, fd);
	return n == -ECONNRESET ? 0 : n;
}

/*
 * One request/reply: the reply's status, or -ENOTCONN (closed), -ETIMEDOUT,
 * -EBADMSG (a reply of another type or seq). reply must hold a header.
 */
static inline int kcoll_raw_call(struct kcoll_raw *rc, void *msg, size_t len, void *reply,
				 size_t cap, int *reply_fd, int timeout_ms)
{
	const struct kcoll_msg_hdr *h = msg;
	const struct kcoll_msg_hdr *rh = reply;
	ssize_t n;
	int r;

	memset(reply, 0, cap);
	r = kcoll_raw_send_msg(rc, msg, len, -1);
	if (r)
		return r == -EPIPE || r == -ECONNRESET ? -ENOTCONN : r;
	n = kcoll_raw_recv(rc, reply, cap, reply_fd, timeout_ms);
	if (n == 0)
		return -ENOTCONN;
	if (n < 0)
		return (int)n;
	if (rh->type != h->type || rh->seq != h->seq)
		return -EBADMSG;
	return rh->status;
}

static inline void kcoll_raw_wake(uint32_t *word)
{
	kcoll_futex_wake(word, INT_MAX);
}

/*
 * HELLO with the given versions. On success the ring is mapped and checked.
 * rep (may be NULL) gets the reply, error text included, either way.
 */
static inline int kcoll_raw_hello(struct kcoll_raw *rc, uint32_t proto, uint32_t abi,
				  uint32_t sq_entries, struct kcoll_msg_hello_reply *rep)
{
	struct kcoll_msg_hello m = {
		.hdr.type = KCOLL_MSG_HELLO,
		.proto_version = proto,
		.abi_version = abi,
		.sq_entries = sq_entries,
	};
	struct kcoll_msg_hello_reply local;
	const char *why;
	void *p;
	int fd = -1, r;

	if (!rep)
		rep = &local;
	r = kcoll_raw_call(rc, &m, sizeof(m), rep, sizeof(*rep), &fd, 5000);
	if (r)
		goto out;
	r = -EPROTO;
	if (fd < 0 || rep->ring_size < KCOLL_RING_HDR_SIZE || rep->ring_size > (1ULL << 30))
		goto out;
	p = mmap(NULL, rep->ring_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		goto out;
	}
	r = kcoll_ring_hdr_check(p, rep->ring_size, &why);
	if (r) {
		munmap(p, rep->ring_size);
		goto out;
	}
	rc->ring = p;
	rc->ring_size = rep->ring_size;
	rc->daemon_pid = rep->daemon_pid;
	kcoll_queue_init(&rc->sq, &rc->ring->sq_tail, &rc->ring->sq_head,
			 (uint8_t *)p + rc->ring->sq_off, rc->ring->sq_entries, sizeof(struct kcoll_sqe));
	kcoll_queue_init(&rc->cq, &rc->ring->cq_head, &rc->ring->cq_tail,
			 (uint8_t *)p + rc->ring->cq_off, rc->ring->cq_entries, sizeof(struct kcoll_cqe));
out:
	if (fd >= 0)
		close(fd);
	return r;
}

/* connect + HELLO with this build's versions. */
static inline int kcoll_raw_open(struct kcoll_raw *rc, const char *path, uint32_t sq_entries)
{
	int r = kcoll_raw_connect(rc, path);

	if (r)
		return r;
	r = kcoll_raw_hello(rc, KCOLL_PROTO_VERSION, KCOLL_ABI_VERSION, sq_entries, NULL);
	if (r)
		kcoll_raw_close(rc);
	return r;
}

static inline int kcoll_raw_unique_id(struct kcoll_raw *rc, struct kcoll_id *id)
{
	struct kcoll_msg_hdr m = { .type = KCOLL_MSG_UNIQUE_ID };
	struct {
		struct kcoll_msg_hdr hdr;
		struct kcoll_id id;
	} rep;
	int r = kcoll_raw_call(rc, &m, sizeof(m), &rep, sizeof(rep), NULL, 5000);

	if (!r)
		*id = rep.id;
	return r;
}

/* COMM_INIT without waiting: its reply comes when the communicator forms. */
static inline int kcoll_raw_comm_init_send(struct kcoll_raw *rc, const struct kcoll_id *id,
					   uint32_t nranks, uint32_t rank, uint32_t timeout_ms)
{
	struct kcoll_msg_comm_init m = {
		.hdr.type = KCOLL_MSG_COMM_INIT,
		.id = *id,
		.nranks = nranks,
		.rank = rank,
		.timeout_ms = timeout_ms,
	};

	return kcoll_raw_send_msg(rc, &m, sizeof(m), -1);
}

/* The reply to the last COMM_INIT sent: its status, *comm_id on success. */
static inline int kcoll_raw_comm_init_wait(struct kcoll_raw *rc, uint32_t *comm_id, int timeout_ms)
{
	struct kcoll_msg_comm_init_reply rep;
	ssize_t n;

	memset(&rep, 0, sizeof(rep));
	n = kcoll_raw_recv(rc, &rep, sizeof(rep), NULL, timeout_ms);
	if (n == 0)
		return -ENOTCONN;
	if (n < 0)
		return (int)n;
	if (rep.hdr.type != KCOLL_MSG_COMM_INIT || rep.hdr.seq != rc->seq)
		return -EBADMSG;
	if (!rep.hdr.status)
		*comm_id = rep.comm_id;
	return rep.hdr.status;
}

static inline int kcoll_raw_comm_init(struct kcoll_raw *rc, const struct kcoll_id *id,
				      uint32_t nranks, uint32_t rank, uint32_t timeout_ms,
				      uint32_t *comm_id)
{
	int r = kcoll_raw_comm_init_send(rc, id, nranks, rank, timeout_ms);

	return r ? r : kcoll_raw_comm_init_wait(rc, comm_id, (int)timeout_ms + 5000);
}

/* STATUS (JSON if json): the text, NUL-terminated, in buf. */
static inline int kcoll_raw_status(struct kcoll_raw *rc, int json, char *buf, size_t cap)
{
	struct kcoll_msg_hdr m = { .type = KCOLL_MSG_STATUS, .flags = json ? 1 : 0 };
	size_t hl = sizeof(struct kcoll_msg_hdr);
	char *rep = malloc(KCOLL_MSG_BYTES);
	int r;

	if (!rep)
		return -ENOMEM;
	r = kcoll_raw_call(rc, &m, sizeof(m), rep, KCOLL_MSG_BYTES, NULL, 5000);
	if (!r && cap) {
		size_t len = ((struct kcoll_msg_hdr *)rep)->len - hl;

		if (len >= cap)
			len = cap - 1;
		memcpy(buf, rep + hl, len);
		buf[len] = 0;
	}
	free(rep);
	return r;
}

/* The daemon at $KCOLL_SOCKET (else the default socket). */
static inline const char *kcoll_raw_sock(void)
{
	const char *s = getenv("KCOLL_SOCKET");

	return s ? s : KCOLL_DEFAULT_SOCKET;
}

/* A number of that daemon's STATUS JSON ("key":N); 0 when it is not there. */
static inline unsigned long long kcoll_raw_status_num(const char *key)
{
	static char buf[KCOLL_MSG_BYTES];
	struct kcoll_raw rc;
	char pat[64];
	const char *p;

	if (kcoll_raw_connect(&rc, kcoll_raw_sock()))
		return 0;
	if (kcoll_raw_status(&rc, 1, buf, sizeof(buf)))
		buf[0] = 0;
	kcoll_raw_close(&rc);
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(buf, pat);
	return p ? strtoull(p + strlen(pat), NULL, 10) : 0;
}

/* Write an SQE into free slot i (0 = next); publish separately. */
static inline void kcoll_raw_sq_write(struct kcoll_raw *rc, uint32_t i, const struct kcoll_sqe *sqe)
{
	memcpy(kcoll_queue_slot(&rc->sq, i), sqe, sizeof(*sqe));
}

/* Publish n written SQEs and ring the doorbell. */
static inline void kcoll_raw_sq_publish(struct kcoll_raw *rc, uint32_t n)
{
	kcoll_queue_publish(&rc->sq, n);
	kcoll_smp_mb();	/* tail store before the NEED_WAKEUP load (barrier.h) */
	if (kcoll_load_relaxed(&rc->ring->sq_flags) & KCOLL_SQ_NEED_WAKEUP)
		kcoll_raw_wake(&rc->ring->sq_tail);
}

/* One SQE, as is: 0, or -EAGAIN when the SQ is full. */
static inline int kcoll_raw_submit(struct kcoll_raw *rc, const struct kcoll_sqe *sqe)
{
	int64_t space = kcoll_queue_space(&rc->sq);

	if (space < 0)
		return (int)space;
	if (space == 0)
		return -EAGAIN;
	kcoll_raw_sq_write(rc, 0, sqe);
	kcoll_raw_sq_publish(rc, 1);
	return 0;
}

/* Forge the indices this side owns (the daemon must not trust them). */
static inline void kcoll_raw_set_sq_tail(struct kcoll_raw *rc, uint32_t v)
{
	kcoll_store_release(&rc->ring->sq_tail, v);
	kcoll_smp_mb();
	kcoll_raw_wake(&rc->ring->sq_tail);
}

static inline void kcoll_raw_set_cq_head(struct kcoll_raw *rc, uint32_t v)
{
	kcoll_store_release(&rc->ring->cq_head, v);
}

static inline bool kcoll_raw_ring_dead(const struct kcoll_raw *rc)
{
	return kcoll_load_acquire(&rc->ring->status) & KCOLL_RING_DEAD;
}

/* Has the daemon hung up on us? (Pending input is not a hangup.) */
static inline bool kcoll_raw_hung_up(const struct kcoll_raw *rc)
{
	struct pollfd p = { .fd = rc->sock, .events = POLLIN | POLLRDHUP };

	return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

/*
 * Take the next CQE: 0, -ETIMEDOUT, -ENOTCONN (ring dead or connection
 * closed, nothing left to reap) or -EBADMSG (impossible cq_tail).
 */
static inline int kcoll_raw_cqe(struct kcoll_raw *rc, struct kcoll_cqe *out, int timeout_ms)
{
	int64_t deadline = kcoll_raw_now_ms() + timeout_ms;

	for (;;) {
		int64_t ready = kcoll_queue_ready(&rc->cq);
		uint32_t seen = rc->cq.local;

		if (ready < 0)
			return (int)ready;
		if (ready > 0) {
			kcoll_queue_copy(&rc->cq, 0, out);
			kcoll_queue_release(&rc->cq, 1);
			return 0;
		}
		if (kcoll_raw_ring_dead(rc) || kcoll_raw_hung_up(rc))
			return -ENOTCONN;
		if (kcoll_raw_now_ms() >= deadline)
			return -ETIMEDOUT;
		kcoll_store_relaxed(&rc->ring->cq_flags, KCOLL_CQ_NEED_WAKEUP);
		kcoll_smp_mb();	/* flag store before the tail re-check (barrier.h) */
		if (kcoll_load_acquire(&rc->ring->cq_tail) == seen)
			kcoll_futex_wait(&rc->ring->cq_tail, seen, 20 * 1000000LL);
		kcoll_store_relaxed(&rc->ring->cq_flags, 0);
	}
}

/* Submit one SQE and wait for its CQE (the only one in flight). */
static inline int kcoll_raw_run(struct kcoll_raw *rc, const struct kcoll_sqe *sqe,
				struct kcoll_cqe *cqe, int timeout_ms)
{
	int r = kcoll_raw_submit(rc, sqe);

	return r ? r : kcoll_raw_cqe(rc, cqe, timeout_ms);
}

/*
 * Wait until the daemon closed the connection (EOF or reset), discarding
 * any messages still queued: 0, or -ETIMEDOUT.
 */
static inline int kcoll_raw_wait_closed(struct kcoll_raw *rc, int timeout_ms)
{
	int64_t deadline = kcoll_raw_now_ms() + timeout_ms;
	char buf[512];

	for (;;) {
		int left = (int)(deadline - kcoll_raw_now_ms());
		struct pollfd p = { .fd = rc->sock, .events = POLLIN };
		ssize_t n;

		if (left <= 0)
			return -ETIMEDOUT;
		if (poll(&p, 1, left) <= 0)
			continue;
		n = recv(rc->sock, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			return 0;
	}
}

#endif /* KCOLL_TESTS_RAWCLIENT_H */
