/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the VM-tier tests of kcoll.ko (they run as root in the
 * guest). Results, counts, the TAP plan and the exit status are kselftest's
 * (tools/testing/selftests/kselftest.h, which scripts/vmtest.sh takes from
 * Debian's linux-source): vm_ok and friends add printf checking and return
 * the verdict, so that a step can stop what depends on it.
 */
#ifndef KCOLL_VM_UTIL_H
#define KCOLL_VM_UTIL_H

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stddef.h>
#include <grp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/kcoll.h>

#include "kselftest.h"

#define SYSFS_DIR	"/sys/kernel/kcoll/"
#define NOBODY		65534

/* m = fmt formatted with the caller's variadic arguments. */
#define VM_FORMAT(m, fmt)                              \
	do {                                           \
		va_list ap_;                           \
		va_start(ap_, fmt);                    \
		vsnprintf(m, sizeof(m), fmt, ap_);     \
		va_end(ap_);                           \
	} while (0)

/* One result, counted by kselftest; returns ok. */
static inline int __attribute__((format(printf, 2, 3))) vm_ok(int ok, const char *fmt, ...)
{
	char m[1024];

	VM_FORMAT(m, fmt);
	ksft_test_result(ok, "- %s\n", m);
	fflush(stdout);
	return ok;
}

static inline void __attribute__((format(printf, 1, 2))) vm_skip(const char *fmt, ...)
{
	char m[1024];

	VM_FORMAT(m, fmt);
	ksft_test_result_skip("%s\n", m);
	fflush(stdout);
}

static inline void __attribute__((format(printf, 1, 2))) vm_diag(const char *fmt, ...)
{
	char m[1024];

	VM_FORMAT(m, fmt);
	ksft_print_msg("%s\n", m);
}

/* The plan (what ran), kselftest's totals, and exit: 0 unless a check failed. */
static inline int vm_done(void)
{
	ksft_set_plan(ksft_test_num());
	ksft_finished();
	return KSFT_FAIL;	/* not reached: ksft_finished exits */
}

static inline int dev_open(void)
{
	int fd = open(KCOLL_DEV_PATH, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		ksft_exit_fail_msg("open %s: %s\n", KCOLL_DEV_PATH, strerror(errno));
	return fd;
}

/* ioctl returning 0 or -errno */
static inline int xioctl(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) ? -errno : 0;
}

/* Read a decimal/hex sysfs value; -1 if unreadable. */
static inline long long sysfs_read(const char *name)
{
	char path[256], buf[64];
	long long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), SYSFS_DIR "%s", name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fgets(buf, sizeof(buf), f))
		v = strtoll(buf, NULL, 0);
	fclose(f);
	return v;
}

/* Write a string to a sysfs file; 0 or -errno. */
static inline int sysfs_write(const char *name, const char *val)
{
	char path[256];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), SYSFS_DIR "%s", name);
	fd = open(path, O_WRONLY);
	if (fd < 0)
		return -errno;
	n = write(fd, val, strlen(val));
	n = n < 0 ? -errno : 0;
	close(fd);
	return (int)n;
}

/* Become nobody for good (the child of a fork). */
static inline int drop_to_nobody(void)
{
	if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY))
		return -errno;
	return 0;
}

/* Wait for a child; returns its exit status, 128+signal, or -1. */
static inline int reap(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid)
		return -1;
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + WTERMSIG(st);
}

static inline double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* One-shot messages between parent and child over a pipe pair. */
struct chan {
	int up[2];	/* child -> parent */
	int down[2];	/* parent -> child */
};

static inline void chan_init(struct chan *c)
{
	if (pipe(c->up) || pipe(c->down))
		ksft_exit_fail_msg("pipe: %s\n", strerror(errno));
}

static inline int chan_send(int fd, uint64_t v)
{
	return write(fd, &v, sizeof(v)) == sizeof(v) ? 0 : -1;
}

static inline int chan_recv(int fd, uint64_t *v)
{
	return read(fd, v, sizeof(*v)) == sizeof(*v) ? 0 : -1;
}

/* KCOLL_IOC_BUF_REGISTER of [addr, addr + len); 0 (*handle set) or -errno. */
static inline int buf_reg(int fd, void *addr, uint64_t len, uint32_t flags, uint64_t *handle)
{
	struct kcoll_ioc_buf_register r = {
		.size = sizeof(r), .flags = flags, .addr = (uintptr_t)addr, .len = len,
	};
	int ret = xioctl(fd, KCOLL_IOC_BUF_REGISTER, &r);

	if (!ret)
		*handle = r.handle;
	return ret;
}

static inline int buf_unreg(int fd, uint64_t handle)
{
	struct kcoll_ioc_buf_unregister u = { .size = sizeof(u), .handle = handle };

	return xioctl(fd, KCOLL_IOC_BUF_UNREGISTER, &u);
}

/* The module's pin counters (sysfs) are exactly these. */
static inline int pins_at(long long pinned, long long registered)
{
	return sysfs_read("pinned_pages") == pinned && sysfs_read("registered_bytes") == registered;
}

#endif /* KCOLL_VM_UTIL_H */
