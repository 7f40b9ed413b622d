// SPDX-License-Identifier: MIT
/*
 * KV-cache transfer engine (docs/kv.md): segments, batches on the same host,
 * and (below) across hosts over KD_CONN_KV streams between kcollds.
 *
 * A segment is a client buffer registered by SEG_REG: it gets a daemon-wide
 * id, a random token and optional notify counters (a sealed memfd the owner
 * maps read-only and futex-waits on). SEG_IMPORT turns a descriptor into an
 * import handle after checking the daemon instance, the id, the token and
 * the importer's uid. An XFER SQE names one of the submitter's own segments
 * and one import handle; the ring thread validates the whole batch (every
 * range, the limit, overlaps) before it moves a byte, then copies it in
 * rounds of at most KV_ROUND_BYTES / KV_ROUND_IOVS pieces:
 *
 *   both sides mapped (kcoll_mem_alloc / kcoll_mem_register)  memcpy
 *   one side mapped                       process_vm_readv/writev straight
 *                                          between the mapping and the process
 *   neither                               readv into a per-thread stage, writev
 *
 * Each round holds both segments' rwlocks as a reader; unregistering takes
 * the writer side after marking the segment dead, so once SEG_UNREG (or the
 * owner's death) returns no transfer touches that memory again, and the
 * initiator's request fails with -EIDRM. The notify counter is bumped only
 * after the last round of a batch succeeded.
 *
 * Lock order: kv.lock (table) is never held while taking a segment rwlock;
 * client->lock guards client->kv (the import table).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <kcoll/futex.h>

#include "kcolld.h"
#include "iov.h"
#include "log.h"
#include "config.h"
#include "metrics.h"
#include "net.h"
#include "kv_rdma.h"
#include "kv_wire.h"
#include "kv_notif.h"

#define KV_ROUND_BYTES		(1u << 20)
#define KV_ROUND_IOVS		512
#define KV_MAX_IMPORTS		1024	/* per client */
#define KV_MAX_SEGS		65536	/* per daemon */

struct kd_seg {
	uint32_t id;
	uint8_t token[KCOLL_SEG_TOKEN_BYTES];
	struct kd_client *owner;	/* valid while !dead (its close unregisters first) */
	pid_t pid;
	uid_t uid;
	bool granted;
	uid_t grant_uid;
	uint64_t addr, size;
	uint32_t nr_notify;
	uint32_t *counters;		/* shared with the owner; then the notif word */
	size_t counters_len;
	struct kv_notifq notifs;	/* ours: messages for the owner (kv_notif.h) */
	pthread_rwlock_t lock;		/* readers: a copy round; writer: unregister */
	atomic_bool dead;
	atomic_int refs;
	struct kv_remote *rm;		/* imported from another kcolld (NULL: ours) */
	pthread_mutex_t conns_lock;
	struct kv_conn *conns;		/* peers' connections serving this segment */
	struct kd_seg *next;
};

struct kv_remote;

/* A peer kcolld's connection to one of our segments (served by kv_serve). */
struct kv_conn {
	int fd;
	int how;		/* what seg_kill shuts down: SHUT_RD (serving), SHUT_RDWR (sending) */
	struct kd_seg *seg;	/* held by the serving thread; the batch holds it for streams */
	struct kv_conn *next;	/* seg->conns */
};

/* One block of a batch: source and destination offsets in their segments. */
struct kv_piece {
	uint64_t src, dst, len;
};

struct kv_side;

struct kd_kv_client {
	struct kd_seg *imports[KV_MAX_IMPORTS];	/* index = handle - 1, held */
	uint64_t sender[KV_MAX_IMPORTS];	/* names the import to its owner's notifs */
};

static struct {
	pthread_mutex_t lock;
	struct kd_seg *segs;
	uint32_t nsegs;
	uint32_t next_id;
	atomic_ulong xfers_ok, xfers_failed, bytes;
	atomic_ulong rdma_bytes, rdma_sessions;	/* initiator: bytes; owner: sessions */
	atomic_uint next_sender;
	atomic_ulong notifs;			/* notifications queued for our owners */
} kv = { .lock = PTHREAD_MUTEX_INITIALIZER, .next_id = 1 };

static __thread uint8_t *kv_stage;

static void remote_free(struct kv_remote *rm);
static int remote_import(const struct kcoll_seg_wire *w, struct kd_seg **out);
static int run_remote(struct kd_client *c, uint64_t user_data, const struct kv_piece *p, uint32_t n,
		      bool write, struct kv_side *local, struct kd_seg *rs, uint32_t notify_id,
		      const struct kv_msgout *msg, int64_t t0, uint64_t *moved);

static void seg_put(struct kd_seg *s)
{
	if (atomic_fetch_sub(&s->refs, 1) != 1)
		return;
	if (s->rm)
		remote_free(s->rm);
	if (s->counters) {
		kv_notifq_destroy(&s->notifs);
		munmap(s->counters, s->counters_len);
	}
	pthread_rwlock_destroy(&s->lock);
	pthread_mutex_destroy(&s->conns_lock);
	free(s);
}

/* Mark dead and wait for the round in progress, if any: afterwards no
 * transfer touches the segment's memory. A peer's frame may be arriving
 * straight into the segment under the reader lock: shutting its connection
 * down ends that receive at once, however slow the peer. */
static void seg_kill(struct kd_seg *s)
{
	atomic_store(&s->dead, true);
	pthread_mutex_lock(&s->conns_lock);
	for (struct kv_conn *cn = s->conns; cn; cn = cn->next)
		shutdown(cn->fd, cn->how);
	pthread_mutex_unlock(&s->conns_lock);
	pthread_rwlock_wrlock(&s->lock);
	pthread_rwlock_unlock(&s->lock);
}

/* seg_kill shuts cn down while it is in s's conns. */
static void conn_link(struct kd_seg *s, struct kv_conn *cn)
{
	pthread_mutex_lock(&s->conns_lock);
	cn->next = s->conns;
	s->conns = cn;
	pthread_mutex_unlock(&s->conns_lock);
}

static void conn_unlink(struct kd_seg *s, struct kv_conn *cn)
{
	pthread_mutex_lock(&s->conns_lock);
	for (struct kv_conn **pp = &s->conns; *pp; pp = &(*pp)->next) {
		if (*pp == cn) {
			*pp = cn->next;
			break;
		}
	}
	pthread_mutex_unlock(&s->conns_lock);
}

static int seg_counters_create(struct kd_seg *s, int *fd_out)
{
	size_t len = kcoll_seg_counters_len(s->nr_notify);
	int fd = memfd_create("kcoll-notify", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *p;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, len) || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
		goto err_close;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto err_close;
	s->counters = p;
	s->counters_len = len;
	kv_notifq_init(&s->notifs, (uint32_t *)((uint8_t *)p + kcoll_seg_notif_word_off(s->nr_notify)));
	*fd_out = fd;
	return 0;

err_close:
	close(fd);
	return -errno;
}

static void fill_wire(const struct kd_seg *s, struct kcoll_seg_wire *w)
{
	struct kd_p_hostinfo me;

	kd_net_self(&me);
	memset(w, 0, sizeof(*w));
	w->magic = KCOLL_SEG_MAGIC;
	w->version = KCOLL_PROTO_VERSION;
	w->nonce = me.nonce;
	w->size = s->size;
	w->seg_id = s->id;
	w->nr_notify = s->nr_notify;
	w->port = me.port;
	w->naddrs = me.naddrs;
	w->daemon_pid = getpid();
	memcpy(w->addrs, me.addrs, sizeof(w->addrs));
	memcpy(w->token, s->token, sizeof(w->token));
	snprintf(w->host, sizeof(w->host), "%.*s", (int)sizeof(w->host) - 1, me.name);
}

static int seg_register(struct kd_client *c, const struct kcoll_msg_seg_reg *m,
			struct kcoll_msg_seg_reg_reply *rep, int *fd, const char **why)
{
	struct kd_seg *s;
	int r;

	if (m->flags & ~KCOLL_MSG_SEG_F_GRANT_UID || m->reserved) {
		*why = "unknown flags or non-zero reserved field";
		return -EINVAL;
	}
	if (!m->addr || !m->size || m->size > KD_MAX_BYTES || m->addr + m->size < m->addr) {
		*why = "empty, NULL, too large or wrapping buffer";
		return -EINVAL;
	}
	if (m->nr_notify > KCOLL_SEG_MAX_NOTIFY) {
		*why = "more notify counters than KCOLL_SEG_MAX_NOTIFY";
		return -E2BIG;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	if (getrandom(s->token, sizeof(s->token), 0) != sizeof(s->token)) {
		r = -EIO;
		goto err_free;
	}
	s->owner = c;
	s->pid = c->pid;
	s->uid = c->uid;
	s->granted = m->flags & KCOLL_MSG_SEG_F_GRANT_UID;
	s->grant_uid = m->grant_uid;
	s->addr = m->addr;
	s->size = m->size;
	s->nr_notify = m->nr_notify;
	pthread_rwlock_init(&s->lock, NULL);
	pthread_mutex_init(&s->conns_lock, NULL);
	atomic_init(&s->refs, 1);
	/* Always: the memfd carries the notification word too. */
	r = seg_counters_create(s, fd);
	if (r) {
		*why = "cannot create the notify counters";
		goto err_lock;
	}
	pthread_mutex_lock(&kv.lock);
	if (kv.nsegs >= KV_MAX_SEGS || kv.next_id == UINT32_MAX) {
		pthread_mutex_unlock(&kv.lock);
		*why = "too many segments in this kcolld";
		r = -ENOSPC;
		goto err_counters;
	}
	s->id = kv.next_id++;
	s->next = kv.segs;
	kv.segs = s;
	kv.nsegs++;
	pthread_mutex_unlock(&kv.lock);
	fill_wire(s, &rep->desc);
	return 0;

err_counters:
	if (*fd >= 0) {
		close(*fd);
		*fd = -1;
	}
	kv_notifq_destroy(&s->notifs);
	munmap(s->counters, s->counters_len);
err_lock:
	pthread_rwlock_destroy(&s->lock);
	pthread_mutex_destroy(&s->conns_lock);
err_free:
	free(s);
	return r;
}

/* Unlink segment id (owned by c when c is non-NULL) from the table. */
static struct kd_seg *seg_unlink(struct kd_client *c, uint32_t id)
{
	struct kd_seg **pp, *s = NULL;

	pthread_mutex_lock(&kv.lock);
	for (pp = &kv.segs; *pp; pp = &(*pp)->next) {
		if ((*pp)->id == id && (!c || (*pp)->owner == c)) {
			s = *pp;
			*pp = s->next;
			kv.nsegs--;
			break;
		}
	}
	pthread_mutex_unlock(&kv.lock);
	return s;
}

static int seg_unregister(struct kd_client *c, uint32_t id)
{
	struct kd_seg *s = seg_unlink(c, id);

	if (!s)
		return -ENOENT;
	seg_kill(s);
	seg_put(s);
	return 0;
}

/* A live segment by id, referenced. */
static struct kd_seg *seg_find(uint32_t id)
{
	struct kd_seg *s;

