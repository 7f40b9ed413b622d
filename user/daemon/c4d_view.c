// SPDX-License-Identifier: MIT
/*
 * C4's view of a communicator: every host sends its active verdicts and
 * its data path's stalled wait to the others when they change
 * (KD_P_C4_VIEW), so any host answers for the whole communicator. Here:
 * sending ours (c4d.c's tick decides when), taking a peer's (its raises
 * and clears join our event log), and what is read from the merged view:
 * `kcollctl anomalies` and the summary of kcollctl status. Calls
 * c4d_text.c and net_conn.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <kcoll/c4.h>

#include "c4d.h"
#include "c4d_int.h"
#include "kcolld.h"
#include "log.h"
#include "metrics.h"
#include "mh.h"
#include "net.h"

#define KD_C4_SHOW	64		/* merged entries kcollctl anomalies shows per comm */

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
bool c4d_stalled_wait(struct kd_mh *mh, const struct kd_c4 *c, int64_t now, struct kd_p_c4_view *w)
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
uint64_t c4d_view_sig(const struct kcoll_c4_event *act, uint32_t na, const struct kd_p_c4_view *v)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	if (!na && v->wait_host == KCOLL_C4_NONE)
		return 0;
	for (uint32_t i = 0; i < na; i++)
		h = fnv(fnv(h, (uint64_t)act[i].kind << 32 | act[i].rank),
			(uint64_t)act[i].host << 32 | act[i].link);
	return fnv(fnv(fnv(h, v->wait_host), v->wait_link), v->wait_seq) | 1;
}

void c4d_view_send(struct kd_mh *mh, const struct kcoll_c4_event *act, uint32_t na,
		   const struct kd_p_c4_view *w, int64_t now)
{
	struct {
		struct kd_p_c4_view m;
		struct kd_p_c4_anom a[KD_C4_REMOTE];
	} v = { .m = *w };
	int64_t wall = c4d_wall_ms();

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

void kd_c4_on_view(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h)
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
		r->heard_ms[i] = j < old.n ? old.heard_ms[j] : c4d_wall_ms();
		if (j == old.n)
			c4d_log_event(comm, &r->e[i], from_host, r->wall_ms[i]);
	}
	for (uint32_t j = 0; j < old.n; j++) {
		bool still = false;

		for (uint32_t i = 0; i < r->n && !still; i++)
			still = same_verdict(&r->e[i], &old.e[j]);
		if (!still) {
			old.e[j].raised = 0;
			c4d_log_event(comm, &old.e[j], from_host, c4d_wall_ms());
		}
	}
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
	int64_t now = kd_now_ns(), wall = c4d_wall_ms();

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
uint32_t kd_c4_summary(struct kd_comm *comm, uint64_t *seen)
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

		if (!c4d_stalled_wait(mh, mh->c4, now, &w))
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

size_t c4d_render_anomalies(char *buf, size_t cap, int json, bool local)
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
				n += c4d_event_json(mh, &act[i].e, buf + n, n < cap ? cap - n : 0);
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

				c4d_event_text(mh, &act[i].e, t, sizeof(t));
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
					c4d_link_str(mh, h, l, ls, sizeof(ls));
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
						    c4d_hname(mh, h), d ? "tx" : "rx", ls, k->rate / 1e6, k->slow ? "SLOW" : "ok",
						    b->rate / 1e6, b->usual / 1e6, b->retrans, b->srtt_us / 1e3);
					} else {
						PUT("    %-5u %-16.16s %-5s %-22s %10.1f %s\n", h, c4d_hname(mh, h),
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
				    c->rank_host[r], c4d_hname(mh, c->rank_host[r]), s.nsub, s.age_ms, s.think_us / 1e3, st,
				    (int64_t)wseq - 1, wt);
			} else {
				PUT("    %-5u %-5u %-16.16s %8" PRIu64 " %10u %10.2f %s\n", r, c->rank_host[r],
				    c4d_hname(mh, c->rank_host[r]), s.nsub, s.age_ms, s.think_us / 1e3, st);
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
