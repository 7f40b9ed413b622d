// SPDX-License-Identifier: MIT
/*
 * C4 in kcolld: one detector and planner (include/kcoll/c4.h, shared with
 * kcoll.ko) per multi-host communicator, fed with
 *
 *   - each local rank's submissions and completions (comm.c, under
 *     comm->lock, which those paths hold anyway: no new lock on the data path);
 *   - the other hosts' rank summaries, sent every tick over the control
 *     connections (KD_P_C4);
 *   - the bytes and busy time of large pieces on each data stream
 *     (step.c and xport_rdma.c add them to relaxed atomics; the tick turns
 *     deltas into struct kcoll_c4_linkobs, the same struct BPF flow
 *     statistics can fill);
 *   - what the net thread waits for and since when.
 *
 * The control thread evaluates every KD_C4_TICK, logs events (warn when
 * raised, info when cleared), keeps the last ones for `kcollctl events`, and
 * recomputes the plan (`kcollctl plan`). docs/c4.md has the long form.
 *
 * This file is the detector and the top of C4's files (c4d_int.h lists
 * them): a communicator's attach and detach, its inputs, the tick, the
 * hooks table. It calls c4d_view.c, c4d_plan.c and c4d_text.c.
 * C4 sits on top of comm.c, mh.c and the network: they feed it only
 * through the struct kd_c4_hooks that kd_c4_start installs (c4d.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kcoll/c4.h>

#include "c4d.h"
#include "c4d_int.h"
#include "config.h"
#include "flow.h"
#include "kcolld.h"
#include "log.h"
#include "metrics.h"
#include "mh.h"
#include "net.h"

#define KD_C4_TICK	(250 * 1000000LL)
#define KD_C4_BPF_MAX	(KD_MAX_HOSTS * KCOLL_C4_MAX_LINKS)

/* Control thread only. */
static struct {
	int64_t last_tick;
	FILE *trace;
	bool trace_taken;
	/* BPF flow statistics per (peer, link): this tick's and the previous read */
	struct kd_bpf_sum bpf[2][KD_C4_BPF_MAX];
	uint32_t nbpf[2];
	int64_t bpf_t[2];
	bool bpf_failed;
	bool steered;		/* this tick, a communicator's plan steered the foreign flows */
} c4d;

int (*kd_bpf_sums_hook)(struct kd_bpf_sum *out, uint32_t max, uint32_t *n);