	pthread_mutex_lock(&kv.lock);
	for (s = kv.segs; s; s = s->next)
		if (s->id == id)
			break;
	if (s)
		atomic_fetch_add(&s->refs, 1);
	pthread_mutex_unlock(&kv.lock);
	return s;
}

static int token_eq(const uint8_t *a, const uint8_t *b)
{
	uint8_t d = 0;

	for (size_t i = 0; i < KCOLL_SEG_TOKEN_BYTES; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

static int seg_import(struct kd_client *c, const struct kcoll_seg_wire *w,
		      struct kcoll_msg_seg_import_reply *rep, const char **why)
{
	struct kd_p_hostinfo me;
	struct kd_seg *s;
	uint32_t next;
	int r;

	kd_net_self(&me);
	if (w->magic != KCOLL_SEG_MAGIC || w->version != KCOLL_PROTO_VERSION) {
		*why = "not a kcoll segment descriptor (or one from another kcoll version)";
		return -EINVAL;
	}
	if (w->nonce != me.nonce && w->port == me.port && w->addrs[0] == me.addrs[0]) {
		*why = "the descriptor is from this kcolld before a restart: re-export it";
		return -ESTALE;
	}
	if (w->nonce != me.nonce) {
		/* Another kcolld's: its token is checked there, on the first
		 * transfer (connecting now would stall this control thread). */
		r = remote_import(w, &s);
		if (r) {
			*why = r == -EREMOTE ? "the descriptor names no reachable address "
					       "(another kcolld without a listener)" : "out of memory";
			return r;
		}
		goto add;
	}
	pthread_mutex_lock(&kv.lock);
	next = kv.next_id;
	pthread_mutex_unlock(&kv.lock);
	s = seg_find(w->seg_id);
	if (!s) {
		*why = w->seg_id && w->seg_id < next ?
			"the segment was unregistered (the descriptor expired)" : "no such segment";
		return w->seg_id && w->seg_id < next ? -EIDRM : -ENOENT;
	}
	if (!token_eq(s->token, w->token)) {
		*why = "wrong access token for this segment";
		r = -EACCES;
		goto err_put;
	}
	if (c->uid != s->uid && !(s->granted && c->uid == s->grant_uid)) {
		*why = "the segment belongs to another user and was not granted to this uid";
		r = -EPERM;
		goto err_put;
	}
add:
	r = -ENOSPC;
	pthread_mutex_lock(&c->lock);
	if (!c->kv)
		c->kv = calloc(1, sizeof(*c->kv));
	for (uint32_t i = 0; c->kv && i < KV_MAX_IMPORTS; i++) {
		if (!c->kv->imports[i]) {
			c->kv->imports[i] = s;
			c->kv->sender[i] = (uint64_t)(uint32_t)me.nonce << 32 |
					   (atomic_fetch_add(&kv.next_sender, 1) + 1);
			rep->handle = i + 1;
			r = 0;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (r) {
		*why = "too many imported segments in this client";
		goto err_put;
	}
	rep->size = s->size;
	rep->nr_notify = s->nr_notify;
	return 0;

err_put:
	seg_put(s);
	return r;
}

static int seg_close(struct kd_client *c, uint32_t handle)
{
	struct kd_seg *s = NULL;

	pthread_mutex_lock(&c->lock);
	if (c->kv && handle >= 1 && handle <= KV_MAX_IMPORTS) {
		s = c->kv->imports[handle - 1];
		c->kv->imports[handle - 1] = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	if (!s)
		return -ENOENT;
	seg_put(s);
	return 0;
}

/* The owner takes up to m->max of its segment's notifications. */
static int seg_notifs(struct kd_client *c, const struct kcoll_msg_seg_notifs *m,
		      struct kcoll_msg_seg_notifs_reply *rep, size_t *reply_len, const char **why)
{
	struct kd_seg *s = seg_find(m->id);

	if (!s || s->owner != c) {
		*why = "not a segment this client registered";
		if (s)
			seg_put(s);
		return -ENOENT;
	}
	if (!m->max || m->max > KCOLL_SEG_NOTIFS_PER_MSG) {
		seg_put(s);
		*why = "max must be 1..KCOLL_SEG_NOTIFS_PER_MSG";
		return -EINVAL;
	}
	rep->nr = kv_notifq_take(&s->notifs, rep->rec, m->max, &rep->left);
	*reply_len += (size_t)rep->nr * sizeof(rep->rec[0]);
	seg_put(s);
	return 0;
}

/*
 * Deliver notification msg (and bump counter notify_id unless NONE) to our
 * segment s, under its reader lock: -EIDRM dead, -EINVAL no such counter,
 * -ENOBUFS its queue is full (then the counter is not bumped either).
 */
static int notif_deliver(struct kd_seg *s, uint64_t sender, uint32_t notify_id,
			 const uint8_t *data, uint32_t len)
{
	int r = 0;

	if (atomic_load(&s->dead))
		return -EIDRM;
	if (notify_id != KCOLL_NOTIFY_NONE && notify_id >= s->nr_notify)
		return -EINVAL;
	if (len) {
		r = kv_notifq_post(&s->notifs, sender, notify_id, data, len);
		if (r)
			return r;
		atomic_fetch_add(&kv.notifs, 1);
	}
	if (notify_id != KCOLL_NOTIFY_NONE) {
		__atomic_fetch_add(&s->counters[notify_id], 1, __ATOMIC_SEQ_CST);
		kcoll_futex_wake(&s->counters[notify_id], INT_MAX);
	}
	return 0;
}

int kd_kv_message(struct kd_client *c, const struct kcoll_msg_hdr *h, size_t len, void *reply,
		  size_t *reply_len, int *reply_fd)
{
	const char *why = NULL;
	int r;

	*reply_fd = -1;
	switch (h->type) {
	case KCOLL_MSG_SEG_REG: {
		struct kcoll_msg_seg_reg_reply *rep = reply;

		memset(rep, 0, sizeof(*rep));
		*reply_len = sizeof(*rep);
		r = len < sizeof(struct kcoll_msg_seg_reg) ? -EINVAL :
		    seg_register(c, (const void *)h, rep, reply_fd, &why);
		if (why)
			snprintf(rep->error, sizeof(rep->error), "%.*s", (int)sizeof(rep->error) - 1, why);
		break;
	}
	case KCOLL_MSG_SEG_IMPORT: {
		struct kcoll_msg_seg_import_reply *rep = reply;

		memset(rep, 0, sizeof(*rep));
		*reply_len = sizeof(*rep);
		r = len < sizeof(struct kcoll_msg_seg_import) ? -EINVAL :
		    seg_import(c, &((const struct kcoll_msg_seg_import *)h)->desc, rep, &why);
		if (why)
			snprintf(rep->error, sizeof(rep->error), "%.*s", (int)sizeof(rep->error) - 1, why);
		break;
	}
	case KCOLL_MSG_SEG_NOTIFS: {
		const struct kcoll_msg_seg_notifs *m = (const void *)h;
		struct kcoll_msg_seg_notifs_reply *rep = reply;

		memset(rep, 0, offsetof(struct kcoll_msg_seg_notifs_reply, rec));
		*reply_len = offsetof(struct kcoll_msg_seg_notifs_reply, rec);
		r = len < sizeof(*m) ? -EINVAL : seg_notifs(c, m, rep, reply_len, &why);
		break;
	}
	case KCOLL_MSG_SEG_UNREG:
	case KCOLL_MSG_SEG_CLOSE: {
		const struct kcoll_msg_seg_id *m = (const void *)h;

		memset(reply, 0, sizeof(struct kcoll_msg_hdr));
		*reply_len = sizeof(struct kcoll_msg_hdr);
		if (len < sizeof(*m))
			r = -EINVAL;
		else if (h->type == KCOLL_MSG_SEG_UNREG)
			r = seg_unregister(c, m->id);
		else
			r = seg_close(c, m->id);
		break;
	}
	default:
		return -EOPNOTSUPP;
	}
	if (r && why)
		kc_dbg("client %u (pid %d): segment request refused: %s", c->id, c->pid, why);
	return r;
}

void kd_kv_client_gone(struct kd_client *c)
{
	struct kd_seg **pp, *s, *dead = NULL;

	/* Its segments first: transfers into them stop before it is freed. */
	pthread_mutex_lock(&kv.lock);
	for (pp = &kv.segs; *pp;) {
		s = *pp;
		if (s->owner == c) {
			*pp = s->next;
			kv.nsegs--;
			s->next = dead;
			dead = s;
		} else {
			pp = &s->next;
		}
	}
	pthread_mutex_unlock(&kv.lock);
	while (dead) {
		s = dead;
		dead = s->next;
		seg_kill(s);
		seg_put(s);
	}
	if (!c->kv)
		return;
	for (uint32_t i = 0; i < KV_MAX_IMPORTS; i++)
		if (c->kv->imports[i])
			seg_put(c->kv->imports[i]);
	free(c->kv);
	c->kv = NULL;
}

void kd_kv_thread_done(void)
{
	free(kv_stage);
	kv_stage = NULL;
}

/* ---------------------------------------------------------------------------
 * One batch
 */

struct kv_side {
	struct kd_seg *seg;
	struct kd_buf buf;	/* whole segment: direct when mapped */
};

static int cmp_range(const void *a, const void *b)
{
	const struct kv_piece *x = a, *y = b;

	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

/* Does [off, off+len) overlap a destination range of the sorted array? */
static bool hits_dst(const struct kv_piece *sorted, uint32_t n, uint64_t off, uint64_t len)
{
	uint32_t lo = 0, hi = n;

	while (lo < hi) {	/* first range ending after off */
		uint32_t mid = lo + (hi - lo) / 2;

		if (sorted[mid].dst + sorted[mid].len <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && sorted[lo].dst < off + len;
}

static int check_batch(const struct kv_piece *p, uint32_t n, const struct kv_side *src,
		       const struct kv_side *dst, const char **why)
{
	struct kv_piece *sorted;
	uint64_t total = 0;
	int r = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (!p[i].len) {
			*why = "zero-length entry";
			return -EINVAL;
		}
		if (p[i].src > src->seg->size || p[i].len > src->seg->size - p[i].src ||
		    p[i].dst > dst->seg->size || p[i].len > dst->seg->size - p[i].dst) {
			*why = "entry beyond the end of a segment";
			return -ERANGE;
		}
		total += p[i].len;	/* <= 4096 x KD_MAX_BYTES: no wrap */
	}
	/* Sources may overlap, so a batch could name petabytes; the remote
	 * path cuts it into frames in memory first. */
	if (total > KD_MAX_BYTES) {
		*why = "the batch moves more bytes than a segment can hold (KD_MAX_BYTES): split it";
		return -E2BIG;
	}
	if (n < 2 && src->seg != dst->seg)
		return 0;
	sorted = malloc((size_t)n * sizeof(*sorted));
	if (!sorted)
		return -ENOMEM;
	memcpy(sorted, p, (size_t)n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_range);
	for (uint32_t i = 1; i < n; i++) {
		if (sorted[i - 1].dst + sorted[i - 1].len > sorted[i].dst) {
			*why = "entries overlap at the destination";
			r = -EINVAL;
			goto out;
		}
	}
	/* Within one segment a source must not be another entry's destination:
	 * the result would depend on the copy order. */
	if (src->seg == dst->seg) {
		for (uint32_t i = 0; i < n; i++) {
			if (hits_dst(sorted, n, p[i].src, p[i].len)) {
				*why = "a source range overlaps a destination range in the same segment";
				r = -EINVAL;
				goto out;
			}
		}
	}
out:
	free(sorted);
	return r;
}

static int vm_err(ssize_t got, size_t want)
{
	if (got == (ssize_t)want)
		return 0;
	if (got < 0 && errno == ESRCH)
		return -ECONNRESET;	/* a process died */
	return got < 0 && errno == EPERM ? -EPERM : -EFAULT;
}

/* Copy pieces [0, n) (at most KV_ROUND_* of them) from src to dst. */
static int copy_round(const struct kv_piece *p, uint32_t n, const struct kv_side *src,
		      const struct kv_side *dst)
{
	struct iovec liov[KV_ROUND_IOVS], riov[KV_ROUND_IOVS];
	size_t total = 0;
	int r;

	if (src->buf.direct && dst->buf.direct) {
		for (uint32_t i = 0; i < n; i++)
			memmove(dst->buf.direct + p[i].dst, src->buf.direct + p[i].src, p[i].len);
		return 0;
	}
	for (uint32_t i = 0; i < n; i++)
		total += p[i].len;
	if (src->buf.direct) {	/* mapping -> process */
		for (uint32_t i = 0; i < n; i++) {
			liov[i] = (struct iovec){ src->buf.direct + p[i].src, p[i].len };
			riov[i] = (struct iovec){ (void *)(uintptr_t)(dst->seg->addr + p[i].dst), p[i].len };
		}
		return vm_err(process_vm_writev(dst->seg->pid, liov, n, riov, n, 0), total);
	}
	if (dst->buf.direct) {	/* process -> mapping */
		for (uint32_t i = 0; i < n; i++) {
			liov[i] = (struct iovec){ dst->buf.direct + p[i].dst, p[i].len };
			riov[i] = (struct iovec){ (void *)(uintptr_t)(src->seg->addr + p[i].src), p[i].len };
		}
		return vm_err(process_vm_readv(src->seg->pid, liov, n, riov, n, 0), total);
	}
	/* process -> stage -> process; the stage stays in cache between the two */
	if (!kv_stage && !(kv_stage = malloc(KV_ROUND_BYTES)))
		return -ENOMEM;
	liov[0] = (struct iovec){ kv_stage, total };
	for (uint32_t i = 0; i < n; i++)
		riov[i] = (struct iovec){ (void *)(uintptr_t)(src->seg->addr + p[i].src), p[i].len };
	r = vm_err(process_vm_readv(src->seg->pid, liov, 1, riov, n, 0), total);
	if (r)
		return r;
	for (uint32_t i = 0; i < n; i++)
		riov[i] = (struct iovec){ (void *)(uintptr_t)(dst->seg->addr + p[i].dst), p[i].len };
	return vm_err(process_vm_writev(dst->seg->pid, liov, 1, riov, n, 0), total);
}

static int lock_sides(struct kv_side *a, struct kv_side *b)
{
	pthread_rwlock_rdlock(&a->seg->lock);
	if (b->seg != a->seg)
		pthread_rwlock_rdlock(&b->seg->lock);
	if (atomic_load(&a->seg->dead) || atomic_load(&b->seg->dead)) {
		if (b->seg != a->seg)
			pthread_rwlock_unlock(&b->seg->lock);
		pthread_rwlock_unlock(&a->seg->lock);
		return -EIDRM;
	}
	return 0;
}

static void unlock_sides(struct kv_side *a, struct kv_side *b)
{
	if (b->seg != a->seg)
		pthread_rwlock_unlock(&b->seg->lock);
	pthread_rwlock_unlock(&a->seg->lock);
}

/* Resolve a segment's memory in its owner: mapped (zero copy) or by pid. */
static int side_resolve(struct kv_side *s)
{
	int r = lock_sides(s, s);

	if (r)
		return r;
	kd_buf_resolve(s->seg->owner, s->seg->addr, s->seg->size, &s->buf);
	unlock_sides(s, s);
	return 0;
}

static int run_batch(struct kd_client *c, const struct kv_piece *p, uint32_t n,
		     struct kv_side *src, struct kv_side *dst, uint64_t *moved)
{
	struct kv_piece round[KV_ROUND_IOVS];
	uint32_t i = 0;
	uint64_t off = 0;
	int r = 0;

	while (i < n && !r) {
		uint32_t k = 0;
		size_t bytes = 0;

		while (i < n && k < KV_ROUND_IOVS && bytes < KV_ROUND_BYTES) {
			uint64_t take = p[i].len - off;

			if (take > KV_ROUND_BYTES - bytes)
				take = KV_ROUND_BYTES - bytes;
			round[k++] = (struct kv_piece){ p[i].src + off, p[i].dst + off, take };
			bytes += take;
			off += take;
			if (off == p[i].len) {
				i++;
				off = 0;
			}
		}
		if (atomic_load(&c->stop) || atomic_load(&c->dead))
			return -ECANCELED;
		r = lock_sides(src, dst);
		if (r)
			break;
		r = copy_round(round, k, src, dst);
		unlock_sides(src, dst);
		if (!r)
			*moved += bytes;
	}
	return r;
}

void kd_kv_submit(struct kd_client *c, const struct kcoll_sqe *sqe, int err, const char *why)
{
	const struct kcoll_sqe_xfer *x = &sqe->xfer;
	bool write = sqe->opcode == KCOLL_OP_XFER_WRITE;
	struct kv_side local = { 0 }, remote = { 0 }, *src, *dst;
	struct kcoll_xfer_entry *e = NULL;
	struct kv_piece *p = NULL;
	struct kv_msgout msg;
	uint64_t moved = 0;
	int64_t t0 = kd_now_ns();
	int r = err;

	msg.len = 0;
	if (r)
		goto out;
	local.seg = seg_find(x->local_seg);
	if (!local.seg || local.seg->owner != c) {
		why = "local_seg is not a segment this client registered";
		r = -ENOENT;
		goto out;
	}
	pthread_mutex_lock(&c->lock);
	if (c->kv && x->remote_seg >= 1 && x->remote_seg <= KV_MAX_IMPORTS &&
	    (remote.seg = c->kv->imports[x->remote_seg - 1])) {
		atomic_fetch_add(&remote.seg->refs, 1);
		msg.sender = c->kv->sender[x->remote_seg - 1];
	}
	pthread_mutex_unlock(&c->lock);
	if (!remote.seg) {
		why = "remote_seg is not an import handle of this client";
		r = -ENOENT;
		goto out;
	}
	if (x->notify_id != KCOLL_NOTIFY_NONE && x->notify_id >= remote.seg->nr_notify) {
		why = "notify_id beyond the remote segment's counters";
		r = -EINVAL;
		goto out;
	}
	if (x->nr_entries) {
		struct iovec l, rv;
		size_t bytes = (size_t)x->nr_entries * sizeof(*e);

		e = malloc(bytes);
		p = malloc((size_t)x->nr_entries * sizeof(*p));
		if (!e || !p) {
			r = -ENOMEM;
			goto out;
		}
		l = (struct iovec){ e, bytes };
		rv = (struct iovec){ (void *)(uintptr_t)x->entries_addr, bytes };
		if (process_vm_readv(c->pid, &l, 1, &rv, 1, 0) != (ssize_t)bytes) {
			why = "cannot read the entry array from the client";
			r = -EFAULT;
			goto out;
		}
	}
	if (x->msg_len) {
		struct iovec l = { msg.data, x->msg_len };
		struct iovec rv = { (void *)(uintptr_t)x->msg_addr, x->msg_len };

		if (process_vm_readv(c->pid, &l, 1, &rv, 1, 0) != (ssize_t)x->msg_len) {
			why = "cannot read the notification from the client";
			r = -EFAULT;
			goto out;
		}
		msg.len = x->msg_len;
	}
	src = write ? &local : &remote;
	dst = write ? &remote : &local;
	for (uint32_t i = 0; i < x->nr_entries; i++)
		p[i] = write ? (struct kv_piece){ e[i].local_off, e[i].remote_off, e[i].len } :
			       (struct kv_piece){ e[i].remote_off, e[i].local_off, e[i].len };
	r = check_batch(p, x->nr_entries, src, dst, &why);
	if (r)
		goto out;
	if (remote.seg->rm) {
		r = side_resolve(&local);
		if (!r)
			r = run_remote(c, sqe->user_data, p, x->nr_entries, write, &local, remote.seg,
				       x->notify_id, &msg, t0, &moved);
		if (r == 1) {	/* in flight: the stream threads complete it */
			seg_put(remote.seg);
			free(e);
			free(p);
			return;
		}
		if (r)
			why = "transfer to another kcolld failed";
		goto out;
	}
	r = side_resolve(&local);
	if (!r)
		r = side_resolve(&remote);
	if (r) {
		why = "a segment was unregistered";
		goto out;
	}
	r = run_batch(c, p, x->nr_entries, src, dst, &moved);
	if (r) {
		why = r == -EIDRM ? "a segment was unregistered during the transfer" :
		      "copy failed (a process died or unmapped its buffer)";
		goto out;
	}
	if (x->notify_id != KCOLL_NOTIFY_NONE || msg.len) {
		/* Under the reader lock: the counters cannot be unmapped below us,
		 * and a segment unregistered meanwhile gets no late increment. */
		if (lock_sides(&remote, &remote) == 0) {
			r = notif_deliver(remote.seg, msg.sender, x->notify_id, msg.data, msg.len);
			unlock_sides(&remote, &remote);
			if (r)
				why = r == -ENOBUFS ? "the owner's notification queue is full" :
				      "the remote segment was unregistered before the notify";
		} else {
			r = -EIDRM;
			why = "the remote segment was unregistered before the notify";
		}
	}
out:
	kd_buf_release(&local.buf);
	kd_buf_release(&remote.buf);
	if (local.seg)
		seg_put(local.seg);
	if (remote.seg)
		seg_put(remote.seg);
	free(e);
	free(p);
	atomic_fetch_add(r ? &kv.xfers_failed : &kv.xfers_ok, 1);
	atomic_fetch_add(&kv.bytes, moved);
	kd_metrics_kv(write, r, moved, kd_now_ns() - t0);
	if (r)
		kc_dbg("client %u (pid %d): transfer failed: %s (%s)", c->id, c->pid,
		       why ? why : "", strerror(-r));
	kd_client_post(c, sqe->user_data, r, moved, KCOLL_RANK_NONE, 0);
}

size_t kd_kv_render(char *buf, size_t cap, int json)
{
	uint32_t nsegs;
	int n;

	pthread_mutex_lock(&kv.lock);
	nsegs = kv.nsegs;
	pthread_mutex_unlock(&kv.lock);
	if (json)
		n = snprintf(buf, cap, "\"kv\":{\"segments\":%u,\"xfers_ok\":%lu,\"xfers_failed\":%lu,"
			     "\"bytes\":%lu,\"rdma_bytes\":%lu,\"rdma_sessions\":%lu,\"notifs\":%lu,"
			     "\"notif_bytes_queued\":%lu}", nsegs,
			     atomic_load(&kv.xfers_ok), atomic_load(&kv.xfers_failed), atomic_load(&kv.bytes),
			     atomic_load(&kv.rdma_bytes), atomic_load(&kv.rdma_sessions),
			     atomic_load(&kv.notifs), (unsigned long)kv_notif_bytes());
	else
		n = snprintf(buf, cap, "kv: %u segments, %lu transfers ok, %lu failed, %lu bytes "
			     "(%lu sent over rdma, %lu rdma sessions served)\n",
			     nsegs, atomic_load(&kv.xfers_ok), atomic_load(&kv.xfers_failed),
			     atomic_load(&kv.bytes), atomic_load(&kv.rdma_bytes),
			     atomic_load(&kv.rdma_sessions));
	return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}

/* ---------------------------------------------------------------------------
 * Across hosts: the initiator's kcolld talks to the owner's over TCP streams
 * (KD_CONN_KV connections, opened on the first transfer of an import).
 *
 *   initiator -> owner   HELLO {kind KV, token, from_host = seg_id, stream}
 *   owner -> initiator   KV_ACK {status}: 0, -ENOENT, -EIDRM or -EACCES
 *   initiator -> owner   KV_REQ {op, nr, notify_id, tag} kv_fent[nr] [payload]
 *   owner -> initiator   KV_RESP {status, tag} [payload of a read]
 *
 * A batch is validated whole here first, then cut into frames of
 * KV_FRAME_MIN..KV_FRAME_CUT and at most KV_FRAME_ENTRIES blocks (small
 * blocks coalesce, large ones are split). A one-frame batch with nothing
 * in flight goes out on stream 0 from the ring thread; any other joins the
 * import's queue, and each stream's thread takes the oldest frame nobody
 * took whenever its last one was answered: the streams stay busy across a
 * client's batches (up to KV_QUEUE_MAX in flight) and a slow stream
 * carries fewer frames. The notify is one last NOTIFY frame once every
 * data frame of the batch was answered. The owner receives a frame in
 * place under the segment's reader lock (into a buffer first when the
 * segment is not mapped); unregistering shuts the connections down rather
 * than wait for a slow peer.
 * Another transport (RDMA) replaces the frame exchange of frame_xchg()
 * and the connection set of remote_connect(); the batch logic stays.
 */
#define KV_FRAME_BYTES		(4u << 20)	/* the largest frame an owner takes */
#define KV_FRAME_CUT		(2u << 20)	/* the largest an initiator sends */
#define KV_FRAME_MIN		(1u << 20)	/* and so a stream per MiB of a batch at most */
#define KV_FRAME_ENTRIES	4096
#define KV_MAX_STREAMS		8
#define KV_QUEUE_MAX		4	/* batches in flight per import */
#define KV_NOTIFY_FRAME		UINT32_MAX	/* a flight entry for the batch's notify */

struct kv_stream;
struct kv_remote;

struct kv_worker {
	struct kv_remote *rm;
	int idx;
};

struct kv_batch;

struct kv_remote {
	struct kcoll_seg_wire w;
	pthread_mutex_t lock;		/* submitters: set-up, RDMA and the queue's tail */
	int nstreams;
	int fd[KV_MAX_STREAMS];
	/* Batches over TCP, one thread per stream (started by the first batch
	 * that needs them, kept until the import goes). A submitter appends
	 * its batch to the queue and returns; each stream thread takes the
	 * oldest frame no stream took yet whenever its last one was answered
	 * (stream_worker). */
	pthread_mutex_t wlock;
	pthread_cond_t go;		/* a frame to take, or quit */
	pthread_cond_t space;		/* a batch left the queue */
	struct kv_batch *q_head, *q_tail;
	uint32_t nq;
	uint64_t seq;			/* tags' high half: the batch's number */
	int broken;			/* a stream failed: take no frame; reopen once drained */
	pthread_t tid[KV_MAX_STREAMS];
	struct kv_worker wk[KV_MAX_STREAMS];
	bool started[KV_MAX_STREAMS], quit;
	struct kv_fent *fe[KV_MAX_STREAMS];	/* per stream, kept with the import */
	struct iovec *iov[KV_MAX_STREAMS];
	/* RDMA (kv_rdma.h): set up over fd[0] on the first batch whose local
	 * segment is mapped; fd[0] then carries only notify answers. */
	struct kv_rdma *rd;
	bool rd_off;			/* refused for this import (logged once) */
	uint32_t rd_seg;		/* the local segment the region covers */
	struct kd_buf rd_buf;		/* its mapping, held while registered */
	struct kv_rdma_hello peer;
	uint32_t features;		/* the owner's KV_ACK_F_*, from stream 0's ACK */
};

static int io_full(int fd, void *buf, size_t n, bool out)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, MSG_WAITALL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k == 0 || errno != EAGAIN ? -ECONNRESET : -ETIMEDOUT;
		p += k;
		n -= k;
	}
	return 0;
}

static void sock_timeouts(int fd, int64_t ns)
{
	struct timeval tv = { .tv_sec = ns / 1000000000, .tv_usec = ns % 1000000000 / 1000 };

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static int remote_import(const struct kcoll_seg_wire *w, struct kd_seg **out)
{
	struct kd_seg *s;
	struct kv_remote *rm;
	int64_t streams = kcoll_knob_ll("KCOLL_KV_STREAMS");

	if (!w->port || !w->naddrs || w->naddrs > KCOLL_ID_MAX_ADDRS)
		return -EREMOTE;
	s = calloc(1, sizeof(*s));
	rm = calloc(1, sizeof(*rm));
	if (!s || !rm) {
		free(s);
		free(rm);
		return -ENOMEM;
	}
	rm->w = *w;
	rm->nstreams = streams < 1 ? 1 : streams > KV_MAX_STREAMS ? KV_MAX_STREAMS : (int)streams;
	for (int i = 0; i < KV_MAX_STREAMS; i++)
		rm->fd[i] = -1;
	pthread_mutex_init(&rm->lock, NULL);
	pthread_mutex_init(&rm->wlock, NULL);
	pthread_cond_init(&rm->go, NULL);
	pthread_cond_init(&rm->space, NULL);
	s->rm = rm;
	s->size = w->size;
	s->nr_notify = w->nr_notify;
	pthread_rwlock_init(&s->lock, NULL);
	pthread_mutex_init(&s->conns_lock, NULL);
	atomic_init(&s->refs, 1);
	*out = s;
	return 0;
}

static void remote_close_streams(struct kv_remote *rm)
{
	for (int i = 0; i < KV_MAX_STREAMS; i++) {
		if (rm->fd[i] >= 0)
			close(rm->fd[i]);
		rm->fd[i] = -1;
	}
}

static void rdma_drop(struct kv_remote *rm)
{
	kv_rdma_destroy(rm->rd);
	rm->rd = NULL;
	kd_buf_release(&rm->rd_buf);
}

static void remote_free(struct kv_remote *rm)
{
	pthread_mutex_lock(&rm->wlock);
	while (rm->nq)	/* the batches in flight end first (their clients may be gone) */
		pthread_cond_wait(&rm->space, &rm->wlock);
	rm->quit = true;
	pthread_cond_broadcast(&rm->go);
	pthread_mutex_unlock(&rm->wlock);
	for (int i = 0; i < KV_MAX_STREAMS; i++) {
		if (rm->started[i])
			pthread_join(rm->tid[i], NULL);
		free(rm->fe[i]);
		free(rm->iov[i]);
	}
	rdma_drop(rm);
	remote_close_streams(rm);
	pthread_cond_destroy(&rm->go);
	pthread_cond_destroy(&rm->space);
	pthread_mutex_destroy(&rm->wlock);
	pthread_mutex_destroy(&rm->lock);
	free(rm);
}

/* Between batches a healthy stream has nothing to read. */
static bool fd_idle(int fd)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN | POLLRDHUP };

	return fd >= 0 && poll(&pf, 1, 0) == 0;
}

/* Open the streams that are not open; the owner's verdict on the token. */
static int remote_connect(struct kv_remote *rm)
{
	struct kd_p_hostinfo me;

	kd_net_self(&me);
	for (int i = 0; i < rm->nstreams; i++) {
		struct kd_p_hello h = { 0 };
		struct kv_ack ack;
		int fd, r;

		if (rm->fd[i] >= 0) {
			/* Between batches a healthy stream has nothing to read:
			 * readable means the owner dropped it (idle past its
			 * KCOLL_TIMEOUT_MS, restart): reconnect, not fail. */
			struct pollfd pf = { .fd = rm->fd[i], .events = POLLIN | POLLRDHUP };

			if (poll(&pf, 1, 0) == 0)
				continue;
			close(rm->fd[i]);
			rm->fd[i] = -1;
		}
		fd = kd_net_connect(rm->w.addrs[i % rm->w.naddrs], rm->w.port);
		if (fd < 0)
			return fd == -ETIMEDOUT ? -EHOSTUNREACH : fd;
		sock_timeouts(fd, kd.timeout_ns);
		h.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_HELLO, .len = sizeof(h) };
		h.version = KD_PEER_VERSION;
		h.kind = KD_CONN_KV;
		memcpy(h.token, rm->w.token, sizeof(h.token));
		h.from_host = rm->w.seg_id;
		h.stream = i;
		h.nonce = me.nonce;
		r = io_full(fd, &h, sizeof(h), true);
		if (!r)
			r = io_full(fd, &ack, sizeof(ack.hdr), false);
		/* A REJECT (older peer, bad version) is longer than an ACK: its
		 * header says so; either way the connection is over. */
		if (!r && (ack.hdr.magic != KD_PEER_MAGIC || ack.hdr.type != KD_P_KV_ACK ||
			   ack.hdr.len != sizeof(ack)))
			r = -EPROTO;
		if (!r)
			r = io_full(fd, &ack.status, sizeof(ack) - sizeof(ack.hdr), false);
		if (!r)
			r = ack.status > 0 ? -EPROTO : ack.status;
		if (r) {
			close(fd);
			return r;
		}
		if (i == 0)
			rm->features = ack.features;
		rm->fd[i] = fd;
	}
	return 0;
}

struct kv_frame {
	uint32_t first, n;	/* sub-pieces */
	uint64_t bytes;
};

/* One stream's view of a batch, for sending its frames and reading their answers. */
struct kv_stream {
	struct kv_side *local;
	const struct kv_piece *sp;	/* sub-pieces: src/dst in the batch's direction */
	const struct kv_frame *frames;
	bool write;
	int fd;
	uint64_t tag;			/* frame fi's tag: tag | fi */
	uint64_t moved;
	struct iovec *iov;		/* KV_FRAME_ENTRIES + 2: a frame sent from the mapping */
	struct kv_fent *fe;		/* KV_FRAME_ENTRIES: a frame's entries */
};

/* A batch handed to the stream threads (run_remote), until its last answer. */
struct kv_batch {
	struct kd_client *c;		/* held */
	uint64_t user_data;
	struct kv_side local;		/* held: the segment and its mapping */
	bool write;
	uint32_t notify_id;
	struct kv_msgout msg;		/* the notification, sent with the notify */
	struct kv_piece *sp;
	struct kv_frame *fr;
	uint32_t nfr;
	uint64_t tag;			/* its frames' tags: tag | frame */
	int64_t t0;			/* taken off the ring (metrics) */
	/* under the import's wlock: */
	uint32_t next;			/* the first frame no stream took */
	uint32_t left;			/* answers due: frames, and the notify or msg */
	bool notify_sent;
	int err;			/* the first error */
	uint64_t moved;
	struct kv_batch *qnext;
	struct kv_conn node[KV_MAX_STREAMS];	/* in local's conns: seg_kill shuts the streams */
};

/* Copy between a frame buffer and the local segment (under its lock). */
static int local_io(struct kv_stream *st, const struct kv_frame *f, uint8_t *buf)
{
	struct kv_side *l = st->local;
	struct iovec liov[KV_ROUND_IOVS], riov[KV_ROUND_IOVS];
	uint64_t at = 0;
	int r = lock_sides(l, l);

	if (r)
		return r;
	for (uint32_t i = 0; i < f->n && !r;) {
		uint32_t k = 0;
		size_t bytes = 0;

		for (; i < f->n && k < KV_ROUND_IOVS; i++, k++) {
			const struct kv_piece *p = &st->sp[f->first + i];
			/* write: the local side is the source; read: the destination */
			uint64_t off = st->write ? p->src : p->dst;

			if (l->buf.direct) {
				if (st->write)
					memcpy(buf + at, l->buf.direct + off, p->len);
				else
					memcpy(l->buf.direct + off, buf + at, p->len);
			}
			riov[k] = (struct iovec){ (void *)(uintptr_t)(l->seg->addr + off), p->len };
			at += p->len;
			bytes += p->len;
		}
		if (l->buf.direct)
			continue;
		liov[0] = (struct iovec){ buf + at - bytes, bytes };
		r = vm_err(st->write ? process_vm_readv(l->seg->pid, liov, 1, riov, k, 0) :
			   process_vm_writev(l->seg->pid, liov, 1, riov, k, 0), bytes);
	}
	unlock_sides(l, l);
	return r;
}

/* kcoll_io_iovs with MSG_MORE: 0, -ETIMEDOUT (the socket's timeout) or
 * -ECONNRESET. */
static int io_iovs(int fd, struct iovec *iov, size_t n, bool out)
{
	int r = kcoll_io_iovs(fd, iov, n, out, true);

	return !r ? 0 : r == -EAGAIN ? -ETIMEDOUT : -ECONNRESET;
}

/* A write frame straight from the mapped local segment, under its reader
 * lock: seg_kill shuts this stream down instead of waiting for the peer. */
static int frame_send_mapped(struct kv_stream *st, const struct kv_frame *f, struct kv_req *rq,
			     struct kv_fent *fe)
{
	struct kv_side *l = st->local;
	size_t n = 2;
	int r = lock_sides(l, l);

	if (r)
		return r;
	st->iov[0] = (struct iovec){ rq, sizeof(*rq) };
	st->iov[1] = (struct iovec){ fe, f->n * sizeof(*fe) };
	for (uint32_t i = 0; i < f->n; i++) {
		const struct kv_piece *p = &st->sp[f->first + i];

		st->iov[n++] = (struct iovec){ l->buf.direct + p->src, p->len };
	}
	r = io_iovs(st->fd, st->iov, n, true);
	unlock_sides(l, l);
	return r;
}

static int frame_send(struct kv_stream *st, uint32_t fi, uint8_t *buf, struct kv_fent *fe)
{
	const struct kv_frame *f = &st->frames[fi];
	struct kv_req rq = { 0 };
	struct iovec iov[3];
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = st->write ? 3 : 2 };
	size_t total;
	int r;

	for (uint32_t i = 0; i < f->n; i++) {
		const struct kv_piece *p = &st->sp[f->first + i];

		fe[i] = (struct kv_fent){ st->write ? p->dst : p->src, p->len };
	}
	rq.op = st->write ? KV_OP_WRITE : KV_OP_READ;
	rq.nr = f->n;
	rq.tag = st->tag | fi;
	total = sizeof(rq) + f->n * sizeof(*fe) + (st->write ? f->bytes : 0);
	rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ, .len = (uint32_t)total };
	if (st->write && st->local->buf.direct)
		return frame_send_mapped(st, f, &rq, fe);
	if (st->write && (r = local_io(st, f, buf)))
		return r;
	iov[0] = (struct iovec){ &rq, sizeof(rq) };
	iov[1] = (struct iovec){ fe, f->n * sizeof(*fe) };
	iov[2] = (struct iovec){ buf, f->bytes };
	while (total) {
		ssize_t k = sendmsg(st->fd, &mh, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 && errno == EAGAIN ? -ETIMEDOUT : -ECONNRESET;
		total -= k;
		while (k && (size_t)k >= mh.msg_iov->iov_len) {
			k -= mh.msg_iov->iov_len;
			mh.msg_iov++;
			mh.msg_iovlen--;
		}
		if (k) {
			mh.msg_iov->iov_base = (uint8_t *)mh.msg_iov->iov_base + k;
			mh.msg_iov->iov_len -= k;
		}
	}
	return 0;
}

/* A read frame's payload straight into the mapped local segment, under its
 * reader lock (seg_kill shuts this stream down rather than wait). */
static int frame_recv_mapped(struct kv_stream *st, const struct kv_frame *f)
{
	struct kv_side *l = st->local;
	int r = lock_sides(l, l);

	if (r)
		return r;
	for (uint32_t i = 0; i < f->n; i++) {
		const struct kv_piece *p = &st->sp[f->first + i];

		st->iov[i] = (struct iovec){ l->buf.direct + p->dst, p->len };
	}
	r = io_iovs(st->fd, st->iov, f->n, false);
	unlock_sides(l, l);
	return r;
}

static int frame_recv(struct kv_stream *st, uint32_t fi, uint8_t *buf)
{
	const struct kv_frame *f = &st->frames[fi];
	struct kv_resp rs;
	int r = io_full(st->fd, &rs, sizeof(rs), false);

	if (r)
		return r;
	if (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP)
		return -EPROTO;
	if (rs.status)	/* an error may answer an earlier frame or none (tag ~0) */
		return rs.status > 0 ? -EPROTO : rs.status;
	if (rs.tag != (st->tag | fi) || rs.hdr.len != sizeof(rs) + (!st->write ? f->bytes : 0))
		return -EPROTO;
	if (!st->write && st->local->buf.direct) {
		r = frame_recv_mapped(st, f);
	} else if (!st->write) {
		r = io_full(st->fd, buf, f->bytes, false);
		if (!r)
			r = local_io(st, f, buf);
	}
	if (!r)
		st->moved += f->bytes;
	return r;
}

/* A stream broke: the owner may have said why first (-EIDRM, tag ~0). */
static int last_word(int fd, int err)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct kv_resp rs;

	if (poll(&p, 1, 100) != 1 || recv(fd, &rs, sizeof(rs), MSG_DONTWAIT) != sizeof(rs))
		return err;
	/* Unread answers of earlier frames may come first: those are fine. */
	while (rs.hdr.magic == KD_PEER_MAGIC && rs.hdr.type == KD_P_KV_RESP && rs.tag != UINT64_MAX &&
	       !rs.status && rs.hdr.len == sizeof(rs))
		if (recv(fd, &rs, sizeof(rs), MSG_DONTWAIT) != sizeof(rs))
			return err;
	return rs.hdr.magic == KD_PEER_MAGIC && rs.hdr.type == KD_P_KV_RESP && rs.status < 0 ?
	       rs.status : err;
}

/*
 * Frame fi out on st's stream and its answer in. A mapped local segment is
 * sent from and received into in place; other memory needs a frame buffer
 * (*buf, made on first need: a write's frame is staged before it is sent,
 * a read's answer received before it is copied out).
 */
static int frame_xchg(struct kv_stream *st, uint32_t fi, uint8_t **buf)
{
	int r;

	if (!st->local->buf.direct && !*buf && !(*buf = malloc(KV_FRAME_BYTES)))
		return -ENOMEM;
	r = frame_send(st, fi, *buf, st->fe);
	return r ? r : frame_recv(st, fi, *buf);
}

/* A stream broke (-ECONNRESET): say why when we can, the local segment
 * unregistered under it or the owner's last word. */
static int stream_err(const struct kv_stream *st, int r)
{
	if (r != -ECONNRESET)
		return r;
	return atomic_load(&st->local->seg->dead) ? -EIDRM : last_word(st->fd, r);
}

static int notify_send(int fd, uint32_t id, uint64_t tag)
{
	struct kv_req rq = { .op = KV_OP_NOTIFY, .notify_id = id, .tag = tag };

	rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ, .len = sizeof(rq) };
	return io_full(fd, &rq, sizeof(rq), true);
}

static int notify_recv(int fd, uint64_t tag)
{
	struct kv_resp rs;
	int r = io_full(fd, &rs, sizeof(rs), false);

	if (!r && (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP ||
		   rs.hdr.len != sizeof(rs) || (rs.tag != tag && !rs.status)))
		r = -EPROTO;
	return r ? r : rs.status > 0 ? -EPROTO : rs.status;
}

/* A batch's last frame, once all its data landed: NOTIFY, or MSG when it
 * carries a notification (which bumps the counter too). */
static bool has_final(uint32_t notify_id, const struct kv_msgout *m)
{
	return notify_id != KCOLL_NOTIFY_NONE || m->len;
}

/*
 * Send the final frame and read its answer: 0 with the owner's verdict on a
 * MSG in *ans (-ENOBUFS, -EIDRM: the stream stays in step, the batch fails
 * and the streams go on), or the stream's error. A NOTIFY's refusal is the
 * stream's error, as it always was.
 */
static int final_xchg(int fd, uint32_t id, const struct kv_msgout *m, uint64_t tag, int *ans)
{
	struct kv_req rq = { .op = KV_OP_MSG, .notify_id = id, .tag = tag };
	struct kv_msg km = { .sender = m->sender, .len = m->len };
	struct iovec iov[3] = { { &rq, sizeof(rq) }, { &km, sizeof(km) },
				{ (void *)m->data, m->len } };
	struct kv_resp rs;
	int r;

	*ans = 0;
	if (!m->len) {
		r = notify_send(fd, id, tag);
		return r ? r : notify_recv(fd, tag);
	}
	rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ,
				   .len = sizeof(rq) + sizeof(km) + m->len };
	r = kcoll_io_iovs(fd, iov, 3, true, false);
	if (!r)
		r = io_full(fd, &rs, sizeof(rs), false);
	if (r)
		return r;
	if (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP || rs.hdr.len != sizeof(rs) ||
	    rs.status > 0)
		return -EPROTO;
	if (rs.tag != tag)	/* the owner's last word before it closes, or garbage */
		return rs.status ? rs.status : -EPROTO;
	*ans = rs.status;
	return 0;
}

