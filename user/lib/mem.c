// SPDX-License-Identifier: MIT
/*
 * libkcoll: memory. kcoll memory (kcoll_mem_alloc: memfd shared with
 * kcolld), buffers pinned through /dev/kcoll (kcoll_mem_register), plain
 * pages moved into a memfd in place (kcoll_mem_share), device
 * buffers (registered with kcolld on first use), and the memory kind and
 * huge-page hint that each collective's buffers get.
 * Locking: lib.h.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>

#include "kcoll_gpu.h"
#include "kdev.h"
#include "lib.h"
#include "log.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25	/* Linux 6.1; older kernels answer EINVAL */
#endif
#define KCOLL_THP_SIZE	(2u << 20)	/* x86-64 and arm64 (4 KiB pages) PMD size */

/*
 * Device buffers (docs/gpu.md). Only a process that has the CUDA driver loaded
 * can hold one; for it, the driver says whether a pointer is device memory and
 * which allocation holds it. Each allocation is registered with kcolld once,
 * with a CUDA IPC handle; a new buffer id at a registered base means the
 * allocation was freed and the address reused: the old registration goes and
 * the new allocation is registered in its place.
 */
/* dl_iterate_phdr callback: the count of objects ever loaded, then stop. */
static int loaded_adds(struct dl_phdr_info *info, size_t size, void *arg)
{
	if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
		*(unsigned long long *)arg = info->dlpi_adds;
	return 1;
}

/*
 * Is the CUDA driver loaded in this process? Asked on every submission, so it
 * must cost next to nothing. dlopen(RTLD_NOLOAD) answers it but searches the
 * library path with system calls (it tripled small-message latency when asked
 * per op), so it is asked again only when something was loaded since it last
 * said no (the loader's count of loaded objects, read in memory).
 */
bool kc_cuda_loaded(void)
{
	static int seen;	/* once loaded, libcuda stays */
	static unsigned long long no_at;	/* the answer was no at this count */
	unsigned long long adds = 0;
	void *h;

	if (__atomic_load_n(&seen, __ATOMIC_RELAXED))
		return true;
	dl_iterate_phdr(loaded_adds, &adds);
	if (adds && adds == __atomic_load_n(&no_at, __ATOMIC_RELAXED))
		return false;
	h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
	if (!h) {
		__atomic_store_n(&no_at, adds, __ATOMIC_RELAXED);
		return false;
	}
	dlclose(h);
	__atomic_store_n(&seen, 1, __ATOMIC_RELAXED);
	return true;
}

/* The driver for pointer queries and IPC export; never the kernels library. */
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
static struct kcoll_gpu *gpu;

static void gpu_open(void)
{
	static const struct kcoll_gpu_config cfg = { .driver_only = 1 };

	kcoll_gpu_open(&gpu, &cfg);
}

static int dev_unreg(struct kcoll *k, uint64_t base)
{
	struct kcoll_msg_mem_unreg req = { .hdr.type = KCOLL_MSG_MEM_UNREG, .addr = base };
	struct kcoll_msg_hdr rep;
	int r = kcoll_priv_ctl(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);

	return r == -ENOENT || r == -ENOTCONN ? 0 : r;
}

