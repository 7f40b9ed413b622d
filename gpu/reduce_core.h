/* SPDX-License-Identifier: MIT */
/*
 * The element-wise semantics of the GPU reductions, written once for both
 * sides: reduce.cu runs these functions on the device, tests/test_gpu.c runs
 * the very same ones on the host against kcoll_reduce_ref (user/common), so
 * the contract of user/common/reduce.h is checked even where no GPU exists.
 *
 *  - out[i] = in[0][i] op in[1][i] op ... op in[nin-1][i], strictly in input
 *    order (the accumulator is the left operand);
 *  - f16/bf16 widen to f32, combine in f32, round once to nearest-even; the
 *    conversions are done with integer code so that NaN payloads are kept
 *    (and made quiet) exactly like the CPU conversions, whatever the hardware
 *    conversion instructions would do;
 *  - integers travel in 64 bits: sum/prod wrap there and are truncated to the
 *    element width at the end, which equals wrapping at every step; avg sums
 *    in 64 bits and divides truncating toward zero (signed division for
 *    signed types); min/max compare the sign- or zero-extended values;
 *  - float avg is the sum divided by nin in the accumulator's precision;
 *  - min/max are (b < a ? b : a) and (b > a ? b : a), a the accumulator;
 *  - every NaN result leaves quiet, its payload kept.
 *
 * Valid C11 (gcc, clang) and CUDA C++. Called with constant dtype/op, every
 * switch folds away after inlining.
 */
#ifndef KCOLL_GPU_REDUCE_CORE_H
#define KCOLL_GPU_REDUCE_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <linux/kcoll.h>

#ifdef __CUDACC__
#define KCOLL_HD static __host__ __device__ __forceinline__
#else
#define KCOLL_HD static inline
#endif

/* The widened value of one element: f32/f16/bf16 in f, f64 in d, integers in u. */
union kcoll_acc {
	float f;
	double d;
	uint64_t u;
};

KCOLL_HD uint32_t kcoll_core_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

KCOLL_HD float kcoll_core_bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

KCOLL_HD uint64_t kcoll_core_f64_bits(double d)
{
	uint64_t u;

	memcpy(&u, &d, sizeof(u));
	return u;
}

/* Results leave with every NaN quiet (min/max may select a signaling one). */
KCOLL_HD uint32_t kcoll_core_quiet_f32(uint32_t x)
{
	return (x & 0x7fffffff) > 0x7f800000 ? x | 0x400000 : x;
}

KCOLL_HD uint64_t kcoll_core_quiet_f64(uint64_t x)
{
	return (x & 0x7fffffffffffffffULL) > 0x7ff0000000000000ULL ? x | 0x0008000000000000ULL : x;
}

KCOLL_HD float kcoll_core_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	uint32_t e = 113;	/* f32 biased exponent of a normalized f16 subnormal, before shifts */

	if (exp == 0x1f)	/* inf, or NaN with its payload kept and the quiet bit set */
		return kcoll_core_bits_f32(sign | 0x7f800000 | (man << 13) | (man ? 0x400000 : 0));
	if (exp)
		return kcoll_core_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
	if (!man)
		return kcoll_core_bits_f32(sign);
	while (!(man & 0x400)) {
		man <<= 1;
		e--;
	}
	return kcoll_core_bits_f32(sign | (e << 23) | ((man & 0x3ff) << 13));
}

/* Keep q's bits above 'shift', rounding the dropped ones to nearest-even. */
KCOLL_HD uint32_t kcoll_core_rne_shift(uint32_t q, unsigned int shift)
{
	uint32_t rem = q & ((1U << shift) - 1);
	uint32_t half = 1U << (shift - 1);

	q >>= shift;
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return q;
}

KCOLL_HD uint16_t kcoll_core_f32_to_f16(float f)
{
	uint32_t x = kcoll_core_f32_bits(f);
	uint32_t sign = (x >> 16) & 0x8000;
	uint32_t exp = (x >> 23) & 0xff;
	uint32_t man = x & 0x7fffff;
	int e = (int)exp - 112;	/* f16 biased exponent */

	if (exp == 0xff)
		return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
	if (e >= 31)
		return (uint16_t)(sign | 0x7c00);
	if (e <= 0) {
		/* below 2^-25 everything rounds to zero, ties included */
		if (e < -10)
			return (uint16_t)sign;
		/* an f16 subnormal (or, by carry, the smallest normal) */
		return (uint16_t)(sign | kcoll_core_rne_shift(man | 0x800000, (unsigned int)(14 - e)));
	}
	/* a carry out of the mantissa bumps the exponent, up to inf: still right */
	return (uint16_t)(sign | kcoll_core_rne_shift(((uint32_t)e << 23) | man, 13));
}

KCOLL_HD float kcoll_core_bf16_to_f32(uint16_t b)
{
	uint32_t x = (uint32_t)b << 16;

	if ((x & 0x7f800000) == 0x7f800000 && (x & 0x7fffff))
		x |= 0x400000;
	return kcoll_core_bits_f32(x);
}

KCOLL_HD uint16_t kcoll_core_f32_to_bf16(float f)
{
	uint32_t x = kcoll_core_f32_bits(f);

	if ((x & 0x7f800000) == 0x7f800000 && (x & 0x7fffff))
		return (uint16_t)((x >> 16) | 0x40);
	return (uint16_t)kcoll_core_rne_shift(x, 16);
}

KCOLL_HD int kcoll_core_valid(int dtype, int op)
{
	return dtype >= 0 && dtype < KCOLL_DTYPE_MAX && op >= 0 && op < KCOLL_REDOP_MAX;
}

