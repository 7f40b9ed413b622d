// SPDX-License-Identifier: MIT
/* The fake CUDA driver of gpu/fake_cuda.h: the entry points gpu.c resolves,
 * fake device memory shared between processes, and a kernels table that runs
 * the reductions and copies on the CPU. */
#include <errno.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "fake_cuda.h"
#include "kernels.h"
#include "reduce_core.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

static struct kcoll_fake_cuda fake = {
	.driver_version = 13000,
	.ndev = 1,
	.cc_major = 9,
	.cc_minor = 0,
	.dmabuf = 1,
	.gdr = 1,
	.mem_bytes = 80ULL << 30,
	.kernels_version = KCOLL_GPU_KERNELS_VERSION,
	.min_driver_version = 13000,
	.archs = "sm_80 sm_90 compute_90",
};
static int initialized;

static __thread void *cur_ctx;
static char primary_ctx[64];

/*
 * The kernels table: the same contract as libkcoll_gpu.so (kernels.h), run on
 * the CPU over the fake's "device memory" with gpu/reduce_core.h (the code the
 * CUDA kernels run), synchronously: a stream is done when the call returns.
 * Every call needs a current context on the calling thread, as CUDA does.
 */
static const char *fake_last = "no error";

static int need_ctx(void)
{
	if (cur_ctx)
		return 0;
	fake_last = "CUDA_ERROR_INVALID_CONTEXT: no context current on this thread (fake)";
	return -EINVAL;
}

static int cpu_reduce_n(int dtype, int op, void *out, const void *const *in, unsigned int nin,
			size_t count, void *stream)
{
	size_t esz;

	if (need_ctx())
		return -EINVAL;
	if (!kcoll_core_valid(dtype, op) || !nin || !out)
		return -EINVAL;
	esz = kcoll_core_size(dtype);
	if ((uintptr_t)out % esz)
		return -EINVAL;
	for (unsigned int k = 0; k < nin; k++) {
		if (!in[k] || (uintptr_t)in[k] % esz)
			return -EINVAL;
	}
	if (count > SIZE_MAX / esz)
		return -EOVERFLOW;
	for (size_t i = 0; i < count; i++)
		kcoll_core_reduce_elem(dtype, op, out, in, nin, i);
	return 0;
}

static int cpu_set_device(int dev)
{
	if (dev < 0 || dev >= fake.ndev)
		return -ENODEV;
	cur_ctx = &primary_ctx[dev % (int)sizeof(primary_ctx)];
	return 0;
}

static int cpu_mem_alloc(void **ptr, size_t len)
{
	*ptr = kcoll_fake_cuda_alloc(len);
	return *ptr ? 0 : -ENOMEM;
}

static int cpu_mem_free(void *ptr)
{
	kcoll_fake_cuda_free(ptr);
	return 0;
}

static int cpu_copy(void *dst, const void *src, size_t len)
{
	if (need_ctx())
		return -EINVAL;
	memmove(dst, src, len);
	return 0;
}

static int cpu_stream_sync(void *stream)
{
	return need_ctx();
}

static const char *cpu_last_error(void)
{
	return fake_last;
}

/*
 * Streams, events, asynchronous copies: executed at once, so a stream or an
 * event is always complete. Pinned host memory is ordinary memory, counted.
 * Knobs for the tests (read once, in kcolld's environment):
 *   KCOLL_FAKE_CUDA_FAIL_COPY_ASYNC=N   the Nth copy_async of the process fails
 *   KCOLL_FAKE_CUDA_HOST_ALLOC_MAX=N    host_alloc fails after N allocations in
 *                                       all (a pool that does not reuse runs
 *                                       out); and at exit, pinned memory still
 *                                       allocated makes the process exit 70
 */
static atomic_ulong async_copies, host_allocs_total;
static atomic_long host_allocs_live;
static char fake_stream_obj, fake_event_obj;

static long fake_env(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? strtol(v, NULL, 10) : 0;
}

static int cpu_stream_create(void **stream)
{
	if (need_ctx())
		return -EINVAL;
	*stream = &fake_stream_obj;
	return 0;
}

static int cpu_stream_destroy(void *stream)
{
	return stream == &fake_stream_obj ? need_ctx() : -EBADF;
}

