// SPDX-License-Identifier: MIT
/*
 * Tunables kcolld honours while it runs: chunk_bytes (data-path task size),
 * net_chunk_bytes (piece size between daemons) and timeout_ms (hang timeout
 * of an operation, for communicators whose ranks did not set
 * KCOLL_TIMEOUT_MS themselves), and the C4 detector's slow_ratio_pct,
 * hang_ms and straggler_ms (c4d.c). `kcollctl set` changes them too.
 *
 * At start a value comes from kcolld's environment if set there, else from
 * /sys/kernel/kcoll/ when kcoll.ko is loaded, else the built-in default.
 * Afterwards every change an administrator makes in sysfs (`kcollctl set`)
 * is applied within a second. Control thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kcolld.h"
#include "log.h"

#define SYSFS_DIR "/sys/kernel/kcoll/"

struct tunable {
	const char *sysfs;	/* file under SYSFS_DIR */
	const char *knob;	/* KCOLL_* environment knob */
	long long scale;	/* knob/sysfs unit -> daemon unit */
	long long min, max;	/* in knob units; values outside are clamped */
	void *target;		/* size_t or int64_t in kd */
	bool is_size;
	long long last_sysfs;	/* last value seen in sysfs, -1 none */
	const char *source;
};

static struct tunable tunables[] = {
	{ "chunk_bytes", "KCOLL_CHUNK_BYTES", 1, 4096, KD_STAGE_MAX, &kd.chunk_bytes, true, -1, "default" },
	{ "timeout_ms", "KCOLL_TIMEOUT_MS", 1000000, 1, 86400000, &kd.timeout_ns, false, -1, "default" },
	{ "net_chunk_bytes", "KCOLL_NET_CHUNK_BYTES", 1, 4096, 64 << 20, &kd.net_chunk_bytes, true, -1, "default" },
	{ "slow_ratio_pct", "KCOLL_C4_SLOW_RATIO_PCT", 1, 101, 10000, &kd.c4_slow_ratio_pct, false, -1, "default" },
	{ "hang_ms", "KCOLL_C4_HANG_MS", 1, 1, 3600000, &kd.c4_hang_ms, false, -1, "default" },
	{ "straggler_ms", "KCOLL_C4_STRAGGLER_MS", 1, 1, 3600000, &kd.c4_straggler_ms, false, -1, "default" },
};

static long long sysfs_read(const char *name)
{
	char path[128];
	long long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), SYSFS_DIR "%s", name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%lli", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

static void apply(struct tunable *t, long long v, const char *source)
{
	if (v < t->min || v > t->max) {
		long long c = v < t->min ? t->min : t->max;

		kc_warn("tunable %s=%lld from %s is out of range %lld..%lld; using %lld", t->sysfs, v,
			source, t->min, t->max, c);
		v = c;
	}
	if (t->is_size)
		__atomic_store_n((size_t *)t->target, (size_t)v * t->scale, __ATOMIC_RELAXED);
	else
		__atomic_store_n((int64_t *)t->target, (int64_t)v * t->scale, __ATOMIC_RELAXED);
	t->source = source;
}

void kd_tunables_init(void)
{
	for (size_t i = 0; i < sizeof(tunables) / sizeof(tunables[0]); i++) {
		struct tunable *t = &tunables[i];
		long long s = sysfs_read(t->sysfs);

		t->last_sysfs = s;
		if (kcoll_knob_is_set(t->knob))
			apply(t, kcoll_knob_ll(t->knob), "environment");
		else if (s >= 0)
			apply(t, s, "sysfs");
		else
			apply(t, kcoll_knob_ll(t->knob), "default");
	}
}

void kd_tunables_poll(void)
{
	for (size_t i = 0; i < sizeof(tunables) / sizeof(tunables[0]); i++) {
		struct tunable *t = &tunables[i];
		long long s = sysfs_read(t->sysfs);

		if (s < 0 || s == t->last_sysfs)
			continue;
		kc_info("tunable %s: %lld -> %lld (from " SYSFS_DIR "%s)", t->sysfs,
			t->last_sysfs, s, t->sysfs);
		t->last_sysfs = s;
		apply(t, s, "sysfs");
	}
}

size_t kd_tunables_render(char *buf, size_t cap, int json)
{
	size_t n = 0;

	for (size_t i = 0; i < sizeof(tunables) / sizeof(tunables[0]) && n < cap; i++) {
		const struct tunable *t = &tunables[i];
		long long v = t->is_size ? (long long)__atomic_load_n((size_t *)t->target, __ATOMIC_RELAXED) :
			      (long long)(__atomic_load_n((int64_t *)t->target, __ATOMIC_RELAXED) / t->scale);
		int w = json ? snprintf(buf + n, cap - n, "%s\"%s\":{\"value\":%lld,\"source\":\"%s\"}",
					i ? "," : "", t->sysfs, v, t->source) :
			       snprintf(buf + n, cap - n, "%s%s %lld (%s)", i ? ", " : "", t->sysfs, v,
					t->source);
		if (w < 0)
			break;
		n += (size_t)w;
	}
	return n < cap ? n : cap - 1;
}

int kd_tunable_set(const char *key, const char *value, char *err, size_t errlen)
{
	for (size_t i = 0; i < sizeof(tunables) / sizeof(tunables[0]); i++) {
		struct tunable *t = &tunables[i];
		char *end;
		long long v;

		if (strcmp(t->sysfs, key))
			continue;
		v = strtoll(value, &end, 0);
		if (!*value || *end || v < t->min || v > t->max) {
			snprintf(err, errlen, "%s must be a number in %lld..%lld", key, t->min, t->max);
			return -EINVAL;
		}
		apply(t, v, "kcollctl set");
		return 0;
	}
	snprintf(err, errlen, "unknown key '%s' (algo, streams, chunk_bytes, net_chunk_bytes, timeout_ms, "
		 "slow_ratio_pct, hang_ms, straggler_ms)",
		 key);
	return -ENOENT;
}