/* Stream s's view of batch b for frame_send / frame_recv. */
static struct kv_stream batch_stream(struct kv_remote *rm, struct kv_batch *b, int s)
{
	return (struct kv_stream){ .local = &b->local, .sp = b->sp, .frames = b->fr,
				   .write = b->write, .fd = rm->fd[s], .tag = b->tag,
				   .iov = rm->iov[s], .fe = rm->fe[s] };
}

/* n of b's answers came (or never will: err). Under wlock. true: b is
 * over and out of the queue: batch_end it once wlock is dropped. */
static bool batch_account(struct kv_remote *rm, struct kv_batch *b, int err, uint32_t n)
{
	struct kv_batch **pp;

	if (err && !b->err)
		b->err = err;
	b->left -= n;
	if (b->left == 1 && b->err && !b->notify_sent && has_final(b->notify_id, &b->msg)) {
		b->notify_sent = true;	/* only the notify is due: it will not be sent */
		b->left = 0;
	}
	if (b->left)
		return false;
	for (pp = &rm->q_head; *pp != b; pp = &(*pp)->qnext)
		;
	*pp = b->qnext;
	if (rm->q_tail == b)
		rm->q_tail = NULL;
	for (struct kv_batch *q = rm->q_head; q; q = q->qnext)
		rm->q_tail = q;
	rm->nq--;
	pthread_cond_broadcast(&rm->space);
	return true;
}

