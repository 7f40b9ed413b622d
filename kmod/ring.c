// SPDX-License-Identifier: GPL-2.0
/*
 * The ring a client may take from kcoll.ko instead of kcolld's memfd: same
 * struct kcoll_ring_hdr layout, plus two doorbells (WAIT/WAKE ioctls) that
 * watch the submission and completion tails. The kernel writes the header's
 * identity line once; afterwards it only reads the tails, and trusts nothing
 * it reads there.
 */
#include <linux/log2.h>
#include <linux/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include <kcoll/ring_layout.h>

#include "kcoll_mod.h"

atomic_t kcoll_nr_rings = ATOMIC_INIT(0);

int kcoll_ring_create(struct kcoll_file *kf, struct kcoll_ioc_ring_create *arg)
{
	u32 sq = arg->sq_entries;
	u32 cq = arg->cq_entries ? arg->cq_entries : 2 * sq;
	struct kcoll_ring_hdr *hdr;
	struct kcoll_ring *ring;
	u64 size;
	int i, ret;

	if (!is_power_of_2(sq) || sq > KCOLL_RING_MAX_ENTRIES)
		return -EINVAL;
	if (!is_power_of_2(cq) || cq < sq || cq > 2 * KCOLL_RING_MAX_ENTRIES)
		return -EINVAL;
	size = kcoll_ring_size(sq, cq);

	mutex_lock(&kf->lock);
	if (kf->ring) {
		ret = -EBUSY;
		goto err_unlock;
	}
	if (atomic_inc_return(&kcoll_nr_rings) > kcoll_limits.max_rings) {
		ret = -ENOSPC;
		goto err_uncount;
	}
	ring = kzalloc(sizeof(*ring), GFP_KERNEL);
	if (!ring) {
		ret = -ENOMEM;
		goto err_uncount;
	}
	hdr = vmalloc_user(PAGE_ALIGN(size));
	if (!hdr) {
		ret = -ENOMEM;
		goto err_free_ring;
	}
	kcoll_ring_hdr_init(hdr, sq, cq, 0);
	ring->hdr = hdr;
	ring->size = size;
	for (i = 0; i < KCOLL_NR_DOORBELLS; i++) {
		init_waitqueue_head(&ring->wq[i]);
		atomic_set(&ring->wakes[i], 0);
	}
	/* lock-free readers (wait, wake, mmap) see a fully built ring */
	smp_store_release(&kf->ring, ring);
	mutex_unlock(&kf->lock);

	arg->ring_size = size;
	arg->mmap_offset = KCOLL_MMAP_OFF_RING;
	return 0;

err_free_ring:
	kfree(ring);
err_uncount:
	atomic_dec(&kcoll_nr_rings);
err_unlock:
	mutex_unlock(&kf->lock);
	return ret;
}

/* Called on release: no ioctl can be running and no mapping holds the file. */
void kcoll_ring_destroy(struct kcoll_ring *ring)
{
	vfree(ring->hdr);
	kfree(ring);
	atomic_dec(&kcoll_nr_rings);
}

static struct kcoll_ring *kcoll_file_ring(struct kcoll_file *kf)
{
	/* pairs with smp_store_release() in kcoll_ring_create() */
	return smp_load_acquire(&kf->ring);
}

int kcoll_ring_mmap(struct kcoll_file *kf, struct vm_area_struct *vma)
{
	struct kcoll_ring *ring = kcoll_file_ring(kf);

	if (!ring)
		return -ENXIO;
	if (vma->vm_end - vma->vm_start > PAGE_ALIGN(ring->size))
		return -EINVAL;
	return remap_vmalloc_range(vma, ring->hdr, 0);
}

/*
 * True once the doorbell's index differs from what the waiter saw, or a WAKE
 * came after it started. The index lives in user-writable memory: it is only
 * compared, never trusted.
 */
static bool kcoll_doorbell_rang(struct kcoll_ring *ring, u32 db, u32 seen, int wakes)
{
	u32 *index = db == KCOLL_DOORBELL_SQ ? &ring->hdr->sq_tail : &ring->hdr->cq_tail;

	return READ_ONCE(*index) != seen || atomic_read(&ring->wakes[db]) != wakes;
}

int kcoll_ring_wait(struct kcoll_file *kf, const struct kcoll_ioc_wait *arg)
{
	struct kcoll_ring *ring = kcoll_file_ring(kf);
	u32 db = arg->doorbell;
	u32 seen = arg->value;
	long timeout, ret;
	int wakes;

	if (arg->reserved || db >= KCOLL_NR_DOORBELLS)
		return -EINVAL;
	if (!ring)
		return -ENXIO;
	wakes = atomic_read(&ring->wakes[db]);
	if (kcoll_doorbell_rang(ring, db, seen, wakes))
		return 0;
	if (!arg->timeout_ms)
		return -ETIMEDOUT;
	timeout = arg->timeout_ms == KCOLL_WAIT_FOREVER ? MAX_SCHEDULE_TIMEOUT :
		  (long)msecs_to_jiffies(arg->timeout_ms);
	if (arg->flags & KCOLL_WAIT_F_INTERRUPTIBLE)
		ret = wait_event_interruptible_timeout(ring->wq[db],
						       kcoll_doorbell_rang(ring, db, seen, wakes),
						       timeout);
	else
		ret = wait_event_killable_timeout(ring->wq[db],
						  kcoll_doorbell_rang(ring, db, seen, wakes),
						  timeout);
	if (ret < 0)
		return -EINTR;	/* not restarted: the timeout would start over */
	if (ret == 0)
		return -ETIMEDOUT;
	return 0;
}

int kcoll_ring_wake(struct kcoll_file *kf, const struct kcoll_ioc_wake *arg)
{
	struct kcoll_ring *ring = kcoll_file_ring(kf);

	if (arg->reserved || arg->doorbell >= KCOLL_NR_DOORBELLS)
		return -EINVAL;
	if (!ring)
		return -ENXIO;
	atomic_inc(&ring->wakes[arg->doorbell]);
	/* wake_up_all() orders the increment before the waiters' re-check */
	wake_up_all(&ring->wq[arg->doorbell]);
	return 0;
}
