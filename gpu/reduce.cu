// SPDX-License-Identifier: MIT
/*
 * libkcoll_gpu.so: element-wise N-input reductions on the GPU for every kcoll
 * dtype x op, with the semantics of user/common/reduce.h. The per-element
 * arithmetic is gpu/reduce_core.h, shared with the host-side tests; this file
 * adds the launch: 16-byte vector loads when every pointer is 16-byte
 * aligned, a scalar kernel otherwise, grid-stride loops in both.
 *
 * The library is loaded by gpu/gpu.c with dlopen and exports only
 * kcoll_gpu_reduce_n and the table kcoll_gpu_kernels_v1 (libkcoll_gpu.map);
 * cudart is linked statically so that nothing but the driver is needed.
 * Every CUDA error is converted to a negative errno here, at the boundary.
 */
#include <cuda_runtime.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_abi.h"
#include "kernels.h"
#include "reduce_core.h"

#ifndef KCOLL_GPU_ARCHS
#error "build.mk passes -DKCOLL_GPU_ARCHS=\"...\" (the -gencode targets)"
#endif

#define KCOLL_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr unsigned int kThreads = 256;
/* Enough blocks to fill any current GPU several times over; the grid-stride
 * loops cover the rest. */
constexpr size_t kMaxBlocks = 8192;

struct reduce_args {
	void *out;
	const void *in[KCOLL_GPU_INLINE_INPUTS];
	const void *const *in_dev;	/* device copy of in[] when nin > KCOLL_GPU_INLINE_INPUTS */
	unsigned int nin;
	size_t count;
	size_t nvec;			/* whole 16-byte vectors (vector kernel only) */
};

thread_local char last_err[192];

int fail(cudaError_t e, const char *what)
{
	snprintf(last_err, sizeof(last_err), "%s: %s: %s", what, cudaGetErrorName(e),
		 cudaGetErrorString(e));
	return kcoll_cuda_errno((int)e);
}

__host__ __device__ constexpr int elem_size(int dtype)
{
	return dtype == KCOLL_F64 || dtype == KCOLL_I64 || dtype == KCOLL_U64	? 8
	       : dtype == KCOLL_F32 || dtype == KCOLL_I32 || dtype == KCOLL_U32 ? 4
	       : dtype == KCOLL_F16 || dtype == KCOLL_BF16			? 2
										: 1;
}

__device__ __forceinline__ const void *const *inputs(const reduce_args &a)
{
	return a.in_dev ? a.in_dev : a.in;
}

/* One 16-byte vector of any element type, in registers. */
union vec16 {
	uint4 v;
	unsigned char b[16];
};

template <int DT, int OP>
__global__ void __launch_bounds__(kThreads) reduce_vec(const __grid_constant__ reduce_args a)
{
	constexpr int V = 16 / elem_size(DT);
	const void *const *in = inputs(a);
	size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t j = t; j < a.nvec; j += stride) {
		union kcoll_acc acc[V];
		vec16 x;

		x.v = static_cast<const uint4 *>(in[0])[j];
#pragma unroll
		for (int e = 0; e < V; e++)
			acc[e] = kcoll_core_load(DT, x.b, e);
		for (unsigned int k = 1; k < a.nin; k++) {
			x.v = static_cast<const uint4 *>(in[k])[j];
#pragma unroll
			for (int e = 0; e < V; e++)
				acc[e] = kcoll_core_combine(DT, OP, acc[e], kcoll_core_load(DT, x.b, e));
		}
#pragma unroll
		for (int e = 0; e < V; e++)
			kcoll_core_store(DT, OP, x.b, e, acc[e], a.nin);
		static_cast<uint4 *>(a.out)[j] = x.v;
	}
	/* the last count % V elements */
	if (t < a.count - a.nvec * V)
		kcoll_core_reduce_elem(DT, OP, a.out, in, a.nin, a.nvec * V + t);
}

template <int DT, int OP>
__global__ void __launch_bounds__(kThreads) reduce_scalar(const __grid_constant__ reduce_args a)
{
	const void *const *in = inputs(a);
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.count; i += stride)
		kcoll_core_reduce_elem(DT, OP, a.out, in, a.nin, i);
}

unsigned int blocks_for(size_t work)
{
	size_t b = (work + kThreads - 1) / kThreads;

	return (unsigned int)(b < kMaxBlocks ? b : kMaxBlocks);
}

