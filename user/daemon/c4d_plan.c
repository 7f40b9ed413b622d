// SPDX-License-Identifier: MIT
/*
 * C4's stream plan (docs/c4.md): the planner (include/kcoll/c4.h) says
 * which of the streams to each peer should move off a slow link; the two
 * hosts of a pair agree on it (the lower one proposes, the other accepts
 * unless its data path already started that op), and the data path applies
 * an agreed plan from the op it names (kd_c4_op_start, on the net thread).
 * Foreign tracked flows follow it through kcolld_bpf.c's steering hook.
 * Also `kcollctl plan`. c4d.c calls in from its tick; calls c4d_text.c
 * and net_conn.c.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <kcoll/c4.h>

#include "c4d.h"
#include "c4d_int.h"
#include "config.h"
#include "flow.h"
#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "net.h"

#define KD_C4_LEAD	4		/* a plan applies this many ops after the proposal */
#define KD_C4_ANSWER_NS	(2000 * 1000000LL)	/* a proposal unanswered this long is dropped */

void (*kd_bpf_steer_hook)(struct kd_steer_want *w, uint32_t n, int64_t now);

size_t (*kd_bpf_steer_render)(char *buf, size_t cap, int json);

/* ---- the plan between a host pair ----------------------------------------- */

void kd_c4_op_start(struct kd_mh *mh, struct kd_op *op)
{
	int64_t t0 = kd_now_ns();

	for (;;) {
		bool wait = false;

		pthread_mutex_lock(&mh->plan_lock);
		if (mh->started < op->seq + 1)
			mh->started = op->seq + 1;
		for (uint32_t h = 0; h < mh->nhosts; h++) {
			struct kd_mh_host *hh = &mh->hosts[h];

			if (hh->next_valid && op->seq >= hh->next_from) {
				hh->avoid = hh->next_avoid;
				hh->next_valid = false;
			}
			wait |= hh->prop_out && op->seq >= hh->prop_from;
		}
		pthread_mutex_unlock(&mh->plan_lock);
		/* Our proposal for this op is unanswered: the peer may switch at
		 * it. The answer comes in a round trip; a peer that never answers
		 * is dropped by the control thread (prop_out cleared). */
		if (!wait || op->seq >= __atomic_load_n(&op->comm->limit_seq, __ATOMIC_RELAXED) ||
		    kd_now_ns() - t0 > 2 * KD_C4_ANSWER_NS)
			return;
		usleep(500);
	}
}

static void plan_send(struct kd_mh *mh, uint32_t h, uint32_t verb, uint32_t avoid, uint64_t from,
		      uint64_t started)
{
	struct kd_p_plan m = { .verb = verb, .avoid = avoid, .from = from, .started = started };

	kd_net_ctrl_send(mh, h, &m, KD_P_PLAN, sizeof(m));
}

/* Lower host of the pair: propose the union of both wishes when it changed. */
void c4d_plan_propose(struct kd_comm *comm, uint32_t h, uint32_t mine, int64_t now)
{
	struct kd_mh *mh = comm->mh;
	struct kd_mh_host *hh = &mh->hosts[h];
	uint32_t want = (mine | hh->peer_want) & ((1u << mh->nstreams) - 1);
	uint64_t from;

	if (want == ((1u << mh->nstreams) - 1))
		want = 0;	/* every stream avoided: use them all */
	pthread_mutex_lock(&mh->plan_lock);
	if (hh->prop_out && now - hh->prop_sent > KD_C4_ANSWER_NS) {
		kc_warn("comm %s: host %u did not answer a stream plan; dropping it", comm->name, h);
		hh->prop_out = false;
	}
	if (hh->prop_out || want == hh->agreed) {
		pthread_mutex_unlock(&mh->plan_lock);
		return;
	}
	from = (mh->started > hh->peer_started ? mh->started : hh->peer_started) + KD_C4_LEAD;
	hh->prop_out = true;
	hh->prop_avoid = want;
	hh->prop_from = from;
	hh->prop_sent = now;
	pthread_mutex_unlock(&mh->plan_lock);
	plan_send(mh, h, KD_PLAN_PROPOSE, want, from, 0);
}

