// SPDX-License-Identifier: MIT
/* The fake CUDA driver of gpu/fake_cuda.h: the ten entry points gpu.c
 * resolves, and a kernels table whose functions all fail with -ENODEV. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "fake_cuda.h"
#include "kernels.h"

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

static int no_reduce_n(int dtype, int op, void *out, const void *const *in, unsigned int nin,
		       size_t count, void *stream)
{
	return -ENODEV;
}

static int no_set_device(int dev)
{
	return -ENODEV;
}

static int no_mem_alloc(void **ptr, size_t len)
{
	return -ENODEV;
}

static int no_mem_free(void *ptr)
{
	return -ENODEV;
}

static int no_copy(void *dst, const void *src, size_t len)
{
	return -ENODEV;
}

static int no_stream_sync(void *stream)
{
	return -ENODEV;
}

static const char *no_last_error(void)
{
	return "fake CUDA: no device";
}

FAKE_EXPORT struct kcoll_gpu_kernels kcoll_gpu_kernels_v1 = {
	.size = sizeof(struct kcoll_gpu_kernels),
	.version = KCOLL_GPU_KERNELS_VERSION,
	.runtime_version = 13000,
	.min_driver_version = 13000,
	.archs = "sm_80 sm_90 compute_90",
	.reduce_n = no_reduce_n,
	.set_device = no_set_device,
	.mem_alloc = no_mem_alloc,
	.mem_free = no_mem_free,
	.copy = no_copy,
	.stream_sync = no_stream_sync,
	.last_error = no_last_error,
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

/* The data path: allocations, IPC handles and dma-buf fds. */
static struct {
	unsigned long long base;
	size_t size;
} allocs[8];

static const char fake_magic[16] = "kcoll-fake-ipc";

struct fake_handle {	/* inside the 64-byte CUipcMemHandle */
	char magic[16];
	unsigned long long base;
	unsigned long long size;
	char pad[32];
};

struct fake_cu_ipc {
	char reserved[KCOLL_CU_IPC_HANDLE_SIZE];
};

FAKE_EXPORT void *kcoll_fake_cuda_alloc(size_t size)
{
	for (size_t i = 0; i < sizeof(allocs) / sizeof(allocs[0]); i++) {
		void *p;

		if (allocs[i].base)
			continue;
		if (posix_memalign(&p, 4096, size))
			return NULL;
		allocs[i].base = (uintptr_t)p;
		allocs[i].size = size;
		return p;
	}
	return NULL;
}

FAKE_EXPORT void kcoll_fake_cuda_free(void *p)
{
	for (size_t i = 0; i < sizeof(allocs) / sizeof(allocs[0]); i++) {
		if (p && allocs[i].base == (uintptr_t)p) {
			allocs[i].base = 0;
			free(p);
		}
	}
}

FAKE_EXPORT int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size,
					unsigned long long dptr)
{
	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	for (size_t i = 0; i < sizeof(allocs) / sizeof(allocs[0]); i++) {
		if (allocs[i].base && dptr >= allocs[i].base &&
		    dptr < allocs[i].base + allocs[i].size) {
			*base = allocs[i].base;
			*size = allocs[i].size;
			return KCOLL_CUDA_SUCCESS;
		}
	}
	return KCOLL_CUDA_NOT_FOUND;
}

FAKE_EXPORT int cuIpcGetMemHandle(struct fake_cu_ipc *handle, unsigned long long dptr)
{
	struct fake_handle h = { .base = dptr };
	unsigned long long base;
	size_t size;
	int err = cuMemGetAddressRange_v2(&base, &size, dptr);

	_Static_assert(sizeof(h) == sizeof(*handle), "fake handle size");
	if (err)
		return err;
	if (base != dptr)	/* CUDA wants the allocation's base */
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

	if (!initialized)
		return KCOLL_CUDA_NOT_INITIALIZED;
	memcpy(&h, &handle, sizeof(h));
	if (memcmp(h.magic, fake_magic, sizeof(h.magic)) ||
	    flags != KCOLL_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
		return KCOLL_CUDA_INVALID_VALUE;
	if (fake.ipc_open_result)
		return fake.ipc_open_result;
	*dptr = h.base;
	return KCOLL_CUDA_SUCCESS;
}

FAKE_EXPORT int cuIpcCloseMemHandle(unsigned long long dptr)
{
	return initialized && dptr ? KCOLL_CUDA_SUCCESS : KCOLL_CUDA_INVALID_VALUE;
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