template <int DT, int OP>
int launch(const reduce_args &a, bool vec, cudaStream_t s)
{
	constexpr size_t V = 16 / elem_size(DT);

	if (vec) {
		size_t tail = a.count - a.nvec * V;

		reduce_vec<DT, OP><<<blocks_for(a.nvec > tail ? a.nvec : tail), kThreads, 0, s>>>(a);
	} else {
		reduce_scalar<DT, OP><<<blocks_for(a.count), kThreads, 0, s>>>(a);
	}
	cudaError_t e = cudaGetLastError();
	return e == cudaSuccess ? 0 : fail(e, "reduce kernel launch");
}

template <int DT>
int launch_op(int op, const reduce_args &a, bool vec, cudaStream_t s)
{
	switch (op) {
	case KCOLL_SUM:
		return launch<DT, KCOLL_SUM>(a, vec, s);
	case KCOLL_PROD:
		return launch<DT, KCOLL_PROD>(a, vec, s);
	case KCOLL_MIN:
		return launch<DT, KCOLL_MIN>(a, vec, s);
	case KCOLL_MAX:
		return launch<DT, KCOLL_MAX>(a, vec, s);
	default:
		return launch<DT, KCOLL_AVG>(a, vec, s);
	}
}

int launch_dtype(int dtype, int op, const reduce_args &a, bool vec, cudaStream_t s)
{
	switch (dtype) {
	case KCOLL_F32:
		return launch_op<KCOLL_F32>(op, a, vec, s);
	case KCOLL_F64:
		return launch_op<KCOLL_F64>(op, a, vec, s);
	case KCOLL_F16:
		return launch_op<KCOLL_F16>(op, a, vec, s);
	case KCOLL_BF16:
		return launch_op<KCOLL_BF16>(op, a, vec, s);
	case KCOLL_I8:
		return launch_op<KCOLL_I8>(op, a, vec, s);
	case KCOLL_U8:
		return launch_op<KCOLL_U8>(op, a, vec, s);
	case KCOLL_I32:
		return launch_op<KCOLL_I32>(op, a, vec, s);
	case KCOLL_U32:
		return launch_op<KCOLL_U32>(op, a, vec, s);
	case KCOLL_I64:
		return launch_op<KCOLL_I64>(op, a, vec, s);
	default:
		return launch_op<KCOLL_U64>(op, a, vec, s);
	}
}

int set_device(int dev)
{
	cudaError_t e = cudaSetDevice(dev);

	return e == cudaSuccess ? 0 : fail(e, "cudaSetDevice");
}

int mem_alloc(void **ptr, size_t len)
{
	cudaError_t e = cudaMalloc(ptr, len);

	return e == cudaSuccess ? 0 : fail(e, "cudaMalloc");
}

int mem_free(void *ptr)
{
	cudaError_t e = cudaFree(ptr);

	return e == cudaSuccess ? 0 : fail(e, "cudaFree");
}

int copy(void *dst, const void *src, size_t len)
{
	cudaError_t e = cudaMemcpy(dst, src, len, cudaMemcpyDefault);

	return e == cudaSuccess ? 0 : fail(e, "cudaMemcpy");
}

int stream_sync(void *stream)
{
	cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));

	return e == cudaSuccess ? 0 : fail(e, "cudaStreamSynchronize");
}

int stream_create(void **stream)
{
	cudaError_t e = cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t *>(stream),
						  cudaStreamNonBlocking);

	return e == cudaSuccess ? 0 : fail(e, "cudaStreamCreateWithFlags");
}

int stream_destroy(void *stream)
{
	cudaError_t e = cudaStreamDestroy(static_cast<cudaStream_t>(stream));

	return e == cudaSuccess ? 0 : fail(e, "cudaStreamDestroy");
}

int copy_async(void *dst, const void *src, size_t len, void *stream)
{
	cudaError_t e = cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault,
					static_cast<cudaStream_t>(stream));

	return e == cudaSuccess ? 0 : fail(e, "cudaMemcpyAsync");
}

int event_create(void **event)
{
	cudaError_t e = cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t *>(event),
						 cudaEventDisableTiming);

	return e == cudaSuccess ? 0 : fail(e, "cudaEventCreateWithFlags");
}

int event_destroy(void *event)
{
	cudaError_t e = cudaEventDestroy(static_cast<cudaEvent_t>(event));

	return e == cudaSuccess ? 0 : fail(e, "cudaEventDestroy");
}

