// SPDX-License-Identifier: MIT
/*
 * The scalar reference reduction and the f16/bf16 conversions.
 *
 * Written for obviousness, not speed: one element at a time, branches where
 * the format has cases. kcoll_reduce_n (reduce.c) must match it bit for bit;
 * tests/test_reduce.c checks that for every implementation.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "reduce.h"

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Shift right by sh (1..31), rounding to nearest, ties to even. */
static uint32_t shift_rne(uint32_t v, unsigned int sh)
{
	uint32_t q = v >> sh;
	uint32_t rem = v & ((1u << sh) - 1);
	uint32_t half = 1u << (sh - 1);

	if (rem > half || (rem == half && (q & 1)))
		q++;
	return q;
}

float kcoll_f16_to_f32(unsigned short h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;

	if (exp == 0x1f)	/* inf, or NaN made quiet */
		return bits_f32(sign | 0x7f800000 | man << 13 | (man ? 0x400000 : 0));
	if (exp == 0) {		/* zero or subnormal: normalize into an f32 */
		int e = 127 - 15 + 1;

		if (!man)
			return bits_f32(sign);
		while (!(man & 0x400)) {
			man <<= 1;
			e--;
		}
		return bits_f32(sign | (uint32_t)e << 23 | (man & 0x3ff) << 13);
	}
	return bits_f32(sign | (exp + 127 - 15) << 23 | man << 13);
}

unsigned short kcoll_f32_to_f16(float f)
{
	uint32_t u = f32_bits(f);
	uint16_t sign = (u >> 16) & 0x8000;
	int exp = (u >> 23) & 0xff;
	uint32_t man = u & 0x7fffff;
	int e = exp - 127 + 15;	/* the f16 exponent field, if the result is normal */

	if (exp == 0xff)	/* inf, or NaN: keep the top payload bits, quiet */
		return sign | 0x7c00 | (man ? 0x200 | man >> 13 : 0);
	if (e >= 0x1f)
		return sign | 0x7c00;
	if (e <= 0) {
		/* f16 subnormal: value * 2^24 = (1.man) * 2^(exp - 103), a right shift */
		unsigned int sh = 126 - exp;

		if (exp == 0 || sh > 24)	/* below half the smallest subnormal */
			return sign;
		return sign | shift_rne(man | 0x800000, sh);	/* may carry into the min normal */
	}
	/* normal; a carry out of the mantissa bumps the exponent, up to inf */
	return sign | shift_rne((uint32_t)e << 23 | man, 13);
}

float kcoll_bf16_to_f32(unsigned short b)
{
	uint32_t u = (uint32_t)b << 16;

	if ((u & 0x7f800000) == 0x7f800000 && (u & 0x7fffff))
		u |= 0x400000;	/* NaN made quiet */
	return bits_f32(u);
}

unsigned short kcoll_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7f800000) == 0x7f800000 && (u & 0x7fffff))
		return (u >> 16) | 0x40;	/* NaN: truncate, quiet */
	return shift_rne(u, 16);	/* a carry may reach inf: correct for RNE */
}

static size_t dtype_size(enum kcoll_dtype dtype)
{
	switch (dtype) {
	case KCOLL_I8: case KCOLL_U8: return 1;
	case KCOLL_F16: case KCOLL_BF16: return 2;
	case KCOLL_F32: case KCOLL_I32: case KCOLL_U32: return 4;
	default: return 8;
	}
}

/* One element, any alignment. */
static void load(void *v, const void *base, size_t i, size_t size)
{
	memcpy(v, (const char *)base + i * size, size);
}

static void store(void *base, size_t i, const void *v, size_t size)
{
	memcpy((char *)base + i * size, v, size);
}

static float load_f32(enum kcoll_dtype dtype, const void *p, size_t i)
{
	uint16_t h;
	float f;

	if (dtype == KCOLL_F32) {
		load(&f, p, i, 4);
		return f;
	}
	load(&h, p, i, 2);
	return dtype == KCOLL_F16 ? kcoll_f16_to_f32(h) : kcoll_bf16_to_f32(h);
}

/* Results leave with every NaN quiet (f16/bf16: by the conversions). */
static void store_f32(enum kcoll_dtype dtype, void *p, size_t i, float f)
{
	uint32_t u = f32_bits(f);
	uint16_t h;

	if (dtype == KCOLL_F32) {
		if (isnan(f))
			u |= 0x400000;
		store(p, i, &u, 4);
		return;
	}
	h = dtype == KCOLL_F16 ? kcoll_f32_to_f16(f) : kcoll_f32_to_bf16(f);
	store(p, i, &h, 2);
}

