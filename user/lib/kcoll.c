// SPDX-License-Identifier: MIT
/*
 * libkcoll: connection, ring, requests and the collective calls.
 *
 * Locking: k->ctl_lock serializes control request/reply pairs on the socket;
 * k->ring_lock covers SQ production, CQ consumption and the request table.
 * Neither is held while sleeping on the CQ doorbell.
 */
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/futex.h>
#include <kcoll/kcoll.h>
#include <kcoll/proto.h>
#include <kcoll/ring.h>

#include "config.h"
#include "kcoll_gpu.h"
#include "kdev.h"
#include "lib.h"
#include "log.h"

enum req_state { REQ_FREE, REQ_PENDING, REQ_DONE };

struct kcoll_req {
	struct kcoll *k;
	uint32_t idx;
	uint32_t gen;
	enum req_state state;
	int res;
	uint32_t err_rank;
	int64_t spin_ns;	/* how long kcoll_wait polls before sleeping */
	struct kcoll_comm *lane_comm;	/* a lane op (lane.c) while it is pending */
	struct kcoll_req *next_free;
};

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25	/* Linux 6.1; older kernels answer EINVAL */
#endif
#define KCOLL_THP_SIZE	(2u << 20)	/* x86-64 and arm64 (4 KiB pages) PMD size */
#define KCOLL_THP_SEEN	16

struct kcoll_region {
	void *addr;
	size_t size;
	uint64_t kdev_handle;	/* pinned through /dev/kcoll (not ours to unmap) */
	bool pinned;
	struct kcoll_region *next;
};

/* A GPU allocation registered with kcolld (MEM_REG_DEV). */
struct kcoll_devreg {
	uint64_t base, size, buffer_id;
	struct kcoll_devreg *next;
};

struct kcoll {
	int sock;
	pthread_mutex_t ctl_lock;
	uint32_t ctl_seq;
	int timeout_ms;
	bool timeout_set;	/* KCOLL_TIMEOUT_MS set in our environment */

	struct kcoll_ring_hdr *ring;
	size_t ring_size;
	pthread_mutex_t ring_lock;
	struct kcoll_queue sq, cq;
	struct kcoll_req *reqs;
	uint32_t nreqs;
	struct kcoll_req *free_reqs;
	int dead;		/* daemon gone: everything fails with -ENOTCONN */
	int64_t spin_ns;
	bool spin_set;		/* KCOLL_SPIN_US given in the environment */

	pthread_mutex_t mem_lock;
	struct kcoll_region *regions;
	struct kcoll_kdev kdev;	/* opened on the first kcoll_mem_register */
	bool kdev_tried;
	uint32_t daemon_pid;

	pthread_mutex_t dev_lock;	/* held across a device registration */
	struct kcoll_devreg *devregs;

	size_t thp_min;		/* KCOLL_THP_MIN_BYTES; 0: no collapsing */
	uint64_t thp_done[KCOLL_THP_SEEN][2];	/* ranges collapsed lately (mem_lock) */
	unsigned int thp_next;
};

struct kcoll_comm {
	struct kcoll *k;
	uint32_t comm_id;
	int rank;
	int nranks;
	uint32_t nhosts;	/* hosts the communicator spans */

