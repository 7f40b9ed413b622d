// SPDX-License-Identifier: MIT
/*
 * exec.c's jobs (struct kd_job, kd_exec_job: how mh.c runs a multi-host op's
 * node-local phases on the worker pool) on their own, in this process:
 *   - every task of a job runs exactly once, for 0, 1, 2 and many tasks,
 *     with and without a pool
 *   - kd_exec_job returns only after every task finished, also the ones a
 *     worker claimed (slow tasks: a missing wait is seen)
 *   - the workers share the tasks (with a pool, some ran off the caller)
 *   - two threads running jobs at once (two communicators' net threads)
 *   - kd_exec_stage gives each thread a buffer of at least the size asked
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <kcoll/kcoll.h>

#include "kcoll/tap.h"

#include "kcolld.h"

#define MAXT	4096

struct tjob {
	struct kd_job job;
	atomic_uint ran[MAXT];
	atomic_uint done[MAXT];
	atomic_uint off_caller;	/* tasks run by a thread other than the caller */
	atomic_uint stage_bad;
	pthread_t caller;
	long sleep_ns;
};

static void task(struct kd_job *job, uint32_t t)
{
	struct tjob *j = (struct tjob *)job;
	struct timespec ts = { 0, j->sleep_ns };
	size_t sz = 4096 + t % 7 * 1000;
	uint8_t *st = kd_exec_stage(sz);

	atomic_fetch_add(&j->ran[t], 1);
	if (!pthread_equal(pthread_self(), j->caller))
		atomic_fetch_add(&j->off_caller, 1);
	if (!st)
		atomic_fetch_add(&j->stage_bad, 1);
	else
		memset(st, (int)t, sz);	/* the whole size is ours (ASan would say) */
	if (j->sleep_ns)
		nanosleep(&ts, NULL);
	atomic_store(&j->done[t], 1);
}

/* Run a job of n tasks; 1 when each ran once and all were done at return. */
static int run(struct tjob *j, uint32_t n, long sleep_ns)
{
	uint32_t bad = 0;

	memset(j, 0, sizeof(*j));
	j->job.task = task;
	j->job.ntasks = n;
	j->caller = pthread_self();
	j->sleep_ns = sleep_ns;
	kd_exec_job(&j->job);
	for (uint32_t t = 0; t < n; t++)
		if (atomic_load(&j->ran[t]) != 1 || !atomic_load(&j->done[t]))
			bad++;
	for (uint32_t t = n; t < MAXT; t++)
		if (atomic_load(&j->ran[t]))
			bad++;
	return !bad && !atomic_load(&j->stage_bad);
}

static struct tjob jobs[2];

static void *concurrent(void *arg)
{
	struct tjob *j = arg;
	int ok = 1;

	for (int i = 0; i < 50; i++)
		ok &= run(j, 64 + i, 0);
	/* Tasks this thread ran took its staging buffer; a thread that calls
	 * kd_exec_job frees it on the way out, as kcolld's net thread does. */
	kd_exec_thread_done();
	return (void *)(long)ok;
}

int main(void)
{
	static const uint32_t sizes[] = { 0, 1, 2, 3, 64, MAXT };
	pthread_t th[2];
	void *ok[2];
	int r;

	/* No pool yet: the caller runs everything. */
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		tap_ok(run(&jobs[0], sizes[i], 0) && !atomic_load(&jobs[0].off_caller),
		       "no pool, %u tasks: each ran once, on the caller", sizes[i]);

	r = kd_pool_start(3);
	tap_ok(!r, "worker pool of 3 started (%d)", r);
	if (r)
		return tap_done();
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		tap_ok(run(&jobs[0], sizes[i], 0), "pool, %u tasks: each ran once, all done at return",
		       sizes[i]);
	/* Slow tasks: the workers claim some, and the caller must wait for them. */
	tap_ok(run(&jobs[0], 32, 2000000), "pool, 32 tasks of 2 ms: all done when kd_exec_job returned");
	tap_ok(atomic_load(&jobs[0].off_caller) > 0, "pool, 32 tasks of 2 ms: the workers ran %u of them",
	       atomic_load(&jobs[0].off_caller));

	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, concurrent, &jobs[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], &ok[i]);
	tap_ok(ok[0] && ok[1], "two threads, 50 jobs each at once: every task ran once, in time");

	kd_pool_stop();
	kd_exec_thread_done();
	return tap_done();
}