/* No stream takes b's frames any more (an error, or its client left): the
 * untaken frames and an unsent notify are counted out. */
static bool batch_stop(struct kv_remote *rm, struct kv_batch *b, int err)
{
	uint32_t untaken = b->nfr - b->next;

	b->next = b->nfr;
	if (!b->notify_sent && has_final(b->notify_id, &b->msg)) {
		b->notify_sent = true;
		untaken++;
	}
	return batch_account(rm, b, err, untaken);
}

static void batch_free(struct kv_batch *b)
{
	free(b->sp);
	free(b->fr);
	free(b);
}

/* Post b's completion and let go of what it held (not under wlock). */
static void batch_end(struct kv_remote *rm, struct kv_batch *b)
{
	struct kd_seg *ls = b->local.seg;

	for (int s = 0; s < rm->nstreams; s++)
		conn_unlink(ls, &b->node[s]);
	atomic_fetch_add(b->err ? &kv.xfers_failed : &kv.xfers_ok, 1);
	atomic_fetch_add(&kv.bytes, b->moved);
	kd_metrics_kv(b->write, b->err, b->moved, kd_now_ns() - b->t0);
	if (b->err)
		kc_dbg("client %u (pid %d): transfer failed: transfer to another kcolld failed (%s)",
		       b->c->id, b->c->pid, strerror(-b->err));
	kd_client_post(b->c, b->user_data, b->err, b->moved, KCOLL_RANK_NONE, 0);
	kd_buf_release(&b->local.buf);
	seg_put(ls);
	kd_client_put(b->c);
	batch_free(b);
}

