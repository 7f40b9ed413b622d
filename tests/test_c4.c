// SPDX-License-Identifier: MIT
/*
 * The C4 detector and planner core (include/kcoll/c4.h) on synthetic traces
 * of each anomaly class, on noisy but healthy traces (no event allowed), and
 * on traces recorded by kcolld on the netns cluster (tests/data/c4-*.trace,
 * written with KCOLL_C4_TRACE): the recorded healthy run must stay silent,
 * the recorded degraded run must name the degraded host and link.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcoll/c4.h"
#include "kcoll/tap.h"

#define MS 1000000ull
#define TICK (250 * MS)

static struct kcoll_c4 c4;
static uint64_t now;
static uint32_t rng = 12345;

/* Deterministic noise: uniform in [100 - pct, 100 + pct] percent of v. */
static uint64_t noisy(uint64_t v, uint32_t pct)
{
	rng = rng * 1103515245u + 12345u;
	return v * (100 - pct + (rng >> 8) % (2 * pct + 1)) / 100;
}

/* 4 hosts, one rank each, we are host 'self' with rank 'self'. */
static void setup(uint32_t self, const struct kcoll_c4_params *p)
{
	uint16_t rh[4] = { 0, 1, 2, 3 };
	struct kcoll_c4_params d;

	if (!p) {
		kcoll_c4_params_default(&d);
		p = &d;
	}
	now = 1000 * MS;
	if (kcoll_c4_init(&c4, p, 4, 4, self, 2, rh, now) || kcoll_c4_local(&c4, self)) {
		printf("Bail out! kcoll_c4_init\n");
		exit(1);
	}
}

/* Ring traffic seen from host self: rx from prev, tx to next, on both links.
 * rate[h][l] in MB/s (0: no traffic on that key). */
static void traffic(uint32_t self, uint64_t rate_rx[2], uint64_t rate_tx[2], uint32_t noise)
{
	uint32_t prev = (self + 3) % 4, next = (self + 1) % 4;

	for (uint32_t l = 0; l < 2; l++) {
		for (uint32_t d = 0; d < 2; d++) {
			uint64_t r = d ? rate_tx[l] : rate_rx[l];
			uint64_t bytes = 8u << 20;
			struct kcoll_c4_linkobs o = {
				.host = d ? next : prev, .link = l, .dir = d, .bytes = bytes, .t_ns = now,
			};

			if (!r)
				continue;
			o.busy_ns = noisy(bytes * 1000 / r, noise);	/* bytes / (MB/s) in ns */
			kcoll_c4_link_obs(&c4, &o);
		}
	}
}

/* Healthy submissions: every rank submits op seq after a think time. */
static void ops(uint32_t self, uint64_t seq, const uint32_t think_ms[4], uint32_t noise)
{
	for (uint32_t r = 0; r < 4; r++) {
		uint64_t t = noisy((uint64_t)think_ms[r] * 1000 + 200, noise);

		if (r == self) {
			kcoll_c4_complete(&c4, r, now);
			now += t * 1000;
			kcoll_c4_submit(&c4, r, seq, now);
			now -= t * 1000;
		} else {
			struct kcoll_c4_rankrep rep = { .rank = r, .nsub = seq + 1, .age_ms = 1,
							.think_us = (uint32_t)t, .nthink = 16 };

			kcoll_c4_rank_report(&c4, &rep, now);
		}
	}
}

/* One tick of time passes and the detector evaluates; returns what it did. */
static int advance(void)
{
	now += TICK;
	return kcoll_c4_evaluate(&c4, now);
}

/* One tick of healthy submissions (ops), then advance(). */
static int step(uint32_t self, uint64_t seq, const uint32_t think_ms[4], uint32_t noise)
{
	ops(self, seq, think_ms, noise);
	return advance();
}

static uint32_t count_kind(uint64_t since, uint32_t kind, int raised, struct kcoll_c4_event *last)
{
	struct kcoll_c4_event ev[KCOLL_C4_EVQ];
	uint32_t n = kcoll_c4_events(&c4, since, ev, KCOLL_C4_EVQ), k = 0;

	for (uint32_t i = 0; i < n; i++)
		if ((!kind || ev[i].kind == kind) && (raised < 0 || (int)ev[i].raised == raised)) {
			k++;
			if (last)
				*last = ev[i];
		}
	return k;
}

static uint32_t all_events(void)
{
	return count_kind(0, 0, -1, NULL);
}

