// SPDX-License-Identifier: MIT
/*
 * Communicators: rendezvous of ranks (control thread), matching of the n-th
 * operation of every rank into one op (ring threads), in-order execution,
 * and failure: a member that dies, leaves or stalls fails every pending op
 * of the communicator with an error naming it, so no rank waits forever.
 *
 * comm.c sits below what runs its ops (exec.c; mh.c across hosts) and the
 * network (net.c): it hands ready ops and reaches peers only through the
 * tables they install (struct kd_comm_exec_ops, struct kd_comm_net_ops),
 * and tells the C4 detector through its hooks (c4d.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c4d.h"
#include "kcolld.h"
#include "log.h"
#include "metrics.h"
#include "mh.h"

static const struct kd_comm_exec_ops *exec_ops;
static const struct kd_comm_net_ops *net_ops;

void kd_comm_set_exec(const struct kd_comm_exec_ops *ops)
{
	exec_ops = ops;
}

void kd_comm_set_net(const struct kd_comm_net_ops *ops)
{
	net_ops = ops;
}

void kd_comm_abort_peers(struct kd_comm *comm, int err, uint32_t rank, uint32_t flags,
			 uint64_t from_seq)
{
	if (net_ops && comm->mh)
		net_ops->abort_peers(comm, err, rank, flags, from_seq);
}

/* A ready op: across hosts the comm's net thread runs it, else exec.c. */
static void op_run(struct kd_op *op)
{
	if (op->comm->mh)
		net_ops->run(op);
	else
		exec_ops->run(op);
}

static void comm_free(struct kd_comm *comm)
{
	for (uint32_t r = 0; r < comm->nranks; r++)
		if (comm->clients[r])
			kd_client_put(comm->clients[r]);
	free(comm->clients);
	free(comm->handles);
	free(comm->init_seq);
	free(comm->gone);
	free(comm->next_seq);
	pthread_mutex_destroy(&comm->lock);
	free(comm);
}

void kd_comm_put(struct kd_comm *comm)
{
	if (atomic_fetch_sub(&comm->refs, 1) == 1)
		comm_free(comm);
}

static struct kd_comm *comm_new(const struct kcoll_id *id, uint32_t nranks, uid_t uid,
				int64_t timeout_ns)
{
	struct kd_comm *comm = calloc(1, sizeof(*comm));

	if (!comm)
		return NULL;
	comm->clients = calloc(nranks, sizeof(*comm->clients));
	comm->handles = calloc(nranks, sizeof(*comm->handles));
	comm->init_seq = calloc(nranks, sizeof(*comm->init_seq));
	comm->gone = calloc(nranks, sizeof(*comm->gone));
	comm->next_seq = calloc(nranks, sizeof(*comm->next_seq));
	if (!comm->clients || !comm->handles || !comm->init_seq || !comm->gone || !comm->next_seq) {
		comm_free(comm);
		return NULL;
	}
	pthread_mutex_init(&comm->lock, NULL);
	memcpy(comm->token, id->token, sizeof(comm->token));
	for (int i = 0; i < 8; i++)
		sprintf(comm->name + 2 * i, "%02x", id->token[i]);
	comm->uid = uid;
	comm->nranks = nranks;
	comm->timeout_ns = timeout_ns;
	comm->deadline_ns = kd_now_ns() + timeout_ns;
	comm->state = KD_COMM_FORMING;
	comm->limit_seq = UINT64_MAX;
	comm->nlocal = nranks;
	atomic_init(&comm->refs, 1);	/* the daemon's list */
	return comm;
}

