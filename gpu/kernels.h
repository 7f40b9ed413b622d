/* SPDX-License-Identifier: MIT */
/*
 * The interface of libkcoll_gpu.so (built from reduce.cu by nvcc), which
 * gpu.c dlopens: one versioned table, exported as KCOLL_GPU_KERNELS_SYMBOL.
 * The loader checks version and size before using it, so a library from
 * another kcoll build is refused with a message instead of crashing.
 * Rules: append fields only; bump the version for any other change.
 *
 * All functions return 0 or a negative errno (CUDA errors converted by
 * kcoll_cuda_errno); last_error() then names the CUDA error.
 * Valid C11 and CUDA C++.
 */
#ifndef KCOLL_GPU_KERNELS_H
#define KCOLL_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define KCOLL_GPU_KERNELS_SYMBOL	"kcoll_gpu_kernels_v1"
#define KCOLL_GPU_KERNELS_VERSION	1

/* Inputs passed in the kernel's parameters; more go through a device array. */
#define KCOLL_GPU_INLINE_INPUTS		64

struct kcoll_gpu_kernels {
	uint32_t size;			/* sizeof(struct kcoll_gpu_kernels) as built */
	uint32_t version;		/* KCOLL_GPU_KERNELS_VERSION */
	int runtime_version;		/* CUDART_VERSION it was built with, e.g. 13000 */
	int min_driver_version;		/* cuDriverGetVersion() it needs */
	const char *archs;		/* "sm_80 sm_90 compute_90": images it carries */

	/*
	 * out[i] = in[0][i] op ... op in[nin-1][i] on the current device, queued
	 * on stream (a cudaStream_t; NULL is the legacy default stream). in is a
	 * host array of device-accessible pointers; out may alias any in[].
	 * Semantics: gpu/reduce_core.h. -EINVAL for a bad dtype or op, nin == 0,
	 * or a NULL or not element-aligned pointer (the CPU path takes any
	 * alignment; a device fault would poison the context).
	 */
	int (*reduce_n)(int dtype, int op, void *out, const void *const *in, unsigned int nin,
			size_t count, void *stream);
	int (*set_device)(int dev);
	int (*mem_alloc)(void **ptr, size_t len);	/* device memory */
	int (*mem_free)(void *ptr);
	int (*copy)(void *dst, const void *src, size_t len);	/* any direction, synchronous */
	int (*stream_sync)(void *stream);
	/* The last CUDA error this thread saw in the library, as "name: text". */
	const char *(*last_error)(void);

	/*
	 * Streams, asynchronous copies, events and pinned host memory (appended:
	 * the loader refuses a table too small to hold them). All on the current
	 * device; a stream is a cudaStream_t, an event a cudaEvent_t.
	 */
	int (*stream_create)(void **stream);		/* non-blocking w.r.t. the legacy stream */
	int (*stream_destroy)(void *stream);
	/* Any direction (cudaMemcpyDefault), queued on stream; host memory should
	 * be pinned (host_alloc) for the copy to be truly asynchronous. */
	int (*copy_async)(void *dst, const void *src, size_t len, void *stream);
	int (*event_create)(void **event);		/* no timing */
	int (*event_destroy)(void *event);
	int (*event_record)(void *event, void *stream);
	int (*event_query)(void *event);		/* 0 done, -EAGAIN not yet */
	int (*event_sync)(void *event);
	int (*host_alloc)(void **ptr, size_t len);	/* pinned, usable from every context */
	int (*host_free)(void *ptr);
};

#endif /* KCOLL_GPU_KERNELS_H */