static int cpu_copy_async(void *dst, const void *src, size_t len, void *stream)
{
	long fail_at = fake_env("KCOLL_FAKE_CUDA_FAIL_COPY_ASYNC");

	if (need_ctx())
		return -EINVAL;
	if (stream && stream != &fake_stream_obj)
		return -EBADF;
	if ((long)atomic_fetch_add(&async_copies, 1) + 1 == fail_at) {
		fake_last = "CUDA_ERROR_UNKNOWN: injected by KCOLL_FAKE_CUDA_FAIL_COPY_ASYNC (fake)";
		return -EIO;
	}
	memmove(dst, src, len);
	return 0;
}

static int cpu_event_create(void **event)
{
	if (need_ctx())
		return -EINVAL;
	*event = &fake_event_obj;
	return 0;
}

static int cpu_event_op(void *event)
{
	return event == &fake_event_obj ? need_ctx() : -EBADF;
}

static int cpu_event_record(void *event, void *stream)
{
	if (stream && stream != &fake_stream_obj)
		return -EBADF;
	return cpu_event_op(event);
}

static int cpu_host_alloc(void **ptr, size_t len)
{
	long max = fake_env("KCOLL_FAKE_CUDA_HOST_ALLOC_MAX");

	if (need_ctx())
		return -EINVAL;
	if (max && (long)atomic_load(&host_allocs_total) >= max) {
		fake_last = "CUDA_ERROR_OUT_OF_MEMORY: KCOLL_FAKE_CUDA_HOST_ALLOC_MAX reached (fake)";
		return -ENOMEM;
	}
	*ptr = malloc(len ? len : 1);
	if (!*ptr)
		return -ENOMEM;
	atomic_fetch_add(&host_allocs_total, 1);
	atomic_fetch_add(&host_allocs_live, 1);
	return 0;
}

static int cpu_host_free(void *ptr)
{
	if (ptr) {
		free(ptr);
		atomic_fetch_sub(&host_allocs_live, 1);
	}
	return 0;
}

__attribute__((destructor)) static void fake_exit_check(void)
{
	long live = atomic_load(&host_allocs_live);

	if (live && fake_env("KCOLL_FAKE_CUDA_HOST_ALLOC_MAX")) {
		fprintf(stderr, "fake CUDA: %ld pinned host allocations never freed\n", live);
		_exit(70);
	}
}

FAKE_EXPORT struct kcoll_gpu_kernels kcoll_gpu_kernels_v1 = {
	.size = sizeof(struct kcoll_gpu_kernels),
	.version = KCOLL_GPU_KERNELS_VERSION,
	.runtime_version = 13000,
	.min_driver_version = 13000,
	.archs = "sm_80 sm_90 compute_90",
	.reduce_n = cpu_reduce_n,
	.set_device = cpu_set_device,
	.mem_alloc = cpu_mem_alloc,
	.mem_free = cpu_mem_free,
	.copy = cpu_copy,
	.stream_sync = cpu_stream_sync,
	.last_error = cpu_last_error,
	.stream_create = cpu_stream_create,
	.stream_destroy = cpu_stream_destroy,
	.copy_async = cpu_copy_async,
	.event_create = cpu_event_create,
	.event_destroy = cpu_event_op,
	.event_record = cpu_event_record,
	.event_query = cpu_event_op,
	.event_sync = cpu_event_op,
	.host_alloc = cpu_host_alloc,
	.host_free = cpu_host_free,
};

FAKE_EXPORT void kcoll_fake_cuda_set(const struct kcoll_fake_cuda *cfg)
{
	fake = *cfg;
	initialized = 0;
	kcoll_gpu_kernels_v1.version = cfg->kernels_version;
	kcoll_gpu_kernels_v1.min_driver_version = cfg->min_driver_version;
	kcoll_gpu_kernels_v1.archs = cfg->archs;
}

static int check_dev(int dev)
{
	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	return dev >= 0 && dev < fake.ndev ? KCOLL_CUDA_SUCCESS : KCOLL_CUDA_INVALID_DEVICE;
}

FAKE_EXPORT int cuInit(unsigned int flags)
{
	if (flags)
		return KCOLL_CUDA_INVALID_VALUE;
	initialized = fake.init_result == KCOLL_CUDA_SUCCESS;
	return fake.init_result;
}

FAKE_EXPORT int cuDriverGetVersion(int *version)
{
	*version = fake.driver_version;
	return KCOLL_CUDA_SUCCESS;
}

