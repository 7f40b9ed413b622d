// SPDX-License-Identifier: MIT
/*
 * A client: its ring, the thread that consumes its SQ, CQ posting, regions.
 * The ring server sits below the rooms that give SQEs meaning: it hands
 * them, and a client's end, to the tables those rooms registered
 * (struct kd_client_ops, kcolld.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kcoll/futex.h>

#include "kcoll_gpu.h"
#include "kcolld.h"
#include "log.h"

#define CLIENT_OPS_MAX 4

static const struct kd_client_ops *client_ops[CLIENT_OPS_MAX];
static int nclient_ops;

int kd_client_register(const struct kd_client_ops *ops)
{
	if (nclient_ops == CLIENT_OPS_MAX)
		return -ENOSPC;
	client_ops[nclient_ops++] = ops;
	return 0;
}

struct kd_client *kd_client_new(int sock)
{
	struct kd_client *c = calloc(1, sizeof(*c));
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (!c)
		return NULL;
	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len)) {
		free(c);
		return NULL;
	}
	c->sock = sock;
	c->pid = cred.pid;
	c->uid = cred.uid;
	c->id = ++kd.next_client_id;
	atomic_init(&c->refs, 1);
	pthread_mutex_init(&c->cq_lock, NULL);
	pthread_mutex_init(&c->lock, NULL);
	return c;
}

void kd_client_get(struct kd_client *c)
{
	atomic_fetch_add(&c->refs, 1);
}

void kd_client_put(struct kd_client *c)
{
	struct kd_region *rg, *next;

	if (atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	for (rg = c->regions; rg; rg = next) {
		next = rg->next;
		kd_region_put(rg);
	}
	if (c->ring)
		munmap(c->ring, c->ring_size);
	/* Closed only now: kd_client_kill may still shutdown() it from a
	 * worker, and the number must not be reused by a new client before. */
	close(c->sock);
	pthread_mutex_destroy(&c->cq_lock);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int kd_client_ring_create(struct kd_client *c, uint32_t sq_entries, int *out_fd)
{
	struct kcoll_ring_hdr *h;
	uint32_t cq_entries;
	size_t size;
	int fd, r;

	if (sq_entries < 2)
		sq_entries = 2;
	if (sq_entries > KCOLL_RING_MAX_ENTRIES)
		sq_entries = KCOLL_RING_MAX_ENTRIES;
	while (!kcoll_is_pow2(sq_entries))
		sq_entries &= sq_entries - 1;	/* round down to a power of two */
	cq_entries = 2 * sq_entries;
	size = kcoll_ring_size(sq_entries, cq_entries);

	fd = memfd_create("kcoll-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, size) || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		r = -errno;
		goto err_close;
	}
	h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (h == MAP_FAILED) {
		r = -errno;
		goto err_close;
	}
	kcoll_ring_hdr_init(h, sq_entries, cq_entries, getpid());
	c->ring = h;
	c->ring_size = size;
	kcoll_queue_init(&c->sq, &h->sq_head, &h->sq_tail, (uint8_t *)h + h->sq_off, sq_entries,
			 sizeof(struct kcoll_sqe));
	kcoll_queue_init(&c->cq, &h->cq_tail, &h->cq_head, (uint8_t *)h + h->cq_off, cq_entries,
			 sizeof(struct kcoll_cqe));
	*out_fd = fd;
	return 0;

err_close:
	close(fd);
	return r;
}

void kd_client_kill(struct kd_client *c, const char *why)
{
	if (atomic_exchange(&c->dead, true))
		return;
	kc_warn("client %u (pid %d): disconnecting: %s", c->id, c->pid, why);
	atomic_fetch_add(&kd.stats.rings_killed, 1);
	if (c->ring)
		kcoll_store_release(&c->ring->status, KCOLL_RING_DEAD);
	/* The control thread sees the hangup and reaps the client. */
	shutdown(c->sock, SHUT_RDWR);
}

void kd_client_post(struct kd_client *c, uint64_t user_data, int res, uint64_t aux,
		    uint32_t err_rank, uint32_t flags)
{
	struct kcoll_cqe *cqe;
	int64_t space;

	atomic_fetch_add(&c->ops, 1);
	if (res)
		atomic_fetch_add(&c->errors, 1);
	pthread_mutex_lock(&c->cq_lock);
	atomic_fetch_sub(&c->inflight, 1);
	if (atomic_load(&c->dead)) {
		pthread_mutex_unlock(&c->cq_lock);
		return;
	}
	space = kcoll_queue_space(&c->cq);
	if (space <= 0) {
		/* Admission keeps the CQ from filling; only a forged cq_head gets here. */
		pthread_mutex_unlock(&c->cq_lock);
		kd_client_kill(c, "completion queue head is corrupt");
		return;
	}
	cqe = kcoll_queue_slot(&c->cq, 0);
	cqe->user_data = user_data;
	cqe->res = res;
	cqe->flags = flags;
	cqe->aux = aux;
	cqe->err_rank = err_rank;
	cqe->reserved = 0;
	kcoll_queue_publish(&c->cq, 1);
	pthread_mutex_unlock(&c->cq_lock);
	kcoll_smp_mb();	/* cq_tail store before the NEED_WAKEUP load (barrier.h) */
	if (kcoll_load_relaxed(&c->ring->cq_flags) & KCOLL_CQ_NEED_WAKEUP)
		kcoll_futex_wake(&c->ring->cq_tail, INT_MAX);
}