static void test_bad_input(void)
{
	struct kcoll_c4_params p;
	uint16_t rh[2] = { 0, 5 };
	struct kcoll_c4_linkobs o = { .host = 0, .link = 0, .bytes = 1 << 20, .busy_ns = 1 };
	struct kcoll_c4_rankrep rep = { .rank = 0 };
	struct kcoll_c4_plan pl = { 0 };
	uint32_t shared[4] = { 3, 3, 3, 3 };

	kcoll_c4_params_default(&p);
	tap_ok(kcoll_c4_init(&c4, &p, 2, 2, 0, 1, rh, 0) == -EINVAL, "init: rank on a host that does not exist");
	rh[1] = 1;
	tap_ok(kcoll_c4_init(&c4, &p, 0, 2, 0, 1, rh, 0) == -EINVAL, "init: no ranks");
	tap_ok(kcoll_c4_init(&c4, &p, 2, 2, 2, 1, rh, 0) == -EINVAL, "init: self out of range");
	tap_ok(kcoll_c4_init(&c4, &p, 2, 2, 0, 9, rh, 0) == -EINVAL, "init: too many links");
	p.slow_ratio_pct = 100;
	tap_ok(kcoll_c4_init(&c4, &p, 2, 2, 0, 1, rh, 0) == -EINVAL, "init: slow ratio must exceed 100%%");
	setup(0, NULL);
	tap_ok(kcoll_c4_local(&c4, 1) == -EINVAL, "a rank of another host is not local");
	tap_ok(kcoll_c4_submit(&c4, 1, 0, now) == -EINVAL, "submit of a non-local rank refused");
	tap_ok(kcoll_c4_link_obs(&c4, &o) == -EINVAL, "observation of a link to ourselves refused");
	o.host = 1;
	o.link = 2;
	tap_ok(kcoll_c4_link_obs(&c4, &o) == -EINVAL, "observation of a link we do not have refused");
	tap_ok(kcoll_c4_rank_report(&c4, &rep, now) == -EINVAL, "a peer's report about our own rank refused");
	rep.rank = 1;
	rep.nthink = 99;
	tap_ok(kcoll_c4_rank_report(&c4, &rep, now) == -EINVAL, "report with more samples than a window refused");
	tap_ok(kcoll_c4_plan(&c4, shared, 0, now, &pl) == -EINVAL, "plan with no stream refused");
	tap_ok(all_events() == 0, "bad input raised no event");
}

static void test_healthy_noisy(void)
{
	uint64_t rx[2] = { 600, 600 }, tx[2] = { 900, 900 };
	uint32_t think[4] = { 1, 1, 1, 1 };

	setup(0, NULL);
	for (uint64_t i = 0; i < 2000; i++) {	/* 500 s */
		/* 45% noise on every sample, and the links' means differ by 1.6x */
		rx[1] = 600 + (i / 200 % 2) * 360;
		traffic(0, rx, tx, 45);
		step(0, i, think, 80);
	}
	tap_ok(all_events() == 0, "noisy healthy trace (45%% rate noise, 1.6x link imbalance, 500 s): "
	       "no event (got %u)", all_events());
}

static void test_comm_slow(uint32_t self, bool own_link)
{
	uint64_t rx[2] = { 600, 600 }, tx[2] = { 600, 600 };
	uint32_t think[4] = { 1, 1, 1, 1 }, shared[4] = { 3, 3, 3, 3 };
	struct kcoll_c4_plan pl = { 0 };
	struct kcoll_c4_event e, act[8];
	uint32_t culprit = own_link ? self : (self + 3) % 4, i, degraded_at;
	uint64_t t0;

	setup(self, NULL);
	for (i = 0; i < 40; i++) {
		traffic(self, rx, tx, 20);
		step(self, i, think, 20);
	}
	kcoll_c4_plan(&c4, shared, 2, now, &pl);
	tap_ok(pl.link[culprit == self ? (self + 1) % 4 : culprit][0] == 0 &&
	       pl.link[culprit == self ? (self + 1) % 4 : culprit][1] == 1,
	       "healthy plan: stream 0 on link 0, stream 1 on link 1");
	/* Degrade link 1: the rx from prev at 10% (the prev host's link), or
	 * also our tx (our own link). */
	rx[1] = 60;
	if (own_link)
		tx[1] = 60;
	t0 = now;
	degraded_at = i;
	for (; i < degraded_at + 40 && !count_kind(0, KCOLL_C4_COMM_SLOW, 1, &e); i++) {
		traffic(self, rx, tx, 20);
		step(self, i, think, 20);
	}
	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 1, &e) == 1 && e.host == culprit && e.link == 1,
	       "%s link slow: communication slow names host %u link %u (got host %u link %u)",
	       own_link ? "own" : "peer's", culprit, 1, e.host, e.link);
	tap_ok(now - t0 <= 2000 * MS, "... within 2 s of samples (%llu ms)",
	       (unsigned long long)((now - t0) / MS));
	tap_ok(e.value && e.value * 2 < e.ref, "... evidence: %llu B/s against a median of "
	       "%llu B/s", (unsigned long long)e.value, (unsigned long long)e.ref);
	tap_ok(kcoll_c4_active(&c4, act, 8) == 1 && act[0].kind == KCOLL_C4_COMM_SLOW,
	       "... one active anomaly");
	tap_ok(kcoll_c4_plan(&c4, shared, 2, now, &pl) == 1, "plan changes");
	for (uint32_t h = 0; h < 4; h++) {
		bool touches = h != self && (culprit == self || h == culprit);

		if (h == self)
			continue;
		if (touches)
			tap_ok(pl.link[h][0] == 0 && pl.link[h][1] == 0 &&
			       pl.why[h][1] == KCOLL_C4_WHY_AVOID && pl.avoided[h][1] == 1,
			       "plan: both streams to host %u on link 0 (stream 1 avoids link 1)", h);
		else
			tap_ok(pl.link[h][0] == 0 && pl.link[h][1] == 1, "plan: host %u untouched", h);
	}
	tap_ok(kcoll_c4_plan(&c4, shared, 2, now, &pl) == 0, "same state: the plan does not change");
	/* Heal: the detector clears after clear_evals, the planner waits heal_hold_ms more. */
	rx[1] = tx[1] = 600;
	t0 = now;
	for (int k = 0; k < 60 && !count_kind(0, KCOLL_C4_COMM_SLOW, 0, NULL); k++, i++) {
		traffic(self, rx, tx, 20);
		step(self, i, think, 20);
	}
	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 0, &e) == 1 && e.host == culprit,
	       "heal: cleared after %llu ms", (unsigned long long)((now - t0) / MS));
	uint32_t peer = culprit == self ? (self + 1) % 4 : culprit;

	kcoll_c4_plan(&c4, shared, 2, now, &pl);
	tap_ok(pl.link[peer][1] == 0 && pl.why[peer][1] == KCOLL_C4_WHY_HOLD,
	       "plan holds the healed link off for heal_hold_ms");
	now += 2100 * MS;
	tap_ok(kcoll_c4_plan(&c4, shared, 2, now, &pl) == 1 && pl.link[peer][1] == 1 &&
	       pl.why[peer][1] == KCOLL_C4_WHY_SPREAD, "after heal_hold_ms: stream 1 back on link 1");
}