	/* Lanes (lane.c): small all-reduces run here, not in kcolld. */
	struct kc_lanes *lanes;
	pthread_mutex_t lane_lock;	/* taken before ring_lock, never after */
	struct kcoll_req *lane_rq;	/* the lane op in flight */
	int64_t lane_checked;		/* when we last asked whether kcolld lives */
};

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Wait for the socket to be readable; -ETIMEDOUT, or -ENOTCONN on hangup. */
static int sock_wait(int sock, int timeout_ms)
{
	struct pollfd p = { .fd = sock, .events = POLLIN };
	int r;

	do
		r = poll(&p, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (r == 0)
		return -ETIMEDOUT;
	if ((p.revents & (POLLHUP | POLLERR)) && !(p.revents & POLLIN))
		return -ENOTCONN;
	return 0;
}

/* One control round trip. reply must hold at least a kcoll_msg_hdr. */
static int ctl_call(struct kcoll *k, void *msg, size_t len, int fd, void *reply, size_t cap,
		    int *reply_fd, int timeout_ms)
{
	struct kcoll_msg_hdr *h = msg;
	struct kcoll_msg_hdr *rh = reply;
	ssize_t n;
	int r;

	pthread_mutex_lock(&k->ctl_lock);
	h->magic = KCOLL_PROTO_MAGIC;
	h->len = len;
	h->seq = ++k->ctl_seq;
	r = kcoll_msg_send(k->sock, msg, len, fd);
	if (r)
		goto out;
	for (;;) {
		r = sock_wait(k->sock, timeout_ms);
		if (r)
			goto out;
		n = kcoll_msg_recv(k->sock, reply, cap, reply_fd);
		if (n <= 0) {
			r = n ? (int)n : -ENOTCONN;
			goto out;
		}
		if (rh->seq == h->seq)
			break;
		/* A late reply to a request that timed out earlier: drop it. */
		if (reply_fd && *reply_fd >= 0)
			close(*reply_fd);
	}
	r = rh->type == h->type ? rh->status : -EBADMSG;
out:
	if (r == -EPIPE || r == -ECONNRESET)
		r = -ENOTCONN;
	pthread_mutex_unlock(&k->ctl_lock);
	return r;
}

const char *kcoll_version(void)
{
	return KCOLL_VERSION;
}

static int ring_map(struct kcoll *k, int fd, uint64_t size)
{
	const char *why;
	void *p;
	int r;

	if (size < KCOLL_RING_HDR_SIZE || size > (1ULL << 30))
		return -EPROTO;
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	k->ring = p;
	k->ring_size = size;
	r = kcoll_ring_hdr_check(k->ring, size, &why);
	if (r) {
		fprintf(stderr, "libkcoll: %s\n", why);
		munmap(p, size);
		k->ring = NULL;
		return r;
	}
	kcoll_queue_init(&k->sq, &k->ring->sq_tail, &k->ring->sq_head,
			 (uint8_t *)p + k->ring->sq_off, k->ring->sq_entries, sizeof(struct kcoll_sqe));
	kcoll_queue_init(&k->cq, &k->ring->cq_head, &k->ring->cq_tail,
			 (uint8_t *)p + k->ring->cq_off, k->ring->cq_entries, sizeof(struct kcoll_cqe));
	return 0;
}

static int reqs_init(struct kcoll *k)
{
	k->nreqs = k->ring->sq_entries;
	k->reqs = calloc(k->nreqs, sizeof(*k->reqs));
	if (!k->reqs)
		return -ENOMEM;
	for (uint32_t i = k->nreqs; i-- > 0;) {
		k->reqs[i].k = k;
		k->reqs[i].idx = i;
		k->reqs[i].next_free = k->free_reqs;
		k->free_reqs = &k->reqs[i];
	}
	return 0;
}

int kcoll_connect(const struct kcoll_connect_opts *opts, struct kcoll **out)
{
	struct kcoll_connect_opts o = { 0 };
	struct kcoll_msg_hello hello = { .hdr.type = KCOLL_MSG_HELLO };
	struct kcoll_msg_hello_reply rep = { 0 };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *path;
	struct kcoll *k;
	int fd = -1, r;

	if (!out)
		return -EINVAL;
	if (opts) {
		if (opts->size < offsetof(struct kcoll_connect_opts, reserved) || opts->flags)
			return -EINVAL;
		memcpy(&o, opts, opts->size < sizeof(o) ? opts->size : sizeof(o));
	}
	path = o.socket_path ? o.socket_path : kcoll_knob_str("KCOLL_SOCKET");
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);

	k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	pthread_mutex_init(&k->ctl_lock, NULL);
	pthread_mutex_init(&k->ring_lock, NULL);
	pthread_mutex_init(&k->mem_lock, NULL);
	pthread_mutex_init(&k->dev_lock, NULL);
	k->timeout_ms = kcoll_knob_ll("KCOLL_TIMEOUT_MS");
	k->timeout_set = kcoll_knob_is_set("KCOLL_TIMEOUT_MS");
	k->spin_ns = kcoll_knob_ll("KCOLL_SPIN_US") * 1000;
	k->spin_set = kcoll_knob_is_set("KCOLL_SPIN_US");
	k->thp_min = kcoll_knob_ll("KCOLL_THP_MIN_BYTES");

	k->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (k->sock < 0) {
		r = -errno;
		goto err_free;
	}
	if (connect(k->sock, (struct sockaddr *)&sa, sizeof(sa))) {
		r = errno == ENOENT ? -ECONNREFUSED : -errno;
		goto err_close;
	}

	hello.proto_version = KCOLL_PROTO_VERSION;
	hello.abi_version = KCOLL_ABI_VERSION;
	hello.sq_entries = o.sq_entries ? o.sq_entries : kcoll_knob_ll("KCOLL_SQ_ENTRIES");
	r = ctl_call(k, &hello, sizeof(hello), -1, &rep, sizeof(rep), &fd, 5000);
	if (r) {
		if (rep.hdr.magic == KCOLL_PROTO_MAGIC && rep.error[0])
			fprintf(stderr, "libkcoll: kcolld refused the connection: %.*s\n",
				(int)sizeof(rep.error), rep.error);
		goto err_fd;
	}
	if (fd < 0) {
		r = -EPROTO;
		goto err_close;
	}
	r = ring_map(k, fd, rep.ring_size);
	if (r)
		goto err_fd;
	close(fd);
	fd = -1;
	r = reqs_init(k);
	if (r)
		goto err_unmap;
	/* Under YAMA ptrace_scope=1 the daemon may only copy our buffers
	 * (process_vm_readv) if we name it; harmless where YAMA is absent. */
	prctl(PR_SET_PTRACER, (unsigned long)rep.daemon_pid, 0, 0, 0);
	k->daemon_pid = rep.daemon_pid;
	k->kdev.fd = -1;
	*out = k;
	return 0;

err_unmap:
	munmap(k->ring, k->ring_size);
err_fd:
	if (fd >= 0)
		close(fd);
err_close:
	close(k->sock);
err_free:
	free(k);
	return r;
}

/* Fail every pending request: the daemon is gone or we are leaving. */
static void reqs_fail_all(struct kcoll *k, int res)
{
	for (uint32_t i = 0; i < k->nreqs; i++) {
		/* A lane op fails when its communicator's lanes learn of it
		 * (lane_progress), under the locks that take it off them. */
		if (k->reqs[i].state == REQ_PENDING && !k->reqs[i].lane_comm) {
			k->reqs[i].state = REQ_DONE;
			k->reqs[i].res = res;
			k->reqs[i].err_rank = KCOLL_RANK_NONE;
		}
	}
}

void kcoll_disconnect(struct kcoll *k)
{
	struct kcoll_region *rg, *next;

	if (!k)
		return;
	close(k->sock);
	munmap(k->ring, k->ring_size);
	for (rg = k->regions; rg; rg = next) {
		next = rg->next;
		if (rg->pinned)
			kcoll_kdev_unregister(&k->kdev, rg->kdev_handle);
		else
			munmap(rg->addr, rg->size);
		free(rg);
	}
	kcoll_kdev_close(&k->kdev);
	while (k->devregs) {
		struct kcoll_devreg *d = k->devregs;

		k->devregs = d->next;
		free(d);
	}
	free(k->reqs);
	free(k);
}

/* Take completions off the CQ. Called with ring_lock held. */
static void cq_reap(struct kcoll *k)
{
	int64_t n = kcoll_queue_ready(&k->cq);
	struct kcoll_cqe cqe;

	if (n < 0) {
		k->dead = 1;
		reqs_fail_all(k, -EPROTO);
		return;
	}
	for (int64_t i = 0; i < n; i++) {
		uint32_t idx, gen;

		kcoll_queue_copy(&k->cq, i, &cqe);
		idx = (uint32_t)cqe.user_data;
		gen = (uint32_t)(cqe.user_data >> 32);
		if (idx >= k->nreqs || k->reqs[idx].gen != gen || k->reqs[idx].state != REQ_PENDING)
			continue;
		k->reqs[idx].state = REQ_DONE;
		k->reqs[idx].res = cqe.res;
		k->reqs[idx].err_rank = cqe.err_rank;
	}
	if (n)
		kcoll_queue_release(&k->cq, n);
}

