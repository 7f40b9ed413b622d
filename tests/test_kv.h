/* SPDX-License-Identifier: MIT */
/*
 * What the KV tests against the running kcolld (test_kv.c, test_kv_notif.c)
 * share: the board their children report on (shared memory: descriptors
 * out, verdicts back), random contents, a bounded wait for a child, and the
 * connection every case starts from.
 */
#ifndef KCOLL_TESTS_TEST_KV_H
#define KCOLL_TESTS_TEST_KV_H

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "kv_util.h"

/* Shared with the children: descriptors out, verdicts back. */
struct shared {
	kcoll_seg_desc_t desc[4];
	uint64_t expect_hash;
	int bad;			/* child: 0 ok, else a line number */
	int err;			/* child: last errno seen */
	char why[160];
	volatile int go;
};

static struct shared *B;

static inline void fill_random(uint8_t *p, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t v = rnd();

		memcpy(p + i, &v, 8);
	}
	for (; i < n; i++)
		p[i] = (uint8_t)rnd();
}

static inline int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline struct kcoll *connect_or_die(void)
{
	struct kcoll *k;
	int r = kcoll_connect(NULL, &k);

	if (r) {
		printf("Bail out! kcoll_connect: %s\n", kcoll_strerror(r));
		exit(1);
	}
	return k;
}

#define CH_FAIL(...)                                                                 \
	do {                                                                         \
		snprintf(B->why, sizeof(B->why), __VA_ARGS__);                        \
		B->bad = __LINE__;                                                   \
		_exit(1);                                                            \
	} while (0)

static inline int wait_child(pid_t pid, int timeout_ms)
{
	int64_t end = now_ms() + timeout_ms;
	int st;

	for (;;) {
		pid_t w = waitpid(pid, &st, WNOHANG);

		if (w == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		if (now_ms() > end) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -ETIMEDOUT;
		}
		usleep(2000);
	}
}

static inline int all_bytes(const uint8_t *p, size_t n, uint8_t v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

/* A target process: size zeroed bytes registered and exported to
 * B->desc[0], "r" on fd, then it waits to be killed. */
static inline void target_child(int fd, size_t size)
{
	struct kcoll *k = connect_or_die();
	uint8_t *dst = malloc(size);
	struct kcoll_seg *seg;
	int r;

	memset(dst, 0, size);
	if ((r = kcoll_seg_register(k, dst, size, NULL, &seg)))
		CH_FAIL("target: %s", kcoll_strerror(r));
	kcoll_seg_export(seg, &B->desc[0]);
	if (write(fd, "r", 1) != 1)
		CH_FAIL("pipe");
	pause();
	_exit(0);
}

/* The board in shared memory, before any child starts; Bail out if none. */
static inline void board_map(void)
{
	B = mmap(NULL, sizeof(*B), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (B == MAP_FAILED) {
		printf("Bail out! mmap\n");
		exit(1);
	}
}

#endif /* KCOLL_TESTS_TEST_KV_H */
