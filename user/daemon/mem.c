// SPDX-License-Identifier: MIT
/*
 * How kcolld reaches a rank's buffer: the data-path ops table.
 *
 *   kd_mem_mapped  the buffer lies in a region mapped into the daemon (a sealed
 *                  memfd from kcoll_mem_alloc, or pages the client pinned with
 *                  kcoll_mem_register and kcolld mapped through /dev/kcoll):
 *                  used in place
 *   kd_mem_vm      any other buffer: one process_vm_readv/writev per chunk
 *
 * kd_buf_resolve picks the ops once per buffer per op; the executor only
 * calls kd_buf_read/kd_buf_write. A new way in (kernel module, GPU IPC)
 * is a new ops table here, nothing else.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <fcntl.h>

#include "kcolld.h"
#include "rdma.h"

static int mapped_read(struct kd_client *c, const struct kd_buf *b, uint64_t off, size_t n,
		       uint8_t *tmp, const uint8_t **p)
{
	*p = b->direct + off;
	return 0;
}

static int mapped_write(struct kd_client *c, const struct kd_buf *b, uint64_t off,
			const uint8_t *src, size_t n)
{
	/* The reduction may already have written the result right here. */
	if (b->direct + off != src)
		memcpy(b->direct + off, src, n);
	return 0;
}

static int vm_errno(int e)
{
	/* The process is gone: report it like a dead rank. */
	return e == ESRCH ? -ECONNRESET : e == EPERM ? -EPERM : -EFAULT;
}

static int vm_read(struct kd_client *c, const struct kd_buf *b, uint64_t off, size_t n,
		   uint8_t *tmp, const uint8_t **p)
{
	struct iovec l = { .iov_base = tmp, .iov_len = n };
	struct iovec r = { .iov_base = (void *)(uintptr_t)(b->addr + off), .iov_len = n };
	ssize_t got = process_vm_readv(c->pid, &l, 1, &r, 1, 0);

	if (got != (ssize_t)n)
		return got < 0 ? vm_errno(errno) : -EFAULT;
	*p = tmp;
	return 0;
}

static int vm_write(struct kd_client *c, const struct kd_buf *b, uint64_t off, const uint8_t *src,
		    size_t n)
{
	struct iovec l = { .iov_base = (void *)src, .iov_len = n };
	struct iovec r = { .iov_base = (void *)(uintptr_t)(b->addr + off), .iov_len = n };
	ssize_t put = process_vm_writev(c->pid, &l, 1, &r, 1, 0);

	if (put != (ssize_t)n)
		return put < 0 ? vm_errno(errno) : -EFAULT;
	return 0;
}

const struct kd_mem_ops kd_mem_mapped = {
	.read = mapped_read, .write = mapped_write,
};

const struct kd_mem_ops kd_mem_vm = {
	.read = vm_read, .write = vm_write,
};

int kd_buf_read(struct kd_client *c, const struct kd_buf *b, uint64_t off, size_t n, uint8_t *tmp,
		const uint8_t **p)
{
	atomic_fetch_add(b->direct ? &kd.stats.bytes_mapped : &kd.stats.bytes_copied, n);
	return b->ops->read(c, b, off, n, tmp, p);
}

int kd_buf_write(struct kd_client *c, const struct kd_buf *b, uint64_t off, const uint8_t *src,
		 size_t n)
{
	atomic_fetch_add(b->direct ? &kd.stats.bytes_mapped : &kd.stats.bytes_copied, n);
	return b->ops->write(c, b, off, src, n);
}

void kd_region_put(struct kd_region *rg)
{
	if (atomic_fetch_sub(&rg->refs, 1) != 1)
		return;
	/* The RDMA registration cache may hold this mapping (zero-copy
	 * sends): drop it before the address can be mapped again. */
	kcoll_rdma_mr_invalidate(rg->map, rg->size);
	if (rg->pinned)
		kcoll_kdev_unmap(&rg->kmap);
	else
		munmap(rg->map, rg->size);
	free(rg);
}

