/* SPDX-License-Identifier: MIT */
/*
 * kcoll_kdev: the user side of kcoll.ko's /dev/kcoll (man/kcoll.4).
 *
 * kcolld uses it to map a client's registered buffer into its own address
 * space by handle; libkcoll to register and grant. The device is optional:
 * kcoll_kdev_open() returns -ENODEV when it is absent, with a sentence in
 * kcoll_kdev_why() for the log, and callers fall back to copying.
 *
 * Every function returns 0 or a negative errno. Not thread-safe per struct
 * kcoll_kdev except kcoll_kdev_map/unmap, which only read it.
 */
#ifndef KCOLL_KDEV_H
#define KCOLL_KDEV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <linux/kcoll.h>

struct kcoll_kdev {
	int fd;				/* -1 when closed */
	uint64_t features;		/* KCOLL_FEAT_* */
	uint32_t page_size;
	uint64_t max_buf_bytes;
	char why[192];			/* why the last failing call failed */
};

/* A registered buffer mapped into this process. */
struct kcoll_kdev_map {
	void *addr;			/* the buffer's first byte here */
	uint64_t len;			/* registered length */
	uint32_t buf_flags;		/* KCOLL_BUF_F_* */
	pid_t owner_pid;		/* registrant, 0 if it is gone */
	void *map_base;			/* the whole mapping (page aligned) */
	size_t map_len;
};

/* Open path (NULL: KCOLL_DEV_PATH) and check the module's ABI version.
 * -ENODEV: no device there (module not loaded); kd->fd is -1 on failure. */
int kcoll_kdev_open(struct kcoll_kdev *kd, const char *path);
void kcoll_kdev_close(struct kcoll_kdev *kd);
const char *kcoll_kdev_why(const struct kcoll_kdev *kd);

static inline int kcoll_kdev_has(const struct kcoll_kdev *kd, uint64_t feature)
{
	return kd->fd >= 0 && (kd->features & feature) == feature;
}

/* Fill q (its size field is set here) from KCOLL_IOC_QUERY. */
int kcoll_kdev_query(struct kcoll_kdev *kd, struct kcoll_ioc_query *q);

/* kcolld side: map the buffer a client registered as handle. prot is
 * PROT_READ and/or PROT_WRITE, or 0 for what the registration allows.
 * -ENOENT: no such registration (ended); -EACCES: not permitted. */
int kcoll_kdev_map(struct kcoll_kdev *kd, uint64_t handle, int prot, struct kcoll_kdev_map *m);
/* Unmap; pages a dead client left pinned are released by the last unmap. */
int kcoll_kdev_unmap(struct kcoll_kdev_map *m);
/* kcolld side: the pages of handle as a dma-buf (*fd, close-on-exec; -1 on
 * error) for ibv_reg_dmabuf_mr. Its offset 0 is the mapping's first page
 * (kcoll_kdev_map's map_base). -EOPNOTSUPP: the module has no
 * KCOLL_FEAT_DMABUF; -ENOENT, -EACCES as for kcoll_kdev_map. */
int kcoll_kdev_dmabuf(struct kcoll_kdev *kd, uint64_t handle, int *fd);

/* Client side: pin [addr, addr+len) (must be writable) and get a handle. */
int kcoll_kdev_register(struct kcoll_kdev *kd, void *addr, uint64_t len, uint32_t flags,
			uint64_t *handle);
int kcoll_kdev_unregister(struct kcoll_kdev *kd, uint64_t handle);
/* Let a uid (KCOLL_GRANT_UID) or a process (KCOLL_GRANT_PID) map handle;
 * flags KCOLL_GRANT_F_REVOKE takes it back. */
int kcoll_kdev_grant(struct kcoll_kdev *kd, uint64_t handle, uint32_t kind, uint32_t id,
		     uint32_t flags);

/* kcolld: publish one peer's link health (needs CAP_NET_ADMIN). */
int kcoll_kdev_peer_report(struct kcoll_kdev *kd, uint32_t peer, uint32_t state,
			   uint32_t latency_us, uint32_t bw_mbps);

#endif /* KCOLL_KDEV_H */
