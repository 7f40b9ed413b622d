// SPDX-License-Identifier: MIT
/*
 * How kcolld reaches a rank's buffer: the data-path ops table.
 *
 *   kd_mem_mapped  the buffer lies in a region mapped into the daemon (a sealed
 *                  memfd from kcoll_mem_alloc, or pages the client pinned with
 *                  kcoll_mem_register and kcolld mapped through /dev/kcoll):
 *                  used in place
 *   kd_mem_vm      any other buffer: one process_vm_readv/writev per chunk
 *   kd_mem_dev     GPU memory the client registered (MEM_REG_DEV: a CUDA IPC
 *                  handle kcolld opened): staged through host memory with the
 *                  kernels library's copies; exec.c reduces on the GPU itself
 *                  when every buffer of an op is on one GPU (docs/gpu.md)
 *   kd_mem_nodev   a device address outside every registered allocation:
 *                  -EFAULT, never a guess
 *
 * kd_buf_resolve picks the ops once per buffer per op; the executor only
 * calls kd_buf_read/kd_buf_write. A new way in (kernel module, GPU IPC)
 * is a new ops table here, nothing else.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <unistd.h>

#include "kcoll_gpu.h"
#include "kcolld.h"
#include "log.h"

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

int kd_gpu_ready(char *why, size_t len)
{
	const struct kcoll_gpu_kernels *k;
	struct kcoll_gpu *g;
	int rc = kcoll_gpu_process(&g);

	if (!rc)
		rc = kcoll_gpu_kernels(g, &k);
	if (rc) {
		if (why && len)
			snprintf(why, len, "device buffers need a GPU in kcolld: %s; run "
				 "'kcollctl gpu' for the fix", g ? kcoll_gpu_info(g)->why : "out of memory");
		return -EOPNOTSUPP;
	}
	return 0;
}

int kd_gpu_enter(int dev, const struct kcoll_gpu_kernels **k)
{
	char why[KCOLL_GPU_TEXT];
	struct kcoll_gpu *g;
	int rc = kd_gpu_ready(why, sizeof(why));

	if (!rc) {
		kcoll_gpu_process(&g);
		kcoll_gpu_kernels(g, k);
		rc = kcoll_gpu_ctx_enter(g, dev, why, sizeof(why));
	}
	if (rc)
		kc_warn("GPU %d: %s", dev, why);
	return rc;
}

/*
 * Per device: kcolld's own stream (created with the primary context current)
 * and a bounded pool of pinned staging slabs, each with an event that marks
 * the copy last queued on it done. Made on first use, freed by kd_gpu_cleanup.
 */
#define KD_DEV_SLAB	(64u << 10)	/* bytes per pinned slab: one piece of a copy */
#define KD_DEV_SLABS	16		/* per device; a staged copy holds two */

struct kd_dev_slab {
	uint8_t *host;			/* pinned */
	void *ev;
	struct kd_dev_slab *next;
};

static struct {
	void *stream;
	int nslab;			/* made so far */
	struct kd_dev_slab slab[KD_DEV_SLABS];
	struct kd_dev_slab *free;
} kd_devs[KCOLL_GPU_MAX_DEVICES];
static pthread_mutex_t kd_dev_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t kd_dev_cond = PTHREAD_COND_INITIALIZER;

int kd_gpu_stream(int dev, const struct kcoll_gpu_kernels **k, void **stream)
{
	int r = kd_gpu_enter(dev, k);

	if (r)
		return r;
	if (dev < 0 || dev >= KCOLL_GPU_MAX_DEVICES)
		return -ENODEV;
	pthread_mutex_lock(&kd_dev_lock);
	if (!kd_devs[dev].stream) {
		r = (*k)->stream_create(&kd_devs[dev].stream);
		if (r) {
			kd_devs[dev].stream = NULL;
			kc_warn("GPU %d: creating kcolld's stream failed: %s", dev, (*k)->last_error());
		}
	}
	*stream = kd_devs[dev].stream;
	pthread_mutex_unlock(&kd_dev_lock);
	return r;
}

static int free_slabs(int dev)
{
	int n = 0;

	for (struct kd_dev_slab *s = kd_devs[dev].free; s; s = s->next)
		n++;
	return n;
}