FAKE_EXPORT int cuDeviceGetCount(int *count)
{
	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	*count = fake.ndev;
	return KCOLL_CUDA_SUCCESS;
}

FAKE_EXPORT int cuDeviceGet(int *dev, int ordinal)
{
	int err = check_dev(ordinal);

	if (!err)
		*dev = ordinal;
	return err;
}

FAKE_EXPORT int cuDeviceGetName(char *name, int len, int dev)
{
	int err = check_dev(dev);

	if (!err)
		snprintf(name, (size_t)len, "Fake \"GPU\" %d", dev);
	return err;
}

FAKE_EXPORT int cuDeviceGetAttribute(int *value, int attr, int dev)
{
	int err = check_dev(dev);
	int v;

	if (err)
		return err;
	switch (attr) {
	case KCOLL_CU_ATTR_CC_MAJOR:
		v = fake.cc_major;
		break;
	case KCOLL_CU_ATTR_CC_MINOR:
		v = fake.cc_minor;
		break;
	case KCOLL_CU_ATTR_MULTIPROCESSOR_COUNT:
		v = 132;
		break;
	case KCOLL_CU_ATTR_DMA_BUF_SUPPORTED:
		v = fake.dmabuf;
		break;
	case KCOLL_CU_ATTR_GPU_DIRECT_RDMA_SUPPORTED:
		v = fake.gdr;
		break;
	default:
		return KCOLL_CUDA_INVALID_VALUE;
	}
	if (v < 0)	/* an attribute this (old) driver does not know */
		return KCOLL_CUDA_INVALID_VALUE;
	*value = v;
	return KCOLL_CUDA_SUCCESS;
}

FAKE_EXPORT int cuDeviceTotalMem_v2(size_t *bytes, int dev)
{
	int err = check_dev(dev);

	if (!err)
		*bytes = (size_t)fake.mem_bytes;
	return err;
}

FAKE_EXPORT int cuDeviceGetPCIBusId(char *id, int len, int dev)
{
	int err = check_dev(dev);

	if (!err)
		snprintf(id, (size_t)len, "0000:%02x:00.0", 0x19 + dev);
	return err;
}

static const char *fake_error(int err, int name)
{
	switch (err) {
	case KCOLL_CUDA_SUCCESS:
		return name ? "CUDA_SUCCESS" : "no error";
	case KCOLL_CUDA_NO_DEVICE:
		return name ? "CUDA_ERROR_NO_DEVICE" : "no CUDA-capable device is detected";
	case KCOLL_CUDA_STUB_LIBRARY:
		return name ? "CUDA_ERROR_STUB_LIBRARY" : "CUDA driver is a stub library";
	case KCOLL_CUDA_SYSTEM_DRIVER_MISMATCH:
		return name ? "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"
			    : "system has unsupported display driver / cuda driver combination";
	case KCOLL_CUDA_INVALID_VALUE:
		return name ? "CUDA_ERROR_INVALID_VALUE" : "invalid argument";
	case KCOLL_CUDA_INVALID_HANDLE:
		return name ? "CUDA_ERROR_INVALID_HANDLE" : "invalid resource handle";
	case KCOLL_CUDA_NOT_FOUND:
		return name ? "CUDA_ERROR_NOT_FOUND" : "named symbol not found";
	case KCOLL_CUDA_NOT_SUPPORTED:
		return name ? "CUDA_ERROR_NOT_SUPPORTED" : "operation not supported";
	case KCOLL_CUDA_OPERATING_SYSTEM:
		return name ? "CUDA_ERROR_OPERATING_SYSTEM" : "OS call failed";
	default:
		return NULL;
	}
}

FAKE_EXPORT int cuGetErrorName(int err, const char **str)
{
	*str = fake_error(err, 1);
	return *str ? KCOLL_CUDA_SUCCESS : KCOLL_CUDA_INVALID_VALUE;
}

FAKE_EXPORT int cuGetErrorString(int err, const char **str)
{
	*str = fake_error(err, 0);
	return *str ? KCOLL_CUDA_SUCCESS : KCOLL_CUDA_INVALID_VALUE;
}

/*
 * The data path: allocations, IPC handles and dma-buf fds.
 *
 * "Device memory" is a memfd mapped at a fixed slot of an address range the
 * fake reserves once, so that freeing and allocating again reuses the address
 * like CUDA's allocator does (the freed-and-reused case of the tests). Every
 * allocation gets a new buffer id. An IPC handle names the maker's pid and
 * memfd; another process opens it through /proc/<pid>/fd/<fd> and maps it at
 * an address of its own, so the importer really translates addresses.
 */