static void reply_init(struct kd_client *c, uint32_t seq, int status, uint32_t handle, const char *err,
		       const struct kd_comm *comm)
{
	const struct kd_mh *mh = comm ? comm->mh : NULL;
	struct kcoll_msg_comm_init_reply rep = {
		.hdr = { .magic = KCOLL_PROTO_MAGIC, .type = KCOLL_MSG_COMM_INIT,
			 .len = sizeof(rep), .seq = seq, .status = status },
		.comm_id = handle,
		.nhosts = mh ? mh->nhosts : 1,
		.self_host = mh ? mh->self : 0,
		.lane_bytes = mh ? mh->lane_bytes : 0,
		.timeout_ms = comm ? (uint32_t)(comm->timeout_ns / 1000000) : 0,
	};

	if (err)
		snprintf(rep.error, sizeof(rep.error), "%s", err);
	if (!atomic_load(&c->dead) && kcoll_msg_send(c->sock, &rep, sizeof(rep), -1))
		kd_client_kill(c, "cannot send the communicator reply (client not reading its socket)");
}

/* Control thread: a forming communicator failed; tell every joined rank. */
void kd_comm_form_fail(struct kd_comm *comm, int err, const char *msg)
{
	struct kd_client **who = calloc(comm->nranks, sizeof(*who));
	uint32_t *handle = calloc(comm->nranks, sizeof(*handle));
	uint32_t *seq = calloc(comm->nranks, sizeof(*seq));

	if (!who || !handle || !seq)
		abort();	/* a few bytes; nothing sensible to do without them */
	pthread_mutex_lock(&comm->lock);
	if (comm->state != KD_COMM_FORMING) {
		pthread_mutex_unlock(&comm->lock);
		free(who);
		free(handle);
		free(seq);
		return;
	}
	comm->state = KD_COMM_ABORTED;
	comm->abort_err = err;
	comm->limit_seq = 0;
	for (uint32_t r = 0; r < comm->nranks; r++) {
		if (comm->clients[r] && !comm->gone[r]) {
			who[r] = comm->clients[r];
			kd_client_get(who[r]);
			handle[r] = comm->handles[r];
			seq[r] = comm->init_seq[r];
		}
		comm->gone[r] = true;
	}
	pthread_mutex_unlock(&comm->lock);
	kc_info("comm %s: not formed: %s", comm->name, msg);
	for (uint32_t r = 0; r < comm->nranks; r++) {
		struct kd_client *c = who[r];
		bool drop = false;

		if (!c)
			continue;
		reply_init(c, seq[r], err, 0, msg, NULL);
		pthread_mutex_lock(&c->lock);
		if (c->members[handle[r] - 1].comm == comm) {
			c->members[handle[r] - 1].comm = NULL;
			drop = true;
		}
		pthread_mutex_unlock(&c->lock);
		if (drop)
			kd_comm_put(comm);
		kd_client_put(c);
	}
	free(who);
	free(handle);
	free(seq);
}

int kd_comm_join(struct kd_client *c, const struct kcoll_msg_comm_init *m, const char **why)
{
	const struct kcoll_id *id = &m->id;
	struct kd_comm *comm;
	uint32_t slot;
	int64_t timeout_ns = m->timeout_ms ? (int64_t)m->timeout_ms * 1000000 :
			     __atomic_load_n(&kd.timeout_ns, __ATOMIC_RELAXED);

	if (id->magic != KCOLL_PROTO_MAGIC || id->version != KCOLL_PROTO_VERSION) {
		*why = "not a kcoll unique id (get one with kcoll_get_unique_id)";
		return -EINVAL;
	}
	if (!m->nranks || m->nranks > KD_MAX_RANKS || m->rank >= m->nranks) {
		*why = "rank or nranks out of range (1..256 ranks per host)";
		return -EINVAL;
	}
	pthread_mutex_lock(&c->lock);
	for (slot = 0; slot < KD_MAX_COMMS && c->members[slot].comm; slot++)
		;
	pthread_mutex_unlock(&c->lock);
	if (slot == KD_MAX_COMMS) {
		*why = "too many communicators on this connection";
		return -EMFILE;
	}
	for (comm = kd.comms; comm; comm = comm->next)
		if (comm->state != KD_COMM_ABORTED && !memcmp(comm->token, id->token, sizeof(id->token)))
			break;
	if (comm) {
		if (comm->uid != c->uid) {
			*why = "the communicator belongs to another user";
			return -EPERM;
		}
		if (comm->nranks != m->nranks) {
			*why = "nranks differs from the ranks that already joined";
			return -EINVAL;
		}
		if (comm->state != KD_COMM_FORMING || comm->clients[m->rank]) {
			*why = "this rank already joined the communicator";
			return -EEXIST;
		}
	} else {
		comm = comm_new(id, m->nranks, c->uid, timeout_ns);
		if (!comm) {
			*why = "out of memory";
			return -ENOMEM;
		}
		comm->next = kd.comms;
		kd.comms = comm;
	}

	pthread_mutex_lock(&comm->lock);
	kd_client_get(c);
	comm->clients[m->rank] = c;
	comm->handles[m->rank] = slot + 1;
	comm->init_seq[m->rank] = m->hdr.seq;
	comm->joined++;
	atomic_fetch_add(&comm->refs, 1);	/* the membership's */
	pthread_mutex_unlock(&comm->lock);
	pthread_mutex_lock(&c->lock);
	c->members[slot].comm = comm;
	c->members[slot].rank = m->rank;
	pthread_mutex_unlock(&c->lock);
	kc_dbg("comm %s: rank %u/%u joined (client %u)", comm->name, m->rank, m->nranks, c->id);

	/* The id's root daemon learns where every rank is; once all are
	 * placed, the comm is activated (kd_comm_activate), maybe right here. */
	int r = -ENOTCONN;

	if (net_ops)
		r = net_ops->join(comm, id, m->rank, m->flags, why);
	else
		*why = "this kcolld runs without its network part";

	if (r < 0) {
		kd_comm_form_fail(comm, r, *why);
		return 1;	/* answered (with the error) by kd_comm_form_fail */
	}
	return 1;
}