/* Is the daemon still there? Checked only when a wait is slow. */
static int daemon_alive(struct kcoll *k)
{
	struct pollfd p = { .fd = k->sock, .events = POLLIN };

	if (kcoll_load_relaxed(&k->ring->status) & KCOLL_RING_DEAD)
		return 0;
	return !(poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)));
}

/*
 * Wait until 'done' holds (checked under ring_lock after reaping), the
 * deadline passes (-ETIMEDOUT) or the daemon dies (-ENOTCONN, all pending
 * requests failed). Spin briefly, then sleep on the CQ doorbell in slices so
 * a dead daemon is noticed within a slice.
 */
static int cq_wait(struct kcoll *k, int (*done)(struct kcoll *, void *), void *arg, int timeout_ms,
		   int64_t spin_ns)
{
	const int64_t slice_ns = 100 * 1000000LL;
	int64_t start = now_ns();
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000;

	for (;;) {
		uint32_t seen;
		int64_t t;

		pthread_mutex_lock(&k->ring_lock);
		cq_reap(k);
		/* Sleep only while the tail still equals what we consumed: a CQE
		 * posted after this point changes it and the futex won't block. */
		seen = k->cq.local;
		if (done(k, arg)) {
			pthread_mutex_unlock(&k->ring_lock);
			return 0;
		}
		if (k->dead) {
			reqs_fail_all(k, -ENOTCONN);
			pthread_mutex_unlock(&k->ring_lock);
			continue;	/* done() now sees the failure */
		}
		pthread_mutex_unlock(&k->ring_lock);

		t = now_ns();
		if (t >= deadline)
			return -ETIMEDOUT;
		if (t - start < spin_ns) {
			kcoll_spin_yield();
			continue;
		}
		kcoll_store_relaxed(&k->ring->cq_flags, KCOLL_CQ_NEED_WAKEUP);
		kcoll_smp_mb();
		if (kcoll_load_acquire(&k->ring->cq_tail) == seen) {
			int64_t left = deadline - t;

			kcoll_futex_wait(&k->ring->cq_tail, seen, left < slice_ns ? left : slice_ns);
		}
		kcoll_store_relaxed(&k->ring->cq_flags, 0);
		/* A completion woke us: the daemon lives. Ask the socket only
		 * when nothing arrived (a slice ran out): one system call less
		 * per completion, and a dead daemon is still seen within a slice. */
		if (kcoll_load_acquire(&k->ring->cq_tail) == seen && !daemon_alive(k)) {
			pthread_mutex_lock(&k->ring_lock);
			cq_reap(k);	/* keep completions that did arrive */
			k->dead = 1;
			pthread_mutex_unlock(&k->ring_lock);
		}
	}
}

static int have_free_req(struct kcoll *k, void *arg)
{
	return k->free_reqs != NULL || k->dead;
}

/*
 * A free request, made pending: 0 with ring_lock held, or -ENOTCONN (the
 * daemon is gone) / -EBUSY (none came free within the timeout) without it.
 */
static int req_take(struct kcoll *k, int64_t spin_ns, struct kcoll_req **out)
{
	struct kcoll_req *rq;
	int r;

	for (;;) {
		pthread_mutex_lock(&k->ring_lock);
		if (k->dead) {
			pthread_mutex_unlock(&k->ring_lock);
			return -ENOTCONN;
		}
		if (k->free_reqs)
			break;
		pthread_mutex_unlock(&k->ring_lock);
		/* Every slot in flight: wait for one to complete (and be freed). */
		r = cq_wait(k, have_free_req, NULL, k->timeout_ms, k->spin_ns);
		if (r)
			return r == -ETIMEDOUT ? -EBUSY : r;
	}
	rq = k->free_reqs;
	k->free_reqs = rq->next_free;
	rq->gen++;
	rq->state = REQ_PENDING;
	rq->spin_ns = spin_ns;
	*out = rq;
	return 0;
}

/* Queue one SQE; on success *req is the pending request. */
static int submit(struct kcoll *k, struct kcoll_sqe *sqe, struct kcoll_req **req, int64_t spin_ns)
{
	struct kcoll_req *rq;
	int r;

	if (!req)
		return -EINVAL;
	r = req_take(k, spin_ns, &rq);
	if (r)
		return r;
	/* Requests in flight never exceed sq_entries, so the SQ has room. */
	sqe->user_data = (uint64_t)rq->gen << 32 | rq->idx;
	if (kcoll_queue_space(&k->sq) <= 0) {
		rq->state = REQ_FREE;
		rq->next_free = k->free_reqs;
		k->free_reqs = rq;
		pthread_mutex_unlock(&k->ring_lock);
		return -EPROTO;
	}
	memcpy(kcoll_queue_slot(&k->sq, 0), sqe, sizeof(*sqe));
	kcoll_queue_publish(&k->sq, 1);
	kcoll_smp_mb();	/* tail store before the NEED_WAKEUP load (see barrier.h) */
	if (kcoll_load_relaxed(&k->ring->sq_flags) & KCOLL_SQ_NEED_WAKEUP)
		kcoll_futex_wake(&k->ring->sq_tail, 1);
	pthread_mutex_unlock(&k->ring_lock);
	*req = rq;
	return 0;
}

static int req_is_done(struct kcoll *k, void *arg)
{
	return ((struct kcoll_req *)arg)->state == REQ_DONE;
}

/* Called with ring_lock held on a REQ_DONE request. */
static int req_finish(struct kcoll_req *rq)
{
	struct kcoll *k = rq->k;

	rq->state = REQ_FREE;
	rq->next_free = k->free_reqs;
	k->free_reqs = rq;
	return rq->res;
}

/* ---- lane ops (lane.c does the exchange) ---- */

