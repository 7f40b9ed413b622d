/* SPDX-License-Identifier: MIT */
/*
 * A stand-in for libcuda.so.1, and for libkcoll_gpu.so (it exports the kernels
 * table too, with functions that only fail), that tests/test_gpu.c points the
 * loader at, so that the loader's and the doctor's branches run without a GPU
 * or nvcc. Built
 * by gpu/build.mk as $(TBIN)/fixtures/libcuda-fake.so; never installed.
 * The test dlopens the same file, calls kcoll_fake_cuda_set, then has the
 * loader open it: both see one instance.
 */
#ifndef KCOLL_GPU_FAKE_CUDA_H
#define KCOLL_GPU_FAKE_CUDA_H

#include <stddef.h>

struct kcoll_fake_cuda {
	int init_result;		/* what cuInit returns (a CUresult) */
	int driver_version;		/* cuDriverGetVersion */
	int ndev;
	int cc_major, cc_minor;
	int dmabuf, gdr;		/* attribute values; -1: the query fails (old driver) */
	unsigned long long mem_bytes;
	/* the kernels table it exports */
	unsigned int kernels_version;
	int min_driver_version;
	const char *archs;		/* must outlive the loader's use */
	/* data path: what cuIpcOpenMemHandle_v2 / cuMemGetHandleForAddressRange return */
	int ipc_open_result;
	int dmabuf_result;
};

void kcoll_fake_cuda_set(const struct kcoll_fake_cuda *cfg);
/*
 * "Device memory": page-aligned host memory the fake's cuMemGetAddressRange
 * and IPC calls know (at most 8 at once). An opened IPC handle yields the same
 * address, which a fork()ed child can read.
 */
void *kcoll_fake_cuda_alloc(size_t size);
void kcoll_fake_cuda_free(void *p);
/*
 * It also answers the driver calls of a program that holds device memory
 * of its own (cuMemAlloc_v2, cuMemFree_v2, cuMemcpyHtoD_v2/DtoH_v2,
 * cuStreamSynchronize), and counts the stream synchronizations.
 */
unsigned int kcoll_fake_cuda_stream_syncs(void);

#endif /* KCOLL_GPU_FAKE_CUDA_H */
