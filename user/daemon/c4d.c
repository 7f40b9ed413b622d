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
 *     (xport_tcp.c adds them to relaxed atomics; the tick turns deltas into
 *     struct kcoll_c4_linkobs, the same struct BPF flow statistics can fill);
 *   - what the net thread waits for and since when.
 *
 * The control thread evaluates every KD_C4_TICK, logs events (warn when
 * raised, info when cleared), keeps the last ones for `kcollctl events`, and
 * recomputes the plan (`kcollctl plan`). docs/c4.md has the long form.
 *
 * c4d.c sits on top of comm.c, mh.c and net.c: they feed it only through
 * the struct kd_c4_hooks that kd_c4_start installs (c4d.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/c4.h>

#include "c4d.h"
#include "config.h"
#include "flow.h"
#include "kcolld.h"
#include "log.h"
#include "metrics.h"
#include "mh.h"
#include "net.h"

#define KD_C4_TICK	(250 * 1000000LL)
#define KD_C4_LOG	256
#define KD_C4_LEAD	4		/* a plan applies this many ops after the proposal */
#define KD_C4_ANSWER_NS	(2000 * 1000000LL)	/* a proposal unanswered this long is dropped */
#define KD_C4_BPF_MAX	(KD_MAX_HOSTS * KCOLL_C4_MAX_LINKS)
#define KD_C4_REMOTE	16		/* active anomalies kept per peer host */
#define KD_C4_SHOW	64		/* merged entries kcollctl anomalies shows per comm */

int (*kd_bpf_sums_hook)(struct kd_bpf_sum *out, uint32_t max, uint32_t *n);
void (*kd_bpf_steer_hook)(struct kd_steer_want *w, uint32_t n, int64_t now);
size_t (*kd_bpf_steer_render)(char *buf, size_t cap, int json);

/* A peer host's last KD_P_C4_VIEW: its active anomalies and its data path's wait. */
struct kd_c4_remote {
	uint32_t n;
	struct kcoll_c4_event e[KD_C4_REMOTE];
	int64_t wall_ms[KD_C4_REMOTE];		/* raised, the observer's wall clock */
	int64_t heard_ms[KD_C4_REMOTE];		/* first in a view from it, our wall clock */
	uint32_t wait_host, wait_link, wait_ms;
	uint64_t wait_seq;
	int64_t at;				/* received (0: never) */
};

struct kd_c4 {
	struct kcoll_c4 core;			/* comm->lock */
	struct kd_c4_remote remote[KD_MAX_HOSTS];	/* control thread */
	uint64_t view_sig;			/* of the last view sent to the peers */
	struct kcoll_c4_plan plan;		/* control thread */
	uint64_t seen_bytes[KD_MAX_HOSTS][KD_MAX_STREAMS][2];
	uint64_t seen_busy[KD_MAX_HOSTS][KD_MAX_STREAMS][2];
	uint64_t consumed;			/* last core event logged */
	uint32_t peer_state[KD_MAX_HOSTS];	/* last reported to kcoll.ko's peers table */
	bool trace;				/* this comm writes the trace */
};

struct kd_c4_logent {
	uint64_t id;
	char comm[17];
	char link_addr[20];
	uint32_t self;		/* the host that observed it */
	bool remote;		/* a peer's verdict (KD_P_C4_VIEW), not ours */
	int64_t wall_ms;
	struct kcoll_c4_event e;
	char text[512];
};

/* Control thread only. */
static struct {
	struct kd_c4_logent log[KD_C4_LOG];
	uint64_t next_id;
	int64_t last_tick;
	FILE *trace;
	bool trace_taken;
	/* BPF flow statistics per (peer, link): this tick's and the previous read */
	struct kd_bpf_sum bpf[2][KD_C4_BPF_MAX];
	uint32_t nbpf[2];
	int64_t bpf_t[2];
	bool bpf_failed;
	bool steered;		/* this tick, a communicator's plan steered the foreign flows */
} c4d = { .next_id = 1 };

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

static const char *hname(const struct kd_mh *mh, uint32_t h)
{
	return h < mh->nhosts ? mh->hosts[h].info.name : "?";
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

/* ---- the plan between a host pair ----------------------------------------- */

static void kd_c4_op_start(struct kd_mh *mh, struct kd_op *op)
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
static void plan_propose(struct kd_comm *comm, uint32_t h, uint32_t mine, int64_t now)
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

static void kd_c4_on_plan(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h)
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
				comm->name, from_host, hname(mh, from_host),
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
				comm->name, from_host, hname(mh, from_host), m->avoid, m->from);
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
static uint32_t plan_avoid(const struct kd_mh *mh, const struct kcoll_c4_plan *pl, uint32_t h)
{
	uint32_t m = 0;

	for (uint32_t s = 0; s < mh->nstreams; s++)
		if (pl->link[h][s] != mh->hosts[h].link[s])
			m |= 1u << s;
	return m;
}

/* ---- rendering ---------------------------------------------------------- */

static const char *kind_key(uint32_t k)
{
	switch (k) {
	case KCOLL_C4_COMM_HANG: return "comm_hang";
	case KCOLL_C4_NONCOMM_HANG: return "noncomm_hang";
	case KCOLL_C4_COMM_SLOW: return "comm_slow";
	case KCOLL_C4_NONCOMM_SLOW: return "straggler";
	}
	return "?";
}

/* "link 1 (eth1 10.20.0.3)" for ours, "link 1 (10.20.0.3)" for a peer's. */
static void link_str(const struct kd_mh *mh, uint32_t h, uint32_t l, char *buf, size_t len)
{
	char addr[20], ifn[20];

	if (l == KCOLL_C4_NONE) {
		snprintf(buf, len, "no link");
		return;
	}
	kd_net_link_addr(mh, h, l, addr, sizeof(addr));
	if (h == mh->self) {
		kd_net_link_ifname(l, ifn, sizeof(ifn));
		snprintf(buf, len, "link %u (%s %s)", l, ifn, addr);
	} else {
		snprintf(buf, len, "link %u (%s)", l, addr);
	}
}

static size_t event_text(const struct kd_mh *mh, const struct kcoll_c4_event *e, char *b, size_t cap)
{
	char ls[64];

	link_str(mh, e->host, e->link, ls, sizeof(ls));
	switch (e->kind) {
	case KCOLL_C4_COMM_SLOW:
		if (!e->raised)
			return snprintf(b, cap, "communication slow cleared: host %u (%s) %s", e->host,
					hname(mh, e->host), ls);
	{
		size_t n = (size_t)snprintf(b, cap, "communication slow: host %u (%s) %s: %.1f MB/s against a "
					    "median of %.1f MB/s over the links (seen on traffic with host %u; %u "
					    "of %u peers on that link slow; %u samples)", e->host,
					    hname(mh, e->host), ls, e->value / 1e6, e->ref / 1e6, e->via_host,
					    (uint32_t)(e->spread >> 32), (uint32_t)e->spread, e->nsamples);

		if (e->bpf_flags && n < cap)
			n += (size_t)snprintf(b + n, cap - n, "; BPF %s: %.1f MB/s (usually %.1f), %u "
					      "retransmissions in %u ms, srtt %.2f ms (usually %.2f)%s",
					      e->bpf_dir ? "tx" : "rx", e->bpf_rate / 1e6, e->bpf_usual / 1e6,
					      e->bpf_retrans, mh->c4 ? mh->c4->core.p.bpf_window_ms : 0,
					      e->bpf_srtt_us / 1e3, e->bpf_usual_srtt_us / 1e3,
					      e->bpf_flags & KCOLL_C4_BPF_CORROB ? ", corroborates" : "");
		return n;
	}
	case KCOLL_C4_COMM_HANG:
		if (!e->raised)
			return snprintf(b, cap, "communication hang cleared: host %u (%s)", e->host,
					hname(mh, e->host));
		return snprintf(b, cap, "communication hang: op %u: every rank submitted it, but no data from "
				"host %u (%s, rank %u) on %s for %" PRIu64 " ms", e->seq_lo, e->host,
				hname(mh, e->host), e->rank, ls, e->value);
	case KCOLL_C4_NONCOMM_HANG:
		if (!e->raised)
			return snprintf(b, cap, "non-communication hang cleared: rank %u (host %u, %s)", e->rank,
					e->host, hname(mh, e->host));
		return snprintf(b, cap, "non-communication hang: rank %u (host %u, %s) never submitted op %u; "
				"other ranks have waited %" PRIu64 " ms, it submitted nothing for %" PRIu64
				" ms", e->rank, e->host, hname(mh, e->host), e->seq_lo, e->value, e->ref);
	case KCOLL_C4_NONCOMM_SLOW:
		if (!e->raised)
			return snprintf(b, cap, "straggler cleared: rank %u (host %u, %s)", e->rank, e->host,
					hname(mh, e->host));
		return snprintf(b, cap, "straggler: rank %u (host %u, %s) submits %.1f ms after its previous "
				"op completes; the ranks' median is %.1f ms (MAD %.1f ms, %u samples)", e->rank,
				e->host, hname(mh, e->host), e->value / 1e3, e->ref / 1e3, e->spread / 1e3,
				e->nsamples);
	}
	return snprintf(b, cap, "?");
}

/* JSON string body: the texts are ours, but host names come from peers. */
static size_t jstr(char *b, size_t cap, const char *s)
{
	size_t n = 0;

	for (; *s && n + 7 < cap; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			n += snprintf(b + n, cap - n, "\\%c", ch);
		else if (ch < 0x20 || ch >= 0x7f)
			n += snprintf(b + n, cap - n, "\\u%04x", ch);
		else
			b[n++] = ch;
	}
	if (n < cap)
		b[n] = 0;
	return n;
}

#define PUT(...)                                                              \
	do {                                                                  \
		int w_ = snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__); \
		if (w_ > 0)                                                   \
			n += (size_t)w_;                                      \
	} while (0)