KCOLL_HD size_t kcoll_core_size(int dtype)
{
	switch (dtype) {
	case KCOLL_F64:
	case KCOLL_I64:
	case KCOLL_U64:
		return 8;
	case KCOLL_F32:
	case KCOLL_I32:
	case KCOLL_U32:
		return 4;
	case KCOLL_F16:
	case KCOLL_BF16:
		return 2;
	default:
		return 1;
	}
}

KCOLL_HD int kcoll_core_signed(int dtype)
{
	return dtype == KCOLL_I8 || dtype == KCOLL_I32 || dtype == KCOLL_I64;
}

KCOLL_HD int kcoll_core_f32_like(int dtype)
{
	return dtype == KCOLL_F32 || dtype == KCOLL_F16 || dtype == KCOLL_BF16;
}

/* Element i of p, widened. */
KCOLL_HD union kcoll_acc kcoll_core_load(int dtype, const void *p, size_t i)
{
	union kcoll_acc a;

	switch (dtype) {
	case KCOLL_F32:
		a.f = ((const float *)p)[i];
		break;
	case KCOLL_F64:
		a.d = ((const double *)p)[i];
		break;
	case KCOLL_F16:
		a.f = kcoll_core_f16_to_f32(((const uint16_t *)p)[i]);
		break;
	case KCOLL_BF16:
		a.f = kcoll_core_bf16_to_f32(((const uint16_t *)p)[i]);
		break;
	case KCOLL_I8:
		a.u = (uint64_t)(int64_t)((const int8_t *)p)[i];
		break;
	case KCOLL_U8:
		a.u = ((const uint8_t *)p)[i];
		break;
	case KCOLL_I32:
		a.u = (uint64_t)(int64_t)((const int32_t *)p)[i];
		break;
	case KCOLL_U32:
		a.u = ((const uint32_t *)p)[i];
		break;
	default:
		a.u = ((const uint64_t *)p)[i];
		break;
	}
	return a;
}

/* a op b, a being the accumulator (the earlier inputs). */
KCOLL_HD union kcoll_acc kcoll_core_combine(int dtype, int op, union kcoll_acc a, union kcoll_acc b)
{
	if (kcoll_core_f32_like(dtype)) {
		switch (op) {
		case KCOLL_PROD:
			a.f = a.f * b.f;
			break;
		case KCOLL_MIN:
			a.f = b.f < a.f ? b.f : a.f;
			break;
		case KCOLL_MAX:
			a.f = b.f > a.f ? b.f : a.f;
			break;
		default:	/* sum, avg */
			a.f = a.f + b.f;
			break;
		}
	} else if (dtype == KCOLL_F64) {
		switch (op) {
		case KCOLL_PROD:
			a.d = a.d * b.d;
			break;
		case KCOLL_MIN:
			a.d = b.d < a.d ? b.d : a.d;
			break;
		case KCOLL_MAX:
			a.d = b.d > a.d ? b.d : a.d;
			break;
		default:
			a.d = a.d + b.d;
			break;
		}
	} else {
		int s = kcoll_core_signed(dtype);

		switch (op) {
		case KCOLL_PROD:
			a.u = a.u * b.u;
			break;
		case KCOLL_MIN:
			if (s ? (int64_t)b.u < (int64_t)a.u : b.u < a.u)
				a.u = b.u;
			break;
		case KCOLL_MAX:
			if (s ? (int64_t)b.u > (int64_t)a.u : b.u > a.u)
				a.u = b.u;
			break;
		default:
			a.u = a.u + b.u;
			break;
		}
	}
	return a;
}

/* Finish the reduction of nin inputs (avg divides) and store element i of p. */
KCOLL_HD void kcoll_core_store(int dtype, int op, void *p, size_t i, union kcoll_acc a,
			       unsigned int nin)
{
	if (op == KCOLL_AVG) {
		if (kcoll_core_f32_like(dtype))
			a.f = a.f / (float)nin;
		else if (dtype == KCOLL_F64)
			a.d = a.d / (double)nin;
		else if (kcoll_core_signed(dtype))
			a.u = (uint64_t)((int64_t)a.u / (int64_t)nin);
		else
			a.u = a.u / nin;
	}
	switch (dtype) {
	case KCOLL_F32:
		((uint32_t *)p)[i] = kcoll_core_quiet_f32(kcoll_core_f32_bits(a.f));
		break;
	case KCOLL_F64:
		((uint64_t *)p)[i] = kcoll_core_quiet_f64(kcoll_core_f64_bits(a.d));
		break;
	case KCOLL_F16:
		((uint16_t *)p)[i] = kcoll_core_f32_to_f16(a.f);
		break;
	case KCOLL_BF16:
		((uint16_t *)p)[i] = kcoll_core_f32_to_bf16(a.f);
		break;
	case KCOLL_I8:
	case KCOLL_U8:
		((uint8_t *)p)[i] = (uint8_t)a.u;
		break;
	case KCOLL_I32:
	case KCOLL_U32:
		((uint32_t *)p)[i] = (uint32_t)a.u;
		break;
	default:
		((uint64_t *)p)[i] = a.u;
		break;
	}
}

/* One output element; out may alias any in[] (element i is read before written). */
KCOLL_HD void kcoll_core_reduce_elem(int dtype, int op, void *out, const void *const *in,
				     unsigned int nin, size_t i)
{
	union kcoll_acc acc = kcoll_core_load(dtype, in[0], i);

	for (unsigned int k = 1; k < nin; k++)
		acc = kcoll_core_combine(dtype, op, acc, kcoll_core_load(dtype, in[k], i));
	kcoll_core_store(dtype, op, out, i, acc, nin);
}

#endif /* KCOLL_GPU_REDUCE_CORE_H */