void kd_c4_on_plan(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h)
{
	const struct kd_p_plan *m = (const void *)h;
	struct kd_mh *mh = comm->mh;
	struct kd_mh_host *hh = &mh->hosts[from_host];
	uint32_t all = (1u << mh->nstreams) - 1;
	uint64_t started;
	bool ok;

	if (h->len != sizeof(*m) || (m->avoid & ~all) || m->avoid == all || m->verb > KD_PLAN_REFUSE ||
	    (m->verb == KD_PLAN_PROPOSE) != (from_host < mh->self)) {
		kc_warn("comm %s: host %u sent a malformed stream plan; ignored", comm->name, from_host);
		return;
	}
	pthread_mutex_lock(&mh->plan_lock);
	switch (m->verb) {
	case KD_PLAN_PROPOSE:
		/* Accept unless the data path already started that op. */
		started = mh->started;
		ok = started <= m->from;
		if (ok) {
			hh->next_avoid = m->avoid;
			hh->next_from = m->from;
			hh->next_valid = true;
			hh->agreed = m->avoid;
		}
		pthread_mutex_unlock(&mh->plan_lock);
		plan_send(mh, from_host, ok ? KD_PLAN_ACCEPT : KD_PLAN_REFUSE, m->avoid, m->from, started);
		if (ok)
			kc_info("comm %s: C4 streams to host %u (%s): %s from op %" PRIu64 " (agreed with it)",
				comm->name, from_host, c4d_hname(mh, from_host),
				m->avoid ? "some left unused" : "all in use", m->from);
		return;
	case KD_PLAN_ACCEPT:
		if (hh->prop_out && m->from == hh->prop_from && m->avoid == hh->prop_avoid) {
			hh->next_avoid = m->avoid;
			hh->next_from = m->from;
			hh->next_valid = true;
			hh->agreed = m->avoid;
			hh->prop_out = false;
			pthread_mutex_unlock(&mh->plan_lock);
			kc_info("comm %s: C4 streams to host %u (%s): avoid mask 0x%x from op %" PRIu64,
				comm->name, from_host, c4d_hname(mh, from_host), m->avoid, m->from);
			return;
		}
		break;
	case KD_PLAN_REFUSE:
		if (hh->prop_out && m->from == hh->prop_from) {
			hh->prop_out = false;	/* proposed again at the next tick, beyond it */
			hh->peer_started = m->started;
		}
		break;
	}
	pthread_mutex_unlock(&mh->plan_lock);
}

/* Streams toward host h the plan wants unused: those whose link it moves. */
uint32_t c4d_plan_avoid(const struct kd_mh *mh, const struct kcoll_c4_plan *pl, uint32_t h)
{
	uint32_t m = 0;

	for (uint32_t s = 0; s < mh->nstreams; s++)
		if (pl->link[h][s] != mh->hosts[h].link[s])
			m |= 1u << s;
	return m;
}

void c4d_plan_log(struct kd_comm *comm, struct kd_c4 *c, const struct kcoll_c4_plan *old)
{
	struct kd_mh *mh = comm->mh;

	for (uint32_t h = 0; h < mh->nhosts; h++) {
		if (h == mh->self)
			continue;
		for (uint32_t s = 0; s < mh->nstreams; s++) {
			char from[64], to[64];

			if (old->version && old->link[h][s] == c->plan.link[h][s] && old->why[h][s] == c->plan.why[h][s])
				continue;
			if (!old->version && c->plan.why[h][s] == KCOLL_C4_WHY_SPREAD)
				continue;
			c4d_link_str(mh, mh->self, old->version ? old->link[h][s] : mh->hosts[h].link[s], from,
				 sizeof(from));
			c4d_link_str(mh, mh->self, c->plan.link[h][s], to, sizeof(to));
			kc_info("comm %s: C4 plan %" PRIu64 ": host %u (%s) stream %u: %s -> %s (%s)", comm->name,
				c->plan.version, h, c4d_hname(mh, h), s, from, to, kcoll_c4_why_name(c->plan.why[h][s]));
		}
	}
}

/* Links of the streams in mask s toward host h. */
static uint32_t stream_links(const struct kd_mh *mh, uint32_t h, uint32_t s)
{
	uint32_t l = 0;

	for (uint32_t k = 0; k < mh->nstreams; k++)
		if (s & (1u << k) && mh->hosts[h].link[k] < KD_STEER_LINKS)
			l |= 1u << mh->hosts[h].link[k];
	return l;
}

static uint32_t link_addr(const struct kd_mh *mh, uint32_t h, uint32_t l)
{
	char a[20];
	struct in_addr in;

	kd_net_link_addr(mh, h, l, a, sizeof(a));
	return inet_pton(AF_INET, a, &in) == 1 ? in.s_addr : 0;
}

/* Foreign tracked flows follow the plan (kcolld_bpf.c): per peer, the links
 * our plan and the peer's want left and where their streams went instead. */