static size_t event_json(const struct kd_mh *mh, const struct kcoll_c4_event *e, char *buf, size_t cap)
{
	char addr[20], t[512], js[640];
	size_t n = 0;

	addr[0] = 0;
	if (e->link != KCOLL_C4_NONE)
		kd_net_link_addr(mh, e->host, e->link, addr, sizeof(addr));
	event_text(mh, e, t, sizeof(t));
	jstr(js, sizeof(js), t);
	PUT("{\"kind\":\"%s\",\"raised\":%s,\"rank\":%d,\"host\":%u,\"host_name\":\"", kind_key(e->kind),
	    e->raised ? "true" : "false", e->rank == KCOLL_C4_NONE ? -1 : (int)e->rank, e->host);
	n += jstr(buf + n, n < cap ? cap - n : 0, hname(mh, e->host));
	PUT("\",\"link\":%d,\"link_addr\":\"%s\",\"via_host\":%d,\"value\":%" PRIu64 ",\"ref\":%" PRIu64
	    ",\"spread\":%" PRIu64 ",\"samples\":%u,\"op\":%u,\"text\":\"%s\"}",
	    e->link == KCOLL_C4_NONE ? -1 : (int)e->link, addr,
	    e->via_host == KCOLL_C4_NONE ? -1 : (int)e->via_host, e->value, e->ref, e->spread, e->nsamples,
	    e->seq_lo, js);
	if (e->bpf_flags) {
		n--;	/* reopen the object */
		PUT(",\"bpf\":{\"dir\":\"%s\",\"rate\":%" PRIu64 ",\"usual\":%" PRIu64 ",\"retrans\":%u,"
		    "\"srtt_us\":%u,\"usual_srtt_us\":%u,\"collapsed\":%s,\"rtt_up\":%s,"
		    "\"corroborates\":%s}}", e->bpf_dir ? "tx" : "rx", e->bpf_rate, e->bpf_usual,
		    e->bpf_retrans, e->bpf_srtt_us, e->bpf_usual_srtt_us,
		    e->bpf_flags & KCOLL_C4_BPF_COLLAPSED ? "true" : "false",
		    e->bpf_flags & KCOLL_C4_BPF_RTT_UP ? "true" : "false",
		    e->bpf_flags & KCOLL_C4_BPF_CORROB ? "true" : "false");
	}
	return n;
}

