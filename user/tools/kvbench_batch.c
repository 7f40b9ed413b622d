/* SPDX-License-Identifier: MIT */
/*
 * What every kcoll-kvbench mode reads: the options' values (their defaults
 * here, kcoll-kvbench.c parses them) and the batches the initiator, the
 * memcpy anchor and the raw TCP anchor move alike (the same generator and
 * seeds: random disjoint block slots of the segments).
 */
#include <stdlib.h>
#include <time.h>

#include "kvbench.h"

struct kvb_opts kvb_opt = {
	.batch = 64, .threads = 1, .duration = 1.0, .depth = 2, .seg_bytes = 256u << 20,
	.shm = true, .anchor = true,
};

double kvb_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t xrand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* A generator state from a seed: splitmix64's finalizer, so that nearby
 * seeds (one per batch) start far apart; odd, hence never zero. */
static uint64_t seed_state(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return (x ^ (x >> 31)) | 1;
}

uint32_t kvb_nbatches(size_t block, uint32_t batch)
{
	uint64_t n = kvb_opt.seg_bytes / ((uint64_t)block * batch);

	return n < 1 ? 1 : n > 64 ? 64 : (uint32_t)n;
}

void kvb_make_entries(struct kcoll_xfer_entry *e, uint32_t n, size_t block, size_t seg,
		      uint64_t seed)
{
	uint64_t slots = seg / block, s = seed_state(seed);
	uint64_t *perm = malloc(slots * sizeof(*perm));

	for (uint64_t i = 0; i < slots; i++)
		perm[i] = i;
	for (uint32_t i = 0; i < n; i++) {	/* partial Fisher-Yates */
		uint64_t j = i + xrand(&s) % (slots - i), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
		e[i].remote_off = perm[i] * block;
	}
	for (uint64_t i = 0; i < slots; i++)
		perm[i] = i;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t j = i + xrand(&s) % (slots - i), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
		e[i].local_off = perm[i] * block;
		e[i].len = block;
	}
	free(perm);
}