#define FAKE_SLOTS	8
#define FAKE_SLOT_BYTES	(64ULL << 20)
#define FAKE_OPENED	64

static struct {
	unsigned long long base;	/* 0: free */
	size_t size;
	int fd;
	unsigned long long buffer_id;
} allocs[FAKE_SLOTS];
static struct {
	unsigned long long base;	/* 0: free */
	size_t size;
} opened[FAKE_OPENED];
static uint8_t *arena;
static unsigned long long next_buffer_id = 1;
static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;


static const char fake_magic[16] = "kcoll-fake-ipc";

struct fake_handle {	/* inside the 64-byte CUipcMemHandle */
	char magic[16];
	unsigned long long base;
	unsigned long long size;
	int pid;
	int fd;
	unsigned long long buffer_id;
	char pad[16];
};

struct fake_cu_ipc {
	char reserved[KCOLL_CU_IPC_HANDLE_SIZE];
};

FAKE_EXPORT void *kcoll_fake_cuda_alloc(size_t size)
{
	void *ret = NULL;

	if (!size || size > FAKE_SLOT_BYTES)
		return NULL;
	pthread_mutex_lock(&mem_lock);
	if (!arena) {
		void *a = mmap(NULL, FAKE_SLOTS * FAKE_SLOT_BYTES, PROT_NONE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		arena = a == MAP_FAILED ? NULL : a;
	}
	for (size_t i = 0; arena && i < FAKE_SLOTS; i++) {
		void *want = arena + i * FAKE_SLOT_BYTES, *p;
		int fd;

		if (allocs[i].base)
			continue;
		fd = memfd_create("kcoll-fake-device", MFD_CLOEXEC);
		if (fd < 0)
			break;
		if (ftruncate(fd, (off_t)size)) {
			close(fd);
			break;
		}
		p = mmap(want, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
		if (p == MAP_FAILED) {
			close(fd);
			break;
		}
		allocs[i].base = (uintptr_t)p;
		allocs[i].size = size;
		allocs[i].fd = fd;
		allocs[i].buffer_id = next_buffer_id++;
		ret = p;
		break;
	}
	pthread_mutex_unlock(&mem_lock);
	/* Like cudaMalloc: the allocating thread has the primary context. */
	if (ret)
		cur_ctx = &primary_ctx[0];
	return ret;
}

FAKE_EXPORT void kcoll_fake_cuda_free(void *p)
{
	pthread_mutex_lock(&mem_lock);
	for (size_t i = 0; i < FAKE_SLOTS; i++) {
		if (p && allocs[i].base == (uintptr_t)p) {
			/* Back to reserved address space: the slot's address is reused. */
			mmap(p, allocs[i].size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
			     MAP_NORESERVE, -1, 0);
			close(allocs[i].fd);
			allocs[i].base = 0;
		}
	}
	pthread_mutex_unlock(&mem_lock);
}

/* The allocation or opened mapping holding dptr; 0 when none. */
static int fake_find(unsigned long long dptr, unsigned long long *base, size_t *size,
		     unsigned long long *id)
{
	int found = 0;

	pthread_mutex_lock(&mem_lock);
	for (size_t i = 0; !found && i < FAKE_SLOTS; i++) {
		if (allocs[i].base && dptr >= allocs[i].base &&
		    dptr < allocs[i].base + allocs[i].size) {
			*base = allocs[i].base;
			*size = allocs[i].size;
			*id = allocs[i].buffer_id;
			found = 1;
		}
	}
	for (size_t i = 0; !found && i < FAKE_OPENED; i++) {
		if (opened[i].base && dptr >= opened[i].base &&
		    dptr < opened[i].base + opened[i].size) {
			*base = opened[i].base;
			*size = opened[i].size;
			*id = 0x8000000000000000ULL | i;
			found = 1;
		}
	}
	pthread_mutex_unlock(&mem_lock);
	return found;
}

FAKE_EXPORT int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size,
					unsigned long long dptr)
{
	unsigned long long id;

	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	return fake_find(dptr, base, size, &id) ? KCOLL_CUDA_SUCCESS : KCOLL_CUDA_NOT_FOUND;
}

FAKE_EXPORT int cuPointerGetAttribute(void *data, int attr, unsigned long long dptr)
{
	unsigned long long base, id;
	size_t size;

	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	if (!fake_find(dptr, &base, &size, &id))
		return KCOLL_CUDA_INVALID_VALUE;	/* host memory CUDA does not know */
	switch (attr) {
	case KCOLL_CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = KCOLL_CU_MEMORYTYPE_DEVICE;
		return KCOLL_CUDA_SUCCESS;
	case KCOLL_CU_POINTER_ATTRIBUTE_BUFFER_ID:
		*(unsigned long long *)data = id;
		return KCOLL_CUDA_SUCCESS;
	case KCOLL_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = 0;
		return KCOLL_CUDA_SUCCESS;
	default:
		return KCOLL_CUDA_INVALID_VALUE;
	}
}

FAKE_EXPORT int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
	int err = check_dev(dev);

	if (!err)
		*ctx = &primary_ctx[dev % (int)sizeof(primary_ctx)];
	return err;
}

