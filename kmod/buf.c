// SPDX-License-Identifier: GPL-2.0
/*
 * Registered buffers: a client pins part of its memory and names it by a
 * handle; another process (kcolld) that passes the permission check maps
 * the same pages into its own address space through its own /dev/kcoll fd.
 *
 * Lifetime: the registering file holds one reference (dropped by UNREGISTER
 * or when the file is released, e.g. at the owner's death), each importer
 * VMA holds one. A registration that ended can no longer be imported; its
 * pages stay pinned, and mapped, until the last importer VMA goes, so an
 * importer never sees memory that was freed under it.
 *
 * Importer VMAs are PFN maps (anonymous pages cannot be vm_insert_page'd):
 * the kernel cannot get_user_pages() them, so they cannot be handed to
 * O_DIRECT or RDMA registration; plain loads, stores and copies work. A
 * device gets the pages through a dma-buf instead (dmabuf.c), which holds a
 * reference like an importer VMA.
 */
#include <linux/mm.h>
#include <linux/overflow.h>
#include <linux/pid.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/xarray.h>

#include "kcoll_mod.h"

atomic64_t kcoll_registered_bytes = ATOMIC64_INIT(0);
atomic64_t kcoll_pinned_pages = ATOMIC64_INIT(0);

/* handle -> registration, for as long as the registration lasts */
static DEFINE_XARRAY_ALLOC1(kcoll_bufs);
static u32 kcoll_next_handle;

static void kcoll_buf_free(struct kref *ref)
{
	struct kcoll_buf *buf = container_of(ref, struct kcoll_buf, ref);
	unsigned int i;

	/* importers may have written through their mappings */
	unpin_user_pages_dirty_lock(buf->pages, buf->npages, true);
	atomic64_sub(buf->npages, &buf->mm->pinned_vm);
	atomic64_sub(buf->npages, &kcoll_pinned_pages);
	mmdrop(buf->mm);
	for (i = 0; i < buf->nr_grants; i++)
		put_pid(buf->grants[i].pid);
	put_pid(buf->owner_pid);
	kvfree(buf->pages);
	mutex_destroy(&buf->grant_lock);
	kfree(buf);
}

void kcoll_buf_put(struct kcoll_buf *buf)
{
	kref_put(&buf->ref, kcoll_buf_free);
}

/* A reference to a live registration, or NULL. */
struct kcoll_buf *kcoll_buf_get(u64 handle)
{
	struct kcoll_buf *buf;

	if (!handle || handle > KCOLL_MAX_HANDLE)
		return NULL;
	/* entries leave the array before their owner's reference is dropped */
	xa_lock(&kcoll_bufs);
	buf = xa_load(&kcoll_bufs, handle);
	if (buf)
		kref_get(&buf->ref);
	xa_unlock(&kcoll_bufs);
	return buf;
}

/* Pin npages from start, charging the caller's RLIMIT_MEMLOCK. */
static int kcoll_pin(unsigned long start, unsigned long npages, struct page **pages)
{
	unsigned long limit = rlimit(RLIMIT_MEMLOCK) >> PAGE_SHIFT;
	unsigned long pinned = 0;
	int ret;

	if (atomic64_add_return(npages, &current->mm->pinned_vm) > limit &&
	    !capable(CAP_IPC_LOCK)) {
		ret = -ENOMEM;
		goto err_uncharge;
	}
	while (pinned < npages) {
		ret = pin_user_pages_fast(start + pinned * PAGE_SIZE,
					  min_t(unsigned long, npages - pinned, INT_MAX),
					  FOLL_WRITE | FOLL_LONGTERM, pages + pinned);
		if (ret <= 0) {
			ret = ret ? ret : -EFAULT;
			goto err_unpin;
		}
		pinned += ret;
	}
	return 0;

err_unpin:
	unpin_user_pages(pages, pinned);
err_uncharge:
	atomic64_sub(npages, &current->mm->pinned_vm);
	return ret;
}