/* Ticks of ring traffic with link 1's rx at rate1 MB/s (the others at 600)
 * until a COMM_SLOW event with raised == want comes after event since_id, at most
 * max_ms; returns the ms it took (max_ms + 1: none came). */
static uint64_t slow_until(uint64_t rate1, int want, uint64_t since_id, uint64_t max_ms, uint32_t *seq)
{
	uint64_t rx[2] = { 600, rate1 }, tx[2] = { 600, 600 }, t0 = now;
	uint32_t think[4] = { 1, 1, 1, 1 };

	while (!count_kind(since_id, KCOLL_C4_COMM_SLOW, want, NULL)) {
		if (now - t0 > max_ms * MS)
			return max_ms + 1;
		traffic(0, rx, tx, 20);
		step(0, (*seq)++, think, 20);
	}
	return (now - t0) / MS;
}

/*
 * A link that just healed is not raised again on noise: for heal_hold_ms +
 * 2 windows after the clear (8 s by default), a verdict needs 4 times the
 * margin. At 4x slower than the rest (what the netns cluster's per-stream
 * rates swing by on a busy 2-core host, t_c4_steer.sh) it stays clear there,
 * while a link 20x slow is raised inside it; after the probation 4x slower
 * is raised again.
 */
static void test_heal_probation(void)
{
	uint32_t seq = 0;
	uint64_t t, since, cleared;

	setup(0, NULL);
	slow_until(600, 1, 0, 10000, &seq);	/* 10 s healthy: nothing */
	tap_ok(all_events() == 0, "probation: healthy ring, no event");
	t = slow_until(60, 1, 0, 10000, &seq);
	tap_ok(t <= 2000, "probation: link 1 at 10%% raised (%llu ms)", (unsigned long long)t);
	t = slow_until(600, 0, 0, 20000, &seq);
	tap_ok(t <= 20000, "probation: healed, cleared (%llu ms)", (unsigned long long)t);
	since = c4.next_id - 1;	/* events after this id */
	cleared = now;
	t = slow_until(150, 1, since, 5000, &seq);
	tap_ok(t > 5000, "probation: at 25%% for the 5 s after the clear, not raised again%s",
	       t > 5000 ? "" : " (it was)");
	t = slow_until(30, 1, since, 3000, &seq);
	tap_ok(t <= 2000 && now - cleared < 8000 * MS,
	       "probation: at 5%% inside the probation, raised within 2 s (%llu ms, %llu ms after the clear)",
	       (unsigned long long)t, (unsigned long long)((now - cleared) / MS));
	t = slow_until(600, 0, since, 20000, &seq);
	since = c4.next_id - 1;	/* events after this id */
	slow_until(600, 1, since, 9000, &seq);	/* 9 s healthy: past the probation */
	tap_ok(t <= 20000 && !count_kind(since, KCOLL_C4_COMM_SLOW, 1, NULL),
	       "probation: cleared again, 9 s healthy without an event");
	t = slow_until(150, 1, since, 5000, &seq);
	tap_ok(t <= 5000, "probation: past it, 25%% is raised again (%llu ms)", (unsigned long long)t);
}

/* BPF flow statistics of one tick for the ring seen from host self: every
 * key moves wall[l] MB/s of payload (wall clock: a slow link slows the whole
 * ring, so every key's wall rate drops, not only the slow one's); key
 * (prev, link 1, rx) also gets srtt_us and retrans. */
static void bpf_traffic(uint32_t self, const uint64_t wall[2], uint32_t noise, uint32_t srtt_us,
			uint32_t retrans_l1)
{
	uint32_t prev = (self + 3) % 4, next = (self + 1) % 4;

	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t d = 0; d < 2; d++) {
			bool hot = l == 1 && d == KCOLL_C4_RX;
			struct kcoll_c4_linkobs o = {
				.host = d ? next : prev, .link = l, .dir = d, .flags = KCOLL_C4_OBS_BPF,
				.bytes = noisy(wall[l] * 250000, noise), .busy_ns = TICK, .t_ns = now,
				.srtt_us = hot ? srtt_us : (uint32_t)noisy(100, noise),
				.retrans = hot ? retrans_l1 : 0,
			};

			if (kcoll_c4_link_obs(&c4, &o)) {
				printf("Bail out! BPF observation refused\n");
				exit(1);
			}
		}
}

/* The peer's link 1 slows to 10%: timing alone (with_bpf 0), timing with BPF
 * flow statistics (1: rates collapsed on every key, RTT and retransmissions
 * up on the slow one; 2: retransmissions only). Returns evaluations to the
 * raise; *e: the raise event. */