FAKE_EXPORT int cuDevicePrimaryCtxRelease_v2(int dev)
{
	return check_dev(dev);
}

FAKE_EXPORT int cuCtxSetCurrent(void *ctx)
{
	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	if (ctx && ((char *)ctx < primary_ctx || (char *)ctx >= primary_ctx + sizeof(primary_ctx)))
		return KCOLL_CUDA_INVALID_CONTEXT;
	cur_ctx = ctx;
	return KCOLL_CUDA_SUCCESS;
}

FAKE_EXPORT int cuIpcGetMemHandle(struct fake_cu_ipc *handle, unsigned long long dptr)
{
	struct fake_handle h = { .base = dptr, .pid = (int)getpid(), .fd = -1 };
	unsigned long long base;
	size_t size;
	int err = cuMemGetAddressRange_v2(&base, &size, dptr);

	_Static_assert(sizeof(h) == sizeof(*handle), "fake handle size");
	if (err)
		return err;
	if (base != dptr)	/* CUDA wants the allocation's base */
		return KCOLL_CUDA_INVALID_VALUE;
	pthread_mutex_lock(&mem_lock);
	for (size_t i = 0; i < FAKE_SLOTS; i++) {
		if (allocs[i].base == base) {
			h.fd = allocs[i].fd;
			h.buffer_id = allocs[i].buffer_id;
		}
	}
	pthread_mutex_unlock(&mem_lock);
	if (h.fd < 0)	/* an opened mapping: CUDA does not re-export those either */
		return KCOLL_CUDA_INVALID_VALUE;
	memcpy(h.magic, fake_magic, sizeof(h.magic));
	h.size = size;
	memcpy(handle, &h, sizeof(h));
	return KCOLL_CUDA_SUCCESS;
}

