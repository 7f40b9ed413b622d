// SPDX-License-Identifier: MIT
/*
 * KV-cache segments (docs/kv.md): the daemon's registry of them, their
 * descriptors, import handles and the client-facing segment requests of the
 * control socket (SEG_REG, SEG_IMPORT, SEG_NOTIFS, SEG_UNREG, SEG_CLOSE).
 * Batches are elsewhere: kv_local.c (same host), kv_send.c (to another
 * kcolld), kv_serve.c (from one); kv_int.h is what they share.
 *
 * A segment is a client buffer registered by SEG_REG: it gets a daemon-wide
 * id, a random token and optional notify counters (a sealed memfd the owner
 * maps read-only and futex-waits on). SEG_IMPORT turns a descriptor into an
 * import handle after checking the daemon instance, the id, the token and
 * the importer's uid; another kcolld's descriptor becomes a remote import
 * (kv_send.c), its token checked there on the first transfer.
 *
 * Every copy round holds the segments' rwlocks as a reader (kv_lock_sides);
 * unregistering takes the writer side after marking the segment dead, so
 * once SEG_UNREG (or the owner's death) returns no transfer touches that
 * memory again, and the initiator's request fails with -EIDRM. The batch
 * files reach a segment's memory through kv_side_resolve (mapped) or its
 * owner's pid (kv_vm_err says why a process_vm_* call fell short).
 *
 * Lock order: kv_state.lock (table) is never held while taking a segment
 * rwlock; client->lock guards client->kv (the import table).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kcoll/futex.h>

#include "kv_int.h"
#include "log.h"
#include "metrics.h"
#include "net.h"

#define KV_MAX_SEGS		65536	/* per daemon */

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

	if (m->flags & ~(KCOLL_MSG_SEG_F_GRANT_UID | KCOLL_MSG_SEG_F_DEVICE) || m->reserved) {
		*why = "unknown flags or non-zero reserved field";
		return -EINVAL;
	}
	if (!m->addr || !m->size || m->size > KD_MAX_BYTES || m->addr + m->size < m->addr) {
		*why = "empty, NULL, too large or wrapping buffer";
		return -EINVAL;
	}
	if (m->flags & KCOLL_MSG_SEG_F_DEVICE) {
		/* kcolld reaches device memory only through the CUDA IPC
		 * mapping of an allocation the client registered first. */
		struct kd_buf b;
		bool in;

		kd_buf_resolve_kind(c, m->addr, m->size, KCOLL_MEM_DEVICE, &b);
		in = b.rg != NULL;
		kd_buf_release(&b);
		if (!in) {
			*why = "device segment outside every device allocation registered with "
			       "this kcolld (kcoll_seg_register registers it: call that, not the "
			       "raw message)";
			return -EFAULT;
		}
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
	s->dev = m->flags & KCOLL_MSG_SEG_F_DEVICE;
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
	pthread_mutex_lock(&kv_state.lock);
	if (kv_state.nsegs >= KV_MAX_SEGS || kv_state.next_id == UINT32_MAX) {
		pthread_mutex_unlock(&kv_state.lock);
		*why = "too many segments in this kcolld";
		r = -ENOSPC;
		goto err_counters;
	}
	s->id = kv_state.next_id++;
	s->next = kv_state.segs;
	kv_state.segs = s;
	kv_state.nsegs++;
	kd_metrics_kv_seg(s->dev, 1);
	pthread_mutex_unlock(&kv_state.lock);
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

	pthread_mutex_lock(&kv_state.lock);
	for (pp = &kv_state.segs; *pp; pp = &(*pp)->next) {
		if ((*pp)->id == id && (!c || (*pp)->owner == c)) {
			s = *pp;
			*pp = s->next;
			kv_state.nsegs--;
			kd_metrics_kv_seg(s->dev, -1);
			break;
		}
	}
	pthread_mutex_unlock(&kv_state.lock);
	return s;
}