static uint32_t slow_run(int with_bpf, struct kcoll_c4_event *e)
{
	uint64_t rx[2] = { 600, 600 }, tx[2] = { 600, 600 }, wall[2] = { 300, 300 };
	uint32_t think[4] = { 1, 1, 1, 1 }, i, k = 0;

	rng = 777;
	setup(1, NULL);
	for (i = 0; i < 40; i++) {
		traffic(1, rx, tx, 20);
		if (with_bpf)
			bpf_traffic(1, wall, 20, 150, 0);
		step(1, i, think, 20);
	}
	rx[1] = 60;
	if (with_bpf == 1)
		wall[0] = wall[1] = 30;
	for (; k < 40 && !count_kind(0, KCOLL_C4_COMM_SLOW, 1, e); k++, i++) {
		traffic(1, rx, tx, 20);
		if (with_bpf)	/* 2: retransmissions only, rate and RTT as usual */
			bpf_traffic(1, wall, 20, with_bpf == 1 ? 25000 : 150, 3);
		step(1, i, think, 20);
	}
	return k;
}

static void test_bpf_evidence(void)
{
	struct kcoll_c4_event e = { 0 }, act[8];
	uint32_t plain = slow_run(0, &e), with;

	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 1, NULL) == 1 && e.bpf_flags == 0,
	       "timing only: communication slow raised after %u evaluations, no BPF evidence", plain);
	with = slow_run(1, &e);
	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 1, NULL) == 1 && e.host == 0 && e.link == 1 &&
	       e.via_host == 0 && e.bpf_dir == KCOLL_C4_RX,
	       "with BPF: names host 0 link 1 (got host %u link %u via %u dir %u)", e.host, e.link,
	       e.via_host, e.bpf_dir);
	tap_ok(with + 1 == plain, "with BPF: the corroborated raise comes one evaluation sooner (%u vs %u)",
	       with, plain);
	tap_ok((e.bpf_flags & (KCOLL_C4_BPF_SEEN | KCOLL_C4_BPF_COLLAPSED | KCOLL_C4_BPF_RETRANS |
			       KCOLL_C4_BPF_RTT_UP | KCOLL_C4_BPF_CORROB)) ==
	       (KCOLL_C4_BPF_SEEN | KCOLL_C4_BPF_COLLAPSED | KCOLL_C4_BPF_RETRANS | KCOLL_C4_BPF_RTT_UP |
		KCOLL_C4_BPF_CORROB), "... evidence flags: seen, collapsed, retransmissions, RTT up, "
	       "corroborated (0x%x)", e.bpf_flags);
	tap_ok(e.bpf_rate >= 15000000 && e.bpf_rate <= 60000000 && e.bpf_usual >= 200000000 &&
	       e.bpf_usual <= 400000000, "... BPF rate %llu B/s against its usual %llu B/s",
	       (unsigned long long)e.bpf_rate, (unsigned long long)e.bpf_usual);
	tap_ok(e.bpf_retrans >= 3 && e.bpf_srtt_us == 25000 && e.bpf_usual_srtt_us > 0 &&
	       e.bpf_usual_srtt_us < 1000, "... %u retransmissions, srtt %u us (usually %u us)",
	       e.bpf_retrans, e.bpf_srtt_us, e.bpf_usual_srtt_us);
	tap_ok(kcoll_c4_active(&c4, act, 8) == 1 && act[0].bpf_flags == e.bpf_flags &&
	       act[0].bpf_rate == e.bpf_rate, "... the active anomaly carries the same BPF evidence");
	tap_ok(c4.bpf[0][0][KCOLL_C4_RX].state & KCOLL_C4_BPF_COLLAPSED && !c4.link[0][0][KCOLL_C4_RX].slow,
	       "link 0 of the same peer: BPF rate collapsed too (the ring slowed), not judged slow");
	with = slow_run(2, &e);
	tap_ok(with == plain && (e.bpf_flags & KCOLL_C4_BPF_RETRANS) && !(e.bpf_flags & KCOLL_C4_BPF_CORROB),
	       "retransmissions alone: shown (flags 0x%x), not corroboration: raised after %u evaluations "
	       "like timing alone", e.bpf_flags, with);
}

/* Noisy but healthy, with BPF statistics as noisy (45% rate noise, an odd
 * retransmission, RTT jitter) and then a 10x lighter load on every key
 * (BPF rates collapse, the timing of large pieces does not): no event. */
static void test_bpf_noisy_healthy(void)
{
	uint64_t rx[2] = { 600, 600 }, tx[2] = { 900, 900 }, wall[2] = { 300, 300 };
	uint32_t think[4] = { 1, 1, 1, 1 };
	struct kcoll_c4_linkobs o = { .host = 1, .link = 0, .flags = KCOLL_C4_OBS_BPF, .bytes = 1 };

	setup(0, NULL);
	tap_ok(kcoll_c4_link_obs(&c4, &o) == -EINVAL, "BPF observation over no interval refused");
	o.busy_ns = TICK;
	o.flags = 0x80;
	tap_ok(kcoll_c4_link_obs(&c4, &o) == -EINVAL, "observation with an unknown flag refused");
	for (uint64_t i = 0; i < 1200; i++) {	/* 300 s */
		rx[1] = 600 + (i / 200 % 2) * 360;
		if (i == 600)
			wall[0] = wall[1] = 30;
		traffic(0, rx, tx, 45);
		bpf_traffic(0, wall, 45, (uint32_t)noisy(300, 80), i % 37 == 0 ? 2 : 0);
		step(0, i, think, 80);
	}
	tap_ok(all_events() == 0, "noisy healthy trace with noisy BPF statistics and a 10x lighter "
	       "load (300 s): no event (got %u)", all_events());
	tap_ok(c4.bpf[3][1][KCOLL_C4_RX].state == (KCOLL_C4_BPF_SEEN | KCOLL_C4_BPF_RETRANS) ||
	       c4.bpf[3][1][KCOLL_C4_RX].state == KCOLL_C4_BPF_SEEN,
	       "... its BPF state at the end: seen%s, no collapse, no RTT rise (0x%x)",
	       c4.bpf[3][1][KCOLL_C4_RX].state & KCOLL_C4_BPF_RETRANS ? ", a retransmission" : "",
	       c4.bpf[3][1][KCOLL_C4_RX].state);
	tap_ok(c4.bpf[3][1][KCOLL_C4_RX].usual > 0 && c4.bpf[3][1][KCOLL_C4_RX].usual < 100000000,
	       "the usual BPF rate followed the lighter load (%llu B/s)",
	       (unsigned long long)c4.bpf[3][1][KCOLL_C4_RX].usual);
}

