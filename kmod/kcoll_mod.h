/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kcoll.ko internals shared by its source files. The user-visible ABI is in
 * include/uapi/linux/kcoll.h.
 */
#ifndef KCOLL_MOD_H
#define KCOLL_MOD_H

#include <linux/atomic.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/mm_types.h>
#include <linux/mutex.h>
#include <linux/types.h>
#include <linux/uidgid.h>
#include <linux/wait.h>
#include <linux/kcoll.h>

#define KCOLL_FEATURES		(KCOLL_FEAT_RING | KCOLL_FEAT_DOORBELL | KCOLL_FEAT_BUF | \
				 KCOLL_FEAT_GRANT | KCOLL_FEAT_PEERS | KCOLL_FEAT_DMABUF)
#define KCOLL_MAX_GRANTS	8
/* Handles index 4 GiB mmap slots; keep the offsets well inside 64 bits. */
#define KCOLL_MAX_HANDLE	((1U << 20) - 1)
#define KCOLL_SLOT_PGSHIFT	(KCOLL_MMAP_BUF_SHIFT - PAGE_SHIFT)

/* Load-time limits (module parameters, validated in kcoll_init). */
struct kcoll_limits {
	unsigned int max_rings;
	u64 max_buf_bytes;
	u64 max_pinned_pages;
};

extern struct kcoll_limits kcoll_limits;

/* Live counters shown in /sys/kernel/kcoll. */
extern atomic_t kcoll_nr_rings;
extern atomic64_t kcoll_registered_bytes;
extern atomic64_t kcoll_pinned_pages;

struct kcoll_ring {
	struct kcoll_ring_hdr *hdr;	/* vmalloc_user memory, also mapped by users */
	size_t size;
	wait_queue_head_t wq[KCOLL_NR_DOORBELLS];
	/* bumped by every WAKE so a waiter returns even if the index is unchanged */
	atomic_t wakes[KCOLL_NR_DOORBELLS];
};

struct kcoll_grant {
	u32 kind;			/* KCOLL_GRANT_UID or KCOLL_GRANT_PID */
	kuid_t uid;
	struct pid *pid;		/* a process (tgid); reference held */
};

/*
 * One registration. References: the registering file's (dropped on
 * unregister or release), one per importer VMA and one per dma-buf; the pages are unpinned
 * when the last one goes.
 */
struct kcoll_buf {
	struct kref ref;
	u32 handle;
	u32 flags;			/* KCOLL_BUF_F_* */
	struct list_head node;		/* in the owner's kcoll_file.bufs */
	u64 len;
	unsigned int page_offset;
	unsigned long npages;
	struct page **pages;
	struct mm_struct *mm;		/* charged for the pin (mmgrab'ed) */
	kuid_t owner_uid;
	struct pid *owner_pid;
	struct mutex grant_lock;	/* protects grants and nr_grants */
	unsigned int nr_grants;
	struct kcoll_grant grants[KCOLL_MAX_GRANTS];
};

/* Per open file of /dev/kcoll. */
struct kcoll_file {
	struct mutex lock;		/* serializes ring creation and the bufs list */
	struct kcoll_ring *ring;	/* set once, under lock; read with acquire */
	struct list_head bufs;
};

/* ring.c */
int kcoll_ring_create(struct kcoll_file *kf, struct kcoll_ioc_ring_create *arg);
void kcoll_ring_destroy(struct kcoll_ring *ring);
int kcoll_ring_mmap(struct kcoll_file *kf, struct vm_area_struct *vma);
int kcoll_ring_wait(struct kcoll_file *kf, const struct kcoll_ioc_wait *arg);
int kcoll_ring_wake(struct kcoll_file *kf, const struct kcoll_ioc_wake *arg);

/* buf.c */
int kcoll_buf_register(struct kcoll_file *kf, struct kcoll_ioc_buf_register *arg);
int kcoll_buf_unregister(struct kcoll_file *kf, u64 handle);
int kcoll_buf_grant(struct kcoll_file *kf, const struct kcoll_ioc_buf_grant *arg);
int kcoll_buf_import(struct kcoll_ioc_buf_import *arg);
int kcoll_buf_mmap(struct vm_area_struct *vma);
void kcoll_buf_release_all(struct kcoll_file *kf);
void kcoll_buf_exit(void);
struct kcoll_buf *kcoll_buf_get(u64 handle);
void kcoll_buf_put(struct kcoll_buf *buf);
int kcoll_buf_may_map(struct kcoll_buf *buf);

/* dmabuf.c */
int kcoll_buf_dmabuf(struct kcoll_ioc_buf_dmabuf *arg, struct file **filep);

/* sysfs.c */
int kcoll_sysfs_init(const char *algo);
void kcoll_sysfs_exit(void);
int kcoll_algo_parse(const char *s);
int kcoll_peer_report(const struct kcoll_ioc_peer_report *arg);

/* c4.c: the C4 core (user/common/c4.c, built in) on a synthetic trace */
ssize_t kcoll_c4_selftest(char *buf, u32 slow_ratio_pct, u32 hang_ms, u32 straggler_ms);

#endif /* KCOLL_MOD_H */