static int dev_register(struct kcoll *k, struct kcoll_gpu *g, const struct kcoll_gpu_ptr *q)
{
	struct kcoll_msg_mem_reg_dev m = { .hdr.type = KCOLL_MSG_MEM_REG_DEV };
	struct kcoll_devreg *d, **pp, *stale = NULL;
	struct kcoll_msg_hdr rep;
	struct kcoll_gpu_ipc h;
	char why[KCOLL_GPU_TEXT];
	int r;

	_Static_assert(sizeof(h) == sizeof(m.ipc), "struct kcoll_gpu_ipc on the wire");
	pthread_mutex_lock(&k->dev_lock);
	for (pp = &k->devregs; *pp; pp = &(*pp)->next) {
		if ((*pp)->base != q->base)
			continue;
		if ((*pp)->buffer_id == q->buffer_id && (*pp)->size == q->size) {
			pthread_mutex_unlock(&k->dev_lock);
			return 0;	/* registered already */
		}
		stale = *pp;
		*pp = stale->next;
		break;
	}
	if (stale) {
		kc_dbg("device allocation at 0x%llx was freed and reused (buffer id %llu -> %llu): "
		       "registering the new one", (unsigned long long)q->base,
		       (unsigned long long)stale->buffer_id, (unsigned long long)q->buffer_id);
		free(stale);
		r = dev_unreg(k, q->base);
		if (r)
			goto out;
	}
	r = kcoll_gpu_ipc_export(g, (const void *)(uintptr_t)q->base, q->size, &h, why,
				 sizeof(why));
	if (r) {
		kc_warn("device buffer at 0x%llx: %s", (unsigned long long)q->base, why);
		goto out;
	}
	m.addr = q->base;
	m.size = q->size;
	m.buffer_id = q->buffer_id;
	snprintf(m.pci_bus_id, sizeof(m.pci_bus_id), "%s", q->pci_bus_id);
	memcpy(m.ipc, &h, sizeof(h));
	r = kcoll_priv_ctl(k, &m, sizeof(m), -1, &rep, sizeof(rep), NULL, 5000);
	if (r) {
		kc_warn("kcolld refused device allocation 0x%llx (%llu bytes): %s; its log says why",
			(unsigned long long)q->base, (unsigned long long)q->size, kcoll_strerror(r));
		goto out;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		dev_unreg(k, q->base);
		r = -ENOMEM;
		goto out;
	}
	d->base = q->base;
	d->size = q->size;
	d->buffer_id = q->buffer_id;
	d->next = k->devregs;
	k->devregs = d;
out:
	pthread_mutex_unlock(&k->dev_lock);
	return r;
}

/* 1 when [ptr, ptr + bytes) is device memory (q: its allocation), 0 when
 * host memory, -errno when the driver cannot say or the range runs past
 * its allocation. A process without CUDA loaded holds no device memory. */
static int dev_query(const void *ptr, size_t bytes, struct kcoll_gpu **gp, struct kcoll_gpu_ptr *q)
{
	char why[KCOLL_GPU_TEXT];
	struct kcoll_gpu *g;
	uint64_t off;
	int r;

	if (!ptr || !bytes || !kc_cuda_loaded())
		return 0;
	pthread_once(&gpu_once, gpu_open);
	g = gpu;
	r = g ? kcoll_gpu_ptr_query(g, ptr, q, why, sizeof(why)) : -EOPNOTSUPP;
	if (r == -EOPNOTSUPP)
		return 0;	/* a driver without a device: nothing is device memory */
	if (r) {
		kc_warn("device buffer %p: %s", ptr, why);
		return r;
	}
	if (!q->is_device)
		return 0;
	off = (uintptr_t)ptr - q->base;
	if (bytes > q->size - off) {
		kc_warn("device buffer %p of %zu bytes runs past its allocation (0x%llx, %llu bytes)",
			ptr, bytes, q->base, q->size);
		return -EINVAL;
	}
	*gp = g;
	return 1;
}

/* The SQE memory kind of [ptr, ptr + bytes), registering a device allocation. */
int kc_mem_kind(struct kcoll *k, const void *ptr, size_t bytes, uint8_t *kind)
{
	struct kcoll_gpu_ptr q;
	struct kcoll_gpu *g = NULL;
	int r;

	*kind = KCOLL_MEM_HOST;
	r = dev_query(ptr, bytes, &g, &q);
	if (r <= 0)
		return r;
	r = dev_register(k, g, &q);
	if (!r)
		*kind = KCOLL_MEM_DEVICE;
	return r;
}