/* Complete c's lane op. lane_lock and ring_lock held. */
static void lane_done(struct kcoll_comm *c, int res, uint32_t err_rank)
{
	struct kcoll_req *rq = c->lane_rq;

	rq->state = REQ_DONE;
	rq->res = res;
	rq->err_rank = res ? err_rank : KCOLL_RANK_NONE;
	rq->lane_comm = NULL;
	c->lane_rq = NULL;
}

/* Move c's lane op on for up to timeout_ms (0: one pass, < 0: until it
 * ends): 1 when there is none (any more), 0 while it runs. lane_lock held. */
static int lane_progress(struct kcoll_comm *c, int timeout_ms)
{
	struct kcoll *k = c->k;
	uint32_t host;
	int res;

	if (!c->lane_rq)
		return 1;
	if (kcoll_load_relaxed(&k->dead) || (kcoll_load_relaxed(&k->ring->status) & KCOLL_RING_DEAD))
		kc_lanes_kill(c->lanes, -ENOTCONN);
	if (!kc_lanes_progress(c->lanes, timeout_ms, k->sock, &res, &host))
		return 0;
	pthread_mutex_lock(&k->ring_lock);
	if (res == -ENOTCONN && host == KCOLL_RANK_NONE)
		k->dead = 1;	/* the lanes saw kcolld go: so does everything else */
	lane_done(c, res, host);
	pthread_mutex_unlock(&k->ring_lock);
	return 1;
}

static int lane_submit(struct kcoll_comm *c, const void *send, void *recv, size_t count, int dtype,
		       int op, struct kcoll_req **req)
{
	struct kcoll *k = c->k;
	struct kcoll_req *rq;
	int64_t now;
	int r;

	pthread_mutex_lock(&c->lane_lock);
	/* A communicator's lane ops run one at a time, in the order issued. */
	lane_progress(c, -1);
	r = req_take(k, 0, &rq);
	if (r) {
		if (r == -ENOTCONN)
			kc_lanes_kill(c->lanes, r);
		pthread_mutex_unlock(&c->lane_lock);
		return r;
	}
	rq->lane_comm = c;
	c->lane_rq = rq;
	pthread_mutex_unlock(&k->ring_lock);
	/* Is kcolld still there? At most once a millisecond (a system call per
	 * op would cost more than this check is worth); a wait in
	 * kc_lanes_progress watches its socket anyway. */
	now = now_ns();
	if (now - c->lane_checked > 1000000) {
		c->lane_checked = now;
		if (!daemon_alive(k)) {
			pthread_mutex_lock(&k->ring_lock);
			k->dead = 1;
			pthread_mutex_unlock(&k->ring_lock);
		}
	}
	r = kcoll_load_relaxed(&k->dead) ? -ENOTCONN : kc_lanes_start(c->lanes, send, recv, count, dtype, op);
	if (r) {
		uint32_t host;

		if (r == -ENOTCONN)
			kc_lanes_kill(c->lanes, r);
		pthread_mutex_lock(&k->ring_lock);
		lane_done(c, r, kc_lanes_error(c->lanes, &host) == r ? host : KCOLL_RANK_NONE);
		pthread_mutex_unlock(&k->ring_lock);
	} else {
		lane_progress(c, 0);	/* our input leaves now */
	}
	*req = rq;
	pthread_mutex_unlock(&c->lane_lock);
	return 0;
}

/* rq is a pending lane op: move it on (see lane_progress). */
static int lane_req_progress(struct kcoll_req *rq, int timeout_ms)
{
	struct kcoll_comm *c = rq->lane_comm;
	int done;

	pthread_mutex_lock(&c->lane_lock);
	done = c->lane_rq != rq || lane_progress(c, timeout_ms);
	pthread_mutex_unlock(&c->lane_lock);
	return done;
}

int kcoll_test(struct kcoll_req *rq, int *result)
{
	struct kcoll *k;
	int done = 0;

	if (!rq || !result)
		return -EINVAL;
	k = rq->k;
	if (rq->lane_comm && rq->state == REQ_PENDING)
		lane_req_progress(rq, 0);
	pthread_mutex_lock(&k->ring_lock);
	cq_reap(k);
	if (rq->state == REQ_PENDING && k->dead)
		reqs_fail_all(k, -ENOTCONN);
	if (rq->state == REQ_DONE) {
		*result = req_finish(rq);
		done = 1;
	}
	pthread_mutex_unlock(&k->ring_lock);
	return done;
}

int kcoll_wait(struct kcoll_req *rq, int timeout_ms)
{
	struct kcoll *k;
	int r;

	if (!rq || rq->state == REQ_FREE)
		return -EINVAL;
	k = rq->k;
	if (rq->lane_comm && rq->state == REQ_PENDING && !lane_req_progress(rq, timeout_ms))
		return -ETIMEDOUT;
	r = cq_wait(k, req_is_done, rq, timeout_ms, rq->spin_ns);
	if (r)
		return r;
	pthread_mutex_lock(&k->ring_lock);
	r = req_finish(rq);
	pthread_mutex_unlock(&k->ring_lock);
	return r;
}

int kcoll_req_err_rank(const struct kcoll_req *rq)
{
	return rq && rq->err_rank != KCOLL_RANK_NONE ? (int)rq->err_rank : -1;
}

int kcoll_get_unique_id(struct kcoll *k, kcoll_unique_id_t *id)
{
	struct kcoll_msg_hdr req = { .type = KCOLL_MSG_UNIQUE_ID };
	struct {
		struct kcoll_msg_hdr hdr;
		struct kcoll_id id;
	} rep;
	int r;

	_Static_assert(sizeof(struct kcoll_id) <= sizeof(kcoll_unique_id_t), "id too large");
	if (!k || !id)
		return -EINVAL;
	r = ctl_call(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);
	if (r)
		return r;
	memset(id, 0, sizeof(*id));
	memcpy(id->bytes, &rep.id, sizeof(rep.id));
	return 0;
}

static bool cuda_loaded(void);