/* Two slabs of dev's pool: made while under the bound, else wait for some. */
static int slabs_get(int dev, const struct kcoll_gpu_kernels *k, struct kd_dev_slab *pair[2])
{
	int r = 0;

	pthread_mutex_lock(&kd_dev_lock);
	while (free_slabs(dev) < 2) {
		struct kd_dev_slab *s;

		if (kd_devs[dev].nslab == KD_DEV_SLABS) {
			pthread_cond_wait(&kd_dev_cond, &kd_dev_lock);
			continue;
		}
		s = &kd_devs[dev].slab[kd_devs[dev].nslab];
		r = k->host_alloc((void **)&s->host, KD_DEV_SLAB);
		if (!r) {
			r = k->event_create(&s->ev);
			if (r)
				k->host_free(s->host);
		}
		if (r) {
			kc_warn("GPU %d: no pinned staging memory (%d slabs of %u KiB made): %s; "
				"check 'ulimit -l' and free host memory", dev, kd_devs[dev].nslab,
				KD_DEV_SLAB >> 10, k->last_error());
			if (kd_devs[dev].nslab >= 2) {
				r = 0;	/* enough exist: wait for them */
				pthread_cond_wait(&kd_dev_cond, &kd_dev_lock);
				continue;
			}
			break;
		}
		kd_devs[dev].nslab++;
		s->next = kd_devs[dev].free;
		kd_devs[dev].free = s;
	}
	if (!r) {
		pair[0] = kd_devs[dev].free;
		pair[1] = pair[0]->next;
		kd_devs[dev].free = pair[1]->next;
	}
	pthread_mutex_unlock(&kd_dev_lock);
	return r;
}

static void slabs_put(int dev, struct kd_dev_slab *pair[2])
{
	pthread_mutex_lock(&kd_dev_lock);
	pair[1]->next = kd_devs[dev].free;
	pair[0]->next = pair[1];
	kd_devs[dev].free = pair[0];
	pthread_cond_broadcast(&kd_dev_cond);
	pthread_mutex_unlock(&kd_dev_lock);
}

void kd_gpu_cleanup(void)
{
	for (int dev = 0; dev < KCOLL_GPU_MAX_DEVICES; dev++) {
		const struct kcoll_gpu_kernels *k;

		if (!kd_devs[dev].stream && !kd_devs[dev].nslab)
			continue;
		if (kd_gpu_enter(dev, &k))
			continue;	/* logged; the process is exiting anyway */
		if (kd_devs[dev].stream)
			k->stream_sync(kd_devs[dev].stream);
		for (int i = 0; i < kd_devs[dev].nslab; i++) {
			k->event_destroy(kd_devs[dev].slab[i].ev);
			k->host_free(kd_devs[dev].slab[i].host);
		}
		if (kd_devs[dev].stream)
			k->stream_destroy(kd_devs[dev].stream);
		memset(&kd_devs[dev], 0, sizeof(kd_devs[dev]));
	}
}

/*
 * Host staging through two pinned slabs, pipelined in KD_DEV_SLAB pieces on
 * kcolld's stream. Up (device to host): the copy of piece i+1 is queued
 * before piece i is moved from its slab into host; down: piece i+1 is moved
 * into its slab while piece i's copy runs. Both wait for their last copy
 * before returning, so the bytes are where they belong when the call returns.
 */
static int dev_stage(const struct kd_buf *b, uint8_t *host, uint64_t off, size_t n, bool up)
{
	const struct kcoll_gpu_kernels *k;
	struct kd_dev_slab *s[2];
	size_t np = (n + KD_DEV_SLAB - 1) / KD_DEV_SLAB;
	uint8_t *dptr = b->dptr + off;
	const char *what = "asynchronous copy";
	void *stream;
	int r = kd_gpu_stream(b->gpu_dev, &k, &stream);

	if (r || !n)
		return r;
	r = slabs_get(b->gpu_dev, k, s);
	if (r)
		return r;
#define PIECE(i) ((i) + 1 < np ? KD_DEV_SLAB : n - (i) * (size_t)KD_DEV_SLAB)
	if (up) {
		r = k->copy_async(s[0]->host, dptr, PIECE(0), stream);
		if (!r)
			r = k->event_record(s[0]->ev, stream);
		for (size_t i = 0; !r && i < np; i++) {
			struct kd_dev_slab *cur = s[i % 2], *nxt = s[(i + 1) % 2];

			if (i + 1 < np) {
				what = "asynchronous copy";
				r = k->copy_async(nxt->host, dptr + (i + 1) * KD_DEV_SLAB, PIECE(i + 1),
						  stream);
				if (!r)
					r = k->event_record(nxt->ev, stream);
			}
			if (!r) {
				what = "event synchronization";
				r = k->event_sync(cur->ev);
			}
			if (!r)
				memcpy(host + i * KD_DEV_SLAB, cur->host, PIECE(i));
		}
	} else {
		for (size_t i = 0; !r && i < np; i++) {
			struct kd_dev_slab *cur = s[i % 2];

			if (i >= 2) {	/* its previous piece's copy must be done with it */
				what = "event synchronization";
				r = k->event_sync(cur->ev);
				if (r)
					break;
			}
			memcpy(cur->host, host + i * KD_DEV_SLAB, PIECE(i));
			what = "asynchronous copy";
			r = k->copy_async(dptr + i * KD_DEV_SLAB, cur->host, PIECE(i), stream);
			if (!r)
				r = k->event_record(cur->ev, stream);
		}
		if (!r) {	/* stream order: the last piece's event covers them all */
			what = "event synchronization";
			r = k->event_sync(s[(np - 1) % 2]->ev);
		}
	}
#undef PIECE
	if (r) {
		kc_warn("GPU %d: %s of %zu bytes %s the device failed: %s; the op fails, kcolld "
			"goes on", b->gpu_dev, what, n, up ? "from" : "to", k->last_error());
		/* Nothing may still be copying into a slab that goes back to the pool. */
		k->stream_sync(stream);
	}
	slabs_put(b->gpu_dev, s);
	return r;
}