/*
 * kcolld reaches a buffer outside kcoll memory with process_vm_readv/writev,
 * which pins the pages of every chunk it copies, page by page: with 4 KiB
 * pages that pinning costs about as much as the copy itself (docs/perf/shim.md
 * section 5). Collapsing the 2 MiB-aligned inside of a large buffer into
 * huge pages once (MADV_COLLAPSE: synchronous, keeps the contents, adds no
 * memory beyond pages the op reads or writes anyway, all of them) lets
 * each pin take 512 pages at a time. A hint: failures (no huge page free,
 * an old kernel, a file mapping) change nothing. Remembers the last
 * KCOLL_THP_SEEN ranges so a buffer used in a loop is collapsed once.
 */
void kc_thp_collapse(struct kcoll *k, const void *ptr, size_t bytes)
{
	uint64_t lo = ((uintptr_t)ptr + KCOLL_THP_SIZE - 1) & ~(uint64_t)(KCOLL_THP_SIZE - 1);
	uint64_t hi = ((uintptr_t)ptr + bytes) & ~(uint64_t)(KCOLL_THP_SIZE - 1);
	bool seen = false;

	if (!k->thp_min || bytes < k->thp_min || hi <= lo)
		return;
	pthread_mutex_lock(&k->mem_lock);
	for (const struct kcoll_region *rg = k->regions; rg && !seen; rg = rg->next)
		seen = (uintptr_t)ptr >= (uintptr_t)rg->addr &&
		       (uintptr_t)ptr < (uintptr_t)rg->addr + rg->size;	/* kcoll memory */
	for (unsigned int i = 0; i < KCOLL_THP_SEEN && !seen; i++)
		seen = k->thp_done[i][0] <= lo && hi <= k->thp_done[i][1];
	if (!seen) {
		k->thp_done[k->thp_next][0] = lo;
		k->thp_done[k->thp_next][1] = hi;
		k->thp_next = (k->thp_next + 1) % KCOLL_THP_SEEN;
	}
	pthread_mutex_unlock(&k->mem_lock);
	if (!seen && madvise((void *)(uintptr_t)lo, hi - lo, MADV_COLLAPSE))
		kc_dbg("MADV_COLLAPSE of %#llx+%llu: %s (kcolld copies it page by page)",
		       (unsigned long long)lo, (unsigned long long)(hi - lo), strerror(errno));
}

/* A region kcolld now maps: into the handle's list. */
static void region_add(struct kcoll *k, struct kcoll_region *rg)
{
	pthread_mutex_lock(&k->mem_lock);
	rg->next = k->regions;
	k->regions = rg;
	pthread_mutex_unlock(&k->mem_lock);
}

int kcoll_mem_alloc(struct kcoll *k, size_t size, void **ptr)
{
	struct kcoll_msg_mem_reg req = { .hdr.type = KCOLL_MSG_MEM_REG };
	struct kcoll_msg_hdr rep;
	struct kcoll_region *rg;
	size_t len;
	void *p;
	int fd, r;

	if (!k || !ptr || !size)
		return -EINVAL;
	if (size > (1ULL << 40))
		return -EOVERFLOW;
	len = (size + 4095) & ~(size_t)4095;
	rg = calloc(1, sizeof(*rg));
	if (!rg)
		return -ENOMEM;
	fd = memfd_create("kcoll-buf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		r = -errno;
		goto err_free;
	}
	/* Sealed size: the daemon maps it too and must never see it shrink. */
	if (ftruncate(fd, len) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		r = -errno;
		goto err_close;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		goto err_close;
	}
	req.addr = (uintptr_t)p;
	req.size = len;
	r = kcoll_priv_ctl(k, &req, sizeof(req), fd, &rep, sizeof(rep), NULL, 5000);
	if (r)
		goto err_unmap;
	close(fd);
	rg->addr = p;
	rg->size = len;
	region_add(k, rg);
	*ptr = p;
	return 0;

err_unmap:
	munmap(p, len);
err_close:
	close(fd);
err_free:
	free(rg);
	return r;
}

