/* SPDX-License-Identifier: MIT */
/*
 * What the KV tests (test_kv.c, test_kv_notif.c, kv_peer.c) share: a seeded
 * xorshift64 for reproducible batches and contents, and a 64-bit FNV-1a
 * style hash to compare a target image with what was sent (8 bytes a step:
 * a 64 MiB image hashes in a few ms), a shuffle so a batch's entries are not
 * in offset order, and buffers from the heap or kcoll_mem_alloc.
 */
#ifndef KCOLL_TESTS_KV_UTIL_H
#define KCOLL_TESTS_KV_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kcoll/kcoll.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static inline uint64_t rnd(void)
{
	uint64_t x = rng_state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

static inline uint64_t fnv(const uint8_t *p, size_t n)
{
	uint64_t h = 1469598103934665603ULL;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t v;

		memcpy(&v, p + i, 8);
		h = (h ^ v) * 1099511628211ULL;
	}
	for (; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ULL;
	return h;
}

/* Allocate n bytes the chosen way: shm = kcoll_mem_alloc (daemon maps it). */
static inline uint8_t *buf_alloc(struct kcoll *k, size_t n, int shm)
{
	void *p = NULL;

	if (!shm)
		return malloc(n);
	return kcoll_mem_alloc(k, n, &p) ? NULL : p;
}

static inline void buf_free(struct kcoll *k, uint8_t *p, int shm)
{
	if (shm)
		kcoll_mem_free(k, p);
	else
		free(p);
}

static inline void shuffle_entries(struct kcoll_xfer_entry *e, uint32_t n)
{
	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = rnd() % i;
		struct kcoll_xfer_entry t = e[i - 1];

		e[i - 1] = e[j];
		e[j] = t;
	}
}

#endif