static int64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* observer: mh->self, or the peer host whose view reported it (at its wall_ms). */
static void log_event(struct kd_comm *comm, const struct kcoll_c4_event *e, uint32_t observer, int64_t when)
{
	struct kd_c4_logent *le = &c4d.log[c4d.next_id % KD_C4_LOG];
	struct kd_mh *mh = comm->mh;

	le->id = c4d.next_id++;
	memcpy(le->comm, comm->name, sizeof(le->comm));
	le->self = observer;
	le->remote = observer != mh->self;
	le->wall_ms = when;
	le->e = *e;
	le->link_addr[0] = 0;
	if (e->link != KCOLL_C4_NONE)
		kd_net_link_addr(mh, e->host, e->link, le->link_addr, sizeof(le->link_addr));
	event_text(mh, e, le->text, sizeof(le->text));
	if (le->remote) {
		/* the observer logs and counts it; here it is news of the communicator */
		kc_info("comm %s: C4 (seen by host %u): %s", comm->name, observer, le->text);
	} else if (e->raised) {
		kd_metrics_c4_raised(e->kind);
		kc_warn("comm %s: C4: %s", comm->name, le->text);
	} else {
		kc_info("comm %s: C4: %s", comm->name, le->text);
	}
}

/* ---- the communicator's view: every host's verdicts ------------------------ */

static bool same_verdict(const struct kcoll_c4_event *a, const struct kcoll_c4_event *b)
{
	return a->kind == b->kind && a->rank == b->rank && a->host == b->host && a->link == b->link;
}

static uint64_t fnv(uint64_t h, uint64_t v)
{
	for (int i = 0; i < 8; i++, v >>= 8)
		h = (h ^ (v & 0xff)) * 0x100000001b3ULL;
	return h;
}

/*
 * Our data path's wait, when it is stalled: in op running_seq, nothing moved
 * from the host it waits for since half the hang threshold or longer. A
 * wait that moves on with every op is no news (sent on each change, it made
 * a view per tick to every peer while an anomaly was active and ops flowed);
 * a stalled one is what a hang report needs, and it holds still.
 */
static bool stalled_wait(struct kd_mh *mh, const struct kd_c4 *c, int64_t now, struct kd_p_c4_view *w)
{
	uint64_t seq = atomic_load(&mh->running_seq);
	int64_t since = atomic_load(&mh->last_progress);
	uint32_t whom = mh->wait_host;

	*w = (struct kd_p_c4_view){ .wait_host = KCOLL_C4_NONE };
	if (seq == UINT64_MAX || whom >= mh->nhosts || now - since < (int64_t)c->core.p.hang_ms * 500000)
		return false;
	*w = (struct kd_p_c4_view){ .wait_host = whom, .wait_seq = seq,
				    .wait_link = mh->hosts[whom].link[mh->wait_stream % KD_MAX_STREAMS],
				    .wait_ms = (uint32_t)((now - since) / 1000000) };
	return true;
}