static void test_no_choice(void)
{
	uint64_t rx[2] = { 60, 60 }, tx[2] = { 600, 600 };
	uint32_t think[4] = { 1, 1, 1, 1 }, shared[4] = { 3, 3, 3, 3 };
	struct kcoll_c4_plan pl = { 0 };

	setup(0, NULL);
	for (uint32_t i = 0; i < 8; i++) {
		traffic(0, (uint64_t[2]){ 600, 600 }, tx, 10);
		step(0, i, think, 10);
	}
	/* Both of host 3's links slow: tx keys keep the median up. */
	for (uint32_t i = 8; i < 30; i++) {
		traffic(0, rx, tx, 10);
		step(0, i, think, 10);
	}
	kcoll_c4_plan(&c4, shared, 2, now, &pl);
	tap_ok(c4.culprit[3][0].slow && c4.culprit[3][1].slow && pl.link[3][0] == 0 && pl.link[3][1] == 1 &&
	       pl.why[3][0] == KCOLL_C4_WHY_NO_CHOICE, "every link to a host degraded: keep spreading, say why");
}

/* Two hosts, one link, we are host 0 (the two-guest RDMA pair's 2-host
 * communicator), default parameters. */
static void pair_setup(void)
{
	uint16_t rh[2] = { 0, 1 };
	struct kcoll_c4_params p;

	kcoll_c4_params_default(&p);
	now = 1000 * MS;
	if (kcoll_c4_init(&c4, &p, 2, 2, 0, 1, rh, now) || kcoll_c4_local(&c4, 0)) {
		printf("Bail out! kcoll_c4_init\n");
		exit(1);
	}
}

/* ... one tick of rx from and tx to host 1 at rx / tx kB/s. */
static void pair_tick(uint64_t rx, uint64_t tx, uint32_t noise)
{
	for (uint32_t d = 0; d < 2; d++) {
		uint64_t r = d ? tx : rx, bytes = noisy(r * 250, noise);	/* kB/s x 0.25 s */
		struct kcoll_c4_linkobs o = { .host = 1, .link = 0, .dir = d, .bytes = bytes, .t_ns = now };

		/* busy most of the tick: bytes at the rate, noise apart */
		o.busy_ns = noisy(bytes * 1000000 / r, noise);
		kcoll_c4_link_obs(&c4, &o);
	}
	advance();
}

/* A link so slow that no tick holds min_obs_bytes (256 KiB) of it: its small
 * observations add up to samples of min_obs_bytes or min_obs_busy_ms, so it
 * is judged (they were dropped: the slower the link, the surer it escaped).
 * Healthy thin traffic stays silent. */
static void test_thin_link(void)
{
	struct kcoll_c4_event e = { 0 };
	uint64_t t0;
	uint32_t i;

	pair_setup();
	/* healthy, both ways 600 kB/s: 150 kB a tick, under min_obs_bytes */
	for (i = 0; i < 800; i++)	/* 200 s */
		pair_tick(600, 600, 30);
	tap_ok(all_events() == 0 && c4.link[1][0][KCOLL_C4_RX].rate && c4.link[1][0][KCOLL_C4_TX].rate,
	       "thin healthy traffic (600 kB/s both ways, 150 kB a tick, 200 s): judged (rx %llu, tx %llu B/s), "
	       "no event (got %u)", (unsigned long long)c4.link[1][0][KCOLL_C4_RX].rate,
	       (unsigned long long)c4.link[1][0][KCOLL_C4_TX].rate, all_events());
	/* 3 MB/s both ways, then host 1's data to us at 400 kB/s: 100 kB a tick */
	for (i = 0; i < 40; i++)
		pair_tick(3000, 3000, 20);
	t0 = now;
	for (i = 0; i < 80 && !count_kind(0, KCOLL_C4_COMM_SLOW, 1, &e); i++)
		pair_tick(400, 3000, 20);
	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 1, &e) == 1 && e.host == 1 && e.link == 0 &&
	       e.via_host == 1 && e.bpf_dir == KCOLL_C4_RX,
	       "host 1's data to us at 400 kB/s (100 kB a tick): communication slow names host 1 link 0, "
	       "evidence rx from host 1 (got %s host %u link %u via %u dir %u) after %llu ms",
	       count_kind(0, KCOLL_C4_COMM_SLOW, 1, NULL) ? "raised:" : "nothing raised:", e.host, e.link,
	       e.via_host, e.bpf_dir, (unsigned long long)((now - t0) / MS));
	t0 = now;
	for (i = 0; i < 80 && !count_kind(0, KCOLL_C4_COMM_SLOW, 0, NULL); i++)
		pair_tick(3000, 3000, 20);
	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 0, NULL) == 1, "... cleared %llu ms after it healed",
	       (unsigned long long)((now - t0) / MS));
	/* 100 kB/s: 256 KiB take 2.6 s, fewer than min_samples of them in
	 * window_ms; a tick's busy time (min_obs_busy_ms) makes a sample */
	for (i = 0; i < 40; i++)
		pair_tick(3000, 3000, 20);
	t0 = now;
	for (i = 0; i < 80 && count_kind(0, KCOLL_C4_COMM_SLOW, 1, NULL) < 2; i++)
		pair_tick(100, 3000, 20);
	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 1, &e) == 2 && e.host == 1 && e.via_host == 1 &&
	       e.bpf_dir == KCOLL_C4_RX, "host 1's data to us at 100 kB/s (25 kB a tick): named again (host %u "
	       "via %u dir %u) after %llu ms", e.host, e.via_host, e.bpf_dir,
	       (unsigned long long)((now - t0) / MS));
}

