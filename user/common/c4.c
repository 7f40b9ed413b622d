// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * C4 detector and planner core (include/kcoll/c4.h). Freestanding: integer
 * arithmetic only, no allocation, no libc calls, so kcoll.ko can build it.
 */
#ifdef __KERNEL__
#include <linux/errno.h>
#include <linux/math64.h>
/* 64-bit divisions by a variable or a constant other than a power of two:
 * 32-bit kernels have no libgcc to do them */
#define DIV64(a, b) div64_u64((a), (b))
#else
#include <errno.h>
#define DIV64(a, b) ((uint64_t)(a) / (uint64_t)(b))
#endif

#include <kcoll/c4.h>

#define MS	1000000ull

void kcoll_c4_params_default(struct kcoll_c4_params *p)
{
	*p = (struct kcoll_c4_params){
		.slow_ratio_pct = 200,
		.hang_ms = 5000,
		.straggler_ms = 20,
		.mad_k = 5,
		.min_samples = 3,
		.raise_evals = 2,
		.clear_evals = 4,
		.window_ms = 3000,
		.heal_hold_ms = 2000,
		.probe_ms = 5000,
		.min_obs_bytes = 256 << 10,
		.min_obs_busy_ms = 200,
		.min_busy_pct = 20,
		.bpf_window_ms = 1000,
	};
}

static void zero(void *p, uint64_t n)
{
	uint8_t *b = p;

	while (n--)
		*b++ = 0;
}

/* Sort a small array in place (insertion sort: n <= 256). */
static void sort_u64(uint64_t *v, uint32_t n)
{
	for (uint32_t i = 1; i < n; i++) {
		uint64_t x = v[i];
		uint32_t j = i;

		for (; j && v[j - 1] > x; j--)
			v[j] = v[j - 1];
		v[j] = x;
	}
}