int kd_buf_copy_dev(const struct kd_buf *dst, uint64_t doff, const struct kd_buf *src,
		    uint64_t soff, size_t n)
{
	const struct kcoll_gpu_kernels *k;
	int r;

	if (!dst->dptr || !src->dptr)
		return -EFAULT;
	if (!n)
		return 0;
	r = kd_gpu_enter(dst->gpu_dev, &k);
	if (r)
		return r;
	r = k->copy(dst->dptr + doff, src->dptr + soff, n);
	if (r)
		kc_warn("GPU %d -> GPU %d: copy of %zu bytes failed: %s; the transfer fails, "
			"kcolld goes on", src->gpu_dev, dst->gpu_dev, n, k->last_error());
	return r;
}

/* Host staging: the chunk comes up into tmp, the result goes down from src. */
static int dev_read(struct kd_client *c, const struct kd_buf *b, uint64_t off, size_t n,
		    uint8_t *tmp, const uint8_t **p)
{
	int r = dev_stage(b, tmp, off, n, true);

	if (!r)
		*p = tmp;
	return r;
}

static int dev_write(struct kd_client *c, const struct kd_buf *b, uint64_t off, const uint8_t *src,
		     size_t n)
{
	return dev_stage(b, (uint8_t *)src, off, n, false);
}

static int nodev_read(struct kd_client *c, const struct kd_buf *b, uint64_t off, size_t n,
		      uint8_t *tmp, const uint8_t **p)
{
	return -EFAULT;
}

static int nodev_write(struct kd_client *c, const struct kd_buf *b, uint64_t off,
		       const uint8_t *src, size_t n)
{
	return -EFAULT;
}

const struct kd_mem_ops kd_mem_dev = {
	.read = dev_read, .write = dev_write,
};

const struct kd_mem_ops kd_mem_nodev = {
	.read = nodev_read, .write = nodev_write,
};

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
	/* The RDMA registration cache may hold a host mapping (zero-copy
	 * sends): drop it before the address can be mapped again. */
	if (!rg->dev)
		kd_unmap_notify(rg->map, rg->size);
	if (rg->dev) {
		const struct kcoll_gpu_kernels *k;
		struct kcoll_gpu *g;
		int r = kd_gpu_enter(rg->gpu_dev, &k);

		kcoll_gpu_process(&g);
		if (!r)
			r = kcoll_gpu_ipc_close(g, rg->gpu_base);
		if (r)
			kc_warn("GPU %d: closing a device buffer's IPC mapping: %s", rg->gpu_dev,
				strerror(-r));
	} else if (rg->pinned) {
		if (atomic_load(&rg->dmabuf_fd) >= 0)
			close(atomic_load(&rg->dmabuf_fd));
		kcoll_kdev_unmap(&rg->kmap);
	} else {
		munmap(rg->map, rg->size);
	}
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
	rg->khandle = handle;
	atomic_init(&rg->dmabuf_fd, -1);
	rg->map = rg->kmap.addr;
	rg->addr = addr;
	rg->size = size;
	atomic_init(&rg->refs, 1);
	return region_insert(c, rg);
}

/*
 * kcoll.ko's dma-buf of a pinned region's pages (offset 0 = kmap.map_base),
 * asked for on first use and kept with the region: the NIC cannot pin the
 * PFN map itself, it can take the dma-buf (zero-copy RDMA sends,
 * xport_rdma.c zc_span). Returns the fd (the region owns it) or -errno.
 */
int kd_region_dmabuf(struct kd_region *rg)
{
	int fd = atomic_load(&rg->dmabuf_fd), want = -1, r;

	if (!rg->pinned)
		return -EINVAL;
	if (fd != -1)
		return fd >= 0 ? fd : -EOPNOTSUPP;
	r = kcoll_kdev_dmabuf(&kd.kdev, rg->khandle, &fd);
	if (r) {
		kc_dbg("no dma-buf of kcoll.ko handle %llu (%s): RDMA sends from it copy",
		       (unsigned long long)rg->khandle, strerror(-r));
		fd = -2;
	}
	/* another thread may have raced us here: keep the first */
	if (!atomic_compare_exchange_strong(&rg->dmabuf_fd, &want, fd)) {
		if (fd >= 0)
			close(fd);
		fd = want;
	}
	return fd >= 0 ? fd : (r ? r : -EOPNOTSUPP);
}

