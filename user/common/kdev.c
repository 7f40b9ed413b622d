// SPDX-License-Identifier: MIT
/* The user side of /dev/kcoll; see kdev.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kdev.h"

static int kdev_fail(struct kcoll_kdev *kd, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int kdev_fail(struct kcoll_kdev *kd, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(kd->why, sizeof(kd->why), fmt, ap);
	va_end(ap);
	return err;
}

/* ioctl() with the size field filled in; returns 0 or -errno. */
static int kdev_ioctl(int fd, unsigned long cmd, void *arg, uint32_t size)
{
	memcpy(arg, &size, sizeof(size));
	return ioctl(fd, cmd, arg) ? -errno : 0;
}

int kcoll_kdev_query(struct kcoll_kdev *kd, struct kcoll_ioc_query *q)
{
	memset(q, 0, sizeof(*q));
	return kdev_ioctl(kd->fd, KCOLL_IOC_QUERY, q, sizeof(*q));
}

int kcoll_kdev_open(struct kcoll_kdev *kd, const char *path)
{
	struct kcoll_ioc_query q;
	int err;

	memset(kd, 0, sizeof(*kd));
	kd->fd = -1;
	if (!path)
		path = KCOLL_DEV_PATH;
	kd->fd = open(path, O_RDWR | O_CLOEXEC);
	if (kd->fd < 0) {
		err = errno;
		if (err == ENOENT || err == ENXIO || err == ENODEV)
			return kdev_fail(kd, -ENODEV, "%s: %s (kcoll.ko is not loaded)",
					 path, strerror(err));
		return kdev_fail(kd, -err, "%s: %s", path, strerror(err));
	}
	err = kcoll_kdev_query(kd, &q);
	if (err) {
		kcoll_kdev_close(kd);
		if (err == -ENOTTY)
			return kdev_fail(kd, -ENODEV, "%s is not a kcoll device", path);
		return kdev_fail(kd, err, "%s: feature query failed: %s", path, strerror(-err));
	}
	if (q.abi_version != KCOLL_KDEV_ABI_VERSION) {
		kcoll_kdev_close(kd);
		return kdev_fail(kd, -EPROTONOSUPPORT,
				 "%s speaks device ABI %u, this build speaks %u: rebuild or reload kcoll.ko",
				 path, q.abi_version, KCOLL_KDEV_ABI_VERSION);
	}
	kd->features = q.features;
	kd->page_size = q.page_size;
	kd->max_buf_bytes = q.max_buf_bytes;
	kd->why[0] = '\0';
	return 0;
}

void kcoll_kdev_close(struct kcoll_kdev *kd)
{
	if (kd->fd >= 0)
		close(kd->fd);
	kd->fd = -1;
	kd->features = 0;
}

const char *kcoll_kdev_why(const struct kcoll_kdev *kd)
{
	return kd->why[0] ? kd->why : "no error";
}

int kcoll_kdev_map(struct kcoll_kdev *kd, uint64_t handle, int prot, struct kcoll_kdev_map *m)
{
	struct kcoll_ioc_buf_import imp;
	void *p;
	int err;

	memset(m, 0, sizeof(*m));
	memset(&imp, 0, sizeof(imp));
	imp.handle = handle;
	err = kdev_ioctl(kd->fd, KCOLL_IOC_BUF_IMPORT, &imp, sizeof(imp));
	if (err)
		return err;
	if (!prot)
		prot = imp.buf_flags & KCOLL_BUF_F_READONLY ? PROT_READ : PROT_READ | PROT_WRITE;
	/* a 32-bit off_t cannot reach the 4 GiB-per-handle slots */
	if (imp.map_len > SIZE_MAX || (uint64_t)(off_t)imp.mmap_offset != imp.mmap_offset)
		return -EOVERFLOW;
	p = mmap(NULL, (size_t)imp.map_len, prot, MAP_SHARED, kd->fd, (off_t)imp.mmap_offset);
	if (p == MAP_FAILED)
		return -errno;
	m->map_base = p;
	m->map_len = (size_t)imp.map_len;
	m->addr = (char *)p + imp.page_offset;
	m->len = imp.len;
	m->buf_flags = imp.buf_flags;
	m->owner_pid = (pid_t)imp.owner_pid;
	return 0;
}

int kcoll_kdev_unmap(struct kcoll_kdev_map *m)
{
	int err = 0;

	if (m->map_base && munmap(m->map_base, m->map_len))
		err = -errno;
	memset(m, 0, sizeof(*m));
	return err;
}

int kcoll_kdev_dmabuf(struct kcoll_kdev *kd, uint64_t handle, int *fd)
{
	struct kcoll_ioc_buf_dmabuf d;
	int err;

	*fd = -1;
	if (!kcoll_kdev_has(kd, KCOLL_FEAT_DMABUF))
		return -EOPNOTSUPP;
	memset(&d, 0, sizeof(d));
	d.handle = handle;
	err = kdev_ioctl(kd->fd, KCOLL_IOC_BUF_DMABUF, &d, sizeof(d));
	if (err)
		return err;
	*fd = d.fd;
	return 0;
}

int kcoll_kdev_register(struct kcoll_kdev *kd, void *addr, uint64_t len, uint32_t flags,
			uint64_t *handle)
{
	struct kcoll_ioc_buf_register r;
	int err;

	memset(&r, 0, sizeof(r));
	r.flags = flags;
	r.addr = (uintptr_t)addr;
	r.len = len;
	err = kdev_ioctl(kd->fd, KCOLL_IOC_BUF_REGISTER, &r, sizeof(r));
	if (!err)
		*handle = r.handle;
	return err;
}

int kcoll_kdev_unregister(struct kcoll_kdev *kd, uint64_t handle)
{
	struct kcoll_ioc_buf_unregister u;

	memset(&u, 0, sizeof(u));
	u.handle = handle;
	return kdev_ioctl(kd->fd, KCOLL_IOC_BUF_UNREGISTER, &u, sizeof(u));
}

int kcoll_kdev_grant(struct kcoll_kdev *kd, uint64_t handle, uint32_t kind, uint32_t id,
		     uint32_t flags)
{
	struct kcoll_ioc_buf_grant g;

	memset(&g, 0, sizeof(g));
	g.flags = flags;
	g.handle = handle;
	g.kind = kind;
	g.id = id;
	return kdev_ioctl(kd->fd, KCOLL_IOC_BUF_GRANT, &g, sizeof(g));
}

int kcoll_kdev_peer_report(struct kcoll_kdev *kd, uint32_t peer, uint32_t state,
			   uint32_t latency_us, uint32_t bw_mbps)
{
	struct kcoll_ioc_peer_report p;

	memset(&p, 0, sizeof(p));
	p.peer = peer;
	p.state = state;
	p.latency_us = latency_us;
	p.bw_mbps = bw_mbps;
	return kdev_ioctl(kd->fd, KCOLL_IOC_PEER_REPORT, &p, sizeof(p));
}
