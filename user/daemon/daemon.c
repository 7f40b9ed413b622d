// SPDX-License-Identifier: MIT
/*
 * The daemon's one global state and its clock. They live here, apart from
 * every room that uses them, so that using them makes no file depend on
 * the ring server (client.c), the network (net.c) or anything else
 * (scripts/layering.py reads those dependencies from the objects).
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "c4d.h"
#include "kcolld.h"

struct kd_daemon kd;

/* Installed by c4d.c (kd_c4_start), read by comm.c, mh.c and net*.c: it lives
 * here so that neither side depends on the other. */
const struct kd_c4_hooks *kd_c4;

int64_t kd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#define UNMAP_SUBSCRIBERS 4

static kd_unmap_fn *unmap_subs[UNMAP_SUBSCRIBERS];

int kd_unmap_subscribe(kd_unmap_fn *fn)
{
	for (int i = 0; i < UNMAP_SUBSCRIBERS; i++) {
		if (unmap_subs[i] == fn)
			return 0;
		if (!unmap_subs[i]) {
			unmap_subs[i] = fn;
			return 0;
		}
	}
	return -ENOSPC;
}

void kd_unmap_notify(void *addr, size_t len)
{
	for (int i = 0; i < UNMAP_SUBSCRIBERS && unmap_subs[i]; i++)
		unmap_subs[i](addr, len);
}

int kd_grow(uint8_t **p, size_t *have, size_t want)
{
	if (*have < want) {
		uint8_t *n;

		/* A registration (RDMA zero-copy) of the old block would
		 * outlive it: drop it first. */
		if (*p)
			kd_unmap_notify(*p, *have);
		n = realloc(*p, want);

		if (!n)
			return -ENOMEM;
		*p = n;
		*have = want;
	}
	return 0;
}