void kd_comm_activate(struct kd_comm *comm)
{
	pthread_mutex_lock(&comm->lock);
	if (comm->state != KD_COMM_FORMING) {
		pthread_mutex_unlock(&comm->lock);
		return;
	}
	comm->state = KD_COMM_ACTIVE;
	pthread_mutex_unlock(&comm->lock);
	if (comm->mh)
		kc_info("comm %s: formed with %u ranks on %u hosts (%u here)", comm->name, comm->nranks,
			comm->mh->nhosts, comm->nlocal);
	else
		kc_info("comm %s: formed with %u ranks", comm->name, comm->nranks);
	for (uint32_t r = 0; r < comm->nranks; r++)
		if (comm->clients[r])
			reply_init(comm->clients[r], comm->init_seq[r], 0, comm->handles[r], NULL, comm);
}

void kd_op_fail(struct kd_op *op, int err, uint32_t err_rank, uint32_t flags)
{
	int expected = 0;

	atomic_compare_exchange_strong(&op->err, &expected, err);
	if (!expected) {
		atomic_store(&op->err_rank, err_rank);
		op->cqe_flags = flags;
	}
}

static void op_release(struct kd_op *op)
{
	for (uint32_t r = 0; r < op->comm->nranks; r++) {
		struct kd_contrib *ct = &op->c[r];

		if (!ct->present)
			continue;
		kd_buf_release(&ct->sbuf);
		kd_buf_release(&ct->rbuf);
		kd_client_put(ct->client);
	}
	kd_comm_put(op->comm);
	free(op);
}

/* Post the op's result to every rank that contributed, then free it. */
static void op_post(struct kd_op *op, int cancel_rank)
{
	int err = atomic_load(&op->err);
	uint32_t err_rank = err ? atomic_load(&op->err_rank) : KCOLL_RANK_NONE;
	uint64_t bytes = 0;

	if (err)
		atomic_fetch_add(&kd.stats.ops_failed, 1);
	else
		atomic_fetch_add(&kd.stats.ops_ok, 1);
	for (uint32_t r = 0; r < op->comm->nranks; r++) {
		struct kd_contrib *ct = &op->c[r];

		if (!ct->present)
			continue;
		kd_client_post(ct->client, ct->user_data, (int)r == cancel_rank ? -ECANCELED : err,
			       err ? 0 : ct->rbuf.len, err_rank, err ? op->cqe_flags : 0);
		if (!err)
			bytes += ct->rbuf.len;
	}
	atomic_fetch_add(&kd.stats.bytes, bytes);
	kd_metrics_op(op->opcode, err, bytes, kd_now_ns() - op->first_ns);
	op_release(op);
}