/* Why a device-memory SQE is refused: no GPU in kcolld (the loader says why). */
static const char *dev_mem_why(void)
{
	static __thread char buf[KCOLL_GPU_TEXT + 128];

	if (kd_gpu_ready(buf, sizeof(buf)) == 0)
		snprintf(buf, sizeof(buf), "device buffers: refused");
	return buf;
}

/* One SQE, already copied out of shared memory. */
static void dispatch(struct kd_client *c, const struct kcoll_sqe *sqe)
{
	const char *why = "";
	int r = kd_sqe_check(sqe, &why);

	if (r == -EOPNOTSUPP && sqe->opcode >= KCOLL_OP_ALLREDUCE &&
	    sqe->opcode <= KCOLL_OP_BARRIER &&
	    (sqe->coll.send_mem != KCOLL_MEM_HOST || sqe->coll.recv_mem != KCOLL_MEM_HOST))
		why = dev_mem_why();

	if (r == 0 && sqe->opcode == KCOLL_OP_NOP) {
		kd_client_post(c, sqe->user_data, 0, 0, KCOLL_RANK_NONE, 0);
		return;
	}
	for (int i = 0; i < nclient_ops; i++) {
		const struct kd_client_ops *o = client_ops[i];

		if (o->submit && sqe->opcode >= o->op_first && sqe->opcode <= o->op_last) {
			/* Even when malformed: collectives go to their communicator
			 * so that the other ranks learn of the error. */
			o->submit(c, sqe, r, why);
			return;
		}
	}
	kc_dbg("client %u: sqe refused: %s", c->id, why);
	kd_client_post(c, sqe->user_data, r, 0, KCOLL_RANK_NONE, 0);
}

/*
 * The ring thread: consume the SQ while there is work, spin briefly when it
 * runs dry, then sleep on the sq_tail futex with NEED_WAKEUP set.
 */
static void *ring_thread(void *arg)
{
	struct kd_client *c = arg;
	struct kcoll_ring_hdr *h = c->ring;
	int64_t idle_since = 0;

	while (!atomic_load(&c->stop) && !atomic_load(&c->dead)) {
		int64_t ready = kcoll_queue_ready(&c->sq);
		int64_t space;
		uint32_t n = 0;

		if (ready < 0) {
			kd_client_kill(c, "submission queue tail is corrupt");
			break;
		}
		if (ready == 0) {
			uint32_t tail;
			int64_t now = kd_now_ns();

			if (!idle_since)
				idle_since = now;
			if (now - idle_since < kd.spin_ns) {
				kcoll_spin_yield();
				continue;
			}
			tail = c->sq.local;
			kcoll_store_relaxed(&h->sq_flags, KCOLL_SQ_NEED_WAKEUP);
			kcoll_smp_mb();	/* flag store before the tail re-check (barrier.h) */
			if (kcoll_load_acquire(&h->sq_tail) == tail && !atomic_load(&c->stop))
				kcoll_futex_wait(&h->sq_tail, tail, 1000000000LL);
			kcoll_store_relaxed(&h->sq_flags, 0);
			idle_since = 0;
			continue;
		}
		idle_since = 0;
		space = kcoll_queue_space(&c->cq);
		if (space < 0) {
			kd_client_kill(c, "completion queue head is corrupt");
			break;
		}
		/* Admit only what the CQ can take: each admitted op posts one CQE. */
		while (n < ready && atomic_load(&c->inflight) < (uint64_t)space) {
			struct kcoll_sqe sqe;

			kcoll_queue_copy(&c->sq, n, &sqe);
			n++;
			c->sq_behind = (uint32_t)(ready - n);
			atomic_fetch_add(&c->inflight, 1);
			dispatch(c, &sqe);
			if (atomic_load(&c->dead))
				break;
		}
		if (n)
			kcoll_queue_release(&c->sq, n);
		else
			usleep(100);	/* the client is not reaping its CQ */
	}
	for (int i = 0; i < nclient_ops; i++)
		if (client_ops[i]->thread_done)
			client_ops[i]->thread_done();
	return NULL;
}

int kd_client_start(struct kd_client *c)
{
	sigset_t all, old;
	int r;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = -pthread_create(&c->ring_thread, NULL, ring_thread, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!r)
		c->thread_started = true;
	return r;
}

void kd_client_close(struct kd_client *c)
{
	atomic_store(&c->dead, true);
	atomic_store(&c->stop, true);
	/* Leave the comms first (comm.c's closing): that aborts an op the
	 * ring thread may be running inline across hosts (it returns at once),
	 * so the join below does not wait for the op's timeout. */
	for (int i = 0; i < nclient_ops; i++)
		if (client_ops[i]->closing)
			client_ops[i]->closing(c);
	if (c->thread_started) {
		kcoll_futex_wake(&c->ring->sq_tail, INT_MAX);
		pthread_join(c->ring_thread, NULL);
	}
	for (int i = 0; i < nclient_ops; i++)
		if (client_ops[i]->closed)
			client_ops[i]->closed(c);
	kd_client_put(c);
}