/* Take the communicator's lanes from kcolld, one per other host. */
static int lanes_open(struct kcoll_comm *c, const struct kcoll_msg_comm_init_reply *rep)
{
	int fds[KCOLL_LANES_MAX_HOSTS];
	int r = 0;

	if (rep->nhosts < 2 || rep->nhosts > KCOLL_LANES_MAX_HOSTS || rep->self_host >= rep->nhosts ||
	    rep->nhosts != (uint32_t)c->nranks || rep->self_host != (uint32_t)c->rank)
		return -EPROTO;
	for (uint32_t h = 0; h < rep->nhosts; h++)
		fds[h] = -1;
	for (uint32_t h = 0; h < rep->nhosts && !r; h++) {
		struct kcoll_msg_comm_lane req = { .hdr.type = KCOLL_MSG_COMM_LANE, .comm_id = c->comm_id,
						   .host = h };
		struct kcoll_msg_hdr lrep;

		if (h == rep->self_host)
			continue;
		r = ctl_call(c->k, &req, sizeof(req), -1, &lrep, sizeof(lrep), &fds[h], 5000);
		if (!r && fds[h] < 0)
			r = -EPROTO;
	}
	if (!r)
		r = kc_lanes_new(rep->nhosts, rep->self_host, fds, rep->lane_bytes, (int)rep->timeout_ms,
				 c->k->spin_ns, &c->lanes);
	for (uint32_t h = 0; h < rep->nhosts; h++)
		if (fds[h] >= 0)
			close(fds[h]);
	return r;
}

int kcoll_comm_init_rank(struct kcoll *k, const kcoll_unique_id_t *id, int nranks, int rank,
			 struct kcoll_comm **out)
{
	struct kcoll_msg_comm_init req = { .hdr.type = KCOLL_MSG_COMM_INIT };
	struct kcoll_msg_comm_init_reply rep;
	struct kcoll_comm *c;
	int r;

	if (!k || !id || !out || nranks < 1 || rank < 0 || rank >= nranks)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	memcpy(&req.id, id->bytes, sizeof(req.id));
	req.nranks = nranks;
	req.rank = rank;
	/* Our KCOLL_TIMEOUT_MS if we set one, else 0: kcolld's own (its
	 * environment or /sys/kernel/kcoll/timeout_ms). */
	req.timeout_ms = k->timeout_set ? k->timeout_ms : 0;
	/* A process with CUDA may pass device buffers: its communicators get
	 * no lanes (they move host memory only). */
	req.flags = cuda_loaded() ? KCOLL_COMM_F_GPU : 0;
	memset(&rep, 0, sizeof(rep));
	/* kcolld enforces the timeout and a dead daemon is seen as a hangup;
	 * this bound only guards against one that is stuck. */
	r = ctl_call(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL,
		     (k->timeout_set ? k->timeout_ms : 3600000) + 5000);
	if (r) {
		if (rep.hdr.magic == KCOLL_PROTO_MAGIC && rep.error[0])
			fprintf(stderr, "libkcoll: communicator init failed: %.*s\n",
				(int)sizeof(rep.error), rep.error);
		free(c);
		return r;
	}
	c->k = k;
	c->comm_id = rep.comm_id;
	c->nhosts = rep.nhosts ? rep.nhosts : 1;
	c->rank = rank;
	c->nranks = nranks;
	pthread_mutex_init(&c->lane_lock, NULL);
	if (rep.lane_bytes) {
		r = lanes_open(c, &rep);
		if (r) {
			fprintf(stderr, "libkcoll: communicator init failed: cannot take its lanes from kcolld: "
				"%s (KCOLL_LANE_BYTES=0 on the daemon that issued the id turns lanes off)\n",
				strerror(-r));
			kcoll_comm_destroy(c);
			return r;
		}
	}
	*out = c;
	return 0;
}

int kcoll_comm_destroy(struct kcoll_comm *c)
{
	struct kcoll_msg_comm_destroy req = { .hdr.type = KCOLL_MSG_COMM_DESTROY };
	struct kcoll_msg_hdr rep;
	int r;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->lane_lock);
	if (c->lane_rq) {
		pthread_mutex_lock(&c->k->ring_lock);
		lane_done(c, -ECANCELED, KCOLL_RANK_NONE);
		pthread_mutex_unlock(&c->k->ring_lock);
	}
	kc_lanes_free(c->lanes);
	c->lanes = NULL;
	pthread_mutex_unlock(&c->lane_lock);
	pthread_mutex_destroy(&c->lane_lock);
	req.comm_id = c->comm_id;
	r = ctl_call(c->k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);
	free(c);
	return r;
}

int kcoll_comm_rank(const struct kcoll_comm *c)
{
	return c ? c->rank : -EINVAL;
}

int kcoll_comm_size(const struct kcoll_comm *c)
{
	return c ? c->nranks : -EINVAL;
}

/*
 * Device buffers (docs/gpu.md). Only a process that has the CUDA driver loaded
 * can hold one; for it, the driver says whether a pointer is device memory and
 * which allocation holds it. Each allocation is registered with kcolld once,
 * with a CUDA IPC handle; a new buffer id at a registered base means the
 * allocation was freed and the address reused: the old registration goes and
 * the new allocation is registered in its place.
 */
/* dl_iterate_phdr callback: the count of objects ever loaded, then stop. */
static int loaded_adds(struct dl_phdr_info *info, size_t size, void *arg)
{
	if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
		*(unsigned long long *)arg = info->dlpi_adds;
	return 1;
}

/*
 * Is the CUDA driver loaded in this process? Asked on every submission, so it
 * must cost next to nothing. dlopen(RTLD_NOLOAD) answers it but searches the
 * library path with system calls (it tripled small-message latency when asked
 * per op), so it is asked again only when something was loaded since it last
 * said no (the loader's count of loaded objects, read in memory).
 */
static bool cuda_loaded(void)
{
	static int seen;	/* once loaded, libcuda stays */
	static unsigned long long no_at;	/* the answer was no at this count */
	unsigned long long adds = 0;
	void *h;

	if (__atomic_load_n(&seen, __ATOMIC_RELAXED))
		return true;
	dl_iterate_phdr(loaded_adds, &adds);
	if (adds && adds == __atomic_load_n(&no_at, __ATOMIC_RELAXED))
		return false;
	h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
	if (!h) {
		__atomic_store_n(&no_at, adds, __ATOMIC_RELAXED);
		return false;
	}
	dlclose(h);
	__atomic_store_n(&seen, 1, __ATOMIC_RELAXED);
	return true;
}

