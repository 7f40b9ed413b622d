// SPDX-License-Identifier: GPL-2.0
/*
 * The C4 detector and planner core (include/kcoll/c4.h, user/common/c4.c,
 * built into this module by c4_core.c) run in the kernel: a self-test that
 * feeds the in-kernel copy a synthetic trace and reports what it classified
 * (/sys/kernel/kcoll/c4_selftest, root only; docs/sysfs.md). The thresholds
 * it uses are the module's sysfs knobs, the same ones kcolld follows.
 */
#include <linux/errno.h>
#include <linux/sysfs.h>
#include <linux/vmalloc.h>

#include <kcoll/c4.h>

#include "kcoll_mod.h"

#define C4_MS		1000000ULL
#define C4_TICK		(250 * C4_MS)
#define C4_HOSTS	4
#define C4_SELF		1

struct kcoll_c4_selftest {
	struct kcoll_c4 c4;
	struct kcoll_c4_plan plan;
	u64 now;
	u32 rng;
};

/* Deterministic noise: v * [80 %, 120 %]. */
static u64 c4_noisy(struct kcoll_c4_selftest *t, u64 v)
{
	t->rng = t->rng * 1103515245u + 12345u;
	return v * (80 + (t->rng >> 8) % 41) / 100;
}

/* One tick of a 4-host ring seen from host 1: 8 MiB pieces from host 0 (rx)
 * and to host 2 (tx) on both links at rate_rx[l] / 600 MB/s, every rank
 * submitting op i after a 1.2 ms think time.
 */
static void c4_tick(struct kcoll_c4_selftest *t, u64 i, const u64 rate_rx[2])
{
	u32 l, d, r;

	for (l = 0; l < 2; l++) {
		for (d = 0; d < 2; d++) {
			u64 rate = d ? 600 : rate_rx[l];
			struct kcoll_c4_linkobs o = {
				.host = d ? 2 : 0, .link = l, .dir = d, .bytes = 8ULL << 20,
				.t_ns = t->now,
			};

			/* bytes / (MB/s) = microseconds; busy time in ns */
			o.busy_ns = c4_noisy(t, (8ULL << 20) * 1000 / rate);
			kcoll_c4_link_obs(&t->c4, &o);
		}
	}
	for (r = 0; r < C4_HOSTS; r++) {
		if (r == C4_SELF) {
			kcoll_c4_complete(&t->c4, r, t->now);
			kcoll_c4_submit(&t->c4, r, i, t->now + 1200000);
		} else {
			struct kcoll_c4_rankrep rep = {
				.rank = r, .nsub = i + 1, .age_ms = 1,
				.think_us = (u32)c4_noisy(t, 1200), .nthink = KCOLL_C4_WIN,
			};

			kcoll_c4_rank_report(&t->c4, &rep, t->now);
		}
	}
	t->now += C4_TICK;
	kcoll_c4_evaluate(&t->c4, t->now);
}

static const char *c4_kind_key(u32 kind)
{
	switch (kind) {
	case KCOLL_C4_COMM_HANG: return "comm_hang";
	case KCOLL_C4_NONCOMM_HANG: return "noncomm_hang";
	case KCOLL_C4_COMM_SLOW: return "comm_slow";
	case KCOLL_C4_NONCOMM_SLOW: return "straggler";
	}
	return "?";
}

/*
 * 40 healthy ticks, then host 0's link 1 at 10 % for up to 40 ticks: what
 * was raised (kind, host, link, after how many evaluations, evidence) and
 * where the planner puts host 0's stream 1. Returns the bytes written to buf
 * (a sysfs page) or a negative errno.
 */
ssize_t kcoll_c4_selftest(char *buf, u32 slow_ratio_pct, u32 hang_ms, u32 straggler_ms)
{
	static const u16 rank_host[C4_HOSTS] = { 0, 1, 2, 3 };
	u32 shared[C4_HOSTS] = { 3, 3, 3, 3 };
	u64 healthy[2] = { 600, 600 }, slow[2] = { 600, 60 };
	struct kcoll_c4_event ev[8];
	struct kcoll_c4_selftest *t;
	struct kcoll_c4_params p;
	u32 nhealthy, k, n, i;
	ssize_t len;
	int ret;

	t = vzalloc(sizeof(*t));
	if (!t)
		return -ENOMEM;
	kcoll_c4_params_default(&p);
	p.slow_ratio_pct = slow_ratio_pct;
	p.hang_ms = hang_ms;
	p.straggler_ms = straggler_ms;
	t->now = 1000 * C4_MS;
	t->rng = 12345;
	ret = kcoll_c4_init(&t->c4, &p, C4_HOSTS, C4_HOSTS, C4_SELF, 2, rank_host, t->now);
	if (!ret)
		ret = kcoll_c4_local(&t->c4, C4_SELF);
	if (ret) {
		vfree(t);
		return ret;
	}
	for (i = 0; i < 40; i++)
		c4_tick(t, i, healthy);
	nhealthy = kcoll_c4_events(&t->c4, 0, ev, ARRAY_SIZE(ev));
	len = sysfs_emit(buf, "core %zu bytes of state, params slow_ratio_pct=%u hang_ms=%u ",
			 sizeof(t->c4), p.slow_ratio_pct, p.hang_ms);
	len += sysfs_emit_at(buf, len, "straggler_ms=%u\n", p.straggler_ms);
	len += sysfs_emit_at(buf, len, "healthy evaluations=40 events=%u\n", nhealthy);
	for (k = 0; k < 40; k++) {
		c4_tick(t, i++, slow);
		if (kcoll_c4_events(&t->c4, 0, ev, ARRAY_SIZE(ev)) > nhealthy)
			break;
	}
	n = kcoll_c4_events(&t->c4, 0, ev, ARRAY_SIZE(ev));
	if (n > nhealthy) {
		const struct kcoll_c4_event *e = &ev[nhealthy];

		len += sysfs_emit_at(buf, len,
				     "degraded raised=%s host=%d link=%d evaluations=%u value=%llu ref=%llu\n",
				     c4_kind_key(e->kind),
				     e->host == KCOLL_C4_NONE ? -1 : (int)e->host,
				     e->link == KCOLL_C4_NONE ? -1 : (int)e->link, k + 1,
				     (unsigned long long)e->value, (unsigned long long)e->ref);
	} else {
		len += sysfs_emit_at(buf, len, "degraded raised=none evaluations=%u\n", k);
	}
	ret = kcoll_c4_plan(&t->c4, shared, 2, t->now, &t->plan);
	if (ret < 0) {
		vfree(t);
		return ret;
	}
	len += sysfs_emit_at(buf, len, "plan host=0 stream=0 link=%u stream=1 link=%u why=\"%s\"\n",
			     t->plan.link[0][0], t->plan.link[0][1],
			     kcoll_c4_why_name(t->plan.why[0][1]));
	vfree(t);
	return len;
}