FAKE_EXPORT int cuIpcOpenMemHandle_v2(unsigned long long *dptr, struct fake_cu_ipc handle,
				      unsigned int flags)
{
	struct fake_handle h;
	char path[64];
	struct stat st;
	void *p;
	int fd, err = KCOLL_CUDA_OUT_OF_MEMORY;

	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	if (!cur_ctx)
		return KCOLL_CUDA_INVALID_CONTEXT;
	memcpy(&h, &handle, sizeof(h));
	if (memcmp(h.magic, fake_magic, sizeof(h.magic)) ||
	    flags != KCOLL_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
		return KCOLL_CUDA_INVALID_VALUE;
	if (fake.ipc_open_result)
		return fake.ipc_open_result;
	if (h.pid == (int)getpid())
		return KCOLL_CUDA_INVALID_CONTEXT;	/* CUDA: not in the maker */
	/* The maker's memfd; gone (freed, process exited) = an invalid handle. */
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return KCOLL_CUDA_INVALID_HANDLE;
	if (fstat(fd, &st) || (unsigned long long)st.st_size != h.size) {
		close(fd);
		return KCOLL_CUDA_INVALID_HANDLE;
	}
	p = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return KCOLL_CUDA_OUT_OF_MEMORY;
	pthread_mutex_lock(&mem_lock);
	for (size_t i = 0; i < FAKE_OPENED; i++) {
		if (!opened[i].base) {
			opened[i].base = (uintptr_t)p;
			opened[i].size = h.size;
			*dptr = (uintptr_t)p;
			err = KCOLL_CUDA_SUCCESS;
			break;
		}
	}
	pthread_mutex_unlock(&mem_lock);
	if (err)
		munmap(p, h.size);
	return err;
}

FAKE_EXPORT int cuIpcCloseMemHandle(unsigned long long dptr)
{
	int err = KCOLL_CUDA_INVALID_VALUE;

	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	if (!cur_ctx)
		return KCOLL_CUDA_INVALID_CONTEXT;
	pthread_mutex_lock(&mem_lock);
	for (size_t i = 0; i < FAKE_OPENED; i++) {
		if (dptr && opened[i].base == dptr) {
			munmap((void *)(uintptr_t)dptr, opened[i].size);
			opened[i].base = 0;
			err = KCOLL_CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&mem_lock);
	return err;
}

FAKE_EXPORT int cuMemGetHandleForAddressRange(void *handle, unsigned long long dptr, size_t size,
					      int type, unsigned long long flags)
{
	unsigned long long base;
	size_t alloc;
	int err = cuMemGetAddressRange_v2(&base, &alloc, dptr);
	int fd;

	if (err)
		return err;
	if (type != KCOLL_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags ||
	    size > alloc - (dptr - base))
		return KCOLL_CUDA_INVALID_VALUE;
	if (fake.dmabuf_result)
		return fake.dmabuf_result;
	fd = memfd_create("kcoll-fake-dmabuf", MFD_CLOEXEC);
	if (fd < 0)
		return KCOLL_CUDA_OPERATING_SYSTEM;
	memcpy(handle, &fd, sizeof(fd));
	return KCOLL_CUDA_SUCCESS;
}

/*
 * The driver calls a program that holds device memory of its own makes
 * (tests/python/cuda_rank.py, through ctypes): allocate, copy in and out,
 * synchronize a stream. The same calls reach the real driver on a GPU.
 * Streams are always complete here; kcoll_fake_cuda_stream_syncs() counts
 * cuStreamSynchronize calls, so a test can tell that a consumer
 * synchronized the stream a producer named.
 */
static atomic_uint stream_syncs;

/* cuInit done and a context current on this thread, as these calls need. */
static int driver_ready(void)
{
	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	return cur_ctx ? KCOLL_CUDA_SUCCESS : KCOLL_CUDA_INVALID_CONTEXT;
}

FAKE_EXPORT int cuMemAlloc_v2(unsigned long long *dptr, size_t size)
{
	int err = driver_ready();
	void *p;

	if (err)
		return err;
	if (!size)
		return KCOLL_CUDA_INVALID_VALUE;
	p = kcoll_fake_cuda_alloc(size);
	if (!p)
		return KCOLL_CUDA_OUT_OF_MEMORY;
	*dptr = (uintptr_t)p;
	return KCOLL_CUDA_SUCCESS;
}

FAKE_EXPORT int cuMemFree_v2(unsigned long long dptr)
{
	unsigned long long base, id;
	size_t size;

	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	if (!fake_find(dptr, &base, &size, &id) || base != dptr || (id >> 63))
		return KCOLL_CUDA_INVALID_VALUE;
	kcoll_fake_cuda_free((void *)(uintptr_t)dptr);
	return KCOLL_CUDA_SUCCESS;
}

/* dptr .. dptr + len inside one allocation or opened mapping. */
static int fake_range(unsigned long long dptr, size_t len)
{
	unsigned long long base, id;
	size_t size;
	int err = driver_ready();

	if (err)
		return err;
	if (!fake_find(dptr, &base, &size, &id) || len > size - (dptr - base))
		return KCOLL_CUDA_INVALID_VALUE;
	return KCOLL_CUDA_SUCCESS;
}

FAKE_EXPORT int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t len)
{
	int err = fake_range(dst, len);

	if (!err)
		memcpy((void *)(uintptr_t)dst, src, len);
	return err;
}

FAKE_EXPORT int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t len)
{
	int err = fake_range(src, len);

	if (!err)
		memcpy(dst, (const void *)(uintptr_t)src, len);
	return err;
}

FAKE_EXPORT int cuStreamSynchronize(void *stream)
{
	int err = driver_ready();

	(void)stream;
	if (!err)
		atomic_fetch_add(&stream_syncs, 1);
	return err;
}

FAKE_EXPORT unsigned int kcoll_fake_cuda_stream_syncs(void)
{
	return atomic_load(&stream_syncs);
}