/* The driver for pointer queries and IPC export; never the kernels library. */
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
static struct kcoll_gpu *gpu;

static void gpu_open(void)
{
	static const struct kcoll_gpu_config cfg = { .driver_only = 1 };

	kcoll_gpu_open(&gpu, &cfg);
}

static int dev_unreg(struct kcoll *k, uint64_t base)
{
	struct kcoll_msg_mem_unreg req = { .hdr.type = KCOLL_MSG_MEM_UNREG, .addr = base };
	struct kcoll_msg_hdr rep;
	int r = ctl_call(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);

	return r == -ENOENT || r == -ENOTCONN ? 0 : r;
}

static int dev_register(struct kcoll *k, struct kcoll_gpu *g, const struct kcoll_gpu_ptr *q)
{
	struct kcoll_msg_mem_reg_dev m = { .hdr.type = KCOLL_MSG_MEM_REG_DEV };
	struct kcoll_devreg *d, **pp, *stale = NULL;
	struct kcoll_msg_hdr rep;
	struct kcoll_gpu_ipc h;
	char why[KCOLL_GPU_TEXT];
	int r;

	_Static_assert(sizeof(h) == sizeof(m.ipc), "struct kcoll_gpu_ipc on the wire");
	pthread_mutex_lock(&k->dev_lock);
	for (pp = &k->devregs; *pp; pp = &(*pp)->next) {
		if ((*pp)->base != q->base)
			continue;
		if ((*pp)->buffer_id == q->buffer_id && (*pp)->size == q->size) {
			pthread_mutex_unlock(&k->dev_lock);
			return 0;	/* registered already */
		}
		stale = *pp;
		*pp = stale->next;
		break;
	}
	if (stale) {
		kc_dbg("device allocation at 0x%llx was freed and reused (buffer id %llu -> %llu): "
		       "registering the new one", (unsigned long long)q->base,
		       (unsigned long long)stale->buffer_id, (unsigned long long)q->buffer_id);
		free(stale);
		r = dev_unreg(k, q->base);
		if (r)
			goto out;
	}
	r = kcoll_gpu_ipc_export(g, (const void *)(uintptr_t)q->base, q->size, &h, why,
				 sizeof(why));
	if (r) {
		kc_warn("device buffer at 0x%llx: %s", (unsigned long long)q->base, why);
		goto out;
	}
	m.addr = q->base;
	m.size = q->size;
	m.buffer_id = q->buffer_id;
	snprintf(m.pci_bus_id, sizeof(m.pci_bus_id), "%s", q->pci_bus_id);
	memcpy(m.ipc, &h, sizeof(h));
	r = ctl_call(k, &m, sizeof(m), -1, &rep, sizeof(rep), NULL, 5000);
	if (r) {
		kc_warn("kcolld refused device allocation 0x%llx (%llu bytes): %s; its log says why",
			(unsigned long long)q->base, (unsigned long long)q->size, kcoll_strerror(r));
		goto out;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		dev_unreg(k, q->base);
		r = -ENOMEM;
		goto out;
	}
	d->base = q->base;
	d->size = q->size;
	d->buffer_id = q->buffer_id;
	d->next = k->devregs;
	k->devregs = d;
out:
	pthread_mutex_unlock(&k->dev_lock);
	return r;
}

/* The SQE memory kind of [ptr, ptr + bytes), registering a device allocation. */
static int mem_kind(struct kcoll *k, const void *ptr, size_t bytes, uint8_t *kind)
{
	char why[KCOLL_GPU_TEXT];
	struct kcoll_gpu_ptr q;
	struct kcoll_gpu *g;
	uint64_t off;
	int r;

	*kind = KCOLL_MEM_HOST;
	if (!ptr || !bytes || !cuda_loaded())
		return 0;
	pthread_once(&gpu_once, gpu_open);
	g = gpu;
	r = g ? kcoll_gpu_ptr_query(g, ptr, &q, why, sizeof(why)) : -EOPNOTSUPP;
	if (r == -EOPNOTSUPP)
		return 0;	/* a driver without a device: nothing is device memory */
	if (r) {
		kc_warn("device buffer %p: %s", ptr, why);
		return r;
	}
	if (!q.is_device)
		return 0;
	off = (uintptr_t)ptr - q.base;
	if (bytes > q.size - off) {
		kc_warn("device buffer %p of %zu bytes runs past its allocation (0x%llx, %llu bytes)",
			ptr, bytes, q.base, q.size);
		return -EINVAL;
	}
	r = dev_register(k, g, &q);
	if (!r)
		*kind = KCOLL_MEM_DEVICE;
	return r;
}

/*
 * kcolld reaches a buffer outside kcoll memory with process_vm_readv/writev,
 * which pins the pages of every chunk it copies, page by page: with 4 KiB
 * pages that pinning costs about as much as the copy itself (docs/perf/shim.md
 * section 5). Collapsing the 2 MiB-aligned inside of a large buffer into
 * huge pages once (MADV_COLLAPSE: synchronous, keeps the contents, adds no
 * memory beyond pages the op reads or writes anyway, all of them) lets
 * each pin take 512 pages at a time. A hint: failures (no huge page free,
 * an old kernel, a file mapping) change nothing. Remembers the last
 * KCOLL_THP_SEEN ranges so a buffer used in a loop is collapsed once.
 */
