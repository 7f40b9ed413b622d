/* SPDX-License-Identifier: MIT */
/*
 * Doorbells: shared (not FUTEX_PRIVATE) futexes on ring indices, so a wait in
 * one process is woken from another through the same memfd page.
 */
#ifndef KCOLL_FUTEX_H
#define KCOLL_FUTEX_H

#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Sleep while *word == expected, at most timeout_ns (< 0: forever).
 * Returns 0 when woken or the word changed, -ETIMEDOUT, or -EINTR. */
static inline int kcoll_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
	struct timespec ts, *tsp = NULL;
	long r;

	if (timeout_ns >= 0) {
		ts.tv_sec = timeout_ns / 1000000000;
		ts.tv_nsec = timeout_ns % 1000000000;
		tsp = &ts;
	}
	r = syscall(SYS_futex, word, FUTEX_WAIT, expected, tsp, NULL, 0);
	if (r == 0 || errno == EAGAIN)
		return 0;
	return -errno;
}

static inline void kcoll_futex_wake(uint32_t *word, int nr)
{
	syscall(SYS_futex, word, FUTEX_WAKE, nr, NULL, NULL, 0);
}

#endif /* KCOLL_FUTEX_H */