static void trace(const struct kd_c4 *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void trace(const struct kd_c4 *c, const char *fmt, ...)
{
	va_list ap;

	if (!c->trace || !c4d.trace)
		return;
	va_start(ap, fmt);
	vfprintf(c4d.trace, fmt, ap);
	va_end(ap);
}

static void params(struct kcoll_c4_params *p)
{
	kcoll_c4_params_default(p);
	p->slow_ratio_pct = (uint32_t)__atomic_load_n(&kd.c4_slow_ratio_pct, __ATOMIC_RELAXED);
	p->hang_ms = (uint32_t)__atomic_load_n(&kd.c4_hang_ms, __ATOMIC_RELAXED);
	p->straggler_ms = (uint32_t)__atomic_load_n(&kd.c4_straggler_ms, __ATOMIC_RELAXED);
}

static int kd_c4_attach(struct kd_comm *comm)
{
	struct kd_mh *mh = comm->mh;
	struct kcoll_c4_params p;
	struct kd_c4 *c = calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	params(&p);
	r = kcoll_c4_init(&c->core, &p, comm->nranks, mh->nhosts, mh->self, kd_net_nlinks(),
			  mh->rank_host, (uint64_t)kd_now_ns());
	if (r) {
		kc_warn("comm %s: C4 detector off: %s", comm->name, strerror(-r));
		free(c);
		return 0;	/* the communicator works without it */
	}
	for (uint32_t rk = 0; rk < comm->nranks; rk++)
		if (comm->clients[rk])
			kcoll_c4_local(&c->core, rk);
	if (!c4d.trace_taken && kcoll_knob_is_set("KCOLL_C4_TRACE")) {
		c4d.trace_taken = true;
		char path[512];
		const char *t = kcoll_knob_str("KCOLL_C4_TRACE"), *pp = strstr(t, "%p");

		/* %p: our pid, so that daemons sharing an environment write apart */
		if (pp)
			snprintf(path, sizeof(path), "%.*s%d%s", (int)(pp - t), t, (int)getpid(), pp + 2);
		else
			snprintf(path, sizeof(path), "%s", t);
		c4d.trace = fopen(path, "a");
		if (!c4d.trace)
			kc_warn("KCOLL_C4_TRACE: cannot open %s: %m", path);
		else
			setvbuf(c4d.trace, NULL, _IOLBF, 0);
		c->trace = c4d.trace != NULL;
		trace(c, "init %u %u %u %u", comm->nranks, mh->nhosts, mh->self, kd_net_nlinks());
		for (uint32_t rk = 0; rk < comm->nranks; rk++)
			trace(c, " %u", mh->rank_host[rk]);
		trace(c, "\n");
		for (uint32_t rk = 0; rk < comm->nranks; rk++)
			if (comm->clients[rk])
				trace(c, "local %u\n", rk);
	}
	pthread_mutex_lock(&comm->lock);
	mh->c4 = c;
	pthread_mutex_unlock(&comm->lock);
	return 0;
}

static void kd_c4_detach(struct kd_mh *mh)
{
	struct kd_c4 *c = mh->c4;

	pthread_mutex_destroy(&mh->plan_lock);
	if (!c)
		return;
	pthread_mutex_lock(&mh->comm->lock);
	mh->c4 = NULL;
	pthread_mutex_unlock(&mh->comm->lock);
	if (c->trace && c4d.trace) {
		fclose(c4d.trace);
		c4d.trace = NULL;
	}
	free(c);
}

static void kd_c4_submitted(struct kd_comm *comm, uint32_t rank, uint64_t seq)
{
	struct kd_c4 *c = comm->mh ? comm->mh->c4 : NULL;
	int64_t now;

	if (!c)
		return;
	now = kd_now_ns();
	kcoll_c4_submit(&c->core, rank, seq, (uint64_t)now);
	trace(c, "sub %" PRId64 " %u %" PRIu64 "\n", now, rank, seq);
}

static void kd_c4_completed(struct kd_comm *comm, const struct kd_op *op)
{
	struct kd_c4 *c = comm->mh ? comm->mh->c4 : NULL;
	int64_t now;

	if (!c)
		return;
	now = kd_now_ns();
	for (uint32_t rk = 0; rk < comm->nranks; rk++) {
		if (!op->c[rk].present)
			continue;
		kcoll_c4_complete(&c->core, rk, (uint64_t)now);
		trace(c, "done %" PRId64 " %u\n", now, rk);
	}
}

static void kd_c4_on_report(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h)
{
	const struct kd_p_c4 *m = (const void *)h;
	const struct kd_p_c4_rank *rr = (const void *)(m + 1);
	struct kd_mh *mh = comm->mh;
	int64_t now = kd_now_ns();

	if (h->len < sizeof(*m) || m->n > KD_MAX_RANKS || h->len != sizeof(*m) + m->n * sizeof(*rr)) {
		kc_warn("comm %s: host %u sent a malformed C4 report; ignored", comm->name, from_host);
		return;
	}
	mh->hosts[from_host].peer_want = m->want_avoid & ((1u << mh->nstreams) - 1);
	mh->hosts[from_host].peer_steer_recv = m->steer_recv & ((1u << KD_STEER_LINKS) - 1);
	pthread_mutex_lock(&comm->lock);
	for (uint32_t i = 0; mh->c4 && i < m->n; i++) {
		struct kcoll_c4_rankrep rep = { .rank = rr[i].rank, .age_ms = rr[i].age_ms, .nsub = rr[i].nsub,
						.think_us = rr[i].think_us, .nthink = rr[i].nthink };

		/* A host speaks for its own ranks only. */
		if (rep.rank >= comm->nranks || mh->rank_host[rep.rank] != from_host)
			continue;
		if (!kcoll_c4_rank_report(&mh->c4->core, &rep, (uint64_t)now))
			trace(mh->c4, "rep %" PRId64 " %u %" PRIu64 " %u %u %u\n", now, rep.rank, rep.nsub,
			      rep.age_ms, rep.think_us, rep.nthink);
	}
	pthread_mutex_unlock(&comm->lock);
}

/* ---- the tick ------------------------------------------------------------ */

static void feed_links(struct kd_mh *mh, struct kd_c4 *c, uint64_t now)
{
	for (uint32_t h = 0; h < mh->nhosts; h++) {
		struct kd_mh_host *hh = &mh->hosts[h];

		if (h == mh->self)
			continue;
		for (uint32_t s = 0; s < mh->nstreams; s++) {
			for (uint32_t d = 0; d < 2; d++) {
				uint64_t b = atomic_load_explicit(&hh->obs_bytes[s][d], memory_order_relaxed);
				uint64_t t = atomic_load_explicit(&hh->obs_busy[s][d], memory_order_relaxed);
				struct kcoll_c4_linkobs o = {
					.host = h, .link = hh->link[s], .dir = d, .t_ns = now,
					.bytes = b - c->seen_bytes[h][s][d], .busy_ns = t - c->seen_busy[h][s][d],
				};

				/* Bytes and their busy time may land in different
				 * ticks (RDMA tx: bytes when posted, busy time when
				 * acknowledged): keep both until a tick has each, else
				 * a slow link's busy time would be dropped. */
				if (!o.bytes || !o.busy_ns)
					continue;
				c->seen_bytes[h][s][d] = b;
				c->seen_busy[h][s][d] = t;
				kcoll_c4_link_obs(&c->core, &o);
				kd_metrics_link(c4d_hname(mh, h), o.link, d, o.bytes, o.busy_ns);
				/* every one: the core adds small ones up */
				trace(c, "obs %" PRIu64 " %u %u %u %" PRIu64 " %" PRIu64 "\n", now, h, o.link, d,
				      o.bytes, o.busy_ns);
			}
		}
	}
}

/* Read the BPF flow statistics once per tick (kd_c4_tick). */
static void bpf_read(int64_t now)
{
	uint32_t n = 0;
	int err;

	if (!kd_bpf_sums_hook) {
		c4d.nbpf[0] = c4d.nbpf[1] = 0;
		return;
	}
	memcpy(c4d.bpf[1], c4d.bpf[0], sizeof(c4d.bpf[0][0]) * c4d.nbpf[0]);
	c4d.nbpf[1] = c4d.nbpf[0];
	c4d.bpf_t[1] = c4d.bpf_t[0];
	err = kd_bpf_sums_hook(c4d.bpf[0], KD_C4_BPF_MAX, &n);
	if (err && !c4d.bpf_failed)
		kc_warn("C4: cannot read the BPF flow statistics (%s); the detector goes on with its own "
			"timing", strerror(-err));
	c4d.bpf_failed = err != 0;
	c4d.nbpf[0] = err ? 0 : n;
	c4d.bpf_t[0] = now;
	/* Retransmissions since the previous read, per link (a key seen for the
	 * first time counts from then on: its total covers unknown time). */
	for (uint32_t i = 0; i < c4d.nbpf[0]; i++) {
		const struct kd_bpf_sum *cur = &c4d.bpf[0][i];

		for (uint32_t k = 0; k < c4d.nbpf[1]; k++)
			if (c4d.bpf[1][k].host == cur->host && c4d.bpf[1][k].link == cur->link &&
			    cur->retrans > c4d.bpf[1][k].retrans)
				kd_metrics_retrans(cur->link, cur->retrans - c4d.bpf[1][k].retrans);
	}
}

/* BPF flow statistics since the previous tick as detector observations: per
 * (peer, link) the payload received (rx) and sent (tx) over the interval,
 * retransmissions (ours: tx) and the flows' srtt (both). */
static void feed_bpf(struct kd_mh *mh, struct kd_c4 *c, uint64_t now)
{
	uint64_t dt = (uint64_t)(c4d.bpf_t[0] - c4d.bpf_t[1]);

	if (!c4d.nbpf[0] || !c4d.nbpf[1] || c4d.bpf_t[1] <= 0 || !dt)
		return;
	for (uint32_t i = 0; i < c4d.nbpf[0]; i++) {
		const struct kd_bpf_sum *cur = &c4d.bpf[0][i], *old = NULL;

		if (cur->host >= mh->nhosts || cur->host == mh->self || cur->link >= c->core.nlinks)
			continue;
		for (uint32_t k = 0; k < c4d.nbpf[1] && !old; k++)
			if (c4d.bpf[1][k].host == cur->host && c4d.bpf[1][k].link == cur->link)
				old = &c4d.bpf[1][k];
		if (!old)
			continue;	/* new: its counters cover more than the interval */
		for (uint32_t d = 0; d < 2; d++) {
			uint64_t a = d ? cur->tx_payload : cur->rx_payload, b = d ? old->tx_payload : old->rx_payload;
			struct kcoll_c4_linkobs o = {
				.host = cur->host, .link = cur->link, .dir = d, .flags = KCOLL_C4_OBS_BPF,
				.bytes = a >= b ? a - b : 0, .busy_ns = dt, .t_ns = now, .srtt_us = cur->srtt_us,
				.retrans = d && cur->retrans > old->retrans ?
					(uint32_t)(cur->retrans - old->retrans) : 0,
			};

			kcoll_c4_link_obs(&c->core, &o);
		}
	}
}

/* A peer host's state for kcoll.ko's peers table, and its slowest link's MB/s. */
static uint32_t peer_health(const struct kd_mh *mh, const struct kd_c4 *c, uint32_t h, uint32_t *mbps)
{
	const struct kcoll_c4 *k = &c->core;
	uint64_t lo = 0;
	bool slow = false;

	for (uint32_t l = 0; l < k->nlinks; l++) {
		slow |= k->culprit[h][l].slow;
		for (uint32_t d = 0; d < 2; d++)
			if (k->link[h][l][d].rate && (!lo || k->link[h][l][d].rate < lo))
				lo = k->link[h][l][d].rate;
	}
	*mbps = (uint32_t)(lo / 1000000 < 0xffffffffu ? lo / 1000000 : 0xffffffffu);
	if (mh->hosts[h].dead)
		return KCOLL_PEER_DOWN;
	return k->comm_hung[h] ? KCOLL_PEER_HUNG : slow ? KCOLL_PEER_SLOW : KCOLL_PEER_OK;
}

static void tick_comm(struct kd_comm *comm, int64_t now)
{
	struct kd_mh *mh = comm->mh;
	struct kd_c4 *c = mh->c4;
	struct kcoll_c4_params p;
	struct kcoll_c4_event ev[16];
	struct kcoll_c4_plan old;
	uint32_t shared[KD_MAX_HOSTS] = { 0 }, nev, nrep = 0;
	uint32_t health[KD_MAX_HOSTS] = { 0 }, bw[KD_MAX_HOSTS] = { 0 }, recv_ready[KD_MAX_HOSTS] = { 0 };
	struct {
		struct kd_p_c4 m;
		struct kd_p_c4_rank r[KD_MAX_RANKS];
	} rep;
	uint64_t running = atomic_load(&mh->running_seq);
	bool enforce = kcoll_knob_ll("KCOLL_C4_PLAN") != 0;
	struct kcoll_c4_event act[KD_C4_REMOTE];
	struct kd_p_c4_view wait;
	uint64_t sig;
	uint32_t na;

	params(&p);
	for (uint32_t h = 0; h < mh->nhosts; h++)
		shared[h] = h == mh->self ? 0 : kd_net_shared_links(mh, h);
	pthread_mutex_lock(&comm->lock);
	if (memcmp(&p, &c->core.p, sizeof(p)) && kcoll_c4_set_params(&c->core, &p))
		kc_warn("comm %s: C4 thresholds out of range; keeping the previous ones", comm->name);
	feed_links(mh, c, (uint64_t)now);
	feed_bpf(mh, c, (uint64_t)now);
	if (running != UINT64_MAX && mh->wait_host < mh->nhosts) {
		uint64_t since = (uint64_t)atomic_load(&mh->last_progress);
		uint32_t link = mh->hosts[mh->wait_host].link[mh->wait_stream % KD_MAX_STREAMS];

		kcoll_c4_wait(&c->core, mh->wait_host, link, since, running);
		trace(c, "wait %" PRId64 " %u %u %" PRIu64 " %" PRIu64 "\n", now, mh->wait_host, link, since,
		      running);
	} else {
		kcoll_c4_wait(&c->core, KCOLL_C4_NONE, 0, 0, 0);
		trace(c, "wait %" PRId64 " %u 0 0 0\n", now, KCOLL_C4_NONE);
	}
	kcoll_c4_evaluate(&c->core, (uint64_t)now);
	trace(c, "eval %" PRId64 "\n", now);
	for (uint32_t h = 0; h < mh->nhosts; h++)
		for (uint32_t l = 0; h != mh->self && l < c->core.nlinks; l++)
			for (uint32_t d = 0; d < 2; d++)
				kd_metrics_link_rate(c4d_hname(mh, h), l, d, c->core.link[h][l][d].rate);
	nev = kcoll_c4_events(&c->core, c->consumed, ev, 16);
	if (nev)
		c->consumed = ev[nev - 1].id;
	na = kcoll_c4_active(&c->core, act, KD_C4_REMOTE);
	c4d_stalled_wait(mh, c, now, &wait);
	for (uint32_t rk = 0; rk < comm->nranks; rk++) {
		struct kcoll_c4_rankrep s;

		if (comm->clients[rk] && !kcoll_c4_rank_summary(&c->core, rk, (uint64_t)now, &s))
			rep.r[nrep++] = (struct kd_p_c4_rank){ .rank = s.rank, .age_ms = s.age_ms, .nsub = s.nsub,
								.think_us = s.think_us, .nthink = s.nthink };
	}
	old = c->plan;
	if (kcoll_c4_plan(&c->core, shared, mh->nstreams, (uint64_t)now, &c->plan) > 0)
		c4d_plan_log(comm, c, &old);
	for (uint32_t h = 0; h < mh->nhosts && h < KCOLL_MAX_PEERS; h++)
		health[h] = peer_health(mh, c, h, &bw[h]);
	pthread_mutex_unlock(&comm->lock);

	/* kcoll.ko's /sys/kernel/kcoll/peers (by host index), when it is loaded */
	for (uint32_t h = 0; kd.kdev.fd >= 0 && kcoll_kdev_has(&kd.kdev, KCOLL_FEAT_PEERS) &&
			     h < mh->nhosts && h < KCOLL_MAX_PEERS; h++) {
		if (h == mh->self || health[h] == c->peer_state[h])
			continue;
		c->peer_state[h] = health[h];
		if (kcoll_kdev_peer_report(&kd.kdev, h, health[h], 0, bw[h]))
			kc_dbg("comm %s: cannot publish host %u's link health to kcoll.ko", comm->name, h);
	}

	for (uint32_t i = 0; i < nev; i++)
		c4d_log_event(comm, &ev[i], mh->self, c4d_wall_ms());
	sig = c4d_view_sig(act, na, &wait);
	if (sig != c->view_sig) {
		c4d_view_send(mh, act, na, &wait, now);
		c->view_sig = sig;
	}
	/* one communicator's plan steers the foreign flows (the first one) */
	if (kd_bpf_steer_hook && !c4d.steered) {
		c4d_steer_foreign(mh, &c->plan, enforce, now, recv_ready);
		c4d.steered = true;
	}
	for (uint32_t h = 0; h < mh->nhosts; h++) {
		uint32_t want = enforce ? c4d_plan_avoid(mh, &c->plan, h) : 0;

		if (h == mh->self || mh->hosts[h].dead)
			continue;
		rep.m = (struct kd_p_c4){ .n = nrep, .want_avoid = want, .steer_recv = recv_ready[h] };
		kd_net_ctrl_send(mh, h, &rep, KD_P_C4, sizeof(rep.m) + nrep * sizeof(rep.r[0]));
		if (h > mh->self)
			c4d_plan_propose(comm, h, want, now);
	}
}

void kd_c4_tick(int64_t now)
{
	if (now - c4d.last_tick < KD_C4_TICK)
		return;
	c4d.last_tick = now;
	bpf_read(now);
	c4d.steered = false;
	for (struct kd_comm *comm = kd.comms; comm; comm = comm->next)
		if (comm->mh && comm->mh->c4 && comm->state == KD_COMM_ACTIVE)
			tick_comm(comm, now);
	if (kd_bpf_steer_hook && !c4d.steered)
		kd_bpf_steer_hook(NULL, 0, now);	/* no communicator: every foreign flow home */
}

/* ---- kcollctl ------------------------------------------------------------ */

void kd_c4_active_kinds(uint64_t *n, uint32_t nkinds)
{
	for (struct kd_comm *comm = kd.comms; comm; comm = comm->next) {
		struct kcoll_c4_event act[32];
		uint32_t na;

		if (!comm->mh || !comm->mh->c4 || comm->state != KD_COMM_ACTIVE)
			continue;
		pthread_mutex_lock(&comm->lock);
		na = kcoll_c4_active(&comm->mh->c4->core, act, 32);
		pthread_mutex_unlock(&comm->lock);
		for (uint32_t i = 0; i < na; i++)
			if (act[i].kind < nkinds)
				n[act[i].kind]++;
	}
}

size_t kd_c4_render(uint32_t what, uint64_t since, char *buf, size_t cap, uint32_t flags)
{
	int json = !!(flags & KCOLL_C4_F_JSON);
	bool local = flags & KCOLL_C4_F_LOCAL;
	size_t n;

	switch (what) {
	case KCOLL_C4_EVENTS:
		n = c4d_render_events(since, buf, cap, json, local);
		break;
	case KCOLL_C4_PLAN:
		n = c4d_render_plan(buf, cap, json);
		break;
	default:
		n = c4d_render_anomalies(buf, cap, json, local);
		break;
	}
	return n < cap ? n : cap - 1;
}

static const struct kd_c4_hooks c4_hooks = {
	.attach = kd_c4_attach,
	.detach = kd_c4_detach,
	.submitted = kd_c4_submitted,
	.completed = kd_c4_completed,
	.on_report = kd_c4_on_report,
	.on_plan = kd_c4_on_plan,
	.on_view = kd_c4_on_view,
	.op_start = kd_c4_op_start,
	.summary = kd_c4_summary,
};

void kd_c4_start(void)
{
	kd_c4 = &c4_hooks;
}