static void thp_collapse(struct kcoll *k, const void *ptr, size_t bytes)
{
	uint64_t lo = ((uintptr_t)ptr + KCOLL_THP_SIZE - 1) & ~(uint64_t)(KCOLL_THP_SIZE - 1);
	uint64_t hi = ((uintptr_t)ptr + bytes) & ~(uint64_t)(KCOLL_THP_SIZE - 1);
	bool seen = false;

	if (!k->thp_min || bytes < k->thp_min || hi <= lo)
		return;
	pthread_mutex_lock(&k->mem_lock);
	for (const struct kcoll_region *rg = k->regions; rg && !seen; rg = rg->next)
		seen = (uintptr_t)ptr >= (uintptr_t)rg->addr &&
		       (uintptr_t)ptr < (uintptr_t)rg->addr + rg->size;	/* kcoll memory */
	for (unsigned int i = 0; i < KCOLL_THP_SEEN && !seen; i++)
		seen = k->thp_done[i][0] <= lo && hi <= k->thp_done[i][1];
	if (!seen) {
		k->thp_done[k->thp_next][0] = lo;
		k->thp_done[k->thp_next][1] = hi;
		k->thp_next = (k->thp_next + 1) % KCOLL_THP_SEEN;
	}
	pthread_mutex_unlock(&k->mem_lock);
	if (!seen && madvise((void *)(uintptr_t)lo, hi - lo, MADV_COLLAPSE))
		kc_dbg("MADV_COLLAPSE of %#llx+%llu: %s (kcolld copies it page by page)",
		       (unsigned long long)lo, (unsigned long long)(hi - lo), strerror(errno));
}

static int coll_submit(struct kcoll_comm *c, uint8_t opcode, const void *send, void *recv,
		       size_t count, int dtype, int op, int root, struct kcoll_req **req)
{
	struct kcoll_sqe sqe = { .opcode = opcode };
	size_t esz, sbytes, rbytes;
	int r;

	if (!c || !req)
		return -EINVAL;
	if ((unsigned int)dtype >= KCOLL_DTYPE_MAX || (unsigned int)op >= KCOLL_REDOP_MAX)
		return -EINVAL;
	if (root < 0 || root >= c->nranks)
		return -EINVAL;
	if (count && (!recv || (!send && opcode != KCOLL_OP_BROADCAST)))
		return -EFAULT;
	if (count > (SIZE_MAX / 16) / (size_t)c->nranks)
		return -EOVERFLOW;
	if (send == recv)
		sqe.flags |= KCOLL_SQE_F_IN_PLACE;
	esz = kcoll_dtype_size(dtype);
	sbytes = rbytes = count * esz;
	if (opcode == KCOLL_OP_REDUCE_SCATTER)
		sbytes *= (size_t)c->nranks;
	else if (opcode == KCOLL_OP_ALLGATHER)
		rbytes *= (size_t)c->nranks;
	r = mem_kind(c->k, opcode == KCOLL_OP_BROADCAST && !send ? recv : send, sbytes,
		     &sqe.coll.send_mem);
	if (!r)
		r = mem_kind(c->k, recv, rbytes, &sqe.coll.recv_mem);
	if (r)
		return r;
	/* avg is left to kcolld: recursive doubling would average averages. */
	if (opcode == KCOLL_OP_ALLREDUCE && op != KCOLL_AVG && c->lanes && kc_lanes_fit(c->lanes, sbytes)) {
		/* Every rank takes this path for this op: its size decides. */
		if (sqe.coll.send_mem != KCOLL_MEM_HOST || sqe.coll.recv_mem != KCOLL_MEM_HOST) {
			kc_warn("a device buffer in an all-reduce of %zu bytes, which this communicator runs "
				"over lanes (host memory only; it was made before this process loaded CUDA): "
				"make communicators after loading CUDA, or set KCOLL_LANE_BYTES=0 on the "
				"daemon that issues the id", sbytes);
			return -EOPNOTSUPP;
		}
		return lane_submit(c, send, recv, count, dtype, op, req);
	}
	if (sqe.coll.send_mem == KCOLL_MEM_HOST && send && send != recv)
		thp_collapse(c->k, send, sbytes);
	if (sqe.coll.recv_mem == KCOLL_MEM_HOST)
		thp_collapse(c->k, recv, rbytes);
	sqe.coll.send_addr = (uintptr_t)send;
	sqe.coll.recv_addr = (uintptr_t)recv;
	sqe.coll.count = count;
	sqe.coll.comm_id = c->comm_id;
	sqe.coll.root = root;
	sqe.coll.dtype = dtype;
	sqe.coll.redop = op;
	/*
	 * An op across hosts takes tens of microseconds at best; polling for
	 * it would take the CPU from the daemons doing it (on a shared or
	 * oversubscribed machine that costs more than a futex wake-up). Unless
	 * KCOLL_SPIN_US is set, such waits sleep at once.
	 */
	return submit(c->k, &sqe, req, c->nhosts > 1 && !c->k->spin_set ? 0 : c->k->spin_ns);
}

int kcoll_allreduce(struct kcoll_comm *c, const void *send, void *recv, size_t count,
		    enum kcoll_dtype dtype, enum kcoll_redop op, struct kcoll_req **req)
{
	return coll_submit(c, KCOLL_OP_ALLREDUCE, send, recv, count, dtype, op, 0, req);
}

int kcoll_reduce_scatter(struct kcoll_comm *c, const void *send, void *recv, size_t recvcount,
			 enum kcoll_dtype dtype, enum kcoll_redop op, struct kcoll_req **req)
{
	return coll_submit(c, KCOLL_OP_REDUCE_SCATTER, send, recv, recvcount, dtype, op, 0, req);
}

int kcoll_allgather(struct kcoll_comm *c, const void *send, void *recv, size_t sendcount,
		    enum kcoll_dtype dtype, struct kcoll_req **req)
{
	return coll_submit(c, KCOLL_OP_ALLGATHER, send, recv, sendcount, dtype, 0, 0, req);
}

int kcoll_broadcast(struct kcoll_comm *c, void *buf, size_t count, enum kcoll_dtype dtype, int root,
		    struct kcoll_req **req)
{
	return coll_submit(c, KCOLL_OP_BROADCAST, buf, buf, count, dtype, 0, root, req);
}

int kcoll_barrier(struct kcoll_comm *c, struct kcoll_req **req)
{
	return coll_submit(c, KCOLL_OP_BARRIER, NULL, NULL, 0, KCOLL_U8, 0, 0, req);
}