int kcoll_buf_register(struct kcoll_file *kf, struct kcoll_ioc_buf_register *arg)
{
	unsigned long npages, start;
	struct kcoll_buf *buf;
	u32 handle;
	u64 end;
	int ret;

	if (!arg->len || arg->len > kcoll_limits.max_buf_bytes)
		return -EINVAL;
	if (check_add_overflow(arg->addr, arg->len, &end) ||
	    !access_ok(u64_to_user_ptr(arg->addr), arg->len))
		return -EFAULT;
	start = arg->addr & PAGE_MASK;
	npages = (PAGE_ALIGN(end) - start) >> PAGE_SHIFT;

	if (atomic64_add_return(npages, &kcoll_pinned_pages) > kcoll_limits.max_pinned_pages) {
		ret = -ENOSPC;
		goto err_uncount;
	}
	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf) {
		ret = -ENOMEM;
		goto err_uncount;
	}
	buf->pages = kvmalloc_array(npages, sizeof(*buf->pages), GFP_KERNEL);
	if (!buf->pages) {
		ret = -ENOMEM;
		goto err_free_buf;
	}
	ret = kcoll_pin(start, npages, buf->pages);
	if (ret)
		goto err_free_pages;

	kref_init(&buf->ref);
	mutex_init(&buf->grant_lock);
	buf->flags = arg->flags;
	buf->len = arg->len;
	buf->page_offset = offset_in_page(arg->addr);
	buf->npages = npages;
	mmgrab(current->mm);
	buf->mm = current->mm;
	buf->owner_uid = current_euid();
	buf->owner_pid = get_pid(task_tgid(current));

	/* counted before it can be found, so a racing unregister never underflows */
	atomic64_add(buf->len, &kcoll_registered_bytes);
	mutex_lock(&kf->lock);
	ret = xa_alloc_cyclic(&kcoll_bufs, &handle, buf, XA_LIMIT(1, KCOLL_MAX_HANDLE),
			      &kcoll_next_handle, GFP_KERNEL);
	if (ret < 0) {
		mutex_unlock(&kf->lock);
		atomic64_sub(buf->len, &kcoll_registered_bytes);
		/* the final put unpins, uncharges and frees */
		kcoll_buf_put(buf);
		return ret == -EBUSY ? -ENOSPC : ret;
	}
	buf->handle = handle;
	list_add_tail(&buf->node, &kf->bufs);
	mutex_unlock(&kf->lock);

	arg->handle = handle;
	return 0;

err_free_pages:
	kvfree(buf->pages);
err_free_buf:
	kfree(buf);
err_uncount:
	atomic64_sub(npages, &kcoll_pinned_pages);
	return ret;
}

/* End a registration already taken off its owner's list. */
static void kcoll_buf_retire(struct kcoll_buf *buf)
{
	xa_erase(&kcoll_bufs, buf->handle);
	atomic64_sub(buf->len, &kcoll_registered_bytes);
	kcoll_buf_put(buf);
}

/* Caller holds kf->lock. */
static struct kcoll_buf *kcoll_buf_find_own(struct kcoll_file *kf, u64 handle)
{
	struct kcoll_buf *buf;

	list_for_each_entry(buf, &kf->bufs, node)
		if (buf->handle == handle)
			return buf;
	return NULL;
}

int kcoll_buf_unregister(struct kcoll_file *kf, u64 handle)
{
	struct kcoll_buf *buf;

	mutex_lock(&kf->lock);
	buf = kcoll_buf_find_own(kf, handle);
	if (buf)
		list_del(&buf->node);
	mutex_unlock(&kf->lock);
	if (!buf)
		return -ENOENT;
	kcoll_buf_retire(buf);
	return 0;
}

void kcoll_buf_release_all(struct kcoll_file *kf)
{
	struct kcoll_buf *buf, *tmp;

	list_for_each_entry_safe(buf, tmp, &kf->bufs, node) {
		list_del(&buf->node);
		kcoll_buf_retire(buf);
	}
}

static bool kcoll_grant_match(const struct kcoll_grant *a, const struct kcoll_grant *b)
{
	if (a->kind != b->kind)
		return false;
	return a->kind == KCOLL_GRANT_UID ? uid_eq(a->uid, b->uid) : a->pid == b->pid;
}

int kcoll_buf_grant(struct kcoll_file *kf, const struct kcoll_ioc_buf_grant *arg)
{
	struct kcoll_grant g = { .kind = arg->kind };
	struct kcoll_buf *buf;
	unsigned int i;
	int ret = 0;

	switch (arg->kind) {
	case KCOLL_GRANT_UID:
		g.uid = make_kuid(current_user_ns(), arg->id);
		if (!uid_valid(g.uid))
			return -EINVAL;
		break;
	case KCOLL_GRANT_PID:
		if (!arg->id || arg->id > INT_MAX)
			return -EINVAL;
		g.pid = find_get_pid(arg->id);
		if (!g.pid || !pid_has_task(g.pid, PIDTYPE_TGID)) {
			ret = -ESRCH;
			goto out_put_pid;
		}
		break;
	default:
		return -EINVAL;
	}

	mutex_lock(&kf->lock);
	buf = kcoll_buf_find_own(kf, arg->handle);
	if (!buf) {
		ret = -ENOENT;
		goto out_unlock;
	}
	mutex_lock(&buf->grant_lock);
	for (i = 0; i < buf->nr_grants; i++)
		if (kcoll_grant_match(&buf->grants[i], &g))
			break;
	if (arg->flags & KCOLL_GRANT_F_REVOKE) {
		if (i == buf->nr_grants) {
			ret = -ENOENT;
		} else {
			put_pid(buf->grants[i].pid);
			buf->grants[i] = buf->grants[--buf->nr_grants];
		}
	} else if (i == buf->nr_grants) {
		if (buf->nr_grants == KCOLL_MAX_GRANTS) {
			ret = -ENOSPC;
		} else {
			buf->grants[buf->nr_grants++] = g;
			g.pid = NULL;	/* the grant keeps the reference */
		}
	}
	mutex_unlock(&buf->grant_lock);
out_unlock:
	mutex_unlock(&kf->lock);
out_put_pid:
	put_pid(g.pid);
	return ret;
}