/* The median of v[0..n) (sorts v); the lower middle's and upper middle's mean. */
static uint64_t median(uint64_t *v, uint32_t n)
{
	if (!n)
		return 0;
	sort_u64(v, n);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t absdiff(uint64_t a, uint64_t b)
{
	return a > b ? a - b : b - a;
}

static int check_params(const struct kcoll_c4_params *p)
{
	if (p->slow_ratio_pct <= 100 || !p->hang_ms || !p->min_samples ||
	    p->min_samples > KCOLL_C4_WIN || !p->raise_evals || !p->clear_evals || !p->window_ms)
		return -EINVAL;
	return 0;
}

int kcoll_c4_set_params(struct kcoll_c4 *c, const struct kcoll_c4_params *p)
{
	if (check_params(p))
		return -EINVAL;
	c->p = *p;
	return 0;
}

int kcoll_c4_init(struct kcoll_c4 *c, const struct kcoll_c4_params *p, uint32_t nranks,
		  uint32_t nhosts, uint32_t self, uint32_t nlinks, const uint16_t *rank_host,
		  uint64_t now)
{
	if (!nranks || nranks > KCOLL_C4_MAX_RANKS || !nhosts || nhosts > KCOLL_C4_MAX_HOSTS ||
	    self >= nhosts || !nlinks || nlinks > KCOLL_C4_MAX_LINKS || check_params(p))
		return -EINVAL;
	for (uint32_t r = 0; r < nranks; r++)
		if (rank_host[r] >= nhosts)
			return -EINVAL;
	zero(c, sizeof(*c));
	c->p = *p;
	c->nranks = nranks;
	c->nhosts = nhosts;
	c->self = self;
	c->nlinks = nlinks;
	c->start_ns = now;
	c->wait_host = KCOLL_C4_NONE;
	c->next_id = 1;
	for (uint32_t r = 0; r < nranks; r++)
		c->rank_host[r] = (uint8_t)rank_host[r];
	return 0;
}

int kcoll_c4_local(struct kcoll_c4 *c, uint32_t rank)
{
	if (rank >= c->nranks || c->rank_host[rank] != c->self)
		return -EINVAL;
	c->rank[rank].local = true;
	return 0;
}

static uint32_t think_median(const struct kcoll_c4_rank *r)
{
	uint64_t v[KCOLL_C4_WIN];
	uint32_t n = r->nthink < KCOLL_C4_WIN ? r->nthink : KCOLL_C4_WIN;

	for (uint32_t i = 0; i < n; i++)
		v[i] = r->think_us[i];
	return (uint32_t)median(v, n);
}

int kcoll_c4_submit(struct kcoll_c4 *c, uint32_t rank, uint64_t seq, uint64_t now)
{
	struct kcoll_c4_rank *r;

	if (rank >= c->nranks || !c->rank[rank].local)
		return -EINVAL;
	r = &c->rank[rank];
	/* Think time: from the completion of its previous op to this submission
	 * (0 when it submitted before that op completed: pipelined). */
	if (seq && r->last_done_ns && r->last_done_ns >= r->last_sub_ns && now >= r->last_done_ns) {
		uint64_t us = DIV64(now - r->last_done_ns, 1000);

		r->think_us[r->think_pos] = us > 0xffffffffu ? 0xffffffffu : (uint32_t)us;
		r->think_pos = (r->think_pos + 1) % KCOLL_C4_WIN;
		r->nthink++;
	}
	if (seq + 1 > r->nsub)
		r->nsub = seq + 1;
	r->last_sub_ns = now;
	return 0;
}

int kcoll_c4_complete(struct kcoll_c4 *c, uint32_t rank, uint64_t now)
{
	if (rank >= c->nranks || !c->rank[rank].local)
		return -EINVAL;
	c->rank[rank].last_done_ns = now;
	return 0;
}

/*
 * Just healed: the planner brings streams back to a link heal_hold_ms after
 * its verdict cleared, and their first seconds there (TCP restarting after
 * idle, a busy host's scheduling) must not raise it again on the usual
 * margin: a link that flaps steers flows back and forth. For heal_hold_ms +
 * 2 windows after a verdict on (host h, link l) cleared, either direction's,
 * or on our own link l, its keys take 4 times the margin; a link still
 * degraded (10x and worse) is caught at once.
 */
static bool on_probation(const struct kcoll_c4 *c, uint32_t h, uint32_t l, uint64_t now)
{
	uint64_t p = ((uint64_t)c->p.heal_hold_ms + 2ull * c->p.window_ms) * MS;
	uint64_t t[4] = { c->link[h][l][0].cleared_t, c->link[h][l][1].cleared_t,
			  c->culprit[h][l].cleared_ns, c->culprit[c->self][l].cleared_ns };

	for (int i = 0; i < 4; i++)
		if (t[i] && now - t[i] < p)
			return true;
	return false;
}

static uint64_t since_ms(uint64_t now, uint64_t t)
{
	return now > t ? DIV64(now - t, MS) : 0;
}

int kcoll_c4_rank_summary(const struct kcoll_c4 *c, uint32_t rank, uint64_t now,
			  struct kcoll_c4_rankrep *out)
{
	const struct kcoll_c4_rank *r;
	uint64_t age;

	if (rank >= c->nranks || !c->rank[rank].local)
		return -EINVAL;
	r = &c->rank[rank];
	age = since_ms(now, r->last_sub_ns ? r->last_sub_ns : c->start_ns);
	*out = (struct kcoll_c4_rankrep){
		.rank = rank,
		.age_ms = age > 0xffffffffu ? 0xffffffffu : (uint32_t)age,
		.nsub = r->nsub,
		.think_us = think_median(r),
		.nthink = r->nthink < KCOLL_C4_WIN ? r->nthink : KCOLL_C4_WIN,
	};
	return 0;
}

int kcoll_c4_rank_report(struct kcoll_c4 *c, const struct kcoll_c4_rankrep *m, uint64_t now)
{
	struct kcoll_c4_rank *r;

	if (m->rank >= c->nranks || c->rank[m->rank].local || m->nthink > KCOLL_C4_WIN)
		return -EINVAL;
	r = &c->rank[m->rank];
	r->nsub = m->nsub;
	r->rep_ns = now;
	r->rep_age_ms = m->age_ms;
	r->rep_think_us = m->think_us;
	r->rep_nthink = m->nthink;
	return 0;
}

/* BPF flow statistics: every interval counts (no traffic is a rate too). */
static void bpf_obs(struct kcoll_c4 *c, const struct kcoll_c4_linkobs *o)
{
	struct kcoll_c4_bpf *b = &c->bpf[o->host][o->link][o->dir];

	b->bytes[b->pos] = o->bytes;
	b->dt[b->pos] = o->busy_ns;
	b->t[b->pos] = o->t_ns;
	b->retr[b->pos] = o->retrans;
	b->pos = (b->pos + 1) % KCOLL_C4_BPF_WIN;
	if (b->n < KCOLL_C4_BPF_WIN)
		b->n++;
	if (o->srtt_us)
		b->srtt_us = o->srtt_us;
}

int kcoll_c4_link_obs(struct kcoll_c4 *c, const struct kcoll_c4_linkobs *o)
{
	struct kcoll_c4_link *l;

	if (o->host >= c->nhosts || o->host == c->self || o->link >= c->nlinks || o->dir > 1 ||
	    (o->flags & ~KCOLL_C4_OBS_BPF))
		return -EINVAL;
	if (o->flags & KCOLL_C4_OBS_BPF) {
		if (!o->busy_ns)
			return -EINVAL;	/* an interval of no length */
		bpf_obs(c, o);
		return 0;
	}
	if (!o->busy_ns)
		return 0;
	l = &c->link[o->host][o->link][o->dir];
	/* Small transfers measure latency, not rate: they would skew the median.
	 * But the slower a link, the fewer bytes each observation holds: add
	 * them up until they hold min_obs_bytes, or min_obs_busy_ms of busy
	 * time (that long is a rate, whatever the bytes: without it a link
	 * under min_samples x min_obs_bytes per window_ms, 256 kB/s, was never
	 * judged; dropping them hid exactly the slow link). What was added up
	 * longer than window_ms ago is stale. */
	if (l->acc_bytes && o->t_ns > l->acc_t && o->t_ns - l->acc_t > (uint64_t)c->p.window_ms * MS)
		l->acc_bytes = l->acc_busy = 0;
	if (!l->acc_bytes)
		l->acc_t = o->t_ns;
	l->acc_bytes += o->bytes;
	l->acc_busy += o->busy_ns;
	if (l->acc_bytes < c->p.min_obs_bytes && l->acc_busy < (uint64_t)c->p.min_obs_busy_ms * MS)
		return 0;
	l->bytes[l->pos] = l->acc_bytes;
	l->busy[l->pos] = l->acc_busy;
	l->t[l->pos] = o->t_ns;
	l->acc_bytes = l->acc_busy = 0;
	l->pos = (l->pos + 1) % KCOLL_C4_WIN;
	l->last_t = o->t_ns;
	if (l->n < KCOLL_C4_WIN)
		l->n++;
	return 0;
}

void kcoll_c4_wait(struct kcoll_c4 *c, uint32_t host, uint32_t link, uint64_t since, uint64_t seq)
{
	c->wait_host = host < c->nhosts ? host : KCOLL_C4_NONE;
	c->wait_link = link;
	c->wait_since = since;
	c->wait_seq = seq;
}

/* ---- evaluation --------------------------------------------------------- */

static void emit(struct kcoll_c4 *c, struct kcoll_c4_event *e, uint64_t now)
{
	e->id = c->next_id++;
	e->t_ns = now;
	c->ev[e->id % KCOLL_C4_EVQ] = *e;
}

/* A rank's state is known: local, or a summary fresher than hang_ms. */
static bool rank_known(const struct kcoll_c4 *c, const struct kcoll_c4_rank *r, uint64_t now)
{
	return r->local || (r->rep_ns && since_ms(now, r->rep_ns) < c->p.hang_ms);
}

static uint64_t rank_age_ms(const struct kcoll_c4 *c, const struct kcoll_c4_rank *r, uint64_t now)
{
	if (r->local)
		return since_ms(now, r->last_sub_ns ? r->last_sub_ns : c->start_ns);
	return r->rep_age_ms + since_ms(now, r->rep_ns);
}

static void rank_event(struct kcoll_c4 *c, uint32_t rank, uint32_t kind, bool raised,
		       uint64_t value, uint64_t ref, uint64_t spread, uint32_t n, uint64_t now)
{
	struct kcoll_c4_event e = {
		.kind = kind, .raised = raised, .rank = rank, .host = c->rank_host[rank],
		.link = KCOLL_C4_NONE, .via_host = KCOLL_C4_NONE, .value = value, .ref = ref,
		.spread = spread, .nsamples = n, .seq_lo = (uint32_t)c->rank[rank].nsub,
	};

	emit(c, &e, now);
	if (raised)
		c->rank_ev[rank] = e;
}

/* Non-communication hang: a rank behind the others (it never submitted the
 * op they wait in) that has not submitted anything for hang_ms, while a rank
 * ahead has waited that long. Ranks whose state is unknown are not judged. */
static int judge_rank_hangs(struct kcoll_c4 *c, uint64_t now)
{
	uint64_t maxn = 0;
	int nev = 0;

	for (uint32_t r = 0; r < c->nranks; r++)
		if (rank_known(c, &c->rank[r], now) && c->rank[r].nsub > maxn)
			maxn = c->rank[r].nsub;
	for (uint32_t r = 0; r < c->nranks; r++) {
		struct kcoll_c4_rank *k = &c->rank[r];
		uint64_t wait = 0, age;
		bool hung;

		if (!rank_known(c, k, now)) {
			if (k->hung) {
				k->hung = false;	/* its daemon went silent: not judged */
				rank_event(c, r, KCOLL_C4_NONCOMM_HANG, false, 0, 0, 0, 0, now);
				nev++;
			}
			continue;
		}
		for (uint32_t q = 0; q < c->nranks; q++) {
			const struct kcoll_c4_rank *a = &c->rank[q];

			if (q != r && rank_known(c, a, now) && a->nsub > k->nsub) {
				uint64_t w = rank_age_ms(c, a, now);

				if (w > wait)
					wait = w;
			}
		}
		age = rank_age_ms(c, k, now);
		hung = k->nsub < maxn && wait >= c->p.hang_ms && age >= c->p.hang_ms;
		if (hung != k->hung) {
			k->hung = hung;
			rank_event(c, r, KCOLL_C4_NONCOMM_HANG, hung, wait, age, 0, 0, now);
			nev++;
		}
	}
	return nev;
}

/* Straggler: median think time above the ranks' median by straggler_ms and
 * mad_k MADs, raise_evals evaluations in a row; clears after clear_evals. */
static int judge_stragglers(struct kcoll_c4 *c, uint64_t now)
{
	uint64_t *v = c->tmp_v, *think = c->tmp_think, m, mad;
	uint32_t n = 0, *ns = c->tmp_n;
	int nev = 0;

	for (uint32_t r = 0; r < c->nranks; r++) {
		struct kcoll_c4_rank *k = &c->rank[r];

		ns[r] = 0;
		if (!rank_known(c, k, now))
			continue;
		ns[r] = k->local ? (k->nthink < KCOLL_C4_WIN ? k->nthink : KCOLL_C4_WIN) : k->rep_nthink;
		think[r] = k->local ? think_median(k) : k->rep_think_us;
		if (ns[r] >= c->p.min_samples)
			v[n++] = think[r];
	}
	if (n < 3)
		return 0;	/* a median of two says nothing about which one is late */
	m = median(v, n);
	for (uint32_t i = 0; i < n; i++)
		v[i] = absdiff(v[i], m);
	mad = median(v, n);
	for (uint32_t r = 0; r < c->nranks; r++) {
		struct kcoll_c4_rank *k = &c->rank[r];
		bool late;

		if (ns[r] < c->p.min_samples)
			continue;
		late = think[r] > m + (uint64_t)c->p.straggler_ms * 1000 &&
		       think[r] - m > (uint64_t)c->p.mad_k * mad;
		if (late) {
			k->good = 0;
			if (k->bad < 255)
				k->bad++;
		} else {
			k->bad = 0;
			if (k->good < 255)
				k->good++;
		}
		if (!k->straggler && k->bad >= c->p.raise_evals) {
			k->straggler = true;
			rank_event(c, r, KCOLL_C4_NONCOMM_SLOW, true, think[r], m, mad, ns[r], now);
			nev++;
		} else if (k->straggler && k->good >= c->p.clear_evals) {
			k->straggler = false;
			rank_event(c, r, KCOLL_C4_NONCOMM_SLOW, false, think[r], m, mad, ns[r], now);
			nev++;
		}
	}
	return nev;
}

/* A link's rate over its window: bytes / busy time (B/s), 0 if too few;
 * *busy_pct: how much of the time its samples span it was busy. */
static uint64_t link_rate(struct kcoll_c4 *c, struct kcoll_c4_link *l, uint64_t now, uint32_t *n,
			  uint32_t *busy_pct)
{
	uint64_t b = 0, t = 0, horizon = (uint64_t)c->p.window_ms * MS, lo = ~(uint64_t)0, hi = 0, span;

	*n = 0;
	*busy_pct = 0;
	for (uint32_t i = 0; i < l->n; i++) {
		if (now > l->t[i] && now - l->t[i] > horizon)
			continue;
		b += l->bytes[i];
		t += l->busy[i];
		lo = l->t[i] < lo ? l->t[i] : lo;
		hi = l->t[i] > hi ? l->t[i] : hi;
		(*n)++;
	}
	if (*n < c->p.min_samples || !t)
		return 0;
	/* n samples, one per interval: they span about n intervals */
	span = hi > lo ? DIV64(hi - lo, *n - 1) * *n : 0;
	*busy_pct = span ? (uint32_t)(DIV64(t * 100, span) < 1000 ? DIV64(t * 100, span) : 1000) : 1000;
	/* b * 1e9 / t without overflow for b < 2^34 per sample window */
	return b >= (1ull << 33) ? DIV64(b, DIV64(t, 1000000000ull) + 1) : DIV64(b * 1000000000ull, t);
}

/* bytes * 1e9 / ns without overflow (bytes < 2^44). */
static uint64_t per_sec(uint64_t b, uint64_t ns)
{
	if (!ns)
		return 0;
	if (b < (1ull << 34))
		return DIV64(b * 1000000000ull, ns);
	return DIV64((b >> 10) * 1000000000ull, ns) << 10;
}

/* BPF statistics of one key over bpf_window_ms: rate, retransmissions,
 * and how they compare with its usual values (k: the timing verdict so far,
 * which says whether the link keeps up: only then do the usual values learn;
 * a new level they learn after 16 evaluations in a row at it: the load changed). */
static void judge_bpf(struct kcoll_c4 *c, struct kcoll_c4_bpf *b, const struct kcoll_c4_link *k,
		      uint64_t now)
{
	uint64_t sb = 0, st = 0, horizon = (uint64_t)(c->p.bpf_window_ms ? c->p.bpf_window_ms :
						       c->p.window_ms) * MS;
	uint32_t retr = 0, n = 0;
	bool keeps_up = !k->slow && !k->bad;

	b->state = 0;
	b->rate = 0;
	b->retrans = 0;
	for (uint32_t i = 0; i < b->n; i++) {
		if (now > b->t[i] && now - b->t[i] > horizon)
			continue;
		sb += b->bytes[i];
		st += b->dt[i];
		retr += b->retr[i];
		n++;
	}
	if (!n)
		return;
	b->state = KCOLL_C4_BPF_SEEN;
	b->rate = per_sec(sb, st);
	b->retrans = retr;
	if (b->usual && b->rate * c->p.slow_ratio_pct < b->usual * 100)
		b->state |= KCOLL_C4_BPF_COLLAPSED;
	if (retr)
		b->state |= KCOLL_C4_BPF_RETRANS;
	/* RTT up: above slow_ratio_pct of usual and by 1 ms at least (a veth's
	 * tens of microseconds double for nothing) */
	if (b->usual_srtt_us && b->srtt_us &&
	    (uint64_t)b->srtt_us * 100 > (uint64_t)b->usual_srtt_us * c->p.slow_ratio_pct &&
	    b->srtt_us > b->usual_srtt_us + 1000)
		b->state |= KCOLL_C4_BPF_RTT_UP;
	/* a new level while the timing stays good for 16 evaluations: the load changed */
	if (keeps_up && (b->state & (KCOLL_C4_BPF_COLLAPSED | KCOLL_C4_BPF_RTT_UP)))
		b->shifted = b->shifted < 255 ? b->shifted + 1 : 255;
	else
		b->shifted = 0;
	if (keeps_up && b->rate && (!(b->state & KCOLL_C4_BPF_COLLAPSED) || b->shifted >= 16))
		b->usual = b->usual ? b->usual - b->usual / 8 + b->rate / 8 : b->rate;
	if (keeps_up && b->srtt_us && (!(b->state & KCOLL_C4_BPF_RTT_UP) || b->shifted >= 16))
		b->usual_srtt_us = b->usual_srtt_us ?
			b->usual_srtt_us - b->usual_srtt_us / 8 + b->srtt_us / 8 : b->srtt_us;
}

/* BPF corroborates a timing verdict when it shows two of: rate collapsed,
 * retransmissions, RTT up (a queue at a bottleneck). One alone is common on a
 * busy healthy host: a retransmission on a veth, an RTT doubled by a
 * descheduled receiver, a ring slowed by a late rank. */
static bool bpf_corrob(uint32_t st)
{
	uint32_t k = !!(st & KCOLL_C4_BPF_COLLAPSED) + !!(st & KCOLL_C4_BPF_RETRANS) +
		     !!(st & KCOLL_C4_BPF_RTT_UP);

	return k >= 2;
}

/* Communication slow: every judged (host, link, direction) against the
 * median of them all; a link judged slow on every peer it reaches (two at
 * least) is this host's own, else the peer's. */
static int judge_links(struct kcoll_c4 *c, uint64_t now)
{
	uint32_t (*nsamp)[KCOLL_C4_MAX_LINKS][2] = c->tmp_nsamp;
	uint32_t (*busy)[KCOLL_C4_MAX_LINKS][2] = c->tmp_busy;
	uint64_t *v = c->tmp_v, m;
	int nev = 0;
	uint32_t n = 0;

	for (uint32_t h = 0; h < c->nhosts; h++)
		for (uint32_t l = 0; l < c->nlinks; l++)
			for (uint32_t d = 0; d < 2; d++) {
				struct kcoll_c4_link *k = &c->link[h][l][d];

				k->rate = h == c->self ? 0 : link_rate(c, k, now, &nsamp[h][l][d], &busy[h][l][d]);
				if (h != c->self)
					judge_bpf(c, &c->bpf[h][l][d], k, now);
				if (k->rate)
					v[n++] = k->rate;
			}
	m = median(v, n);
	for (uint32_t h = 0; h < c->nhosts; h++)
		for (uint32_t l = 0; l < c->nlinks; l++)
			for (uint32_t d = 0; d < 2; d++) {
				struct kcoll_c4_link *k = &c->link[h][l][d];
				bool bad, good;
				uint64_t sr = c->p.slow_ratio_pct;

				if (h == c->self)
					continue;
				if (on_probation(c, h, l, now))
					sr *= 4;
				/* Slow: the median is more than slow_ratio_pct of its rate,
				 * and so is its own usual rate (when the whole collective
				 * slows down, the links that wait find their data already
				 * buffered and look fast: that inflates the median, not their
				 * usual rate). Before its usual rate is known (a link slow
				 * from the start), twice the margin. Alone (the other keys
				 * went quiet: a 2-host comm's tx to the peer whose data
				 * crawls in, its sends quick and few), its usual rate is the
				 * only measure: twice the margin below it, never before it
				 * is known. Healthy again above 3/4 of the threshold. */
				if (!k->rate || busy[h][l][d] < c->p.min_busy_pct)
					bad = false;
				else if (n >= 2)
					bad = k->usual ? k->rate * sr < m * 100 && k->rate * sr < k->usual * 100 :
							 k->rate * sr < m * 50;
				else
					bad = k->usual && k->rate * sr < k->usual * 50;
				/* No traffic is no evidence: a slow link the planner emptied
				 * stays slow for probe_ms, then is tried again. */
				if (!k->rate)
					good = !k->slow || now - k->last_t > (uint64_t)c->p.probe_ms * MS;
				else if (n >= 2)
					good = k->rate * c->p.slow_ratio_pct * 3 >= m * 400;
				else
					/* alone: nothing to compare with is no evidence of
					 * health either; healthy once back near its usual rate */
					good = !k->usual || k->rate * c->p.slow_ratio_pct * 3 >= k->usual * 400;
				/* the usual rate learns only while the link keeps up */
				if (k->rate && !bad && !k->slow && !k->bad && k->rate * c->p.slow_ratio_pct >= m * 100)
					k->usual = k->usual ? k->usual - k->usual / 8 + k->rate / 8 : k->rate;
				if (bad) {
					k->good = 0;
					if (k->bad < 255)
						k->bad++;
				} else if (good) {
					k->bad = 0;
					if (k->good < 255)
						k->good++;
				}
				/* BPF flow statistics of the same key that show it too
				 * (two of: rate collapsed, retransmissions, RTT up)
				 * shorten the raise by one evaluation; never raise alone */
				if (!k->slow && k->bad >= c->p.raise_evals -
				    (c->p.raise_evals > 1 && bpf_corrob(c->bpf[h][l][d].state) ? 1 : 0))
					k->slow = true;
				else if (k->slow && k->good >= c->p.clear_evals) {
					k->slow = k->covered = false;
					k->cleared_t = now;
				}
			}
	/* Attribute: per link, is every peer seen on it slow? */
	for (uint32_t l = 0; l < c->nlinks; l++) {
		uint32_t peers = 0, slow = 0;
		bool blamed[KCOLL_C4_MAX_HOSTS];
		bool self_bad;

		for (uint32_t h = 0; h < c->nhosts; h++) {
			bool seen = false, s = false;

			blamed[h] = false;
			for (uint32_t d = 0; d < 2; d++) {
				seen |= c->link[h][l][d].rate != 0 || c->link[h][l][d].slow;
				s |= c->link[h][l][d].slow;
				blamed[h] |= c->link[h][l][d].slow && !c->link[h][l][d].covered;
			}
			peers += seen;
			slow += s;
		}
		self_bad = peers >= 2 && slow == peers;
		for (uint32_t h = 0; self_bad && h < c->nhosts; h++)
			for (uint32_t d = 0; d < 2; d++)
				c->link[h][l][d].covered |= c->link[h][l][d].slow;
		for (uint32_t h = 0; h < c->nhosts; h++) {
			struct kcoll_c4_culprit *cu = &c->culprit[h][l];
			bool now_slow = h == c->self ? self_bad : (blamed[h] && !self_bad);
			uint32_t via = KCOLL_C4_NONE, d = 0;

			if (now_slow == cu->slow)
				continue;
			/* the evidence: the slowest key that shows it */
			for (uint32_t p = 0; p < c->nhosts; p++)
				for (uint32_t dd = 0; dd < 2; dd++)
					if (c->link[p][l][dd].slow && (h == c->self || p == h) &&
					    (via == KCOLL_C4_NONE ||
					     c->link[p][l][dd].rate < c->link[via][l][d].rate)) {
						via = p;
						d = dd;
					}
			struct kcoll_c4_event e = {
				.kind = KCOLL_C4_COMM_SLOW, .raised = now_slow, .rank = KCOLL_C4_NONE,
				.host = h, .link = l, .via_host = via,
				.spread = (uint64_t)slow << 32 | peers,
			};
			if (via != KCOLL_C4_NONE) {
				const struct kcoll_c4_bpf *b = &c->bpf[via][l][d];

				e.value = c->link[via][l][d].rate;
				e.nsamples = nsamp[via][l][d];
				e.ref = m;
				e.bpf_dir = d;
				if (b->state & KCOLL_C4_BPF_SEEN) {
					e.bpf_flags = b->state | (now_slow && bpf_corrob(b->state) ?
								  KCOLL_C4_BPF_CORROB : 0);
					e.bpf_rate = b->rate;
					e.bpf_usual = b->usual;
					e.bpf_retrans = b->retrans;
					e.bpf_srtt_us = b->srtt_us;
					e.bpf_usual_srtt_us = b->usual_srtt_us;
				}
			}
			cu->slow = now_slow;
			if (now_slow) {
				cu->since_ns = now;
				cu->via_host = via;
			} else {
				cu->cleared_ns = now;
			}
			emit(c, &e, now);
			if (now_slow)
				cu->ev = e;
			nev++;
		}
	}
	return nev;
}

/* Communication hang: the data path has waited hang_ms for a host although
 * every rank whose state is known submitted the op (else it is the rank's
 * hang), or that host's daemon stopped telling us about its ranks. */
static int judge_comm_hang(struct kcoll_c4 *c, uint64_t now)
{
	uint32_t h = c->wait_host;
	int nev = 0;

	for (uint32_t k = 0; k < c->nhosts; k++) {
		bool hung = false;

		if (k == h && since_ms(now, c->wait_since) >= c->p.hang_ms) {
			bool all_in = true, silent = false;

			for (uint32_t r = 0; r < c->nranks; r++) {
				const struct kcoll_c4_rank *q = &c->rank[r];

				if (!rank_known(c, q, now)) {
					if (c->rank_host[r] == h)
						silent = true;
					continue;
				}
				if (q->nsub <= c->wait_seq)
					all_in = false;
			}
			hung = all_in || silent;
		}
		if (hung == c->comm_hung[k])
			continue;
		c->comm_hung[k] = hung;
		uint32_t first = KCOLL_C4_NONE;

		for (uint32_t r = 0; r < c->nranks && first == KCOLL_C4_NONE; r++)
			if (c->rank_host[r] == k)
				first = r;
		struct kcoll_c4_event e = {
			.kind = KCOLL_C4_COMM_HANG, .raised = hung, .rank = first, .host = k,
			.link = hung ? c->wait_link : c->hang_ev[k].link, .via_host = k,
			.value = since_ms(now, c->wait_since), .seq_lo = (uint32_t)c->wait_seq,
		};
		emit(c, &e, now);
		if (hung)
			c->hang_ev[k] = e;
		nev++;
	}
	return nev;
}

int kcoll_c4_evaluate(struct kcoll_c4 *c, uint64_t now)
{
	return judge_rank_hangs(c, now) + judge_stragglers(c, now) + judge_links(c, now) +
	       judge_comm_hang(c, now);
}

uint32_t kcoll_c4_events(const struct kcoll_c4 *c, uint64_t since, struct kcoll_c4_event *out,
			 uint32_t max)
{
	uint64_t first = c->next_id > KCOLL_C4_EVQ ? c->next_id - KCOLL_C4_EVQ : 1;
	uint32_t n = 0;

	if (since + 1 > first)
		first = since + 1;
	for (uint64_t id = first; id < c->next_id && n < max; id++)
		out[n++] = c->ev[id % KCOLL_C4_EVQ];
	return n;
}

uint32_t kcoll_c4_active(const struct kcoll_c4 *c, struct kcoll_c4_event *out, uint32_t max)
{
	uint32_t n = 0;

	for (uint32_t r = 0; r < c->nranks && n < max; r++)
		if (c->rank[r].hung || c->rank[r].straggler)
			out[n++] = c->rank_ev[r];
	for (uint32_t h = 0; h < c->nhosts; h++) {
		for (uint32_t l = 0; l < c->nlinks && n < max; l++)
			if (c->culprit[h][l].slow)
				out[n++] = c->culprit[h][l].ev;
		if (c->comm_hung[h] && n < max)
			out[n++] = c->hang_ev[h];
	}
	return n;
}

const char *kcoll_c4_kind_name(uint32_t kind)
{
	switch (kind) {
	case KCOLL_C4_COMM_HANG: return "communication hang";
	case KCOLL_C4_NONCOMM_HANG: return "non-communication hang";
	case KCOLL_C4_COMM_SLOW: return "communication slow";
	case KCOLL_C4_NONCOMM_SLOW: return "non-communication slow (straggler)";
	}
	return "?";
}

/* ---- planner ------------------------------------------------------------ */

/* 1: avoid, 2: cleared but held, 0: usable. */
static int link_state(const struct kcoll_c4 *c, uint32_t h, uint32_t l, uint64_t now)
{
	int s = 0;

	for (int k = 0; k < 2; k++) {
		const struct kcoll_c4_culprit *cu = &c->culprit[k ? c->self : h][l];

		if (cu->slow)
			return 1;
		if (cu->cleared_ns && now - cu->cleared_ns < (uint64_t)c->p.heal_hold_ms * MS)
			s = 2;
	}
	return s;
}

int kcoll_c4_plan(const struct kcoll_c4 *c, const uint32_t *shared, uint32_t nstreams,
		  uint64_t now, struct kcoll_c4_plan *pl)
{
	int changed = 0;

	if (!nstreams || nstreams > KCOLL_C4_MAX_STREAMS)
		return -EINVAL;
	if (pl->nstreams != nstreams) {
		pl->nstreams = nstreams;
		changed = 1;
	}
	for (uint32_t h = 0; h < c->nhosts; h++) {
		uint32_t all[KCOLL_C4_MAX_LINKS], ok[KCOLL_C4_MAX_LINKS], na = 0, nok = 0;
		if (h == c->self)
			continue;
		for (uint32_t l = 0; l < c->nlinks; l++) {
			int st;

			if (!(shared[h] & (1u << l)))
				continue;
			all[na++] = l;
			st = link_state(c, h, l, now);
			if (st == 0)
				ok[nok++] = l;
		}
		for (uint32_t s = 0; s < nstreams; s++) {
			uint32_t def = na ? all[s % na] : 0, link = def, why = KCOLL_C4_WHY_SPREAD;

			if (na && !nok) {
				why = KCOLL_C4_WHY_NO_CHOICE;
			} else if (nok && nok < na) {
				link = ok[s % nok];
				if (link != def)
					why = link_state(c, h, def, now) == 2 ? KCOLL_C4_WHY_HOLD :
										KCOLL_C4_WHY_AVOID;
			}
			if (pl->link[h][s] != link || pl->why[h][s] != why) {
				changed = 1;
				pl->link[h][s] = (uint8_t)link;
				pl->why[h][s] = (uint8_t)why;
				pl->avoided[h][s] = (uint8_t)(link != def ? def : KCOLL_C4_MAX_LINKS);
			}
		}
	}
	if (changed)
		pl->version++;
	return changed;
}

const char *kcoll_c4_why_name(uint32_t why)
{
	switch (why) {
	case KCOLL_C4_WHY_SPREAD: return "spread";
	case KCOLL_C4_WHY_AVOID: return "avoid degraded link";
	case KCOLL_C4_WHY_HOLD: return "link healed, holding off";
	case KCOLL_C4_WHY_NO_CHOICE: return "every link degraded";
	}
	return "?";
}