/* Under wlock: the oldest frame no stream took, skipping (and ending)
 * batches that may not go on; NULL: none. */
static struct kv_batch *frame_take(struct kv_remote *rm, uint32_t *fi)
{
	struct kv_batch *b = rm->q_head;

	while (b) {
		if (b->next == b->nfr) {
			b = b->qnext;
			continue;
		}
		if (!b->err && !atomic_load(&b->c->stop) && !atomic_load(&b->c->dead)) {
			*fi = b->next++;
			return b;
		}
		if (batch_stop(rm, b, b->err ? b->err : -ECANCELED)) {
			pthread_mutex_unlock(&rm->wlock);
			batch_end(rm, b);
			pthread_mutex_lock(&rm->wlock);
		}
		b = rm->q_head;	/* the queue may have changed */
	}
	return NULL;
}

/* Under wlock: stream failed with err: fail the n batches of what it carried
 * and every batch with frames nobody took; no stream takes another. */
static void stream_broke(struct kv_remote *rm, struct kv_batch **carried, uint32_t n, int err)
{
	rm->broken = err;
	for (uint32_t k = 0; k < n; k++)
		if (batch_account(rm, carried[k], err, 1)) {
			pthread_mutex_unlock(&rm->wlock);
			batch_end(rm, carried[k]);
			pthread_mutex_lock(&rm->wlock);
		}
	for (struct kv_batch *q = rm->q_head; q;) {
		if (q->next < q->nfr && batch_stop(rm, q, err)) {
			pthread_mutex_unlock(&rm->wlock);
			batch_end(rm, q);
			pthread_mutex_lock(&rm->wlock);
			q = rm->q_head;
			continue;
		}
		q = q->qnext;
	}
}

/*
 * Stream s's thread: take the oldest frame no stream took yet (of any
 * queued batch), send it, read its answer, and again: each stream has one
 * frame unanswered at a time, so every stream carries a batch's frames as
 * soon as it is free, a stream the kernel serves slower takes fewer, and
 * at most streams x frame bytes are in flight (docs/perf/kv.md section 6a:
 * more in flight moved less here). The thread reading a batch's last
 * answer sends its notify on its own stream (all its data landed), or ends
 * it. A stream that fails marks the import broken (stream_broke); frames
 * other streams carry are still answered, and the next batch after the
 * queue drained opens the streams afresh.
 */