/* With comm->lock held: the next op if it may start now (removed from pending). */
static struct kd_op *next_runnable(struct kd_comm *comm)
{
	struct kd_op *op = comm->pending;

	if (!op || !op->ready || op->seq != comm->exec_seq)
		return NULL;
	comm->pending = op->next;
	op->next = NULL;
	return op;
}

/* Is rank r one of this host's? (Joined here; multi-host comms have others.) */
static bool is_local(const struct kd_comm *comm, uint32_t r)
{
	return comm->clients[r] != NULL;
}

/* The first local rank that did not contribute to op, or KCOLL_RANK_NONE. */
static uint32_t first_missing(const struct kd_comm *comm, const struct kd_op *op)
{
	for (uint32_t r = 0; r < comm->nranks; r++)
		if (is_local(comm, r) && !op->c[r].present)
			return r;
	return KCOLL_RANK_NONE;
}

/* Fail every op not yet started from seq from on. With comm->lock held;
 * returns the list. */
static struct kd_op *fail_pending(struct kd_comm *comm, uint64_t from, int err, uint32_t rank,
				  uint32_t flags, bool missing)
{
	struct kd_op **pp = &comm->pending, *list;

	while (*pp && (*pp)->seq < from)
		pp = &(*pp)->next;
	list = *pp;
	*pp = NULL;
	for (struct kd_op *op = list; op; op = op->next) {
		uint32_t blame = missing ? first_missing(comm, op) : KCOLL_RANK_NONE;

		/* Name a rank that did not contribute to this very op if we know one. */
		kd_op_fail(op, err, blame != KCOLL_RANK_NONE ? blame : rank,
			   blame != KCOLL_RANK_NONE ? KCOLL_CQE_F_MISSING : flags);
	}
	return list;
}

static void post_list(struct kd_op *list, int cancel_rank)
{
	while (list) {
		struct kd_op *next = list->next;

		op_post(list, cancel_rank);
		list = next;
	}
}

bool kd_comm_abort(struct kd_comm *comm, int err, uint32_t rank, uint32_t flags, uint64_t from_seq)
{
	struct kd_op *failed;

	pthread_mutex_lock(&comm->lock);
	if (comm->state == KD_COMM_FORMING || comm->limit_seq <= from_seq) {
		pthread_mutex_unlock(&comm->lock);
		return false;
	}
	comm->state = KD_COMM_ABORTED;
	comm->left = flags & KD_ABORT_F_LEFT;
	flags &= ~KD_ABORT_F_LEFT;
	comm->limit_seq = from_seq;
	comm->abort_err = err;
	comm->abort_rank = rank;
	comm->abort_flags = flags;
	failed = fail_pending(comm, from_seq, err, rank, flags, false);
	pthread_mutex_unlock(&comm->lock);
	post_list(failed, -1);
	if (comm->mh)
		net_ops->wake(comm->mh);
	return true;
}

void kd_comm_submitted(struct kd_comm *comm, uint64_t seq, uint64_t bits[4])
{
	memset(bits, 0, 4 * sizeof(bits[0]));
	pthread_mutex_lock(&comm->lock);
	for (uint32_t r = 0; r < comm->nranks; r++)
		if (is_local(comm, r) && comm->next_seq[r] > seq)
			bits[r / 64] |= 1ULL << (r % 64);
	pthread_mutex_unlock(&comm->lock);
}

