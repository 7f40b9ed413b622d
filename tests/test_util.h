/* SPDX-License-Identifier: MIT */
/*
 * What the collective tests (test_coll.c, mh_rank.c, test_gpu_ring.c,
 * test_gpu.c) share: a 64-bit finalizer (splitmix64's) that turns (case,
 * rank, element) into reproducible input and a fill of any dtype from it;
 * each collective's buffer sizes, its expected result by the scalar
 * reference, the in-place operand layout (NCCL's) and one submission; the
 * buffers of the daemon tests (shared memory or heap); errno names (also
 * for test_faults.c); and the ASan/LSan defaults of a program that loads
 * CUDA.
 */
#ifndef KCOLL_TESTS_TEST_UTIL_H
#define KCOLL_TESTS_TEST_UTIL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kcoll/kcoll.h>

#include "reduce.h"

static inline uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	return x ^ (x >> 33);
}

/*
 * Element i of rank's input to case salt: floats k / div with k uniform in
 * [-range, range] (f64 holds a third of that, f16 a further 1/f16_div so it
 * stays in f16's range); integers take the hash's low bits (wrap-around).
 */
static inline void fill_range(void *buf, int dtype, size_t count, int rank, int salt,
			      uint64_t range, double div, double f16_div)
{
	for (size_t i = 0; i < count; i++) {
		uint64_t h = mix(((uint64_t)salt << 40) ^ ((uint64_t)rank << 32) ^ i);
		double f = ((int64_t)(h % (2 * range + 1)) - (int64_t)range) / div;

		switch (dtype) {
		case KCOLL_F32: ((float *)buf)[i] = (float)f; break;
		case KCOLL_F64: ((double *)buf)[i] = f / 3.0; break;
		case KCOLL_F16: ((uint16_t *)buf)[i] = kcoll_f32_to_f16((float)(f / f16_div)); break;
		case KCOLL_BF16: ((uint16_t *)buf)[i] = kcoll_f32_to_bf16((float)f); break;
		case KCOLL_I8: case KCOLL_U8: ((uint8_t *)buf)[i] = h; break;
		case KCOLL_I32: case KCOLL_U32: ((uint32_t *)buf)[i] = h; break;
		default: ((uint64_t *)buf)[i] = h; break;
		}
	}
}

/* A negative errno's name ("ECONNRESET"), "0", or "?" for an unknown one. */
static inline const char *en(int e)
{
	const char *n;

	if (e == 0)
		return "0";
	n = e < 0 ? strerrorname_np(-e) : NULL;
	return n ? n : "?";
}

/* Submit one collective; broadcast's one buffer is recv (the root's holds the data). */
static inline int submit_coll(struct kcoll_comm *c, int opcode, const void *send, void *recv,
			      size_t count, int dtype, int op, int root, struct kcoll_req **req)
{
	switch (opcode) {
	case KCOLL_OP_ALLREDUCE:
		return kcoll_allreduce(c, send, recv, count, dtype, op, req);
	case KCOLL_OP_REDUCE_SCATTER:
		return kcoll_reduce_scatter(c, send, recv, count, dtype, op, req);
	case KCOLL_OP_ALLGATHER:
		return kcoll_allgather(c, send, recv, count, dtype, req);
	default:
		return kcoll_broadcast(c, recv, count, dtype, root, req);
	}
}

/* Elements in a rank's send / receive buffer of a collective among n ranks. */
static inline size_t coll_send_count(int opcode, size_t count, int n)
{
	return opcode == KCOLL_OP_REDUCE_SCATTER ? count * n : count;
}

static inline size_t coll_recv_count(int opcode, size_t count, int n)
{
	return opcode == KCOLL_OP_ALLGATHER ? count * n : count;
}

/*
 * What 'rank' must receive (into exp) when rank r sent ins[r], by the scalar
 * reference; broadcast (any other opcode) is the root's input. Returns
 * kcoll_reduce_ref's result for reductions, else 0.
 */