/* One tick of rx from host 1 only, at rx kB/s (our sends to it went quiet). */
static void rx_tick(uint64_t rx, uint32_t noise)
{
	uint64_t bytes = noisy(rx * 250, noise);
	struct kcoll_c4_linkobs o = { .host = 1, .link = 0, .dir = KCOLL_C4_RX, .bytes = bytes, .t_ns = now,
				      .busy_ns = noisy(bytes * 1000000 / rx, noise) };

	kcoll_c4_link_obs(&c4, &o);
	advance();
}

/* Two hosts, one link: once host 1's data crawls in, our few quick sends to
 * it make too few samples, and its rx is the only key left. With nothing to
 * compare with, the raised verdict used to clear: it must hold until the rx
 * is back near its usual rate. rx alone from the start raises nothing; alone,
 * a key is measured against its own usual rate, with twice the margin. */
static void test_lone_key(void)
{
	struct kcoll_c4_event e = { 0 };
	uint64_t t0;
	uint32_t i;

	pair_setup();
	for (i = 0; i < 40; i++)
		rx_tick(3000, 20);
	tap_ok(all_events() == 0 && c4.link[1][0][KCOLL_C4_RX].rate && !c4.link[1][0][KCOLL_C4_TX].rate,
	       "rx alone at 3 MB/s for 10 s: judged (%llu B/s), nothing raised (got %u events)",
	       (unsigned long long)c4.link[1][0][KCOLL_C4_RX].rate, all_events());
	for (i = 0; i < 40; i++)
		pair_tick(3000, 3000, 20);
	for (i = 0; i < 80 && !count_kind(0, KCOLL_C4_COMM_SLOW, 1, &e); i++)
		pair_tick(400, 3000, 20);
	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 1, &e) == 1 && e.host == 1 && e.bpf_dir == KCOLL_C4_RX,
	       "rx at 400 kB/s beside tx at 3 MB/s: named (host %u dir %u)", e.host, e.bpf_dir);
	for (i = 0; i < 120; i++)	/* 30 s */
		rx_tick(400, 20);
	tap_ok(!count_kind(0, KCOLL_C4_COMM_SLOW, 0, NULL) && c4.link[1][0][KCOLL_C4_RX].slow &&
	       !c4.link[1][0][KCOLL_C4_TX].rate,
	       "then 30 s with the rx at 400 kB/s the only key left (tx quiet): still raised, not cleared "
	       "(%u cleared)", count_kind(0, KCOLL_C4_COMM_SLOW, 0, NULL));
	t0 = now;
	for (i = 0; i < 80 && !count_kind(0, KCOLL_C4_COMM_SLOW, 0, NULL); i++)
		rx_tick(3000, 20);
	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 0, NULL) == 1,
	       "rx back at 3 MB/s, still alone: cleared after %llu ms", (unsigned long long)((now - t0) / MS));
	for (i = 0; i < 120; i++)	/* 30 s */
		rx_tick(1100, 20);
	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 1, NULL) == 1,
	       "rx alone at 1.1 MB/s, under 3x below its usual rate: not raised again (%u raised)",
	       count_kind(0, KCOLL_C4_COMM_SLOW, 1, NULL));

	/* The CI run of 1ec2f70: the tx went quiet as the rx crawled, so the
	 * slow rx was judged alone from its first slow sample and never raised. */
	pair_setup();
	for (i = 0; i < 40; i++)
		pair_tick(3000, 3000, 20);
	t0 = now;
	for (i = 0; i < 80 && !count_kind(0, KCOLL_C4_COMM_SLOW, 1, &e); i++)
		rx_tick(300, 20);
	tap_ok(count_kind(0, KCOLL_C4_COMM_SLOW, 1, &e) == 1 && e.host == 1 && e.bpf_dir == KCOLL_C4_RX &&
	       !c4.link[1][0][KCOLL_C4_TX].rate,
	       "rx at 300 kB/s, alone from its first slow sample: named against its usual rate "
	       "(host %u dir %u, %llu ms)", e.host, e.bpf_dir, (unsigned long long)((now - t0) / MS));
}

/* The hang tests' start: hang_ms 2000, we are host 0, 20 healthy ops. */
static void hang_start(void)
{
	const uint32_t think[4] = { 1, 1, 1, 1 };
	struct kcoll_c4_params p;

	kcoll_c4_params_default(&p);
	p.hang_ms = 2000;
	setup(0, &p);
	for (uint32_t i = 0; i < 20; i++)
		step(0, i, think, 10);
}

/* Ranks 1..3 report op 20 submitted (nsub 21) and waited on since t0, but
 * rank 'stuck', which has not submitted it and waits 5 ms longer. */
