/* SPDX-License-Identifier: MIT */
/*
 * Ring helpers shared by libkcoll (SQ producer, CQ consumer) and kcolld
 * (SQ consumer, CQ producer). Header-only so both sides inline them.
 *
 * A struct kcoll_queue is one process's private view of one shared queue.
 * The index a side writes is kept privately ('mine') and only ever stored to
 * shared memory, never read back: the other side may scribble on the shared
 * page, but cannot change what we believe we have produced or consumed.
 * The index the other side writes is loaded with acquire and checked: a
 * distance larger than the queue means a corrupt or hostile peer.
 */
#ifndef KCOLL_RING_H
#define KCOLL_RING_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <linux/kcoll.h>
#include <kcoll/barrier.h>
#include <kcoll/ring_layout.h>

struct kcoll_queue {
	uint32_t *mine;		/* shared index this side writes */
	uint32_t *theirs;	/* shared index the other side writes */
	uint8_t *entries;
	uint32_t mask;
	uint32_t entry_size;
	uint32_t local;		/* private copy of *mine */
};

static inline int kcoll_is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

static inline void kcoll_queue_init(struct kcoll_queue *q, uint32_t *mine, uint32_t *theirs,
				    void *entries, uint32_t nentries, uint32_t entry_size)
{
	q->mine = mine;
	q->theirs = theirs;
	q->entries = entries;
	q->mask = nentries - 1;
	q->entry_size = entry_size;
	q->local = kcoll_load_relaxed(mine);
}

static inline void *kcoll_queue_entry(const struct kcoll_queue *q, uint32_t idx)
{
	return q->entries + (size_t)(idx & q->mask) * q->entry_size;
}

/* Producer: free slots, or -EBADMSG if the consumer's head is impossible. */
static inline int64_t kcoll_queue_space(const struct kcoll_queue *q)
{
	uint32_t head = kcoll_load_acquire(q->theirs);
	uint32_t used = q->local - head;

	if (used > q->mask + 1)
		return -EBADMSG;
	return (int64_t)(q->mask + 1 - used);
}

/* Producer: the next slot to fill; call only when space > 0. */
static inline void *kcoll_queue_slot(const struct kcoll_queue *q, uint32_t i)
{
	return kcoll_queue_entry(q, q->local + i);
}

/* Producer: make n filled slots visible (release: entry writes first). */
static inline void kcoll_queue_publish(struct kcoll_queue *q, uint32_t n)
{
	q->local += n;
	kcoll_store_release(q->mine, q->local);
}

/* Consumer: entries ready, or -EBADMSG if the producer's tail is impossible. */
static inline int64_t kcoll_queue_ready(const struct kcoll_queue *q)
{
	uint32_t tail = kcoll_load_acquire(q->theirs);
	uint32_t avail = tail - q->local;

	if (avail > q->mask + 1)
		return -EBADMSG;
	return avail;
}

/* Consumer: copy entry i out of shared memory before looking at it, so the
 * producer cannot change it between validation and use. */
static inline void kcoll_queue_copy(const struct kcoll_queue *q, uint32_t i, void *dst)
{
	memcpy(dst, kcoll_queue_entry(q, q->local + i), q->entry_size);
}

/* Consumer: hand n entries back to the producer (release: our reads first). */
static inline void kcoll_queue_release(struct kcoll_queue *q, uint32_t n)
{
	q->local += n;
	kcoll_store_release(q->mine, q->local);
}

/*
 * Check a ring header a client just mapped (the daemon wrote it). Returns 0,
 * or a negative errno with *why set to a message a person can act on.
 */
static inline int kcoll_ring_hdr_check(const struct kcoll_ring_hdr *h, uint64_t map_size,
				       const char **why)
{
	if (h->magic != KCOLL_RING_MAGIC) {
		*why = "not a kcoll ring (bad magic)";
		return -EPROTO;
	}
	if (h->abi_version != KCOLL_ABI_VERSION) {
		*why = "kcolld and libkcoll speak different ring ABI versions: rebuild or restart kcolld";
		return -EPROTONOSUPPORT;
	}
	if (h->hdr_size != KCOLL_RING_HDR_SIZE || h->sqe_size != sizeof(struct kcoll_sqe) ||
	    h->cqe_size != sizeof(struct kcoll_cqe)) {
		*why = "ring entry sizes differ from this build of libkcoll";
		return -EPROTONOSUPPORT;
	}
	if (!kcoll_is_pow2(h->sq_entries) || !kcoll_is_pow2(h->cq_entries) ||
	    h->sq_entries > KCOLL_RING_MAX_ENTRIES || h->cq_entries > 2 * KCOLL_RING_MAX_ENTRIES ||
	    h->cq_entries < h->sq_entries) {
		*why = "ring sizes are not valid powers of two";
		return -EPROTO;
	}
	if (h->sq_off != kcoll_ring_sq_off() || h->cq_off != kcoll_ring_cq_off(h->sq_entries) ||
	    h->ring_size != kcoll_ring_size(h->sq_entries, h->cq_entries) || h->ring_size > map_size) {
		*why = "ring layout does not match its header";
		return -EPROTO;
	}
	return 0;
}

#endif /* KCOLL_RING_H */