/* Unlink the region at ptr if it is of one of the kinds in mask (1 << kind). */
static struct kcoll_region *region_take(struct kcoll *k, void *ptr, unsigned int mask)
{
	struct kcoll_region **pp, *rg = NULL;

	pthread_mutex_lock(&k->mem_lock);
	for (pp = &k->regions; *pp; pp = &(*pp)->next) {
		if ((*pp)->addr == ptr && (mask & (1u << (*pp)->kind))) {
			rg = *pp;
			*pp = rg->next;
			break;
		}
	}
	pthread_mutex_unlock(&k->mem_lock);
	return rg;
}

/* Make kcolld forget the region at ptr, then release our side of it. */
static int region_release(struct kcoll *k, void *ptr, unsigned int mask)
{
	struct kcoll_msg_mem_unreg req = { .hdr.type = KCOLL_MSG_MEM_UNREG };
	struct kcoll_msg_hdr rep;
	struct kcoll_region *rg;
	int r;

	if (!k || !ptr)
		return -EINVAL;
	rg = region_take(k, ptr, mask);
	if (!rg)
		return -ENOENT;
	req.addr = (uintptr_t)ptr;
	r = kcoll_priv_ctl(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);
	/* kcolld dropped its table entry first; an operation still in flight
	 * keeps its own reference to the daemon's mapping, so releasing ours
	 * now cannot pull pages from under it. A shared region's pages are the
	 * caller's memory: they stay mapped, holding their data. */
	if (rg->kind == KC_REGION_PINNED)
		kcoll_kdev_unregister(&k->kdev, rg->kdev_handle);
	else if (rg->kind == KC_REGION_ALLOC)
		munmap(rg->addr, rg->size);
	else
		kc_share_drop(rg->addr);
	free(rg);
	return r == -ENOTCONN ? 0 : r;
}

int kcoll_mem_free(struct kcoll *k, void *ptr)
{
	return region_release(k, ptr, 1u << KC_REGION_ALLOC);
}

int kcoll_mem_register(struct kcoll *k, void *ptr, size_t size)
{
	struct kcoll_msg_mem_reg_kdev req = { .hdr.type = KCOLL_MSG_MEM_REG_KDEV };
	struct kcoll_msg_hdr rep;
	struct kcoll_region *rg;
	uint64_t handle;
	int r;

	if (!k || !ptr || !size)
		return -EINVAL;
	pthread_mutex_lock(&k->mem_lock);
	if (!k->kdev_tried) {
		k->kdev_tried = true;
		if (kcoll_kdev_open(&k->kdev, NULL) == 0 &&
		    !kcoll_kdev_has(&k->kdev, KCOLL_FEAT_BUF | KCOLL_FEAT_GRANT))
			kcoll_kdev_close(&k->kdev);
	}
	pthread_mutex_unlock(&k->mem_lock);
	if (k->kdev.fd < 0)
		return -ENODEV;
	rg = calloc(1, sizeof(*rg));
	if (!rg)
		return -ENOMEM;
	r = kcoll_kdev_register(&k->kdev, ptr, size, 0, &handle);
	if (r)
		goto err_free;
	/* Only kcolld, by pid, may map these pages. */
	r = kcoll_kdev_grant(&k->kdev, handle, KCOLL_GRANT_PID, k->daemon_pid, 0);
	if (r)
		goto err_unregister;
	req.addr = (uintptr_t)ptr;
	req.size = size;
	req.handle = handle;
	r = kcoll_priv_ctl(k, &req, sizeof(req), -1, &rep, sizeof(rep), NULL, 5000);
	if (r)
		goto err_unregister;
	rg->addr = ptr;
	rg->size = size;
	rg->kdev_handle = handle;
	rg->kind = KC_REGION_PINNED;
	region_add(k, rg);
	return 0;

err_unregister:
	kcoll_kdev_unregister(&k->kdev, handle);
err_free:
	free(rg);
	return r;
}