static int seg_unregister(struct kd_client *c, uint32_t id)
{
	struct kd_seg *s = seg_unlink(c, id);

	if (!s)
		return -ENOENT;
	seg_kill(s);
	kv_seg_put(s);
	return 0;
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
		r = kv_remote_import(w, &s);
		if (r) {
			*why = r == -EREMOTE ? "the descriptor names no reachable address "
					       "(another kcolld without a listener)" : "out of memory";
			return r;
		}
		goto add;
	}
	pthread_mutex_lock(&kv_state.lock);
	next = kv_state.next_id;
	pthread_mutex_unlock(&kv_state.lock);
	s = kv_seg_find(w->seg_id);
	if (!s) {
		*why = w->seg_id && w->seg_id < next ?
			"the segment was unregistered (the descriptor expired)" : "no such segment";
		return w->seg_id && w->seg_id < next ? -EIDRM : -ENOENT;
	}
	if (!kv_token_eq(s->token, w->token)) {
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
					   (atomic_fetch_add(&kv_state.next_sender, 1) + 1);
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
	kv_seg_put(s);
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
	kv_seg_put(s);
	return 0;
}

/* The owner takes up to m->max of its segment's notifications. */
static int seg_notifs(struct kd_client *c, const struct kcoll_msg_seg_notifs *m,
		      struct kcoll_msg_seg_notifs_reply *rep, size_t *reply_len, const char **why)
{
	struct kd_seg *s = kv_seg_find(m->id);

	if (!s || s->owner != c) {
		*why = "not a segment this client registered";
		if (s)
			kv_seg_put(s);
		return -ENOENT;
	}
	if (!m->max || m->max > KCOLL_SEG_NOTIFS_PER_MSG) {
		kv_seg_put(s);
		*why = "max must be 1..KCOLL_SEG_NOTIFS_PER_MSG";
		return -EINVAL;
	}
	rep->nr = kv_notifq_take(&s->notifs, rep->rec, m->max, &rep->left);
	*reply_len += (size_t)rep->nr * sizeof(rep->rec[0]);
	kv_seg_put(s);
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
	pthread_mutex_lock(&kv_state.lock);
	for (pp = &kv_state.segs; *pp;) {
		s = *pp;
		if (s->owner == c) {
			*pp = s->next;
			kv_state.nsegs--;
			kd_metrics_kv_seg(s->dev, -1);
			s->next = dead;
			dead = s;
		} else {
			pp = &s->next;
		}
	}
	pthread_mutex_unlock(&kv_state.lock);
	while (dead) {
		s = dead;
		dead = s->next;
		seg_kill(s);
		kv_seg_put(s);
	}
	if (!c->kv)
		return;
	for (uint32_t i = 0; i < KV_MAX_IMPORTS; i++)
		if (c->kv->imports[i])
			kv_seg_put(c->kv->imports[i]);
	free(c->kv);
	c->kv = NULL;
}

size_t kd_kv_render(char *buf, size_t cap, int json)
{
	uint32_t nsegs, dev_segs;
	uint64_t dev_bytes;
	int n;

	pthread_mutex_lock(&kv_state.lock);
	nsegs = kv_state.nsegs;
	pthread_mutex_unlock(&kv_state.lock);
	kd_metrics_kv_dev_get(&dev_segs, &dev_bytes);
	if (json)
		n = snprintf(buf, cap, "\"kv\":{\"segments\":%u,\"xfers_ok\":%lu,\"xfers_failed\":%lu,"
			     "\"bytes\":%lu,\"rdma_bytes\":%lu,\"rdma_sessions\":%lu,\"notifs\":%lu,"
			     "\"notif_bytes_queued\":%lu,\"dev_segments\":%u,\"dev_bytes\":%lu}", nsegs,
			     atomic_load(&kv_state.xfers_ok), atomic_load(&kv_state.xfers_failed),
			     atomic_load(&kv_state.bytes),
			     atomic_load(&kv_state.rdma_bytes), atomic_load(&kv_state.rdma_sessions),
			     atomic_load(&kv_state.notifs), (unsigned long)kv_notif_bytes(),
			     dev_segs, (unsigned long)dev_bytes);
	else
		n = snprintf(buf, cap, "kv: %u segments (%u in GPU memory), %lu transfers ok, %lu "
			     "failed, %lu bytes (%lu sent over rdma, %lu rdma sessions served, %lu "
			     "copied to or from GPU memory)\n",
			     nsegs, dev_segs, atomic_load(&kv_state.xfers_ok),
			     atomic_load(&kv_state.xfers_failed), atomic_load(&kv_state.bytes),
			     atomic_load(&kv_state.rdma_bytes), atomic_load(&kv_state.rdma_sessions),
			     (unsigned long)dev_bytes);
	return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}