int event_record(void *event, void *stream)
{
	cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(event),
					static_cast<cudaStream_t>(stream));

	return e == cudaSuccess ? 0 : fail(e, "cudaEventRecord");
}

int event_query(void *event)
{
	cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));

	if (e == cudaErrorNotReady)
		return -EAGAIN;
	return e == cudaSuccess ? 0 : fail(e, "cudaEventQuery");
}

int event_sync(void *event)
{
	cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(event));

	return e == cudaSuccess ? 0 : fail(e, "cudaEventSynchronize");
}

int host_alloc(void **ptr, size_t len)
{
	cudaError_t e = cudaHostAlloc(ptr, len, cudaHostAllocPortable);

	return e == cudaSuccess ? 0 : fail(e, "cudaHostAlloc");
}

int host_free(void *ptr)
{
	cudaError_t e = cudaFreeHost(ptr);

	return e == cudaSuccess ? 0 : fail(e, "cudaFreeHost");
}

const char *last_error(void)
{
	return last_err;
}

} // namespace

KCOLL_EXPORT int kcoll_gpu_reduce_n(int dtype, int op, void *out, const void *const *in,
				    unsigned int nin, size_t count, void *stream)
{
	cudaStream_t s = static_cast<cudaStream_t>(stream);
	size_t esize = kcoll_core_size(dtype);
	const void **in_dev = nullptr;
	reduce_args a;
	bool aligned;
	int rc;

	if (!kcoll_core_valid(dtype, op) || !nin || !out || !in)
		return -EINVAL;
	/* Unlike the CPU path, elements must be naturally aligned: a misaligned
	 * access would be a sticky fault that ruins the CUDA context. */
	if (reinterpret_cast<uintptr_t>(out) & (esize - 1))
		return -EINVAL;
	aligned = !(reinterpret_cast<uintptr_t>(out) & 15);
	for (unsigned int k = 0; k < nin; k++) {
		if (!in[k] || reinterpret_cast<uintptr_t>(in[k]) & (esize - 1))
			return -EINVAL;
		aligned = aligned && !(reinterpret_cast<uintptr_t>(in[k]) & 15);
	}
	if (!count)
		return 0;
	if (count > SIZE_MAX / esize)
		return -EOVERFLOW;

	memset(&a, 0, sizeof(a));
	a.out = out;
	a.nin = nin;
	a.count = count;
	a.nvec = aligned ? count / (16 / esize) : 0;
	if (nin <= KCOLL_GPU_INLINE_INPUTS) {
		memcpy(a.in, in, nin * sizeof(*in));
	} else {
		/* Stream-ordered, so it lives exactly as long as the kernel needs it;
		 * a pageable source is staged before cudaMemcpyAsync returns. */
		cudaError_t e = cudaMallocAsync(reinterpret_cast<void **>(&in_dev), nin * sizeof(*in), s);

		if (e != cudaSuccess)
			return fail(e, "cudaMallocAsync");
		e = cudaMemcpyAsync(in_dev, in, nin * sizeof(*in), cudaMemcpyHostToDevice, s);
		if (e != cudaSuccess) {
			rc = fail(e, "cudaMemcpyAsync");
			goto err_free_inputs;
		}
		a.in_dev = in_dev;
	}

	rc = launch_dtype(dtype, op, a, aligned, s);

err_free_inputs:
	if (in_dev) {
		cudaError_t e = cudaFreeAsync(in_dev, s);

		if (e != cudaSuccess && !rc)
			rc = fail(e, "cudaFreeAsync");
	}
	return rc;
}

KCOLL_EXPORT const struct kcoll_gpu_kernels kcoll_gpu_kernels_v1 = {
	sizeof(struct kcoll_gpu_kernels),
	KCOLL_GPU_KERNELS_VERSION,
	CUDART_VERSION,
	/* minor-version compatibility: any driver of the same major release */
	CUDART_VERSION / 1000 * 1000,
	KCOLL_GPU_ARCHS,
	kcoll_gpu_reduce_n,
	set_device,
	mem_alloc,
	mem_free,
	copy,
	stream_sync,
	last_error,
	stream_create,
	stream_destroy,
	copy_async,
	event_create,
	event_destroy,
	event_record,
	event_query,
	event_sync,
	host_alloc,
	host_free,
};