/*
 * kcoll_mem_share: plain memory made kcolld-mapped without kcoll.ko. Private
 * anonymous pages cannot be handed to another process, so the whole pages
 * inside the buffer are copied into a sealed memfd that is then mapped
 * over them at the same address (mremap of the copy's mapping: its page
 * tables move along, nothing faults again) and registered like
 * kcoll_mem_alloc memory. Pages at the buffer's ends that it shares with
 * other objects stay as they are: a write to them during the copy would
 * be lost.
 */
#define KC_SHARE_NAME	"kcoll-share"	/* the memfd; /proc/PID/maps shows it */

/*
 * The ranges shared on every handle of this process. A handle sharing again
 * what another shared would swap the pages under the other's registration
 * (its kcolld mapping would keep the old copy), so a range is claimed here
 * first, process-wide.
 */
struct kc_share_range {
	uintptr_t lo, hi;
	struct kc_share_range *next;
};
static pthread_mutex_t share_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kc_share_range *share_ranges;

static int share_claim(uintptr_t lo, uintptr_t hi)
{
	struct kc_share_range *s, *it;
	int r = 0;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->lo = lo;
	s->hi = hi;
	pthread_mutex_lock(&share_lock);
	for (it = share_ranges; it && !r; it = it->next)
		r = lo < it->hi && it->lo < hi ? -EEXIST : 0;
	if (!r) {
		s->next = share_ranges;
		share_ranges = s;
	}
	pthread_mutex_unlock(&share_lock);
	if (r)
		free(s);
	return r;
}

void kc_share_drop(const void *lo)
{
	struct kc_share_range **pp, *s = NULL;

	pthread_mutex_lock(&share_lock);
	for (pp = &share_ranges; *pp; pp = &(*pp)->next) {
		if ((*pp)->lo == (uintptr_t)lo) {
			s = *pp;
			*pp = s->next;
			break;
		}
	}
	pthread_mutex_unlock(&share_lock);
	free(s);
}

/* Is a /proc/self/maps path (after the inode) one whose pages we may copy? */
static bool share_name_ok(const char *path, bool shared)
{
	if (shared)	/* shared once before: our own memfd, since deregistered */
		return !strncmp(path, "/memfd:" KC_SHARE_NAME " ", strlen("/memfd:" KC_SHARE_NAME " "));
	return !*path || !strcmp(path, "[heap]") || !strcmp(path, "[stack]") ||
	       !strncmp(path, "[anon:", 6);
}

/*
 * Is [lo, hi) all readable, writable, private anonymous memory (or pages
 * shared once before and since deregistered)? 0, -EFAULT (a hole),
 * -EACCES (not read-write) or -EOPNOTSUPP (a file, shared memory, huge
 * pages: copying them would cut them off from whoever else maps them).
 */
static int share_check_maps(uintptr_t lo, uintptr_t hi)
{
	FILE *f = fopen("/proc/self/maps", "re");
	uintptr_t at = lo;
	size_t cap = 0;
	char *line = NULL;
	int r = 0;

	if (!f)
		return -errno;
	while (at < hi && getline(&line, &cap, f) > 0) {
		unsigned long start, end, inode;
		char perms[5];
		int path = 0;

		line[strcspn(line, "\n")] = 0;
		if (sscanf(line, "%lx-%lx %4s %*s %*s %lu %n", &start, &end, perms, &inode, &path) < 4)
			continue;
		if (end <= at)
			continue;
		if (start > at) {
			r = -EFAULT;
			break;
		}
		if (perms[0] != 'r' || perms[1] != 'w') {
			r = -EACCES;
			break;
		}
		if (perms[3] == 'p' ? inode || !share_name_ok(line + path, false) :
				      !share_name_ok(line + path, true)) {
			kc_dbg("kcoll_mem_share: %#lx-%#lx is not private anonymous memory: %s", start,
			       end, line);
			r = -EOPNOTSUPP;
			break;
		}
		at = end;
	}
	if (!r && at < hi)
		r = -EFAULT;
	free(line);
	fclose(f);
	return r;
}