static void report_op20(uint64_t t0, uint32_t stuck)
{
	for (uint32_t r = 1; r < 4; r++) {
		struct kcoll_c4_rankrep rep = { .rank = r, .nsub = r == stuck ? 20 : 21,
						.age_ms = (uint32_t)((now - t0) / MS) + (r == stuck ? 5 : 0),
						.think_us = 300, .nthink = 16 };

		kcoll_c4_rank_report(&c4, &rep, now);
	}
}

static void test_noncomm_hang(bool local_culprit)
{
	uint32_t stuck = local_culprit ? 0 : 2;
	struct kcoll_c4_event e = { 0 };
	uint64_t t0;

	hang_start();
	/* Op 20: every rank but 'stuck' submits and waits. */
	t0 = now;
	if (!local_culprit)
		kcoll_c4_submit(&c4, 0, 20, now);
	for (int k = 0; k < 40; k++) {
		report_op20(t0, stuck);
		if (advance() && count_kind(0, KCOLL_C4_NONCOMM_HANG, 1, &e))
			break;
		if (!local_culprit)
			kcoll_c4_wait(&c4, 2, 1, t0, 20);
	}
	tap_ok(count_kind(0, KCOLL_C4_NONCOMM_HANG, 1, &e) == 1 && e.rank == stuck && e.host == stuck,
	       "non-communication hang names exactly rank %u (%s) (got %u)", stuck,
	       local_culprit ? "ours" : "a peer's", e.rank);
	tap_ok(now - t0 >= 2000 * MS && now - t0 <= 2500 * MS, "... once hang_ms passed (%llu ms)",
	       (unsigned long long)((now - t0) / MS));
	tap_ok(count_kind(0, KCOLL_C4_COMM_HANG, 1, NULL) == 0,
	       "... and no communication hang although the data path waits for that host");
	tap_ok(count_kind(0, 0, 1, NULL) == 1, "... and nothing else");
	/* It submits: cleared. */
	if (local_culprit) {
		kcoll_c4_submit(&c4, 0, 20, now);
	} else {
		struct kcoll_c4_rankrep rep = { .rank = 2, .nsub = 21, .think_us = 300, .nthink = 16 };

		kcoll_c4_rank_report(&c4, &rep, now);
	}
	advance();
	tap_ok(count_kind(0, KCOLL_C4_NONCOMM_HANG, 0, NULL) == 1, "... cleared once it submits");
}

static void test_comm_hang(void)
{
	struct kcoll_c4_event e = { 0 };
	uint64_t t0;

	hang_start();
	t0 = now;
	kcoll_c4_submit(&c4, 0, 20, now);
	for (int k = 0; k < 40 && !count_kind(0, KCOLL_C4_COMM_HANG, 1, &e); k++) {
		report_op20(t0, 0);	/* rank 0 (ours) does not report: nobody is stuck */
		kcoll_c4_wait(&c4, 3, 1, t0, 20);
		advance();
	}
	tap_ok(count_kind(0, KCOLL_C4_COMM_HANG, 1, &e) == 1 && e.host == 3 && e.link == 1 && e.rank == 3,
	       "communication hang: every rank submitted, host 3's data does not come on link 1");
	tap_ok(count_kind(0, KCOLL_C4_NONCOMM_HANG, -1, NULL) == 0, "... not blamed on a rank's submission");
	kcoll_c4_wait(&c4, KCOLL_C4_NONE, 0, 0, 0);
	advance();
	tap_ok(count_kind(0, KCOLL_C4_COMM_HANG, 0, NULL) == 1, "... cleared when data moves again");
}

static void test_straggler(bool local)
{
	uint32_t think[4] = { 1, 1, 1, 1 }, who = local ? 0 : 3;
	struct kcoll_c4_event e = { 0 };
	uint32_t i;

	setup(0, NULL);
	for (i = 0; i < 30; i++)
		step(0, i, think, 50);
	think[who] = 150;
	for (; i < 80 && !count_kind(0, KCOLL_C4_NONCOMM_SLOW, 1, &e); i++)
		step(0, i, think, 20);
	tap_ok(count_kind(0, KCOLL_C4_NONCOMM_SLOW, 1, &e) == 1 && e.rank == who,
	       "straggler (%s rank, 150 ms late each op) named: rank %u, think %llu us vs median %llu us",
	       local ? "our" : "a peer's", e.rank, (unsigned long long)e.value, (unsigned long long)e.ref);
	tap_ok(count_kind(0, 0, 1, NULL) == 1, "... and nothing else");
	think[who] = 1;
	for (int k = 0; k < 60 && !count_kind(0, KCOLL_C4_NONCOMM_SLOW, 0, NULL); k++, i++)
		step(0, i, think, 20);
	tap_ok(count_kind(0, KCOLL_C4_NONCOMM_SLOW, 0, NULL) == 1, "... cleared once it keeps up again");
}

static void test_events_ring(void)
{
	struct kcoll_c4_event ev[4];
	uint64_t last = 0;
	uint32_t n, seen = 0;

	/* A stuck rank raised and cleared many times: ids keep increasing and
	 * a reader resuming from an id gets only newer events. */
	setup(0, NULL);
	for (uint32_t k = 0; k < 300; k++) {
		c4.rank[1].hung = !c4.rank[1].hung;
		c4.next_id++;
		c4.ev[(c4.next_id - 1) % KCOLL_C4_EVQ] = (struct kcoll_c4_event){ .id = c4.next_id - 1 };
	}
	while ((n = kcoll_c4_events(&c4, last, ev, 4))) {
		for (uint32_t i = 0; i < n; i++) {
			if (ev[i].id != last + 1 && last)
				break;
			last = ev[i].id;
			seen++;
		}
	}
	tap_ok(seen == KCOLL_C4_EVQ && last == 300, "events: the newest %u of 300 in order, resumable (%u, last %llu)",
	       KCOLL_C4_EVQ, seen, (unsigned long long)last);
}