/* What the peers last heard of ours: the verdicts and the stalled wait (a
 * hang report says whom each host waits for). 0: neither, so a healthy
 * communicator sends no view at all. */
static uint64_t view_sig(const struct kcoll_c4_event *act, uint32_t na, const struct kd_p_c4_view *v)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	if (!na && v->wait_host == KCOLL_C4_NONE)
		return 0;
	for (uint32_t i = 0; i < na; i++)
		h = fnv(fnv(h, (uint64_t)act[i].kind << 32 | act[i].rank),
			(uint64_t)act[i].host << 32 | act[i].link);
	return fnv(fnv(fnv(h, v->wait_host), v->wait_link), v->wait_seq) | 1;
}

static void view_send(struct kd_mh *mh, const struct kcoll_c4_event *act, uint32_t na,
		      const struct kd_p_c4_view *w, int64_t now)
{
	struct {
		struct kd_p_c4_view m;
		struct kd_p_c4_anom a[KD_C4_REMOTE];
	} v = { .m = *w };
	int64_t wall = wall_ms();

	v.m.n = na;
	for (uint32_t i = 0; i < na; i++) {
		const struct kcoll_c4_event *e = &act[i];

		v.a[i] = (struct kd_p_c4_anom){
			.kind = e->kind, .rank = e->rank, .host = e->host, .link = e->link,
			.via_host = e->via_host, .nsamples = e->nsamples, .seq_lo = e->seq_lo, .bpf_flags = e->bpf_flags,
			.bpf_dir = e->bpf_dir, .bpf_retrans = e->bpf_retrans, .bpf_srtt_us = e->bpf_srtt_us,
			.bpf_usual_srtt_us = e->bpf_usual_srtt_us, .value = e->value, .ref = e->ref,
			.spread = e->spread, .bpf_rate = e->bpf_rate, .bpf_usual = e->bpf_usual,
			.wall_ms = wall - (now - (int64_t)e->t_ns) / 1000000,
		};
	}
	for (uint32_t h = 0; h < mh->nhosts; h++)
		if (h != mh->self && !mh->hosts[h].dead &&
		    !kd_net_ctrl_send(mh, h, &v, KD_P_C4_VIEW, sizeof(v.m) + na * sizeof(v.a[0])))
			kd_metrics_c4_view_sent();
}