static float op_f32(enum kcoll_redop op, float a, float b)
{
	switch (op) {
	case KCOLL_SUM: case KCOLL_AVG: return a + b;
	case KCOLL_PROD: return a * b;
	case KCOLL_MIN: return b < a ? b : a;
	default: return b > a ? b : a;
	}
}

static double op_f64(enum kcoll_redop op, double a, double b)
{
	switch (op) {
	case KCOLL_SUM: case KCOLL_AVG: return a + b;
	case KCOLL_PROD: return a * b;
	case KCOLL_MIN: return b < a ? b : a;
	default: return b > a ? b : a;
	}
}

static int is_signed(enum kcoll_dtype dtype)
{
	return dtype == KCOLL_I8 || dtype == KCOLL_I32 || dtype == KCOLL_I64;
}

/* An integer element widened to 64 bits: sign-extended for signed types. */
static uint64_t load_int(enum kcoll_dtype dtype, const void *p, size_t i)
{
	int8_t s8;
	int32_t s32;
	uint8_t u8;
	uint32_t u32;
	uint64_t u64;

	switch (dtype) {
	case KCOLL_I8: load(&s8, p, i, 1); return (uint64_t)(int64_t)s8;
	case KCOLL_U8: load(&u8, p, i, 1); return u8;
	case KCOLL_I32: load(&s32, p, i, 4); return (uint64_t)(int64_t)s32;
	case KCOLL_U32: load(&u32, p, i, 4); return u32;
	default: load(&u64, p, i, 8); return u64;
	}
}

/* The low bytes of v (little-endian or not). */
static void store_int(enum kcoll_dtype dtype, void *p, size_t i, uint64_t v)
{
	uint8_t u8 = (uint8_t)v;
	uint32_t u32 = (uint32_t)v;

	switch (dtype_size(dtype)) {
	case 1: store(p, i, &u8, 1); break;
	case 4: store(p, i, &u32, 4); break;
	default: store(p, i, &v, 8); break;
	}
}

/*
 * Integer ops on 64-bit widened values: sum and prod wrap modulo 2^64, which
 * truncates to the right answer modulo 2^8 or 2^32; min/max compare the
 * widened values with the element type's signedness.
 */
static uint64_t op_int(enum kcoll_dtype dtype, enum kcoll_redop op, uint64_t a, uint64_t b)
{
	int sgn = is_signed(dtype);

	switch (op) {
	case KCOLL_SUM: case KCOLL_AVG: return a + b;
	case KCOLL_PROD: return a * b;
	case KCOLL_MIN: return (sgn ? (int64_t)b < (int64_t)a : b < a) ? b : a;
	default: return (sgn ? (int64_t)b > (int64_t)a : b > a) ? b : a;
	}
}

int kcoll_reduce_ref(enum kcoll_dtype dtype, enum kcoll_redop op, void *out,
		     const void *const *in, unsigned int nin, size_t count)
{
	size_t i;
	unsigned int k;

	if ((unsigned int)dtype >= KCOLL_DTYPE_MAX || (unsigned int)op >= KCOLL_REDOP_MAX || !nin)
		return -EINVAL;
	for (i = 0; i < count; i++) {
		if (dtype == KCOLL_F64) {
			double a, b;
			uint64_t bits;

			load(&a, in[0], i, 8);
			for (k = 1; k < nin; k++) {
				load(&b, in[k], i, 8);
				a = op_f64(op, a, b);
			}
			if (op == KCOLL_AVG)
				a /= (double)nin;
			memcpy(&bits, &a, 8);
			if (isnan(a))
				bits |= 0x0008000000000000ull;
			store(out, i, &bits, 8);
		} else if (dtype == KCOLL_F32 || dtype == KCOLL_F16 || dtype == KCOLL_BF16) {
			float a = load_f32(dtype, in[0], i);

			for (k = 1; k < nin; k++)
				a = op_f32(op, a, load_f32(dtype, in[k], i));
			if (op == KCOLL_AVG)
				a /= (float)nin;
			store_f32(dtype, out, i, a);
		} else {
			uint64_t a = load_int(dtype, in[0], i);

			for (k = 1; k < nin; k++)
				a = op_int(dtype, op, a, load_int(dtype, in[k], i));
			if (op == KCOLL_AVG)
				a = is_signed(dtype) ? (uint64_t)((int64_t)a / (int64_t)nin) : a / nin;
			store_int(dtype, out, i, a);
		}
	}
	return 0;
}