/*
 * A recorded trace: lines written by kcolld (KCOLL_C4_TRACE):
 *   init NRANKS NHOSTS SELF NLINKS RANKHOST...
 *   local RANK
 *   obs T_NS HOST LINK DIR BYTES BUSY_NS
 *   sub T_NS RANK SEQ / done T_NS RANK
 *   rep T_NS RANK NSUB AGE_MS THINK_US NTHINK
 *   wait T_NS HOST LINK SINCE SEQ
 *   eval T_NS
 */
static int replay(const char *path, struct kcoll_c4_event *last_raise, uint32_t *nraised, uint32_t *nevals)
{
	char line[256];
	FILE *f = fopen(path, "r");
	struct kcoll_c4_params p;
	int r = -ENOENT;

	*nraised = *nevals = 0;
	if (!f)
		return -errno;
	kcoll_c4_params_default(&p);
	while (fgets(line, sizeof(line), f)) {
		unsigned long long a[8] = { 0 };
		char w[16];
		int n = sscanf(line, "%15s %llu %llu %llu %llu %llu %llu %llu %llu", w, &a[0], &a[1], &a[2],
			       &a[3], &a[4], &a[5], &a[6], &a[7]);

		if (n < 2)
			continue;
		if (!strcmp(w, "init") && n >= 6) {
			uint16_t rh[KCOLL_C4_MAX_RANKS];
			char *s = line;

			for (int k = 0; k < 5; k++)
				s = strchr(s, ' ') + 1;
			for (uint32_t k = 0; k < a[0] && k < KCOLL_C4_MAX_RANKS; k++)
				rh[k] = (uint16_t)strtoul(s, &s, 10);
			r = kcoll_c4_init(&c4, &p, a[0], a[1], a[2], a[3], rh, 0);
			if (r)
				break;
		} else if (!strcmp(w, "local")) {
			kcoll_c4_local(&c4, a[0]);
		} else if (!strcmp(w, "obs") && n == 7) {
			struct kcoll_c4_linkobs o = { .t_ns = a[0], .host = a[1], .link = a[2], .dir = a[3],
						      .bytes = a[4], .busy_ns = a[5] };

			kcoll_c4_link_obs(&c4, &o);
		} else if (!strcmp(w, "sub") && n == 4) {
			kcoll_c4_submit(&c4, a[1], a[2], a[0]);
		} else if (!strcmp(w, "done") && n == 3) {
			kcoll_c4_complete(&c4, a[1], a[0]);
		} else if (!strcmp(w, "rep") && n == 7) {
			struct kcoll_c4_rankrep rep = { .rank = a[1], .nsub = a[2], .age_ms = a[3],
							.think_us = a[4], .nthink = a[5] };

			kcoll_c4_rank_report(&c4, &rep, a[0]);
		} else if (!strcmp(w, "wait") && n == 6) {
			kcoll_c4_wait(&c4, a[1] == 4294967295ull ? KCOLL_C4_NONE : a[1], a[2], a[3], a[4]);
		} else if (!strcmp(w, "eval")) {
			kcoll_c4_evaluate(&c4, a[0]);
			(*nevals)++;
		}
	}
	fclose(f);
	if (r)
		return r;
	*nraised = count_kind(0, 0, 1, last_raise);
	return 0;
}

static void test_recorded(void)
{
	const char *dir = getenv("KCOLL_TEST_DATA") ? getenv("KCOLL_TEST_DATA") : "tests/data";
	struct kcoll_c4_event e = { 0 };
	uint32_t nr, ne;
	char path[512];
	int r;

	snprintf(path, sizeof(path), "%s/c4-healthy.trace", dir);
	r = replay(path, &e, &nr, &ne);
	if (r)
		tap_skip("%s: %s (run from the source tree)", path, strerror(-r));
	else
		tap_ok(ne > 10 && nr == 0, "recorded healthy run (%u evaluations): no anomaly (got %u)", ne, nr);
	snprintf(path, sizeof(path), "%s/c4-degraded.trace", dir);
	r = replay(path, &e, &nr, &ne);
	if (r)
		tap_skip("%s: %s (run from the source tree)", path, strerror(-r));
	else {
		struct kcoll_c4_event ev[KCOLL_C4_EVQ];
		uint32_t n = kcoll_c4_events(&c4, 0, ev, KCOLL_C4_EVQ), wrong = 0;

		for (uint32_t i = 0; i < n; i++)
			wrong += ev[i].raised && !(ev[i].kind == KCOLL_C4_COMM_SLOW && ev[i].host == 2 && ev[i].link == 1);
		tap_ok(nr >= 1 && wrong == 0, "recorded run seen from host 3, host 2's eth1 at 1gbit: every one of "
		       "%u raised events is communication slow on host 2 link 1 (%u others)", nr, wrong);
	}
}

int main(void)
{
	printf("TAP version 13\n");
	test_bad_input();
	test_healthy_noisy();
	test_bpf_evidence();
	test_bpf_noisy_healthy();
	test_comm_slow(0, false);
	test_comm_slow(2, true);
	test_heal_probation();
	test_no_choice();
	test_thin_link();
	test_lone_key();
	test_noncomm_hang(false);
	test_noncomm_hang(true);
	test_comm_hang();
	test_straggler(false);
	test_straggler(true);
	test_events_ring();
	test_recorded();
	printf("1..%d\n", tap_n);
	return tap_failed ? 1 : 0;
}
