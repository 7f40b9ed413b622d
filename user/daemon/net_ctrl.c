// SPDX-License-Identifier: MIT
/*
 * A formed communicator's control connections: ABORT, QUERY/ANSWER and the
 * C4 messages (handed to c4d.c through struct kd_c4_hooks), a peer daemon
 * lost, the watchdog and the communicator's teardown.
 *
 * Faults: a CTRL connection that breaks without an ABORT first means the
 * peer daemon died: the comm fails naming a rank of that host. An ABORT
 * names the culprit and the first op that fails. An op that hangs longer
 * than the comm's timeout opens a query round: every peer says which of its
 * ranks submitted the op, and the first rank that did not is named.
 *
 * net.c reads the connections and calls in; calls net_boot.c (the
 * watchdog's bootstrap deadlines) and net_conn.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "c4d.h"
#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "net.h"
#include "net_int.h"
#include "step.h"
#include "xport.h"

/* ---- control -------------------------------------------------------------- */

void kd_net_abort_peers(struct kd_comm *comm, int err, uint32_t rank, uint32_t flags,
			uint64_t from_seq)
{
	struct kd_mh *mh = comm->mh;
	struct kd_p_abort m = { .err = err, .rank = rank, .flags = flags, .from_seq = from_seq };

	if (!mh)
		return;
	for (uint32_t h = 0; h < mh->nhosts; h++)
		if (h != mh->self && mh->hosts[h].ctrl && !mh->hosts[h].dead)
			net_pc_send(mh->hosts[h].ctrl, &m, KD_P_ABORT, sizeof(m));
}

static const char *host_name(const struct kd_mh *mh, uint32_t h)
{
	return h < mh->nhosts ? mh->hosts[h].info.name : "?";
}

/* A peer daemon is gone (its control connection broke without an ABORT). */
void net_host_lost(struct kd_comm *comm, uint32_t h)
{
	struct kd_mh *mh = comm->mh;
	struct kd_mh_host *hh = &mh->hosts[h];
	uint64_t from;

	if (hh->dead)
		return;
	hh->dead = true;
	pthread_mutex_lock(&comm->lock);
	from = comm->exec_seq;
	pthread_mutex_unlock(&comm->lock);
	if (kd_comm_abort(comm, -ECONNRESET, hh->first_rank, 0, from)) {
		kc_warn("comm %s: lost host %u (%s, ranks %u..%u): its kcolld died or the network "
			"failed; failing op %llu and later ones", comm->name, h, hh->info.name,
			hh->first_rank, hh->first_rank + hh->nranks - 1, (unsigned long long)from);
		kd_net_abort_peers(comm, -ECONNRESET, hh->first_rank, 0, from);
	}
}

void net_on_ctrl(struct kd_pconn *pc, const struct kd_phdr *h)
{
	struct kd_comm *comm = pc->comm;
	struct kd_mh *mh = comm->mh;
	struct kd_mh_host *hh = &mh->hosts[pc->host];

	switch (h->type) {
	case KD_P_ABORT: {
		const struct kd_p_abort *m = (const void *)h;

		if (h->len < sizeof(*m))
			break;
		int err = m->err < 0 && m->err >= -4095 ? m->err : -EPROTO;
		uint32_t rank = m->rank < comm->nranks ? m->rank : KCOLL_RANK_NONE;

		hh->answered = true;
		if (!kd_comm_abort(comm, err, rank, m->flags & (KCOLL_CQE_F_MISSING | KD_ABORT_F_LEFT),
				   m->from_seq))
			;	/* already aborted from an earlier op */
		else if (m->flags & KD_ABORT_F_LEFT)
			kc_dbg("comm %s: rank %d on host %u (%s) left; ops from %llu on fail", comm->name,
			       (int)m->rank, pc->host, hh->info.name, (unsigned long long)m->from_seq);
		else
			kc_info("comm %s: host %u (%s) aborted it from op %llu: %s, rank %d", comm->name,
				pc->host, hh->info.name, (unsigned long long)m->from_seq,
				kcoll_strerror(m->err), (int)m->rank);
		/* It said goodbye: its connections closing is not a death. */
		hh->dead = true;
		return;
	}
	case KD_P_QUERY: {
		const struct kd_p_query *m = (const void *)h;
		struct kd_p_answer a = { 0 };

		if (h->len < sizeof(*m))
			break;
		a.seq = m->seq;
		kd_comm_submitted(comm, m->seq, a.submitted);
		net_pc_send(pc, &a, KD_P_ANSWER, sizeof(a));
		return;
	}
	case KD_P_C4:
		if (kd_c4)
			kd_c4->on_report(comm, pc->host, h);
		return;
	case KD_P_PLAN:
		if (kd_c4)
			kd_c4->on_plan(comm, pc->host, h);
		return;
	case KD_P_C4_VIEW:
		if (kd_c4)
			kd_c4->on_view(comm, pc->host, h);
		return;
	case KD_P_ANSWER: {
		const struct kd_p_answer *m = (const void *)h;

		if (h->len < sizeof(*m))
			break;
		if (mh->query_deadline && m->seq == mh->query_seq) {
			hh->answered = true;
			memcpy(hh->submitted, m->submitted, sizeof(hh->submitted));
		}
		return;
	}
	}
	/* A newer peer's type is informative by contract (types that change a
	 * peer's duty bump KD_PEER_VERSION): ignore it without alarm. */
	if (h->type > KD_P_C4_VIEW)
		kc_dbg("comm %s: host %u sent control message type %u, newer than this kcolld; ignored",
		       comm->name, pc->host, h->type);
	else
		kc_warn("comm %s: host %u sent an unexpected control message (type %u)", comm->name,
			pc->host, h->type);
}

/* ---- watchdog, teardown, status ------------------------------------------ */