void kd_comm_member_gone(struct kd_comm *comm, uint32_t rank, int err)
{
	struct kd_op *failed = NULL;
	bool forming;
	int op_err = err == -ECANCELED ? -ECONNRESET : err;
	uint32_t culprit = rank, flags = err == -ECANCELED ? KD_ABORT_F_LEFT : 0;
	uint64_t from = 0;

	pthread_mutex_lock(&comm->lock);
	forming = comm->state == KD_COMM_FORMING;
	comm->gone[rank] = true;
	if (!forming) {
		/* Single host: nothing more runs. Multi-host: what ran, ran; the op
		 * the net thread runs now and every later one fail, here and on
		 * every peer (they learn from_seq with the abort). */
		from = comm->mh ? comm->exec_seq : 0;
		if (comm->limit_seq > from) {
			comm->state = KD_COMM_ABORTED;
			comm->left = err == -ECANCELED;
			comm->limit_seq = from;
			comm->abort_err = op_err;
			comm->abort_rank = rank;
			comm->abort_flags = 0;
			if (err == -ECANCELED)
				kc_dbg("comm %s: rank %u left; the communicator ends here", comm->name, rank);
			else
				kc_info("comm %s: rank %u died; failing its pending operations", comm->name,
					rank);
		}
		failed = fail_pending(comm, 0, op_err, rank, 0, false);
		if (comm->abort_rank != rank && comm->limit_seq <= from && err == -ECANCELED) {
			/* It leaves a communicator that failed before: a peer that has
			 * not heard of that failure yet must learn its cause, not take
			 * the leaver for the culprit. */
			op_err = comm->abort_err;
			culprit = comm->abort_rank;
			flags |= comm->abort_flags;
			from = comm->limit_seq;
		}
	}
	pthread_mutex_unlock(&comm->lock);
	if (forming) {
		char msg[96];

		snprintf(msg, sizeof(msg), "rank %u left or died before the communicator formed", rank);
		kd_comm_form_fail(comm, -ECONNRESET, msg);
		return;
	}
	post_list(failed, err == -ECANCELED ? (int)rank : -1);
	if (comm->mh) {
		net_ops->wake(comm->mh);
		/*
		 * Tell the peers even when the comm already ended earlier
		 * (another host left first, so nothing was lowered here): a
		 * peer still finishing an op that this host did its part in
		 * must take our connections closing next for a goodbye from
		 * op `from` on, not for a death that fails the op it runs.
		 */
		kd_comm_abort_peers(comm, op_err, culprit, flags, from);
	}
}

int kd_comm_destroy(struct kd_client *c, uint32_t handle)
{
	struct kd_comm *comm;
	uint32_t rank;

	if (!handle || handle > KD_MAX_COMMS)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	comm = c->members[handle - 1].comm;
	rank = c->members[handle - 1].rank;
	c->members[handle - 1].comm = NULL;
	pthread_mutex_unlock(&c->lock);
	if (!comm)
		return -ENOENT;
	kd_comm_member_gone(comm, rank, -ECANCELED);
	kd_comm_put(comm);
	return 0;
}

/*
 * COMM_LANE: hand the rank its communicator's lane to 'host' (once; kcolld
 * keeps no copy, so the connection lives exactly as long as the rank holds
 * it). Control thread, like the lanes' arrival.
 */
int kd_comm_take_lane(struct kd_client *c, uint32_t handle, uint32_t host, int *fd)
{
	struct kd_comm *comm;
	struct kd_mh *mh;

	*fd = -1;
	if (!handle || handle > KD_MAX_COMMS)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	comm = c->members[handle - 1].comm;
	pthread_mutex_unlock(&c->lock);
	if (!comm)
		return -ENOENT;
	pthread_mutex_lock(&comm->lock);
	mh = comm->state == KD_COMM_ACTIVE ? comm->mh : NULL;
	if (!mh || !mh->lane_bytes || host >= mh->nhosts || host == mh->self) {
		pthread_mutex_unlock(&comm->lock);
		return -EINVAL;
	}
	*fd = mh->hosts[host].lane;
	mh->hosts[host].lane = -1;
	pthread_mutex_unlock(&comm->lock);
	return *fd >= 0 ? 0 : -EALREADY;
}

