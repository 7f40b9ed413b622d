/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR MIT) */
/*
 * Ring geometry and header initialisation, shared by kcolld (memfd rings) and
 * kcoll.ko (/dev/kcoll rings). Freestanding: only the uapi header, no libc
 * or kernel includes, so both build the very same code.
 */
#ifndef KCOLL_RING_LAYOUT_H
#define KCOLL_RING_LAYOUT_H

#include <linux/kcoll.h>

static inline __u64 kcoll_ring_sq_off(void)
{
	return KCOLL_RING_HDR_SIZE;
}

static inline __u64 kcoll_ring_cq_off(__u32 sq_entries)
{
	return KCOLL_RING_HDR_SIZE + (__u64)sq_entries * sizeof(struct kcoll_sqe);
}

/* The whole mapping, page (4 KiB) rounded. */
static inline __u64 kcoll_ring_size(__u32 sq_entries, __u32 cq_entries)
{
	__u64 end = kcoll_ring_cq_off(sq_entries) + (__u64)cq_entries * sizeof(struct kcoll_cqe);

	return (end + KCOLL_RING_HDR_SIZE - 1) & ~(__u64)(KCOLL_RING_HDR_SIZE - 1);
}

/* Fill the identity line of a zeroed header; the caller checked that both
 * sizes are powers of two within KCOLL_RING_MAX_ENTRIES. */
static inline void kcoll_ring_hdr_init(struct kcoll_ring_hdr *h, __u32 sq_entries,
				       __u32 cq_entries, __u32 daemon_pid)
{
	h->magic = KCOLL_RING_MAGIC;
	h->abi_version = KCOLL_ABI_VERSION;
	h->hdr_size = KCOLL_RING_HDR_SIZE;
	h->sq_entries = sq_entries;
	h->cq_entries = cq_entries;
	h->sqe_size = sizeof(struct kcoll_sqe);
	h->cqe_size = sizeof(struct kcoll_cqe);
	h->sq_off = kcoll_ring_sq_off();
	h->cq_off = kcoll_ring_cq_off(sq_entries);
	h->ring_size = kcoll_ring_size(sq_entries, cq_entries);
	h->daemon_pid = daemon_pid;
}

#endif /* KCOLL_RING_LAYOUT_H */