static void query_decide(struct kd_comm *comm)
{
	struct kd_mh *mh = comm->mh;
	uint32_t culprit = KCOLL_RANK_NONE, flags = KCOLL_CQE_F_MISSING;
	char why[160] = "";

	for (uint32_t r = 0; r < comm->nranks && culprit == KCOLL_RANK_NONE; r++) {
		struct kd_mh_host *hh = &mh->hosts[mh->rank_host[r]];

		if (mh->rank_host[r] == mh->self || !hh->answered)
			continue;
		if (!(hh->submitted[r / 64] & (1ULL << (r % 64)))) {
			culprit = r;
			snprintf(why, sizeof(why), "rank %u (host %s) never submitted it", r, hh->info.name);
		}
	}
	for (uint32_t h = 0; h < mh->nhosts && culprit == KCOLL_RANK_NONE; h++) {
		if (h != mh->self && !mh->hosts[h].answered) {
			culprit = mh->hosts[h].first_rank;
			flags = 0;
			snprintf(why, sizeof(why), "host %s (ranks from %u) does not answer", host_name(mh, h),
				 culprit);
		}
	}
	if (culprit == KCOLL_RANK_NONE) {
		uint32_t h = mh->wait_host < mh->nhosts ? mh->wait_host : (mh->self + 1) % mh->nhosts;

		culprit = mh->hosts[h].first_rank;
		flags = 0;
		snprintf(why, sizeof(why), "every rank submitted it, but host %s sent nothing",
			 host_name(mh, h));
	}
	mh->query_deadline = 0;
	if (kd_comm_abort(comm, -ETIMEDOUT, culprit, flags, mh->query_seq)) {
		kc_warn("comm %s: op %llu timed out: %s", comm->name, (unsigned long long)mh->query_seq,
			why);
		kd_net_abort_peers(comm, -ETIMEDOUT, culprit, flags, mh->query_seq);
	}
}

void kd_net_watchdog(int64_t now)
{
	for (struct kd_pconn *pc = kd_net.conns, *next; pc; pc = next) {
		next = pc->next;
		if (pc->role == PC_NEW && now > pc->deadline) {
			kc_warn("peer %s: no HELLO within 5 s; closing", pc->peer);
			net_pc_close(pc);
		} else if (pc->role == PC_BOOT_ROOT && !pc->boot && pc->deadline && now > pc->deadline) {
			net_pc_close(pc);	/* a member that did not close after bootstrap */
		}
	}
	for (struct kd_boot *b = kd_net.boots, *next; b; b = next) {
		next = b->next;
		if (now < b->expires)
			continue;
		if (!b->nreg) {
			net_boot_unlink(b);
			net_boot_free(b);
			continue;
		}
		char msg[128];
		int n = snprintf(msg, sizeof(msg), "timed out waiting for ranks:");

		for (uint32_t r = 0; r < b->nranks && n < (int)sizeof(msg) - 12; r++)
			if (b->rank_daemon[r] < 0)
				n += snprintf(msg + n, sizeof(msg) - n, " %u", r);
		kc_warn("comm %02x%02x%02x%02x...: %s", b->token[0], b->token[1], b->token[2],
			b->token[3], msg);
		net_boot_fail(b, -ETIMEDOUT, msg);
	}
	for (struct kd_comm *comm = kd.comms; comm; comm = comm->next) {
		struct kd_mh *mh = comm->mh;
		uint64_t running;
		bool all = true;

		if (!mh || comm->state != KD_COMM_ACTIVE)
			continue;
		running = atomic_load(&mh->running_seq);
		if (mh->query_deadline) {
			if (running != mh->query_seq) {
				mh->query_deadline = 0;	/* it finished after all */
				continue;
			}
			for (uint32_t h = 0; h < mh->nhosts; h++)
				if (h != mh->self && !mh->hosts[h].dead && !mh->hosts[h].answered)
					all = false;
			if (all || now > mh->query_deadline)
				query_decide(comm);
			continue;
		}
		/* Hung: no byte moved for a whole timeout (a long transfer is not). */
		if (running == UINT64_MAX || now - atomic_load(&mh->last_progress) <= comm->timeout_ns)
			continue;
		/* Hung: ask every peer which of its ranks submitted the op. */
		mh->query_seq = running;
		mh->query_deadline = now + QUERY_NS;
		for (uint32_t h = 0; h < mh->nhosts; h++) {
			struct kd_p_query q = { .seq = running };

			mh->hosts[h].answered = false;
			if (h != mh->self && mh->hosts[h].ctrl && !mh->hosts[h].dead)
				net_pc_send(mh->hosts[h].ctrl, &q, KD_P_QUERY, sizeof(q));
		}
	}
}

void kd_net_comm_close(struct kd_comm *comm)
{
	struct kd_mh *mh = comm->mh;

	if (comm->boot) {
		net_pc_close(comm->boot);
		comm->boot = NULL;
	}
	if (!mh)
		return;
	kd_mh_stop(mh);
	kd_step_close(mh);
	if (kd_c4)
		kd_c4->detach(mh);
	for (uint32_t h = 0; h < mh->nhosts; h++) {
		if (mh->hosts[h].ctrl)
			net_pc_close(mh->hosts[h].ctrl);
		for (int s = 0; s < KD_MAX_STREAMS; s++)
			if (mh->hosts[h].data[s] >= 0)
				net_close_gracefully(mh->hosts[h].data[s]);
		if (mh->hosts[h].lane >= 0)
			close(mh->hosts[h].lane);
	}
	pthread_mutex_lock(&comm->lock);
	comm->mh = NULL;
	pthread_mutex_unlock(&comm->lock);
	free(mh->hosts);
	free(mh->rank_host);
	free(mh);
}