/* Ring thread: one collective SQE and kd_sqe_check's verdict on it. */
static void comm_submit(struct kd_client *c, const struct kcoll_sqe *sqe, int err,
			const char *why)
{
	const struct kcoll_sqe_coll *a = &sqe->coll;
	uint32_t handle = a->comm_id, rank;
	uint64_t sbytes = 0, rbytes = 0;
	struct kd_comm *comm = NULL;
	struct kd_op *op, **pp, *run;

	if (handle && handle <= KD_MAX_COMMS) {
		pthread_mutex_lock(&c->lock);
		comm = c->members[handle - 1].comm;
		rank = c->members[handle - 1].rank;
		if (comm)
			atomic_fetch_add(&comm->refs, 1);	/* the op's, or dropped below */
		pthread_mutex_unlock(&c->lock);
	}
	if (!comm) {
		kd_client_post(c, sqe->user_data, -EINVAL, 0, KCOLL_RANK_NONE, 0);
		return;
	}
	if (!err)
		err = kd_coll_sizes(sqe, comm->nranks, rank, &sbytes, &rbytes);

	pthread_mutex_lock(&comm->lock);
	if (comm->state == KD_COMM_FORMING || comm->next_seq[rank] >= comm->limit_seq) {
		/* Forming: the client has no comm_id yet, only a forged one gets here. */
		bool forming = comm->state == KD_COMM_FORMING;
		int abort_err = forming ? -EINVAL : comm->abort_err ? comm->abort_err : -ECONNRESET;
		uint32_t abort_rank = forming ? KCOLL_RANK_NONE : comm->abort_rank;
		uint32_t abort_flags = forming ? 0 : comm->abort_flags;

		if (!forming)
			comm->next_seq[rank]++;	/* its place in the sequence is used up */
		pthread_mutex_unlock(&comm->lock);
		kd_client_post(c, sqe->user_data, abort_err, 0, abort_rank, abort_flags);
		kd_comm_put(comm);
		return;
	}
	uint64_t seq = comm->next_seq[rank]++;

	if (kd_c4)
		kd_c4->submitted(comm, rank, seq);

	for (pp = &comm->pending; *pp && (*pp)->seq < seq; pp = &(*pp)->next)
		;
	op = *pp;
	if (!op || op->seq != seq) {
		op = calloc(1, sizeof(*op) + comm->nranks * sizeof(op->c[0]));
		if (!op) {
			comm->next_seq[rank]--;
			pthread_mutex_unlock(&comm->lock);
			kd_client_post(c, sqe->user_data, -ENOMEM, 0, KCOLL_RANK_NONE, 0);
			kd_comm_put(comm);
			return;
		}
		op->comm = comm;
		op->seq = seq;
		op->opcode = sqe->opcode;
		op->dtype = a->dtype;
		op->redop = a->redop;
		op->count = a->count;
		op->root = a->root;
		op->first_ns = kd_now_ns();
		op->next = *pp;
		*pp = op;
	} else {
		kd_comm_put(comm);	/* the op already holds one */
	}
	if (err) {
		kc_dbg("comm %s: rank %u op %llu invalid: %s", comm->name, rank,
		       (unsigned long long)seq, why);
		kd_op_fail(op, err, rank, 0);
	} else if (op->opcode != sqe->opcode || op->dtype != a->dtype || op->redop != a->redop ||
		   op->count != a->count || op->root != a->root) {
		kc_dbg("comm %s: rank %u op %llu disagrees with the other ranks", comm->name, rank,
		       (unsigned long long)seq);
		kd_op_fail(op, -EBADMSG, rank, 0);
	}
	kd_client_get(c);
	op->c[rank].client = c;
	op->c[rank].user_data = sqe->user_data;
	op->c[rank].send = a->send_addr;
	op->c[rank].recv = a->recv_addr;
	op->c[rank].send_mem = a->send_mem;
	op->c[rank].recv_mem = a->recv_mem;
	op->c[rank].sbuf.len = sbytes;
	op->c[rank].rbuf.len = rbytes;
	op->c[rank].present = true;
	if (++op->arrived == comm->nlocal)
		op->ready = true;
	run = next_runnable(comm);
	pthread_mutex_unlock(&comm->lock);
	if (run)
		op_run(run);
}

struct kd_op *kd_comm_op_done(struct kd_op *op)
{
	struct kd_comm *comm = op->comm;
	struct kd_op *next;