void c4d_steer_foreign(struct kd_mh *mh, const struct kcoll_c4_plan *pl, bool enforce, int64_t now,
		       uint32_t *recv_ready)
{
	struct kd_steer_want w[KD_MAX_HOSTS];
	uint32_t n = 0;

	for (uint32_t h = 0; h < mh->nhosts; h++) {
		struct kd_steer_want *x;

		recv_ready[h] = 0;
		if (h == mh->self || mh->hosts[h].dead)
			continue;
		x = &w[n++];
		*x = (struct kd_steer_want){ .host = h, .peer_recv = mh->hosts[h].peer_steer_recv };
		for (uint32_t l = 0; l < KD_STEER_LINKS; l++) {
			x->via[l] = UINT32_MAX;
			x->laddr[l] = l < kd_net_nlinks() ? link_addr(mh, mh->self, l) : 0;
			x->raddr[l] = l < kd_net_nlinks() ? link_addr(mh, h, l) : 0;
		}
		if (!enforce)
			continue;
		x->avoid_mine = stream_links(mh, h, c4d_plan_avoid(mh, pl, h));
		x->avoid_peer = stream_links(mh, h, mh->hosts[h].peer_want);
		for (uint32_t s = 0; s < mh->nstreams; s++)
			if (pl->link[h][s] != mh->hosts[h].link[s] && mh->hosts[h].link[s] < KD_STEER_LINKS)
				x->via[mh->hosts[h].link[s]] = pl->link[h][s];
		/* the peer wants a link left that our plan keeps: use another one we share */
		for (uint32_t l = 0; l < KD_STEER_LINKS; l++)
			for (uint32_t k = 0; x->via[l] == UINT32_MAX && k < kd_net_nlinks(); k++)
				if (k != l && !((x->avoid_mine | x->avoid_peer) & (1u << k)) &&
				    (kd_net_shared_links(mh, h) & (1u << k)))
					x->via[l] = k;
	}
	kd_bpf_steer_hook(w, n, now);
	for (uint32_t i = 0; i < n; i++)
		recv_ready[w[i].host] = w[i].recv_ready;
}

size_t c4d_render_plan(char *buf, size_t cap, int json)
{
	size_t n = 0;
	bool firstc = true;

	if (json)
		PUT("{\"enforced\":%s,\"comms\":[", kcoll_knob_ll("KCOLL_C4_PLAN") ? "true" : "false");
	for (struct kd_comm *comm = kd.comms; comm && n + 4096 < cap; comm = comm->next) {
		struct kd_mh *mh = comm->mh;
		const struct kcoll_c4_plan *pl;
		bool first = true;

		if (!mh || !mh->c4 || comm->state != KD_COMM_ACTIVE)
			continue;
		pl = &mh->c4->plan;
		if (json)
			PUT("%s{\"comm\":\"%s\",\"host\":%u,\"version\":%" PRIu64 ",\"streams\":[", firstc ? "" : ",",
			    comm->name, mh->self, pl->version);
		else
			PUT("comm %s (host %u): plan version %" PRIu64 ", %u streams per peer\n"
			    "  %-5s %-16s %-6s %-24s %-6s %-24s %s\n", comm->name, mh->self, pl->version,
			    mh->nstreams, "HOST", "NAME", "STREAM", "STREAM'S LINK", "IN USE", "PLAN", "WHY");
		for (uint32_t h = 0; h < mh->nhosts; h++) {
			if (h == mh->self)
				continue;
			for (uint32_t s = 0; s < mh->nstreams; s++) {
				char now[64], want[64];

				bool used;

				pthread_mutex_lock(&mh->plan_lock);
				used = !(mh->hosts[h].avoid & (1u << s));
				pthread_mutex_unlock(&mh->plan_lock);
				c4d_link_str(mh, mh->self, mh->hosts[h].link[s], now, sizeof(now));
				c4d_link_str(mh, mh->self, pl->link[h][s], want, sizeof(want));
				if (json)
					PUT("%s{\"host\":%u,\"stream\":%u,\"stream_link\":%u,\"in_use\":%s,"
					    "\"link\":%u,\"why\":\"%s\"}", first ? "" : ",", h, s,
					    mh->hosts[h].link[s], used ? "true" : "false", pl->link[h][s],
					    kcoll_c4_why_name(pl->why[h][s]));
				else
					PUT("  %-5u %-16.16s %-6u %-24s %-6s %-24s %s\n", h, c4d_hname(mh, h), s, now,
					    used ? "yes" : "no", want, kcoll_c4_why_name(pl->why[h][s]));
				first = false;
			}
		}
		if (json)
			PUT("]}");
		firstc = false;
	}
	if (json && kd_bpf_steer_render) {
		PUT("],\"foreign\":[");
		n += kd_bpf_steer_render(buf + n, n < cap ? cap - n : 0, 1);
	}
	if (json)
		PUT("]}\n");
	else if (firstc)
		PUT("no multi-host communicator: nothing to plan\n");
	if (!json && kd_bpf_steer_render)
		n += kd_bpf_steer_render(buf + n, n < cap ? cap - n : 0, 0);
	return n;
}
