/* SPDX-License-Identifier: MIT */
/* Helpers shared by the VM-tier tests of kcoll.ko (they run as root in the guest). */
#ifndef KCOLL_VM_UTIL_H
#define KCOLL_VM_UTIL_H

#include <errno.h>
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
#include <kcoll/tap.h>

#define SYSFS_DIR	"/sys/kernel/kcoll/"
#define NOBODY		65534

static inline int dev_open(void)
{
	int fd = open(KCOLL_DEV_PATH, O_RDWR | O_CLOEXEC);

	if (fd < 0) {
		printf("Bail out! open %s: %s\n", KCOLL_DEV_PATH, strerror(errno));
		exit(1);
	}
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
	if (pipe(c->up) || pipe(c->down)) {
		printf("Bail out! pipe: %s\n", strerror(errno));
		exit(1);
	}
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