static void kd_c4_on_view(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h)
{
	const struct kd_p_c4_view *m = (const void *)h;
	const struct kd_p_c4_anom *a = (const void *)(m + 1);
	struct kd_mh *mh = comm->mh;
	struct kd_c4_remote *r, old;

	if (h->len < sizeof(*m) || m->n > KD_PMSG_MAX / sizeof(*a) || h->len != sizeof(*m) + m->n * sizeof(*a)) {
		kc_warn("comm %s: host %u sent a malformed C4 view; ignored", comm->name, from_host);
		return;
	}
	if (!mh->c4)
		return;
	r = &mh->c4->remote[from_host];
	pthread_mutex_lock(&comm->lock);
	old = *r;
	r->n = 0;
	/* a host judges ranks and links of this communicator only; more than
	 * we keep: a newer peer's bound, the first ones stay */
	for (uint32_t i = 0; i < m->n && r->n < KD_C4_REMOTE; i++) {
		if (a[i].kind < KCOLL_C4_COMM_HANG || a[i].kind > KCOLL_C4_NONCOMM_SLOW ||
		    a[i].host >= mh->nhosts || (a[i].rank != KCOLL_C4_NONE && a[i].rank >= comm->nranks) ||
		    (a[i].link != KCOLL_C4_NONE && a[i].link >= KCOLL_C4_MAX_LINKS))
			continue;
		r->wall_ms[r->n] = a[i].wall_ms;
		r->e[r->n++] = (struct kcoll_c4_event){
			.kind = a[i].kind, .raised = 1, .rank = a[i].rank, .host = a[i].host, .link = a[i].link,
			.via_host = a[i].via_host, .value = a[i].value, .ref = a[i].ref, .spread = a[i].spread,
			.nsamples = a[i].nsamples, .seq_lo = a[i].seq_lo, .bpf_flags = a[i].bpf_flags,
			.bpf_dir = a[i].bpf_dir, .bpf_rate = a[i].bpf_rate, .bpf_usual = a[i].bpf_usual,
			.bpf_retrans = a[i].bpf_retrans, .bpf_srtt_us = a[i].bpf_srtt_us,
			.bpf_usual_srtt_us = a[i].bpf_usual_srtt_us,
		};
	}
	r->wait_host = m->wait_host < mh->nhosts ? m->wait_host : KCOLL_C4_NONE;
	r->wait_link = m->wait_link;
	r->wait_ms = m->wait_ms;
	r->wait_seq = m->wait_seq;
	r->at = kd_now_ns();
	pthread_mutex_unlock(&comm->lock);

	/* its raises and clears join our event log, tagged with it */
	for (uint32_t i = 0; i < r->n; i++) {
		uint32_t j = 0;

		while (j < old.n && !same_verdict(&r->e[i], &old.e[j]))
			j++;
		r->heard_ms[i] = j < old.n ? old.heard_ms[j] : wall_ms();
		if (j == old.n)
			log_event(comm, &r->e[i], from_host, r->wall_ms[i]);
	}
	for (uint32_t j = 0; j < old.n; j++) {
		bool still = false;

		for (uint32_t i = 0; i < r->n && !still; i++)
			still = same_verdict(&r->e[i], &old.e[j]);
		if (!still) {
			old.e[j].raised = 0;
			log_event(comm, &old.e[j], from_host, wall_ms());
		}
	}
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

				c->seen_bytes[h][s][d] = b;
				c->seen_busy[h][s][d] = t;
				if (!o.bytes)
					continue;
				kcoll_c4_link_obs(&c->core, &o);
				kd_metrics_link(hname(mh, h), o.link, d, o.bytes, o.busy_ns);
				if (o.bytes >= c->core.p.min_obs_bytes)
					trace(c, "obs %" PRIu64 " %u %u %u %" PRIu64 " %" PRIu64 "\n", now, h, o.link,
					      d, o.bytes, o.busy_ns);
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

static void plan_log(struct kd_comm *comm, struct kd_c4 *c, const struct kcoll_c4_plan *old)
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
			link_str(mh, mh->self, old->version ? old->link[h][s] : mh->hosts[h].link[s], from,
				 sizeof(from));
			link_str(mh, mh->self, c->plan.link[h][s], to, sizeof(to));
			kc_info("comm %s: C4 plan %" PRIu64 ": host %u (%s) stream %u: %s -> %s (%s)", comm->name,
				c->plan.version, h, hname(mh, h), s, from, to, kcoll_c4_why_name(c->plan.why[h][s]));
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
static void steer_foreign(struct kd_mh *mh, const struct kcoll_c4_plan *pl, bool enforce, int64_t now,
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
		x->avoid_mine = stream_links(mh, h, plan_avoid(mh, pl, h));
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
				kd_metrics_link_rate(hname(mh, h), l, d, c->core.link[h][l][d].rate);
	nev = kcoll_c4_events(&c->core, c->consumed, ev, 16);
	if (nev)
		c->consumed = ev[nev - 1].id;
	na = kcoll_c4_active(&c->core, act, KD_C4_REMOTE);
	stalled_wait(mh, c, now, &wait);
	for (uint32_t rk = 0; rk < comm->nranks; rk++) {
		struct kcoll_c4_rankrep s;

		if (comm->clients[rk] && !kcoll_c4_rank_summary(&c->core, rk, (uint64_t)now, &s))
			rep.r[nrep++] = (struct kd_p_c4_rank){ .rank = s.rank, .age_ms = s.age_ms, .nsub = s.nsub,
								.think_us = s.think_us, .nthink = s.nthink };
	}
	old = c->plan;
	if (kcoll_c4_plan(&c->core, shared, mh->nstreams, (uint64_t)now, &c->plan) > 0)
		plan_log(comm, c, &old);
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
		log_event(comm, &ev[i], mh->self, wall_ms());
	sig = view_sig(act, na, &wait);
	if (sig != c->view_sig) {
		view_send(mh, act, na, &wait, now);
		c->view_sig = sig;
	}
	/* one communicator's plan steers the foreign flows (the first one) */
	if (kd_bpf_steer_hook && !c4d.steered) {
		steer_foreign(mh, &c->plan, enforce, now, recv_ready);
		c4d.steered = true;
	}
	for (uint32_t h = 0; h < mh->nhosts; h++) {
		uint32_t want = enforce ? plan_avoid(mh, &c->plan, h) : 0;

		if (h == mh->self || mh->hosts[h].dead)
			continue;
		rep.m = (struct kd_p_c4){ .n = nrep, .want_avoid = want, .steer_recv = recv_ready[h] };
		kd_net_ctrl_send(mh, h, &rep, KD_P_C4, sizeof(rep.m) + nrep * sizeof(rep.r[0]));
		if (h > mh->self)
			plan_propose(comm, h, want, now);
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

static size_t render_events(uint64_t since, char *buf, size_t cap, int json, bool local)
{
	uint64_t first = c4d.next_id > KD_C4_LOG ? c4d.next_id - KD_C4_LOG : 1;
	size_t n = 0;
	bool any = false;

	if (since + 1 > first)
		first = since + 1;
	if (json)
		PUT("{\"last\":%" PRIu64 ",\"events\":[", c4d.next_id - 1);
	for (uint64_t id = first; id < c4d.next_id && n + 1024 < cap; id++) {
		const struct kd_c4_logent *le = &c4d.log[id % KD_C4_LOG];
		char js[640];

		if (local && le->remote)
			continue;
		if (json) {
			jstr(js, sizeof(js), le->text);
			PUT("%s{\"id\":%" PRIu64 ",\"comm\":\"%s\",\"observer\":%u,\"time_ms\":%" PRId64
			    ",\"kind\":\"%s\",\"raised\":%s,\"rank\":%d,\"host\":%u,\"link\":%d,"
			    "\"link_addr\":\"%s\",\"text\":\"%s\"}",
			    any ? "," : "", le->id, le->comm, le->self, le->wall_ms, kind_key(le->e.kind),
			    le->e.raised ? "true" : "false",
			    le->e.rank == KCOLL_C4_NONE ? -1 : (int)le->e.rank, le->e.host,
			    le->e.link == KCOLL_C4_NONE ? -1 : (int)le->e.link, le->link_addr, js);
		} else {
			time_t t = le->wall_ms / 1000;
			struct tm tm;
			char ts[32];

			gmtime_r(&t, &tm);
			strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
			PUT("%" PRIu64 " %s.%03d comm %s: %s [seen by host %u]\n", le->id, ts,
			    (int)(le->wall_ms % 1000), le->comm, le->text, le->self);
		}
		any = true;
	}
	if (json)
		PUT("]}\n");
	return n;
}

/* One verdict of the communicator and the hosts that hold it. */
struct kd_c4_shown {
	struct kcoll_c4_event e;
	uint64_t seen;		/* bitmap of the observing hosts */
	int64_t held_ms;	/* since when this host knows it (raised here or heard), wall clock */
};

static void shown_add(struct kd_c4_shown *out, uint32_t *n, uint32_t max, const struct kcoll_c4_event *e,
		      uint32_t observer, int64_t held_ms)
{
	for (uint32_t i = 0; i < *n; i++)
		if (same_verdict(&out[i].e, e)) {
			out[i].seen |= 1ULL << observer;
			if (held_ms < out[i].held_ms)
				out[i].held_ms = held_ms;
			return;
		}
	if (*n < max)
		out[(*n)++] = (struct kd_c4_shown){ .e = *e, .seen = 1ULL << observer, .held_ms = held_ms };
}

/* Our active anomalies, then (unless local) each live peer's, one entry per
 * (kind, rank, host, link) with the evidence of its first observer.
 * comm->lock held. */
static uint32_t merged(const struct kd_mh *mh, bool local, struct kd_c4_shown *out, uint32_t max)
{
	struct kcoll_c4_event act[KD_C4_SHOW];
	uint32_t na = kcoll_c4_active(&mh->c4->core, act, KD_C4_SHOW), n = 0;
	int64_t now = kd_now_ns(), wall = wall_ms();

	for (uint32_t i = 0; i < na; i++)
		shown_add(out, &n, max, &act[i], mh->self, wall - (now - (int64_t)act[i].t_ns) / 1000000);
	for (uint32_t h = 0; !local && h < mh->nhosts; h++) {
		const struct kd_c4_remote *r = &mh->c4->remote[h];

		for (uint32_t i = 0; h != mh->self && !mh->hosts[h].dead && i < r->n; i++)
			shown_add(out, &n, max, &r->e[i], h, r->heard_ms[i]);
	}
	return n;
}

/* kcollctl status: the communicator's active anomalies as every host judges
 * them (what kcollctl anomalies lists) and the hosts that hold one. */
static uint32_t kd_c4_summary(struct kd_comm *comm, uint64_t *seen)
{
	struct kd_c4_shown act[KD_C4_SHOW];
	uint32_t n = 0;

	*seen = 0;
	pthread_mutex_lock(&comm->lock);
	if (comm->mh && comm->mh->c4)
		n = merged(comm->mh, false, act, KD_C4_SHOW);
	pthread_mutex_unlock(&comm->lock);
	for (uint32_t i = 0; i < n; i++)
		*seen |= act[i].seen;
	return n;
}

/* What host h's data path is stalled on: from our net thread, or from h's
 * last view (its age added). False: it is not stalled as far as we know. */
static bool host_wait(struct kd_mh *mh, uint32_t h, int64_t now, uint64_t *seq, uint32_t *whom,
		      uint32_t *link, uint64_t *ms)
{
	const struct kd_c4_remote *r = &mh->c4->remote[h];

	if (h == mh->self) {
		struct kd_p_c4_view w;

		if (!stalled_wait(mh, mh->c4, now, &w))
			return false;
		*seq = w.wait_seq;
		*whom = w.wait_host;
		*link = w.wait_link;
		*ms = w.wait_ms;
		return true;
	}
	if (!r->at || r->wait_host == KCOLL_C4_NONE || mh->hosts[h].dead)
		return false;
	*seq = r->wait_seq;
	*whom = r->wait_host;
	*link = r->wait_link;
	*ms = r->wait_ms + (uint64_t)(now - r->at) / 1000000;
	return true;
}

static size_t seen_list(uint64_t seen, char *buf, size_t cap)
{
	size_t n = 0;

	buf[0] = 0;
	for (uint32_t h = 0; h < 64; h++)
		if (seen & (1ULL << h))
			PUT("%s%u", n ? "," : "", h);
	return n;
}

static size_t render_anomalies(char *buf, size_t cap, int json, bool local)
{
	size_t n = 0;
	bool firstc = true;

	if (json)
		PUT("{\"comms\":[");
	for (struct kd_comm *comm = kd.comms; comm && n + 4096 < cap; comm = comm->next) {
		struct kd_mh *mh = comm->mh;
		struct kd_c4_shown act[KD_C4_SHOW];
		struct kcoll_c4 *c;
		int64_t now = kd_now_ns();
		uint32_t na;

		if (!mh || !mh->c4 || comm->state != KD_COMM_ACTIVE)
			continue;
		pthread_mutex_lock(&comm->lock);
		c = &mh->c4->core;
		na = merged(mh, local, act, KD_C4_SHOW);
		if (json) {
			PUT("%s{\"comm\":\"%s\",\"host\":%u,\"local\":%s,\"active\":[", firstc ? "" : ",",
			    comm->name, mh->self, local ? "true" : "false");
			for (uint32_t i = 0; i < na && n + 2048 < cap; i++) {
				char sl[256];

				PUT("%s", i ? "," : "");
				n += event_json(mh, &act[i].e, buf + n, n < cap ? cap - n : 0);
				seen_list(act[i].seen, sl, sizeof(sl));
				n--;	/* reopen the object */
				PUT(",\"seen_by\":[%s],\"held_ms\":%" PRId64 "}", sl, act[i].held_ms);
			}
			PUT("],\"links\":[");
		} else {
			PUT("comm %s (host %u of %u%s): %u active anomal%s\n", comm->name, mh->self, mh->nhosts,
			    local ? ", its own verdicts only" : "", na, na == 1 ? "y" : "ies");
			for (uint32_t i = 0; i < na; i++) {
				char t[512], sl[256];

				event_text(mh, &act[i].e, t, sizeof(t));
				seen_list(act[i].seen, sl, sizeof(sl));
				PUT("  %s [seen by host %s]\n", t, sl);
			}
			PUT("  links (rate of large pieces over the last %u ms, MB/s):\n", c->p.window_ms);
			PUT("    %-5s %-16s %-5s %-22s %10s %s    (BPF: %s)\n", "HOST", "NAME", "DIR", "LINK", "RATE",
			    "STATE", "wall-clock MB/s, usual, retransmissions, srtt ms");
		}
		bool first = true;

		for (uint32_t h = 0; h < mh->nhosts; h++)
			for (uint32_t l = 0; l < c->nlinks; l++)
				for (uint32_t d = 0; d < 2; d++) {
					const struct kcoll_c4_link *k = &c->link[h][l][d];
					const struct kcoll_c4_bpf *b = &c->bpf[h][l][d];
					bool bs = b->state & KCOLL_C4_BPF_SEEN;
					char ls[64];

					if (h == mh->self || (!k->rate && !k->slow && !bs))
						continue;
					link_str(mh, h, l, ls, sizeof(ls));
					if (json) {
						PUT("%s{\"host\":%u,\"link\":%u,\"dir\":\"%s\",\"rate\":%" PRIu64
						    ",\"slow\":%s", first ? "" : ",", h, l, d ? "tx" : "rx", k->rate,
						    k->slow ? "true" : "false");
						if (bs)
							PUT(",\"bpf\":{\"rate\":%" PRIu64 ",\"usual\":%" PRIu64
							    ",\"retrans\":%u,\"srtt_us\":%u,\"usual_srtt_us\":%u,"
							    "\"collapsed\":%s,\"rtt_up\":%s}", b->rate, b->usual,
							    b->retrans, b->srtt_us, b->usual_srtt_us,
							    b->state & KCOLL_C4_BPF_COLLAPSED ? "true" : "false",
							    b->state & KCOLL_C4_BPF_RTT_UP ? "true" : "false");
						PUT("}");
					} else if (bs) {
						PUT("    %-5u %-16.16s %-5s %-22s %10.1f %-4s    %.1f %.1f %u %.2f\n", h,
						    hname(mh, h), d ? "tx" : "rx", ls, k->rate / 1e6, k->slow ? "SLOW" : "ok",
						    b->rate / 1e6, b->usual / 1e6, b->retrans, b->srtt_us / 1e3);
					} else {
						PUT("    %-5u %-16.16s %-5s %-22s %10.1f %s\n", h, hname(mh, h),
						    d ? "tx" : "rx", ls, k->rate / 1e6, k->slow ? "SLOW" : "ok");
					}
					first = false;
				}
		if (json)
			PUT("],\"ranks\":[");
		else
			PUT("  ranks:\n    %-5s %-5s %-16s %8s %10s %10s %-9s %9s %s\n", "RANK", "HOST", "NAME", "OPS",
			    "AGE_MS", "THINK_MS", "STATE", "LAST_DONE", "WAITS IN");
		for (uint32_t r = 0; r < comm->nranks && n + 512 < cap; r++) {
			const struct kcoll_c4_rank *k = &c->rank[r];
			struct kcoll_c4_rankrep s = { 0 };
			bool known = k->local || k->rep_ns;

			if (k->local)
				kcoll_c4_rank_summary(c, r, (uint64_t)kd_now_ns(), &s);
			else
				s = (struct kcoll_c4_rankrep){ .nsub = k->nsub, .think_us = k->rep_think_us,
							       .age_ms = k->rep_age_ms };
			const char *st = k->hung ? "HUNG" : k->straggler ? "STRAGGLER" : known ? "ok" : "unknown";
			uint64_t wseq = 0, wms = 0;
			uint32_t whom = 0, wlink = 0;
			bool waits = host_wait(mh, c->rank_host[r], now, &wseq, &whom, &wlink, &wms);
			char wt[96] = "";

			/* Its host is stalled in op wseq: the ops before it completed
			 * there. A hung rank never submitted op nsub, which the other
			 * ranks wait in: every op before it completed. */
			if (!waits && k->hung) {
				wseq = s.nsub;
				wms = s.age_ms;
			}
			if (waits)
				snprintf(wt, sizeof(wt), "op %" PRIu64 ": host %u on link %u, %" PRIu64 " ms", wseq,
					 whom, wlink, wms);
			else if (k->hung)
				snprintf(wt, sizeof(wt), "op %" PRIu64 ": its own submission, %" PRIu64 " ms", wseq,
					 wms);
			if (json) {
				PUT("%s{\"rank\":%u,\"host\":%u,\"local\":%s,\"ops\":%" PRIu64 ",\"age_ms\":%u,"
				    "\"think_us\":%u,\"state\":\"%s\"", r ? "," : "", r, c->rank_host[r],
				    k->local ? "true" : "false", s.nsub, s.age_ms, s.think_us, st);
				if (waits)
					PUT(",\"last_done\":%" PRId64 ",\"waits\":{\"for\":\"host\",\"op\":%" PRIu64
					    ",\"host\":%u,\"link\":%u,\"ms\":%" PRIu64 "}", (int64_t)wseq - 1, wseq,
					    whom, wlink, wms);
				else if (k->hung)
					PUT(",\"last_done\":%" PRId64 ",\"waits\":{\"for\":\"submission\",\"op\":%"
					    PRIu64 ",\"ms\":%" PRIu64 "}", (int64_t)wseq - 1, wseq, wms);
				PUT("}");
			} else if (wt[0]) {
				PUT("    %-5u %-5u %-16.16s %8" PRIu64 " %10u %10.2f %-9s %9" PRId64 " %s\n", r,
				    c->rank_host[r], hname(mh, c->rank_host[r]), s.nsub, s.age_ms, s.think_us / 1e3, st,
				    (int64_t)wseq - 1, wt);
			} else {
				PUT("    %-5u %-5u %-16.16s %8" PRIu64 " %10u %10.2f %s\n", r, c->rank_host[r],
				    hname(mh, c->rank_host[r]), s.nsub, s.age_ms, s.think_us / 1e3, st);
			}
		}
		if (json)
			PUT("]}");
		pthread_mutex_unlock(&comm->lock);
		firstc = false;
	}
	if (json)
		PUT("]}\n");
	else if (firstc)
		PUT("no multi-host communicator: nothing to judge\n");
	return n;
}

static size_t render_plan(char *buf, size_t cap, int json)
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
				link_str(mh, mh->self, mh->hosts[h].link[s], now, sizeof(now));
				link_str(mh, mh->self, pl->link[h][s], want, sizeof(want));
				if (json)
					PUT("%s{\"host\":%u,\"stream\":%u,\"stream_link\":%u,\"in_use\":%s,"
					    "\"link\":%u,\"why\":\"%s\"}", first ? "" : ",", h, s,
					    mh->hosts[h].link[s], used ? "true" : "false", pl->link[h][s],
					    kcoll_c4_why_name(pl->why[h][s]));
				else
					PUT("  %-5u %-16.16s %-6u %-24s %-6s %-24s %s\n", h, hname(mh, h), s, now,
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

size_t kd_c4_render(uint32_t what, uint64_t since, char *buf, size_t cap, uint32_t flags)
{
	int json = !!(flags & KCOLL_C4_F_JSON);
	bool local = flags & KCOLL_C4_F_LOCAL;
	size_t n;

	switch (what) {
	case KCOLL_C4_EVENTS:
		n = render_events(since, buf, cap, json, local);
		break;
	case KCOLL_C4_PLAN:
		n = render_plan(buf, cap, json);
		break;
	default:
		n = render_anomalies(buf, cap, json, local);
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