int kcoll_mem_share(struct kcoll *k, void *ptr, size_t size, void **lo, size_t *len)
{
	struct kcoll_msg_mem_reg req = { .hdr.type = KCOLL_MSG_MEM_REG };
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a, b;
	struct kcoll_msg_hdr rep;
	struct kcoll_region *rg;
	bool overlap = false;
	void *copy, *at;
	size_t n;
	int fd, r;

	if (!k || !ptr || !size || !lo || !len)
		return -EINVAL;
	if (size > (1ULL << 40))
		return -EOVERFLOW;
	if ((uintptr_t)ptr + size < (uintptr_t)ptr)
		return -EFAULT;
	a = ((uintptr_t)ptr + page - 1) & ~(page - 1);
	b = ((uintptr_t)ptr + size) & ~(page - 1);
	if (b <= a)
		return -ERANGE;	/* no whole page inside: nothing can be shared */
	n = b - a;
	pthread_mutex_lock(&k->mem_lock);
	for (const struct kcoll_region *it = k->regions; it && !overlap; it = it->next)
		overlap = a < (uintptr_t)it->addr + it->size && (uintptr_t)it->addr < b;
	pthread_mutex_unlock(&k->mem_lock);
	if (overlap)
		return -EEXIST;
	r = share_claim(a, b);
	if (r)
		return r;
	r = share_check_maps(a, b);
	if (r)
		goto err_drop;
	rg = calloc(1, sizeof(*rg));
	if (!rg) {
		r = -ENOMEM;
		goto err_drop;
	}
	fd = memfd_create(KC_SHARE_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		r = -errno;
		goto err_free;
	}
	if (ftruncate(fd, n) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		r = -errno;
		goto err_close;
	}
	copy = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (copy == MAP_FAILED) {
		r = -errno;
		goto err_close;
	}
	memcpy(copy, (void *)a, n);
	/* kcolld maps the copy and takes [a, b) as kcoll memory from now on. */
	req.addr = a;
	req.size = n;
	r = kcoll_priv_ctl(k, &req, sizeof(req), fd, &rep, sizeof(rep), NULL, 5000);
	if (r)
		goto err_unmap;
	at = mremap(copy, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)a);
	if (at == MAP_FAILED) {
		struct kcoll_msg_mem_unreg un = { .hdr.type = KCOLL_MSG_MEM_UNREG, .addr = a };

		r = -errno;
		kcoll_priv_ctl(k, &un, sizeof(un), -1, &rep, sizeof(rep), NULL, 5000);
		goto err_unmap;
	}
	close(fd);	/* the two mappings keep the memfd */
	rg->addr = (void *)a;
	rg->size = n;
	rg->kind = KC_REGION_SHARED;
	region_add(k, rg);
	*lo = (void *)a;
	*len = n;
	return 0;

err_unmap:
	munmap(copy, n);
err_close:
	close(fd);
err_free:
	free(rg);
err_drop:
	kc_share_drop((void *)a);
	return r;
}

int kcoll_mem_deregister(struct kcoll *k, void *ptr)
{
	struct kcoll_devreg **pp, *d = NULL;

	if (!k || !ptr)
		return -EINVAL;
	/* A registered GPU allocation (by its base): kcolld closes its mapping. */
	pthread_mutex_lock(&k->dev_lock);
	for (pp = &k->devregs; *pp; pp = &(*pp)->next) {
		if ((*pp)->base == (uintptr_t)ptr) {
			d = *pp;
			*pp = d->next;
			break;
		}
	}
	if (d) {
		free(d);
		pthread_mutex_unlock(&k->dev_lock);
		return dev_unreg(k, (uintptr_t)ptr);
	}
	pthread_mutex_unlock(&k->dev_lock);
	return region_release(k, ptr, 1u << KC_REGION_PINNED | 1u << KC_REGION_SHARED);
}
