// SPDX-License-Identifier: MIT
/*
 * libkcoll: the connection to kcolld. The handshake (hello, ring mapping,
 * request table), control round trips on the socket, whether the daemon
 * still lives, and the calls that only talk to it (version, unique id).
 * Locking: lib.h.
 */
#include <errno.h>
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

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>
#include <kcoll/ring.h>

#include "config.h"
#include "kdev.h"
#include "lib.h"

int64_t kc_now_ns(void)
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
int kcoll_priv_ctl(struct kcoll *k, void *msg, size_t len, int fd, void *reply, size_t cap,
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
	r = kcoll_priv_ctl(k, &hello, sizeof(hello), -1, &rep, sizeof(rep), &fd, 5000);
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

void kcoll_disconnect(struct kcoll *k)
{
	struct kcoll_region *rg, *next;

	if (!k)
		return;
	close(k->sock);
	munmap(k->ring, k->ring_size);
	for (rg = k->regions; rg; rg = next) {
		next = rg->next;
		if (rg->kind == KC_REGION_PINNED)
			kcoll_kdev_unregister(&k->kdev, rg->kdev_handle);
		else if (rg->kind == KC_REGION_ALLOC)
			munmap(rg->addr, rg->size);
		else	/* the caller's memory: it stays where it is */
			kc_share_drop(rg->addr);
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

/* Is the daemon still there? Checked only when a wait is slow. */
int kc_daemon_alive(struct kcoll *k)
{
	struct pollfd p = { .fd = k->sock, .events = POLLIN };

	if (kcoll_load_relaxed(&k->ring->status) & KCOLL_RING_DEAD)
		return 0;
	return !(poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)));
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
	r = kcoll_priv_ctl(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);
	if (r)
		return r;
	memset(id, 0, sizeof(*id));
	memcpy(id->bytes, &rep.id, sizeof(rep.id));
	return 0;
}

int kcoll_priv_alive(struct kcoll *k)
{
	return !k->dead && kc_daemon_alive(k);
}