/* Insert rg unless it overlaps a region the client already has. */
static int region_insert(struct kd_client *c, struct kd_region *rg)
{
	struct kd_region *it;

	pthread_mutex_lock(&c->lock);
	for (it = c->regions; it; it = it->next) {
		if (rg->addr < it->addr + it->size && it->addr < rg->addr + rg->size) {
			pthread_mutex_unlock(&c->lock);
			kd_region_put(rg);
			return -EEXIST;
		}
	}
	rg->next = c->regions;
	c->regions = rg;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

int kd_region_add(struct kd_client *c, int fd, uint64_t addr, uint64_t size)
{
	struct kd_region *rg;
	struct stat st;
	int seals;

	if (!size || size > KD_MAX_BYTES || addr + size < addr || (addr | size) & 4095)
		return -EINVAL;
	/* The client must not be able to shrink it under us (SIGBUS). */
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return -EPERM;
	if (fstat(fd, &st) || (uint64_t)st.st_size < size)
		return -EINVAL;
	rg = calloc(1, sizeof(*rg));
	if (!rg)
		return -ENOMEM;
	rg->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (rg->map == MAP_FAILED) {
		free(rg);
		return -errno;
	}
	rg->addr = addr;
	rg->size = size;
	atomic_init(&rg->refs, 1);
	return region_insert(c, rg);
}

int kd_region_add_pinned(struct kd_client *c, uint64_t handle, uint64_t addr, uint64_t size)
{
	struct kd_region *rg;
	int r;

	if (kd.kdev.fd < 0)
		return -ENODEV;
	if (!size || size > KD_MAX_BYTES || addr + size < addr)
		return -EINVAL;
	rg = calloc(1, sizeof(*rg));
	if (!rg)
		return -ENOMEM;
	r = kcoll_kdev_map(&kd.kdev, handle, PROT_READ | PROT_WRITE, &rg->kmap);
	if (r) {
		free(rg);
		return r;
	}
	/* The handle must be this client's own registration of exactly this
	 * range: kcolld may map what others granted it, the client may not
	 * borrow that power to reach another process's pages. */
	if (rg->kmap.owner_pid != c->pid || rg->kmap.len < size) {
		kcoll_kdev_unmap(&rg->kmap);
		free(rg);
		return -EPERM;
	}
	rg->pinned = true;
	rg->map = rg->kmap.addr;
	rg->addr = addr;
	rg->size = size;
	atomic_init(&rg->refs, 1);
	return region_insert(c, rg);
}

int kd_region_del(struct kd_client *c, uint64_t addr)
{
	struct kd_region **pp, *rg = NULL;

	pthread_mutex_lock(&c->lock);
	for (pp = &c->regions; *pp; pp = &(*pp)->next) {
		if ((*pp)->addr == addr) {
			rg = *pp;
			*pp = rg->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (!rg)
		return -ENOENT;
	kd_region_put(rg);	/* ops still using it keep it mapped */
	return 0;
}

void kd_buf_resolve(struct kd_client *c, uint64_t addr, uint64_t len, struct kd_buf *b)
{
	struct kd_region *rg;

	b->addr = addr;
	b->len = len;
	b->direct = NULL;
	b->rg = NULL;
	b->ops = &kd_mem_vm;
	if (!len)
		return;
	pthread_mutex_lock(&c->lock);
	for (rg = c->regions; rg; rg = rg->next) {
		if (addr >= rg->addr && addr - rg->addr <= rg->size && len <= rg->size - (addr - rg->addr)) {
			atomic_fetch_add(&rg->refs, 1);
			b->rg = rg;
			b->direct = rg->map + (addr - rg->addr);
			b->ops = &kd_mem_mapped;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
}

void kd_buf_release(struct kd_buf *b)
{
	if (b->rg)
		kd_region_put(b->rg);
	b->rg = NULL;
	b->direct = NULL;
}
