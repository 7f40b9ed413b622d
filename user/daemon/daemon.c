// SPDX-License-Identifier: MIT
/*
 * The daemon's one global state and its clock. They live here, apart from
 * every room that uses them, so that using them makes no file depend on
 * the ring server (client.c), the network (net.c) or anything else
 * (scripts/layering.py reads those dependencies from the objects).
 */
#include <time.h>

#include "kcolld.h"

struct kd_daemon kd;

int64_t kd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