int kd_region_add_dev(struct kd_client *c, const struct kcoll_msg_mem_reg_dev *m, char *why,
		      size_t len)
{
	struct kcoll_gpu_ipc h;
	struct kd_region *rg;
	struct kcoll_gpu *g;
	const struct kcoll_gpu_kernels *k;
	char pci[sizeof(m->pci_bus_id) + 1];
	void *base, *dptr;
	int r, dev;

	_Static_assert(sizeof(h) == KCOLL_GPU_IPC_BYTES, "struct kcoll_gpu_ipc on the wire");
	memcpy(&h, m->ipc, sizeof(h));
	if (!m->addr || !m->size || m->size > KD_MAX_BYTES || m->addr + m->size < m->addr) {
		snprintf(why, len, "device allocation of %llu bytes at 0x%llx: bad range",
			 (unsigned long long)m->size, (unsigned long long)m->addr);
		return -EINVAL;
	}
	if (h.offset || h.size != m->size) {
		snprintf(why, len, "the handle must name the whole allocation (offset %llu, "
			 "%llu of %llu bytes)", h.offset, h.size, (unsigned long long)m->size);
		return -EINVAL;
	}
	r = kd_gpu_ready(why, len);
	if (r)
		return r;
	kcoll_gpu_process(&g);
	memcpy(pci, m->pci_bus_id, sizeof(m->pci_bus_id));
	pci[sizeof(m->pci_bus_id)] = '\0';
	dev = kcoll_gpu_device_by_pci(g, pci);
	if (dev < 0) {
		snprintf(why, len, "the client's GPU %.32s is not visible to kcolld (check "
			 "CUDA_VISIBLE_DEVICES in kcolld's environment; 'kcollctl gpu' lists its "
			 "devices)", pci);
		return -ENODEV;
	}
	r = kd_gpu_enter(dev, &k);
	if (r) {
		snprintf(why, len, "no CUDA context on GPU %d in kcolld", dev);
		return r;
	}
	r = kcoll_gpu_ipc_import(g, &h, c->pid, m->size, &base, &dptr, why, len);
	if (r)
		return r;
	rg = calloc(1, sizeof(*rg));
	if (!rg) {
		kcoll_gpu_ipc_close(g, base);
		return -ENOMEM;
	}
	rg->dev = true;
	rg->gpu_dev = dev;
	rg->gpu_base = base;
	rg->map = dptr;
	rg->addr = m->addr;
	rg->size = m->size;
	rg->buffer_id = m->buffer_id;
	atomic_init(&rg->refs, 1);
	r = region_insert(c, rg);	/* on failure it closed the mapping */
	if (r)
		snprintf(why, len, "device allocation at 0x%llx overlaps one already registered",
			 (unsigned long long)m->addr);
	return r;
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

void kd_buf_resolve_kind(struct kd_client *c, uint64_t addr, uint64_t len, int mem,
			 struct kd_buf *b)
{
	bool dev = mem == KCOLL_MEM_DEVICE;
	struct kd_region *rg;

	b->addr = addr;
	b->len = len;
	b->direct = NULL;
	b->dptr = NULL;
	b->gpu_dev = -1;
	b->rg = NULL;
	b->ops = dev ? &kd_mem_nodev : &kd_mem_vm;
	if (!len)
		return;
	pthread_mutex_lock(&c->lock);
	for (rg = c->regions; rg; rg = rg->next) {
		if (rg->dev != dev)
			continue;	/* a device address is never host memory, nor back */
		if (addr >= rg->addr && addr - rg->addr <= rg->size && len <= rg->size - (addr - rg->addr)) {
			atomic_fetch_add(&rg->refs, 1);
			b->rg = rg;
			if (dev) {
				b->dptr = rg->map + (addr - rg->addr);
				b->gpu_dev = rg->gpu_dev;
				b->ops = &kd_mem_dev;
			} else {
				b->direct = rg->map + (addr - rg->addr);
				b->ops = &kd_mem_mapped;
			}
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (dev && !b->rg)
		kc_dbg("client %u: device buffer 0x%llx (%llu bytes) is not inside a registered "
		       "device allocation", c->id, (unsigned long long)addr, (unsigned long long)len);
}

void kd_buf_resolve(struct kd_client *c, uint64_t addr, uint64_t len, struct kd_buf *b)
{
	kd_buf_resolve_kind(c, addr, len, KCOLL_MEM_HOST, b);
}

void kd_buf_release(struct kd_buf *b)
{
	if (b->rg)
		kd_region_put(b->rg);
	b->rg = NULL;
	b->direct = NULL;
}