static void *stream_worker(void *arg)
{
	struct kv_remote *rm = ((struct kv_worker *)arg)->rm;
	int s = ((struct kv_worker *)arg)->idx;
	uint8_t *buf = NULL;	/* frames of unmapped memory, made on first need */

	pthread_mutex_lock(&rm->wlock);
	for (;;) {
		struct kv_batch *b = NULL;
		struct kv_stream st;
		uint32_t fi = 0;
		int r, ans = 0;	/* ans: the owner's verdict on a MSG frame */

		if (!rm->broken)
			b = frame_take(rm, &fi);
		if (!b) {
			if (rm->quit)
				break;
			pthread_cond_wait(&rm->go, &rm->wlock);
			continue;
		}
		pthread_mutex_unlock(&rm->wlock);
		st = batch_stream(rm, b, s);
		r = frame_xchg(&st, fi, &buf);
		while (!r) {	/* answered: count it; the batch's notify, if its turn */
			bool notify, ended;

			pthread_mutex_lock(&rm->wlock);
			b->moved += st.moved;
			st.moved = 0;
			ended = batch_account(rm, b, ans, 1);
			notify = !ended && b->left == 1 && !b->notify_sent &&
				 has_final(b->notify_id, &b->msg);
			if (notify)
				b->notify_sent = true;	/* left's last 1 is its answer */
			pthread_mutex_unlock(&rm->wlock);
			if (ended)
				batch_end(rm, b);
			if (!notify)
				break;
			r = final_xchg(st.fd, b->notify_id, &b->msg, b->tag | KV_NOTIFY_FRAME, &ans);
		}
		r = stream_err(&st, r);
		pthread_mutex_lock(&rm->wlock);
		if (r)
			stream_broke(rm, &b, 1, r);
	}
	pthread_mutex_unlock(&rm->wlock);
	free(buf);
	return NULL;
}

/* ---- the initiator's RDMA path --------------------------------------------
 *
 * With a device on both sides and both segments mapped, a batch moves as
 * RDMA WRITEs (or READs) from the local segment's region straight into the
 * owner's, and its notify is a WRITE_WITH_IMM the owner answers on fd[0].
 * Otherwise the frames above (TCP), with the reason logged once per import.
 */
#define KV_RDMA_CHUNK		(4u << 20)	/* one work request at most */
#define KV_RDMA_INFLIGHT	128

static void rdma_refuse(struct kv_remote *rm, bool loud, const char *why)
{
	char host[sizeof(rm->w.host) + 1];

	rm->rd_off = true;
	snprintf(host, sizeof(host), "%.*s", (int)sizeof(rm->w.host), rm->w.host);
	if (loud)
		kc_err("kv: segment %u of %s: KCOLL_NET_XPORT=rdma but RDMA is not usable (%s); using TCP",
		       rm->w.seg_id, host, why);
	else
		kc_info("kv: segment %u of %s: over TCP (RDMA not used: %s)", rm->w.seg_id, host, why);
}

/*
 * Make rm's RDMA connection ready for a batch from local (held, mapped).
 * 0: use it; 1: use TCP (the streams are open); < 0: the streams broke.
 */
static int rdma_ready(struct kv_remote *rm, struct kv_side *local)
{
	struct kv_req rq = { .op = KV_OP_RDMA, .tag = UINT32_MAX - 1 };
	struct kv_rdma_hello me, peer;
	struct kv_resp rs;
	char why[256];
	bool loud;
	int r;

	if (rm->rd) {
		if (rm->rd_seg == local->seg->id && rm->rd_buf.rg == local->buf.rg)
			return 0;
		/* Another local segment: register it in this connection's PD
		 * (the old region is deregistered before its mapping goes). */
		struct kd_buf nb = { 0 };

		if (lock_sides(local, local))
			return -EIDRM;
		kd_buf_resolve(local->seg->owner, local->seg->addr, local->seg->size, &nb);
		unlock_sides(local, local);
		r = nb.direct ? kv_rdma_set_mr(rm->rd, nb.direct, local->seg->size) : -EIDRM;
		kd_buf_release(&rm->rd_buf);
		rm->rd_buf = nb;
		if (r) {
			/* The owner's side is in RDMA mode on fd[0]: start afresh. */
			rdma_drop(rm);
			remote_close_streams(rm);
			return r;
		}
		rm->rd_seg = local->seg->id;
		return 0;
	}
	if (rm->rd_off)
		return 1;
	if (!kv_rdma_wanted(why, sizeof(why), &loud)) {
		rdma_refuse(rm, loud, why);
		return 1;
	}
	if (lock_sides(local, local))
		return -EIDRM;
	kd_buf_resolve(local->seg->owner, local->seg->addr, local->seg->size, &rm->rd_buf);
	unlock_sides(local, local);
	if (!rm->rd_buf.direct) {
		kd_buf_release(&rm->rd_buf);
		return 1;
	}
	r = kv_rdma_create(rm->fd[0], rm->rd_buf.direct, local->seg->size, false, &rm->rd, why, sizeof(why));
	if (r) {
		kd_buf_release(&rm->rd_buf);
		rdma_refuse(rm, loud, why);
		return 1;
	}
	kv_rdma_hello_fill(rm->rd, &me);
	rq.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ,
				   .len = sizeof(rq) + sizeof(me) };
	r = io_full(rm->fd[0], &rq, sizeof(rq), true);
	if (!r)
		r = io_full(rm->fd[0], &me, sizeof(me), true);
	if (!r)
		r = io_full(rm->fd[0], &rs, sizeof(rs), false);
	if (!r && (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP ||
		   rs.hdr.len != sizeof(rs) + sizeof(peer) || rs.tag != rq.tag))
		r = rs.status < 0 ? rs.status : -EPROTO;
	if (!r)
		r = io_full(rm->fd[0], &peer, sizeof(peer), false);
	if (r) {
		rdma_drop(rm);
		return r;
	}
	peer.why[sizeof(peer.why) - 1] = 0;
	if (rs.status) {
		rdma_drop(rm);
		if (rs.status == -EIDRM)
			return -EIDRM;
		rdma_refuse(rm, loud, peer.why);
		return 1;
	}
	r = kv_rdma_connect(rm->rd, &peer, 0, why, sizeof(why));
	if (r) {
		rdma_drop(rm);
		remote_close_streams(rm);	/* the owner's side is in RDMA mode */
		rdma_refuse(rm, loud, why);
		r = remote_connect(rm);
		return r ? r : 1;
	}
	rm->peer = peer;
	rm->rd_seg = local->seg->id;
	kc_info("kv: segment %u of %.*s: over RDMA (%s)", rm->w.seg_id, (int)sizeof(rm->w.host), rm->w.host,
		kv_rdma_dev(rm->rd));
	return 0;
}

/* Is the next thing on fd the answer to the batch's WRITE_WITH_IMM notify? */
static bool notify_answer_next(int fd)
{
	struct kv_resp rs;

	return recv(fd, &rs, sizeof(rs), MSG_PEEK | MSG_DONTWAIT) == sizeof(rs) &&
	       rs.hdr.magic == KD_PEER_MAGIC && rs.hdr.type == KD_P_KV_RESP &&
	       rs.hdr.len == sizeof(rs) && rs.tag == UINT32_MAX;
}

/* Sleep until a completion or fd[0] says something; deadline in ns.
 * imm_out: the notify's WRITE_WITH_IMM is posted, so its answer may reach
 * fd[0] before the send's own completion: that is no error, only the
 * completion is then waited for. */
static int rdma_wait(struct kv_remote *rm, struct kd_client *c, struct kv_side *local, int64_t deadline,
		     bool imm_out)
{
	struct pollfd pf[2] = { { .fd = kv_rdma_fd(rm->rd), .events = POLLIN },
				{ .fd = rm->fd[0], .events = POLLIN } };
	int64_t left = deadline - kd_now_ns();
	int r;

	if (left <= 0)
		return -ETIMEDOUT;
	r = poll(pf, 2, left > 100000000 ? 100 : (int)(left / 1000000) + 1);
	if (r < 0)
		return errno == EINTR ? 0 : -errno;
	if (pf[0].revents)
		kv_rdma_ack_event(rm->rd);
	if (atomic_load(&local->seg->dead))
		return -EIDRM;
	if (atomic_load(&c->stop) || atomic_load(&c->dead))
		return -ECANCELED;
	/* Nothing else is due on fd[0] before the notify: the owner's last
	 * word (-EIDRM) or its end. */
	if (pf[1].revents && imm_out && notify_answer_next(rm->fd[0])) {
		left = deadline - kd_now_ns();
		if (!pf[0].revents && left > 0 &&
		    poll(pf, 1, left > 100000000 ? 100 : (int)(left / 1000000) + 1) == 1)
			kv_rdma_ack_event(rm->rd);
		return 0;
	}
	if (pf[1].revents)
		return last_word(rm->fd[0], -ECONNRESET);
	return 0;
}