	pthread_mutex_lock(&comm->lock);
	comm->exec_seq++;
	atomic_fetch_add(&comm->ops_done, 1);
	if (kd_c4)
		kd_c4->completed(comm, op);
	next = next_runnable(comm);
	pthread_mutex_unlock(&comm->lock);
	op_post(op, -1);
	return next;
}

void kd_comm_watchdog(int64_t now)
{
	struct kd_comm **pp = &kd.comms, *comm;

	while ((comm = *pp)) {
		struct kd_op *failed = NULL;
		bool forming_expired = false, done;
		uint64_t timed_out_seq = UINT64_MAX;
		uint32_t missing = KCOLL_RANK_NONE;

		pthread_mutex_lock(&comm->lock);
		if (comm->state == KD_COMM_FORMING && now > comm->deadline_ns) {
			forming_expired = true;
		} else if (comm->state != KD_COMM_FORMING && comm->pending && !comm->pending->ready &&
			   comm->pending->seq == comm->exec_seq && comm->pending->seq < comm->limit_seq &&
			   now - comm->pending->first_ns > comm->timeout_ns) {
			struct kd_op *op = comm->pending;

			missing = first_missing(comm, op);
			timed_out_seq = op->seq;
			comm->state = KD_COMM_ABORTED;
			comm->limit_seq = op->seq;
			comm->abort_err = -ETIMEDOUT;
			comm->abort_rank = missing;
			comm->abort_flags = KCOLL_CQE_F_MISSING;
			kc_warn("comm %s: op %llu timed out: rank %u never submitted it", comm->name,
				(unsigned long long)op->seq, missing);
			failed = fail_pending(comm, 0, -ETIMEDOUT, missing, KCOLL_CQE_F_MISSING, true);
		}
		/* An aborted communicator goes once no member is left in it. */
		done = false;
		if (comm->state == KD_COMM_ABORTED) {
			done = true;
			for (uint32_t r = 0; r < comm->nranks; r++)
				if (!comm->gone[r] && comm->clients[r])
					done = false;
		}
		pthread_mutex_unlock(&comm->lock);
		post_list(failed, -1);
		if (timed_out_seq != UINT64_MAX && comm->mh)
			kd_comm_abort_peers(comm, -ETIMEDOUT, missing, KCOLL_CQE_F_MISSING,
					    timed_out_seq);
		if (forming_expired) {
			char msg[128];
			int n = snprintf(msg, sizeof(msg), "timed out waiting for ranks:");

			if (comm->boot || comm->registered) {
				snprintf(msg, sizeof(msg), "timed out: not every rank joined (the root "
					 "daemon that issued the id knows which)");
			} else {
				for (uint32_t r = 0; r < comm->nranks && n < (int)sizeof(msg) - 12; r++)
					if (!comm->clients[r])
						n += snprintf(msg + n, sizeof(msg) - n, " %u", r);
			}
			kd_comm_form_fail(comm, -ETIMEDOUT, msg);
			done = true;
		}
		if (done) {
			if (net_ops)
				net_ops->close(comm);
			*pp = comm->next;
			kd_comm_put(comm);
			continue;
		}
		pp = &comm->next;
	}
}

/* The client is closing: leave its communicators (kd_client_close). */
static void comm_client_closing(struct kd_client *c)
{
	for (uint32_t i = 0; i < KD_MAX_COMMS; i++) {
		struct kd_comm *comm;
		uint32_t rank;

		pthread_mutex_lock(&c->lock);
		comm = c->members[i].comm;
		rank = c->members[i].rank;
		c->members[i].comm = NULL;
		pthread_mutex_unlock(&c->lock);
		if (comm) {
			kd_comm_member_gone(comm, rank, -ECONNRESET);
			kd_comm_put(comm);
		}
	}
}

const struct kd_client_ops kd_comm_client_ops = {
	.name = "comm",
	.op_first = KCOLL_OP_ALLREDUCE,
	.op_last = KCOLL_OP_BARRIER,
	.submit = comm_submit,
	.closing = comm_client_closing,
};
