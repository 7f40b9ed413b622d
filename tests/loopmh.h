/* SPDX-License-Identifier: MIT */
/*
 * A multi-host communicator's host state (struct kd_mh) for tests that run
 * every host of it as a thread of one process, over the in-process
 * loopback transport (user/daemon/xport_loop.c): what test_sched and
 * test_step set up and tear down alike. The caller sets the rest (piece
 * size, data, algorithm) between loopmh_init and its run.
 */
#ifndef KCOLL_TESTS_LOOPMH_H
#define KCOLL_TESTS_LOOPMH_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kcolld.h"
#include "mh.h"
#include "step.h"
#include "xport.h"

/* Host h of H with nstreams streams per peer on fabric f; aborts if out of
 * memory or file descriptors (a test has nothing better to do then). */
static inline void loopmh_init(struct kd_mh *mh, uint32_t h, uint32_t H, uint32_t nstreams,
			       struct kd_loop_fabric *f)
{
	mh->nhosts = H;
	mh->self = h;
	mh->nstreams = nstreams;
	mh->hosts = calloc(H, sizeof(*mh->hosts));
	if (!mh->hosts)
		abort();
	for (uint32_t g = 0; g < H; g++)
		for (uint32_t s = 0; s < KD_MAX_STREAMS; s++)
			mh->hosts[g].data[s] = -1;
	pthread_mutex_init(&mh->plan_lock, NULL);
	mh->abort_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (mh->abort_fd < 0)
		abort();
	mh->xport = &kd_xport_loop;
	mh->xfabric = f;
	atomic_store(&mh->last_progress, kd_now_ns());
}

/* Undo loopmh_init and what the step engine kept (its transport state and
 * receive buffers). */
static inline void loopmh_fini(struct kd_mh *mh)
{
	kd_step_close(mh);
	for (uint32_t i = 0; i < KD_MAX_HOSTS * KD_MAX_STREAMS; i++)
		free(mh->rx[i]);
	free(mh->snap);
	free(mh->hosts);
	close(mh->abort_fd);
	pthread_mutex_destroy(&mh->plan_lock);
}

#endif