static int run_rdma(struct kd_client *c, const struct kv_piece *p, uint32_t n, bool write,
		    struct kv_side *local, struct kv_remote *rm, uint32_t notify_id,
		    const struct kv_msgout *msg, uint64_t *moved)
{
	struct kv_conn node = { .fd = rm->fd[0], .how = SHUT_RDWR, .seg = local->seg };
	uint64_t off = 0, bytes = 0;
	uint32_t i = 0, inflight = 0;
	int64_t deadline = kd_now_ns() + kd.timeout_ns;
	/* A notification goes as a MSG frame on fd[0] after the loop (it
	 * bumps the counter too): no WRITE_WITH_IMM then. */
	bool locked, armed = false, notified = notify_id == KCOLL_NOTIFY_NONE || msg->len;
	int r;

	/* seg_kill of the local segment shuts fd[0] down: rdma_wait wakes. */
	conn_link(local->seg, &node);
	r = lock_sides(local, local);
	locked = !r;
	while (!r && (i < n || inflight || !notified)) {
		struct ibv_wc wc[32];
		int got;

		while (!r && i < n && inflight < KV_RDMA_INFLIGHT) {
			uint64_t len = p[i].len - off < KV_RDMA_CHUNK ? p[i].len - off : KV_RDMA_CHUNK;
			uint64_t lo = (write ? p[i].src : p[i].dst) + off;
			uint64_t ro = (write ? p[i].dst : p[i].src) + off;

			r = kv_rdma_post(rm->rd, write, lo, len, rm->peer.base + ro, rm->peer.rkey, NULL, len);
			inflight += !r;
			off += len;
			if (off == p[i].len) {
				i++;
				off = 0;
			}
		}
		if (!r && i == n && !inflight && !notified) {
			/* Every block landed (RC: acknowledged by the owner's
			 * device): now the counter, as one WRITE_WITH_IMM. */
			r = kv_rdma_post(rm->rd, true, 0, 0, 0, 0, &notify_id, UINT64_MAX);
			inflight += !r;
			notified = true;
		}
		got = r ? 0 : kv_rdma_poll(rm->rd, wc, 32);
		if (got < 0)
			r = got;
		for (int k = 0; k < got; k++) {
			inflight--;
			if (wc[k].status != IBV_WC_SUCCESS && !r)
				r = kv_rdma_wc_err(&wc[k]);
			if (wc[k].status == IBV_WC_SUCCESS && wc[k].wr_id != UINT64_MAX)
				bytes += wc[k].wr_id;
		}
		if (got > 0) {
			deadline = kd_now_ns() + kd.timeout_ns;
			armed = false;
			continue;
		}
		if (r || (i < n && inflight < KV_RDMA_INFLIGHT))
			continue;
		if (!armed) {
			r = kv_rdma_arm(rm->rd);
			armed = true;
			continue;
		}
		armed = false;
		r = rdma_wait(rm, c, local, deadline, notified && notify_id != KCOLL_NOTIFY_NONE &&
			      !msg->len);
	}
	if (inflight) {
		/* Stop the rest: the QP in error flushes what is posted and
		 * nothing more lands in either segment. */
		int64_t until = kd_now_ns() + 2000000000LL;
		struct ibv_wc wc[32];

		kv_rdma_fail(rm->rd);
		while (inflight && kd_now_ns() < until) {
			int got = kv_rdma_poll(rm->rd, wc, 32);

			if (got < 0)
				break;
			inflight -= (uint32_t)got;
			if (!got)
				usleep(1000);
		}
	}
	if (locked)
		unlock_sides(local, local);
	conn_unlink(local->seg, &node);
	*moved += bytes;
	atomic_fetch_add(&kv.rdma_bytes, bytes);
	if (r && (r == -EACCES || r == -EHOSTUNREACH || r == -ECONNRESET || r == -EIO)) {
		char c;

		r = atomic_load(&local->seg->dead) ? -EIDRM : last_word(rm->fd[0], r);
		/* The owner's device refused the rkey and its kcolld closed the
		 * stream without a word: it died (not a wrong token). */
		if (r == -EACCES && recv(rm->fd[0], &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
			r = -ECONNRESET;
	}
	if (!r && msg->len) {
		int ans;

		r = final_xchg(rm->fd[0], notify_id, msg, UINT32_MAX, &ans);
		r = r ? r : ans;
	} else if (!r && notify_id != KCOLL_NOTIFY_NONE) {
		struct kv_resp rs;

		r = io_full(rm->fd[0], &rs, sizeof(rs), false);
		if (!r && (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP ||
			   rs.hdr.len != sizeof(rs) || (rs.tag != UINT32_MAX && !rs.status)))
			r = -EPROTO;
		if (!r)
			r = rs.status > 0 ? -EPROTO : rs.status;
	}
	return r;
}

/* The entry and iovec arrays of streams 0..used-1, kept with the import. */
static int stream_bufs(struct kv_remote *rm, uint32_t used)
{
	for (uint32_t s = 0; s < used; s++) {
		if (!rm->fe[s])
			rm->fe[s] = malloc(KV_FRAME_ENTRIES * sizeof(*rm->fe[s]));
		if (!rm->iov[s])
			rm->iov[s] = malloc((KV_FRAME_ENTRIES + 2) * sizeof(*rm->iov[s]));
		if (!rm->fe[s] || !rm->iov[s])
			return -ENOMEM;
	}
	return 0;
}

/* Streams 0..nstreams-1: their buffers and threads (kept with the import). */
static int stream_threads(struct kv_remote *rm)
{
	int r = stream_bufs(rm, (uint32_t)rm->nstreams);

	for (int s = 0; !r && s < rm->nstreams; s++) {
		if (rm->started[s])
			continue;
		rm->wk[s] = (struct kv_worker){ rm, s };
		r = -pthread_create(&rm->tid[s], NULL, stream_worker, &rm->wk[s]);
		rm->started[s] = !r;
	}
	return r;
}

/*
 * A batch with one import. Over RDMA, or as a single frame while no batch is
 * in flight, it runs here (0 or an error); otherwise it joins the import's
 * queue for the stream threads (1: the batch posts its own completion and
 * now holds local's segment and mapping).
 */
static int run_remote(struct kd_client *c, uint64_t user_data, const struct kv_piece *p, uint32_t n,
		      bool write, struct kv_side *local, struct kd_seg *rs, uint32_t notify_id,
		      const struct kv_msgout *msg, int64_t t0, uint64_t *moved)
{
	struct kv_remote *rm = rs->rm;
	struct kv_piece *sp = NULL;
	struct kv_frame *fr = NULL;
	struct kv_batch *b;
	uint64_t nsp = 0, total = 0, fb;
	uint32_t nfr = 0;
	bool busy;
	int r;

	/* Frames small enough that a batch of a few MiB gives every stream
	 * two (a slow stream takes fewer) and little is in flight, large
	 * enough to keep per-frame costs low. A batch of up to 1 MiB is one
	 * frame: with no batch in flight and no request behind it in the
	 * ring it runs right here on stream 0 (handing a few hundred KiB to
	 * a stream thread costs more than it wins when the client waits for
	 * each batch: docs/perf/kv.md section 6). With requests behind it, it
	 * joins the queue, and so do they: run here, it would hold them in
	 * the ring until its answer, one batch at a time for good. */
	for (uint32_t i = 0; i < n; i++)
		total += p[i].len;
	fb = (total / (2 * rm->nstreams) + 4095) & ~4095ULL;
	fb = fb < KV_FRAME_MIN ? KV_FRAME_MIN : fb > KV_FRAME_CUT ? KV_FRAME_CUT : fb;
	for (uint32_t i = 0; i < n; i++)
		nsp += (p[i].len + fb - 1) / fb;
	sp = malloc((nsp ? nsp : 1) * sizeof(*sp));
	fr = malloc((nsp ? nsp : 1) * sizeof(*fr));
	if (!sp || !fr) {
		r = -ENOMEM;
		goto out;
	}
	/* Split what exceeds a frame; then fill frames in order. */
	nsp = 0;
	for (uint32_t i = 0; i < n; i++)
		for (uint64_t off = 0; off < p[i].len; off += fb) {
			uint64_t len = p[i].len - off < fb ? p[i].len - off : fb;

			sp[nsp++] = (struct kv_piece){ p[i].src + off, p[i].dst + off, len };
		}
	for (uint32_t i = 0; i < nsp; i++) {
		if (!nfr || fr[nfr - 1].n == KV_FRAME_ENTRIES ||
		    fr[nfr - 1].bytes + sp[i].len > fb)
			fr[nfr++] = (struct kv_frame){ i, 0, 0 };
		fr[nfr - 1].n++;
		fr[nfr - 1].bytes += sp[i].len;
	}
	pthread_mutex_lock(&rm->lock);
	/* Join the batches in flight if they are healthy, few enough and use
	 * the same local segment (unregistering one shuts the streams down:
	 * that must not fail another segment's batch). */
	pthread_mutex_lock(&rm->wlock);
	/* A notification waits for the queue to drain: then the batch's
	 * final frame cannot overtake an earlier batch's (in order per
	 * import). */
	while (rm->nq && (rm->broken || !nfr || msg->len || rm->nq >= KV_QUEUE_MAX ||
			  rm->q_tail->local.seg != local->seg))
		pthread_cond_wait(&rm->space, &rm->wlock);
	busy = rm->nq;
	if (!busy && rm->broken) {
		remote_close_streams(rm);	/* mid-frame state unknown: start afresh */
		rm->broken = 0;
	}
	pthread_mutex_unlock(&rm->wlock);
	if (!busy) {
		if (rm->rd && (!local->buf.direct || !fd_idle(rm->fd[0]))) {
			/* A batch from unmapped memory goes over TCP, and fd[0]
			 * is in RDMA mode on the owner's side; or the owner
			 * ended the session: start afresh either way. */
			rdma_drop(rm);
			remote_close_streams(rm);
		}
		r = remote_connect(rm);
		if (!r && msg->len && !(rm->features & KV_ACK_F_MSG))
			r = -EOPNOTSUPP;	/* an older kcolld: tell before any byte moves */
		if (!r && local->buf.direct) {
			r = rdma_ready(rm, local);
			if (r == 0) {
				r = run_rdma(c, p, n, write, local, rm, notify_id, msg, moved);
				/* A full queue is the owner's answer: the session goes on. */
				if (r && r != -ENOBUFS) {
					rdma_drop(rm);
					remote_close_streams(rm);
				}
				goto out_unlock;
			}
			r = r == 1 ? 0 : r;
		}
		if (r)
			goto out_unlock;
		/* An empty batch has nothing for the streams: here, always. */
		if (!nfr || (nfr == 1 && !c->sq_behind)) {
			struct kv_stream st = { .local = local, .sp = sp, .frames = fr, .write = write,
						.fd = rm->fd[0], .tag = ++rm->seq << 32 };
			struct kv_conn node = { .fd = rm->fd[0], .how = SHUT_RDWR, .seg = local->seg };
			uint8_t *buf = NULL;
			int ans = 0;

			r = stream_bufs(rm, 1);
			if (r)
				goto out_unlock;
			st.iov = rm->iov[0];
			st.fe = rm->fe[0];
			conn_link(local->seg, &node);
			r = !nfr ? 0 : atomic_load(&c->stop) || atomic_load(&c->dead) ? -ECANCELED :
			    stream_err(&st, frame_xchg(&st, 0, &buf));
			conn_unlink(local->seg, &node);
			free(buf);
			*moved += st.moved;
			if (!r && has_final(notify_id, msg))
				r = final_xchg(rm->fd[0], notify_id, msg, UINT32_MAX, &ans);
			if (r)
				remote_close_streams(rm);	/* mid-frame state unknown */
			r = r ? r : ans;
			goto out_unlock;
		}
	}
	r = stream_threads(rm);
	b = r ? NULL : calloc(1, sizeof(*b));
	if (!b) {
		r = r ? r : -ENOMEM;
		goto out_unlock;
	}
	*b = (struct kv_batch){ .c = c, .user_data = user_data, .local = *local, .write = write,
				.t0 = t0, .notify_id = notify_id, .sp = sp, .fr = fr, .nfr = nfr,
				.tag = ++rm->seq << 32,
				.left = nfr + has_final(notify_id, msg) };
	b->msg.sender = msg->sender;
	b->msg.len = msg->len;
	memcpy(b->msg.data, msg->data, msg->len);
	kd_client_get(c);
	local->seg = NULL;	/* the batch's now */
	local->buf = (struct kd_buf){ 0 };
	for (int s = 0; s < rm->nstreams; s++) {
		b->node[s] = (struct kv_conn){ .fd = rm->fd[s], .how = SHUT_RDWR, .seg = b->local.seg };
		conn_link(b->local.seg, &b->node[s]);
	}
	pthread_mutex_lock(&rm->wlock);
	if (rm->q_tail)
		rm->q_tail->qnext = b;
	else
		rm->q_head = b;
	rm->q_tail = b;
	rm->nq++;
	pthread_cond_broadcast(&rm->go);
	pthread_mutex_unlock(&rm->wlock);
	pthread_mutex_unlock(&rm->lock);
	return 1;
out_unlock:
	pthread_mutex_unlock(&rm->lock);
out:
	free(sp);
	free(fr);
	return r;
}

/* ---- the owner's side ---------------------------------------------------- */

/* Apply one frame to the segment; entries already range-checked. */
static int frame_apply(struct kd_seg *s, uint32_t op, const struct kv_fent *fe, uint32_t nr,
		       uint8_t *buf, uint32_t notify_id)
{
	struct kv_side side = { .seg = s };
	struct iovec liov[1], riov[KV_ROUND_IOVS];
	uint64_t at = 0;
	int r = lock_sides(&side, &side);

	if (r)
		return r;
	if (op == KV_OP_NOTIFY) {
		if (notify_id >= s->nr_notify) {
			r = -EINVAL;
		} else {
			__atomic_fetch_add(&s->counters[notify_id], 1, __ATOMIC_SEQ_CST);
			kcoll_futex_wake(&s->counters[notify_id], INT_MAX);
		}
		goto out;
	}
	kd_buf_resolve(s->owner, s->addr, s->size, &side.buf);
	for (uint32_t i = 0; i < nr && !r;) {
		uint32_t k = 0;
		size_t bytes = 0;

		for (; i < nr && k < KV_ROUND_IOVS; i++, k++) {
			if (side.buf.direct) {
				if (op == KV_OP_WRITE)
					memcpy(side.buf.direct + fe[i].off, buf + at, fe[i].len);
				else
					memcpy(buf + at, side.buf.direct + fe[i].off, fe[i].len);
			}
			riov[k] = (struct iovec){ (void *)(uintptr_t)(s->addr + fe[i].off), fe[i].len };
			at += fe[i].len;
			bytes += fe[i].len;
		}
		if (side.buf.direct)
			continue;
		liov[0] = (struct iovec){ buf + at - bytes, bytes };
		r = vm_err(op == KV_OP_WRITE ? process_vm_writev(s->pid, liov, 1, riov, k, 0) :
			   process_vm_readv(s->pid, liov, 1, riov, k, 0), bytes);
	}
	kd_buf_release(&side.buf);
out:
	unlock_sides(&side, &side);
	return r;
}

/*
 * A write frame into a mapped segment: receive it in place, under the reader
 * lock (seg_kill shuts the connection down rather than wait for a slow
 * peer). 1: done; 0: not mapped or dead, receive into the buffer instead;
 * -1: the connection failed (the frame may be partly written: the
 * initiator gets an error for the batch).
 */
static int recv_direct(struct kv_conn *cn, const struct kv_fent *fe, uint32_t nr,
		       struct iovec *iov)
{
	struct kv_side side = { .seg = cn->seg };
	int r = 0;

	if (lock_sides(&side, &side))
		return 0;
	kd_buf_resolve(cn->seg->owner, cn->seg->addr, cn->seg->size, &side.buf);
	if (side.buf.direct) {
		for (uint32_t i = 0; i < nr; i++)
			iov[i] = (struct iovec){ side.buf.direct + fe[i].off, fe[i].len };
		r = io_iovs(cn->fd, iov, nr, false) ? -1 : 1;
	}
	kd_buf_release(&side.buf);
	unlock_sides(&side, &side);
	if (r < 0 && atomic_load(&cn->seg->dead)) {
		/* Unregistered under us: say so before the connection goes. */
		struct kv_resp rs = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
					      .len = sizeof(rs) }, .status = -EIDRM, .tag = UINT64_MAX };

		send(cn->fd, &rs, sizeof(rs), MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	return r;
}

/*
 * A MSG frame (header rq already read): its notification and counter, under
 * the segment's reader lock unless the caller holds it (an RDMA session).
 * Nonzero: the stream broke or broke the framing.
 */
static int serve_msg(struct kv_conn *cn, const struct kv_req *rq, bool locked)
{
	struct kd_seg *s = cn->seg;
	struct kv_side side = { .seg = s };
	struct kv_resp rs = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
				      .len = sizeof(rs) }, .tag = rq->tag };
	uint8_t data[KCOLL_NOTIF_MAX_BYTES];
	struct kv_msg km;

	if (rq->nr || rq->hdr.len < sizeof(*rq) + sizeof(km) ||
	    io_full(cn->fd, &km, sizeof(km), false) || !km.len || km.len > KCOLL_NOTIF_MAX_BYTES ||
	    rq->hdr.len != sizeof(*rq) + sizeof(km) + km.len || io_full(cn->fd, data, km.len, false))
		return -EPROTO;
	if (locked)
		rs.status = notif_deliver(s, km.sender, rq->notify_id, data, km.len);
	else if (lock_sides(&side, &side))
		rs.status = -EIDRM;
	else {
		rs.status = notif_deliver(s, km.sender, rq->notify_id, data, km.len);
		unlock_sides(&side, &side);
	}
	return io_full(cn->fd, &rs, sizeof(rs), true);
}