static inline int coll_expected(int opcode, int dtype, int op, size_t count, int root, int n,
				int rank, uint8_t *const *ins, uint8_t *exp)
{
	size_t esz = kcoll_dtype_size(dtype);
	const void *in[n];

	switch (opcode) {
	case KCOLL_OP_ALLREDUCE:
		for (int r = 0; r < n; r++)
			in[r] = ins[r];
		return kcoll_reduce_ref(dtype, op, exp, in, n, count);
	case KCOLL_OP_REDUCE_SCATTER:
		for (int r = 0; r < n; r++)
			in[r] = ins[r] + (size_t)rank * count * esz;
		return kcoll_reduce_ref(dtype, op, exp, in, n, count);
	case KCOLL_OP_ALLGATHER:
		for (int r = 0; r < n; r++)
			memcpy(exp + (size_t)r * count * esz, ins[r], count * esz);
		return 0;
	default:
		memcpy(exp, ins[root], count * esz);
		return 0;
	}
}

/* Buffers of the daemon tests: kcoll_mem_alloc'd shared memory or the heap. */
enum mem { MEM_SHM, MEM_HOST };

static inline int alloc(struct kcoll *k, int mem, size_t bytes, void **p)
{
	bytes = bytes ? bytes : 1;
	if (mem == MEM_SHM)
		return kcoll_mem_alloc(k, bytes, p);
	*p = malloc(bytes);
	return *p ? 0 : -ENOMEM;
}

static inline void release(struct kcoll *k, int mem, void *p)
{
	if (mem == MEM_SHM)
		kcoll_mem_free(k, p);
	else
		free(p);
}

/*
 * One rank's operands: *sbuf and *rbuf start at its send and receive
 * allocations (*rraw the latter); its input `in` (sbytes) is copied where
 * the op reads it. In place per NCCL the operand already sits where the
 * result goes; for reduce-scatter that is recv = send + rank * count, so the
 * receive allocation is released (*rraw NULL). Broadcast has one buffer: the
 * root's holds the data, the others receive into theirs.
 */
static inline void coll_place(struct kcoll *k, int mem, int opcode, int inplace, int rank, int root,
			      size_t count, size_t esz, const void *in, size_t sbytes,
			      uint8_t **sbuf, uint8_t **rbuf, uint8_t **rraw)
{
	if (inplace) {
		switch (opcode) {
		case KCOLL_OP_ALLREDUCE:
		case KCOLL_OP_BROADCAST:
			memcpy(*rbuf, in, sbytes);
			*sbuf = *rbuf;
			break;
		case KCOLL_OP_REDUCE_SCATTER:
			release(k, mem, *rraw);
			*rraw = NULL;
			memcpy(*sbuf, in, sbytes);
			*rbuf = *sbuf + rank * count * esz;
			break;
		case KCOLL_OP_ALLGATHER:
			memcpy(*rbuf + rank * count * esz, in, sbytes);
			*sbuf = *rbuf + rank * count * esz;
			break;
		}
	} else {
		memcpy(*sbuf, in, sbytes);
		if (opcode == KCOLL_OP_BROADCAST && rank != root)
			*sbuf = *rbuf;
		else if (opcode == KCOLL_OP_BROADCAST)
			*rbuf = *sbuf;
	}
}

/*
 * CUDA under ASan needs the shadow gap mapped; the driver's own allocations
 * are not ours to leak-check. Used only by ASan builds; one use per program.
 */
#define TEST_CUDA_SAN_DEFAULTS						\
	const char *__asan_default_options(void);			\
	const char *__asan_default_options(void)			\
	{								\
		return "protect_shadow_gap=0";				\
	}								\
	const char *__lsan_default_suppressions(void);			\
	const char *__lsan_default_suppressions(void)			\
	{								\
		return "leak:libcuda.so\nleak:libkcoll_gpu.so\n";	\
	}

#endif