int kcoll_mem_alloc(struct kcoll *k, size_t size, void **ptr)
{
	struct kcoll_msg_mem_reg req = { .hdr.type = KCOLL_MSG_MEM_REG };
	struct kcoll_msg_hdr rep;
	struct kcoll_region *rg;
	size_t len;
	void *p;
	int fd, r;

	if (!k || !ptr || !size)
		return -EINVAL;
	if (size > (1ULL << 40))
		return -EOVERFLOW;
	len = (size + 4095) & ~(size_t)4095;
	rg = calloc(1, sizeof(*rg));
	if (!rg)
		return -ENOMEM;
	fd = memfd_create("kcoll-buf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		r = -errno;
		goto err_free;
	}
	/* Sealed size: the daemon maps it too and must never see it shrink. */
	if (ftruncate(fd, len) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		r = -errno;
		goto err_close;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		goto err_close;
	}
	req.addr = (uintptr_t)p;
	req.size = len;
	r = ctl_call(k, &req, sizeof(req), fd, &rep, sizeof(rep), NULL, 5000);
	if (r)
		goto err_unmap;
	close(fd);
	rg->addr = p;
	rg->size = len;
	pthread_mutex_lock(&k->mem_lock);
	rg->next = k->regions;
	k->regions = rg;
	pthread_mutex_unlock(&k->mem_lock);
	*ptr = p;
	return 0;

err_unmap:
	munmap(p, len);
err_close:
	close(fd);
err_free:
	free(rg);
	return r;
}

static struct kcoll_region *region_take(struct kcoll *k, void *ptr, bool pinned)
{
	struct kcoll_region **pp, *rg = NULL;

	pthread_mutex_lock(&k->mem_lock);
	for (pp = &k->regions; *pp; pp = &(*pp)->next) {
		if ((*pp)->addr == ptr && (*pp)->pinned == pinned) {
			rg = *pp;
			*pp = rg->next;
			break;
		}
	}
	pthread_mutex_unlock(&k->mem_lock);
	return rg;
}

/* Make kcolld forget the region at ptr, then release our side of it. */
static int region_release(struct kcoll *k, void *ptr, bool pinned)
{
	struct kcoll_msg_mem_unreg req = { .hdr.type = KCOLL_MSG_MEM_UNREG };
	struct kcoll_msg_hdr rep;
	struct kcoll_region *rg;
	int r;

	if (!k || !ptr)
		return -EINVAL;
	rg = region_take(k, ptr, pinned);
	if (!rg)
		return -ENOENT;
	req.addr = (uintptr_t)ptr;
	r = ctl_call(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);
	/* kcolld dropped its table entry first; an operation still in flight
	 * keeps its own reference to the daemon's mapping, so releasing ours
	 * now cannot pull pages from under it. */
	if (rg->pinned)
		kcoll_kdev_unregister(&k->kdev, rg->kdev_handle);
	else
		munmap(rg->addr, rg->size);
	free(rg);
	return r == -ENOTCONN ? 0 : r;
}

int kcoll_mem_free(struct kcoll *k, void *ptr)
{
	return region_release(k, ptr, false);
}

int kcoll_mem_register(struct kcoll *k, void *ptr, size_t size)
{
	struct kcoll_msg_mem_reg_kdev req = { .hdr.type = KCOLL_MSG_MEM_REG_KDEV };
	struct kcoll_msg_hdr rep;
	struct kcoll_region *rg;
	uint64_t handle;
	int r;

	if (!k || !ptr || !size)
		return -EINVAL;
	pthread_mutex_lock(&k->mem_lock);
	if (!k->kdev_tried) {
		k->kdev_tried = true;
		if (kcoll_kdev_open(&k->kdev, NULL) == 0 &&
		    !kcoll_kdev_has(&k->kdev, KCOLL_FEAT_BUF | KCOLL_FEAT_GRANT))
			kcoll_kdev_close(&k->kdev);
	}
	pthread_mutex_unlock(&k->mem_lock);
	if (k->kdev.fd < 0)
		return -ENODEV;
	rg = calloc(1, sizeof(*rg));
	if (!rg)
		return -ENOMEM;
	r = kcoll_kdev_register(&k->kdev, ptr, size, 0, &handle);
	if (r)
		goto err_free;
	/* Only kcolld, by pid, may map these pages. */
	r = kcoll_kdev_grant(&k->kdev, handle, KCOLL_GRANT_PID, k->daemon_pid, 0);
	if (r)
		goto err_unregister;
	req.addr = (uintptr_t)ptr;
	req.size = size;
	req.handle = handle;
	r = ctl_call(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);
	if (r)
		goto err_unregister;
	rg->addr = ptr;
	rg->size = size;
	rg->kdev_handle = handle;
	rg->pinned = true;
	pthread_mutex_lock(&k->mem_lock);
	rg->next = k->regions;
	k->regions = rg;
	pthread_mutex_unlock(&k->mem_lock);
	return 0;

err_unregister:
	kcoll_kdev_unregister(&k->kdev, handle);
err_free:
	free(rg);
	return r;
}

int kcoll_mem_deregister(struct kcoll *k, void *ptr)
{
	struct kcoll_devreg **pp, *d = NULL;

	if (!k || !ptr)
		return -EINVAL;
	/* A registered GPU allocation (by its base): kcolld closes its mapping. */
	pthread_mutex_lock(&k->dev_lock);
	for (pp = &k->devregs; *pp; pp = &(*pp)->next) {
		if ((*pp)->base == (uintptr_t)ptr) {
			d = *pp;
			*pp = d->next;
			break;
		}
	}
	if (d) {
		free(d);
		pthread_mutex_unlock(&k->dev_lock);
		return dev_unreg(k, (uintptr_t)ptr);
	}
	pthread_mutex_unlock(&k->dev_lock);
	return region_release(k, ptr, true);
}

/* For the other files of the library (lib.h). */
int kcoll_priv_ctl(struct kcoll *k, void *msg, size_t len, int fd, void *reply, size_t cap,
		   int *reply_fd, int timeout_ms)
{
	return ctl_call(k, msg, len, fd, reply, cap, reply_fd, timeout_ms);
}

int kcoll_priv_submit(struct kcoll *k, struct kcoll_sqe *sqe, struct kcoll_req **req)
{
	return submit(k, sqe, req, k->spin_ns);
}

int kcoll_priv_alive(struct kcoll *k)
{
	return !k->dead && daemon_alive(k);
}