/*
 * The owner's side of an RDMA session (peer asked with KV_OP_RDMA on a
 * stream whose token was checked): register the segment in a PD of this
 * connection only, answer our address, base and rkey, then serve notifies
 * (WRITE_WITH_IMM, immediate = counter) until the peer closes or the
 * segment is unregistered. The reader lock is held for the whole session:
 * the peer writes into the segment at any time. seg_kill shuts the stream
 * down (SHUT_RD); this thread wakes, moves the QP to error and deregisters
 * the region (the rkey is dead), and only then lets seg_kill return.
 * 0: refused (answered; the stream goes on over TCP); 1: session over.
 */
static int serve_rdma(struct kv_conn *cn, const struct kv_rdma_hello *peer, uint64_t tag)
{
	struct kd_seg *s = cn->seg;
	struct kv_side side = { .seg = s };
	struct kv_rdma_hello me = { 0 };
	struct kv_resp rs = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
				      .len = sizeof(rs) + sizeof(me) }, .tag = tag };
	struct kv_rdma *k = NULL;
	bool loud, locked = false, armed = false;
	int status = 0, one = 1;

	if (!kv_rdma_wanted(me.why, sizeof(me.why), &loud)) {
		status = -EOPNOTSUPP;
	} else if (lock_sides(&side, &side)) {
		status = -EIDRM;
		snprintf(me.why, sizeof(me.why), "the segment was unregistered");
	} else {
		locked = true;
		kd_buf_resolve(s->owner, s->addr, s->size, &side.buf);
		if (!side.buf.direct) {
			status = -EOPNOTSUPP;
			snprintf(me.why, sizeof(me.why), "the owner's segment is not memory kcolld maps "
				 "(register kcoll_mem_alloc'd or kcoll_mem_register'ed memory for RDMA)");
		} else {
			status = kv_rdma_create(cn->fd, side.buf.direct, s->size, true, &k, me.why,
						sizeof(me.why));
		}
		if (!status)
			status = kv_rdma_connect(k, peer, 16, me.why, sizeof(me.why));
	}
	if (status) {
		kv_rdma_destroy(k);
		kd_buf_release(&side.buf);
		if (locked)
			unlock_sides(&side, &side);
		kc_dbg("kv: segment %u: rdma refused to a peer: %s", s->id, me.why);
		rs.status = status;
		return io_full(cn->fd, &rs, sizeof(rs), true) || io_full(cn->fd, &me, sizeof(me), true);
	}
	kv_rdma_hello_fill(k, &me);
	atomic_fetch_add(&kv.rdma_sessions, 1);
	setsockopt(cn->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	if (io_full(cn->fd, &rs, sizeof(rs), true) || io_full(cn->fd, &me, sizeof(me), true))
		goto out;
	for (;;) {
		struct ibv_wc wc[16];
		int got = kv_rdma_poll(k, wc, 16);
		struct pollfd pf[2] = { { .fd = cn->fd, .events = POLLIN },
					{ .fd = kv_rdma_fd(k), .events = POLLIN } };

		if (got < 0)
			goto out;
		for (int i = 0; i < got; i++) {
			struct kv_resp nr = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
						      .len = sizeof(nr) }, .tag = UINT32_MAX };
			uint32_t id = ntohl(wc[i].imm_data);

			if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM)
				goto out;	/* the peer's QP failed: the session is over */
			if (atomic_load(&s->dead)) {
				nr.status = -EIDRM;
			} else if (id >= s->nr_notify) {
				nr.status = -EINVAL;
			} else {
				__atomic_fetch_add(&s->counters[id], 1, __ATOMIC_SEQ_CST);
				kcoll_futex_wake(&s->counters[id], INT_MAX);
			}
			if (kv_rdma_post_recv(k, wc[i].wr_id) || io_full(cn->fd, &nr, sizeof(nr), true))
				goto out;
		}
		if (got)
			continue;
		if (!armed) {	/* arm, then poll once more for what came before */
			if (kv_rdma_arm(k))
				goto out;
			armed = true;
			continue;
		}
		armed = false;
		if (poll(pf, 2, -1) < 0 && errno != EINTR)
			goto out;
		if (pf[1].revents)
			kv_rdma_ack_event(k);
		/* A notification; else the peer closed, sent what an RDMA
		 * session does not carry, or seg_kill shut the stream down:
		 * the session is over. */
		if (pf[0].revents) {
			struct kv_req rq;

			if (!(pf[0].revents & POLLIN) || io_full(cn->fd, &rq, sizeof(rq), false) ||
			    rq.hdr.magic != KD_PEER_MAGIC || rq.hdr.type != KD_P_KV_REQ ||
			    rq.op != KV_OP_MSG || serve_msg(cn, &rq, true))
				goto out;
		}
	}
out:
	kv_rdma_revoke(k);	/* the rkey is dead before the lock is released */
	kd_buf_release(&side.buf);
	unlock_sides(&side, &side);
	if (atomic_load(&s->dead)) {
		rs = (struct kv_resp){ .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
					       .len = sizeof(rs) }, .status = -EIDRM, .tag = UINT64_MAX };
		send(cn->fd, &rs, sizeof(rs), MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	kv_rdma_destroy(k);
	return 1;
}

static void *kv_serve(void *arg)
{
	struct kv_conn *cn = arg;
	struct kd_seg *s = cn->seg;
	uint8_t *buf = malloc(KV_FRAME_BYTES);
	struct kv_fent *fe = malloc(KV_FRAME_ENTRIES * sizeof(*fe));
	struct iovec *iov = malloc(KV_FRAME_ENTRIES * sizeof(*iov));

	while (buf && fe && iov) {
		struct kv_req rq;
		struct kv_resp rs = { 0 };
		uint64_t bytes = 0;
		int status = 0;

		if (io_full(cn->fd, &rq, sizeof(rq), false))
			break;
		if (rq.hdr.magic == KD_PEER_MAGIC && rq.hdr.type == KD_P_KV_REQ && rq.op == KV_OP_RDMA) {
			struct kv_rdma_hello h;

			if (rq.nr || rq.hdr.len != sizeof(rq) + sizeof(h) ||
			    io_full(cn->fd, &h, sizeof(h), false) || serve_rdma(cn, &h, rq.tag))
				break;	/* the RDMA session ended, or the stream broke */
			continue;	/* refused: the peer goes on over TCP */
		}
		if (rq.hdr.magic == KD_PEER_MAGIC && rq.hdr.type == KD_P_KV_REQ && rq.op == KV_OP_MSG) {
			if (serve_msg(cn, &rq, false))
				break;
			continue;
		}
		if (rq.hdr.magic != KD_PEER_MAGIC || rq.hdr.type != KD_P_KV_REQ ||
		    rq.op > KV_OP_NOTIFY || rq.nr > KV_FRAME_ENTRIES ||
		    io_full(cn->fd, fe, rq.nr * sizeof(*fe), false))
			break;
		for (uint32_t i = 0; i < rq.nr; i++) {
			if (fe[i].off > s->size || fe[i].len > s->size - fe[i].off)
				status = -ERANGE;
			bytes += fe[i].len;
		}
		if (bytes > KV_FRAME_BYTES ||
		    rq.hdr.len != sizeof(rq) + rq.nr * sizeof(*fe) + (rq.op == KV_OP_WRITE ? bytes : 0))
			break;	/* not our protocol: drop the connection */
		if (rq.op == KV_OP_WRITE && !status) {
			int got = recv_direct(cn, fe, rq.nr, iov);

			if (got < 0)
				break;
			if (got)
				goto answer;	/* landed in place */
		}
		if (rq.op == KV_OP_WRITE && io_full(cn->fd, buf, bytes, false))
			break;
		if (!status)
			status = frame_apply(s, rq.op, fe, rq.nr, buf, rq.notify_id);
answer:
		rs.status = status;
		rs.tag = rq.tag;
		rs.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_KV_RESP,
					   .len = sizeof(rs) + (rq.op == KV_OP_READ && !status ? bytes : 0) };
		if (io_full(cn->fd, &rs, sizeof(rs), true) ||
		    (rs.hdr.len > sizeof(rs) && io_full(cn->fd, buf, bytes, true)))
			break;
		if (!status && rq.op != KV_OP_NOTIFY)
			atomic_fetch_add(&kv.bytes, bytes);
	}
	free(buf);
	free(fe);
	free(iov);
	conn_unlink(s, cn);
	close(cn->fd);	/* only now: seg_kill must not shut down a reused number */
	seg_put(s);
	free(cn);
	return NULL;
}

void kd_kv_accept(int fd, const struct kd_p_hello *m)
{
	struct kv_ack ack = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_ACK, .len = sizeof(ack) },
			      .features = KV_ACK_F_MSG };
	struct kd_seg *s = seg_find(m->from_host);
	struct kv_conn *cn = NULL;
	pthread_attr_t attr;
	pthread_t tid;
	uint32_t next;

	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	sock_timeouts(fd, kd.timeout_ns);
	pthread_mutex_lock(&kv.lock);
	next = kv.next_id;
	pthread_mutex_unlock(&kv.lock);
	/* Our own nonce: a local client's import dressed up as another
	 * kcolld's loops back here, where only the token would be checked;
	 * same-host importers go through seg_import's uid check. */
	if (m->nonce == kd.nonce)
		ack.status = -EPERM;
	else if (!s)
		ack.status = m->from_host && m->from_host < next ? -EIDRM : -ENOENT;
	else if (!token_eq(s->token, m->token))
		ack.status = -EACCES;
	else if (!(cn = malloc(sizeof(*cn))))
		ack.status = -ENOMEM;
	/* Answer first (a fresh socket: it goes out without blocking), then
	 * the serving thread owns the fd. */
	if (send(fd, &ack, sizeof(ack), MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof(ack) && !ack.status)
		ack.status = -ECONNRESET;
	if (!ack.status) {
		cn->fd = fd;
		cn->how = SHUT_RD;	/* kv_serve may still answer -EIDRM */
		cn->seg = s;
		conn_link(s, cn);
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&tid, &attr, kv_serve, cn)) {
			ack.status = -EAGAIN;	/* the peer sees the connection close */
			/* Not necessarily the head any more: a batch of ours may
			 * have added its streams meanwhile. */
			conn_unlink(s, cn);
		}
		pthread_attr_destroy(&attr);
	}
	if (!ack.status)
		return;
	kc_dbg("kv: refused a peer's connection to segment %u: %s", m->from_host,
	       strerror(-ack.status));
	close(fd);
	free(cn);
	if (s)
		seg_put(s);
}