/* The importer is the current process: the registrant's euid, or granted. */
int kcoll_buf_may_map(struct kcoll_buf *buf)
{
	kuid_t uid = current_euid();
	struct pid *tgid = task_tgid(current);
	unsigned int i;
	int ret = -EACCES;

	if (uid_eq(uid, buf->owner_uid))
		return 0;
	mutex_lock(&buf->grant_lock);
	for (i = 0; i < buf->nr_grants; i++) {
		const struct kcoll_grant *g = &buf->grants[i];

		if (g->kind == KCOLL_GRANT_UID ? uid_eq(g->uid, uid) : g->pid == tgid) {
			ret = 0;
			break;
		}
	}
	mutex_unlock(&buf->grant_lock);
	return ret;
}

int kcoll_buf_import(struct kcoll_ioc_buf_import *arg)
{
	struct kcoll_buf *buf;
	int ret;

	if (arg->reserved)
		return -EINVAL;
	buf = kcoll_buf_get(arg->handle);
	if (!buf)
		return -ENOENT;
	ret = kcoll_buf_may_map(buf);
	if (ret)
		goto out_put;
	arg->mmap_offset = KCOLL_MMAP_OFF_BUF(buf->handle);
	arg->map_len = (u64)buf->npages << PAGE_SHIFT;
	arg->len = buf->len;
	arg->page_offset = buf->page_offset;
	arg->buf_flags = buf->flags;
	rcu_read_lock();
	arg->owner_pid = pid_task(buf->owner_pid, PIDTYPE_TGID) ? pid_vnr(buf->owner_pid) : 0;
	rcu_read_unlock();
out_put:
	kcoll_buf_put(buf);
	return ret;
}

/* VMA split or move: the new VMA holds its own reference. */
static void kcoll_buf_vm_open(struct vm_area_struct *vma)
{
	struct kcoll_buf *buf = vma->vm_private_data;

	kref_get(&buf->ref);
}

static void kcoll_buf_vm_close(struct vm_area_struct *vma)
{
	kcoll_buf_put(vma->vm_private_data);
}

static const struct vm_operations_struct kcoll_buf_vm_ops = {
	.open = kcoll_buf_vm_open,
	.close = kcoll_buf_vm_close,
};

int kcoll_buf_mmap(struct vm_area_struct *vma)
{
	unsigned long first = vma->vm_pgoff & ((1UL << KCOLL_SLOT_PGSHIFT) - 1);
	unsigned long n = vma_pages(vma);
	struct kcoll_buf *buf;
	unsigned long i;
	int ret;

	buf = kcoll_buf_get(vma->vm_pgoff >> KCOLL_SLOT_PGSHIFT);
	if (!buf)
		return -ENOENT;
	ret = kcoll_buf_may_map(buf);
	if (ret)
		goto err_put;
	if (first >= buf->npages || n > buf->npages - first) {
		ret = -EINVAL;
		goto err_put;
	}
	if (buf->flags & KCOLL_BUF_F_READONLY) {
		if (vma->vm_flags & VM_WRITE) {
			ret = -EACCES;
			goto err_put;
		}
		vma->vm_flags &= ~VM_MAYWRITE;
	}
	/* a forked child would hold the pages without holding a reference */
	vma->vm_flags |= VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP;
	for (i = 0; i < n; i++) {
		ret = remap_pfn_range(vma, vma->vm_start + i * PAGE_SIZE,
				      page_to_pfn(buf->pages[first + i]), PAGE_SIZE,
				      vma->vm_page_prot);
		if (ret)
			goto err_put;	/* mmap_region() zaps what was mapped */
	}
	/* the lookup's reference becomes the VMA's */
	vma->vm_private_data = buf;
	vma->vm_ops = &kcoll_buf_vm_ops;
	return 0;

err_put:
	kcoll_buf_put(buf);
	return ret;
}

void kcoll_buf_exit(void)
{
	/* every file is closed, and importer VMAs hold their file */
	WARN_ON(!xa_empty(&kcoll_bufs));
	xa_destroy(&kcoll_bufs);
}
