// SPDX-License-Identifier: MIT
/*
 * The reduction engine: kcoll_reduce_n and its run-time dispatch.
 *
 * Every (dtype, op) pair has one kernel, and the whole set of kernels is
 * compiled once per instruction set (generic, avx2, avx512) from the same
 * source by RK_KERNELS(); the first call picks a set by CPU features, or by
 * KCOLL_REDUCE_IMPL. A kernel walks the arrays in blocks of RK_BLOCK
 * elements: the first two inputs are combined into a small stack accumulator,
 * the middle ones folded into it, and the last one is combined on the way to
 * out. Each input element is read once and each output element written once,
 * after every input of its block was read, so out may be any in[k]; the inner
 * loops are plain element-wise loops that gcc and clang vectorize at -O2.
 * Element i is always combined in input order, so vector width and block
 * size never change a result. reduce_ref.c holds the scalar reference the
 * tests compare every set against, and the public f16/bf16 conversions.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "config.h"
#include "log.h"
#include "reduce.h"

/*
 * Elements per block: the accumulator (at most 2 KiB) stays in L1, and all
 * the inputs of a block are streamed close together, which keeps more
 * prefetch streams busy than long runs of one input (measured: 256 beats 1024
 * and 4096 once the arrays come from DRAM, and is as fast in cache).
 */
#define RK_BLOCK 256
/* Block lengths are multiples of this: 64 one-byte lanes fill a zmm register. */
#define RK_VEC 64

/*
 * Element types for loads and stores: alignment 1, so any byte address is
 * valid (user buffers need not be aligned), and may_alias, so the f16/bf16
 * bit patterns can be read from any buffer.
 */
typedef float rk_f32 __attribute__((aligned(1), may_alias));
typedef double rk_f64 __attribute__((aligned(1), may_alias));
typedef uint16_t rk_h16 __attribute__((aligned(1), may_alias));
typedef int8_t rk_int8 __attribute__((aligned(1), may_alias));
typedef uint8_t rk_uint8 __attribute__((aligned(1), may_alias));
typedef int32_t rk_int32 __attribute__((aligned(1), may_alias));
typedef uint32_t rk_uint32 __attribute__((aligned(1), may_alias));
typedef int64_t rk_int64 __attribute__((aligned(1), may_alias));
typedef uint64_t rk_uint64 __attribute__((aligned(1), may_alias));

typedef void rk_fn(void *out, const void *const *in, unsigned int nin, size_t count);

/*
 * Branch-free f16/bf16 conversions for the kernels: every case is computed
 * and the answer selected, so the loops that call them still vectorize.
 * Widening leaves a signaling NaN signaling (narrowing quiets every NaN), so
 * the round trip agrees bit for bit with the plain ones in reduce_ref.c; the
 * tests push every code through each kernel set. Neither depends on the
 * MXCSR rounding or DAZ/FTZ modes.
 */
static inline __attribute__((always_inline)) float rk_bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline __attribute__((always_inline)) uint32_t rk_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline __attribute__((always_inline)) float rk_f16_to_f32(uint16_t h)
{
	uint32_t mag = (uint32_t)(h & 0x7fff) << 13;
	uint32_t exp = h & 0x7c00;
	uint32_t m = h & 0x3ff, s = 0;
	/* Rebias 15 -> 127; inf/NaN get the top exponent (narrowing quiets NaN). */
	uint32_t normal = mag + (112u << 23);
	uint32_t special = mag | 0x7f800000;
	uint32_t subnormal, r;

	/*
	 * A subnormal, m * 2^-24, becomes a normal f32: shift m left by s until
	 * bit 10 is set, then the value is 1.f * 2^(-14 - s). Integer steps,
	 * because gcc will not vectorize a float operation (one that may trap)
	 * that only one of the selected answers needs.
	 */
	s += m < 0x4 ? 8 : 0;
	m = m < 0x4 ? m << 8 : m;
	s += m < 0x40 ? 4 : 0;
	m = m < 0x40 ? m << 4 : m;
	s += m < 0x100 ? 2 : 0;
	m = m < 0x100 ? m << 2 : m;
	s += m < 0x200 ? 1 : 0;
	m = m < 0x200 ? m << 1 : m;
	s += m < 0x400 ? 1 : 0;
	m = m < 0x400 ? m << 1 : m;
	subnormal = (h & 0x3ff) ? (113 - s) << 23 | (m & 0x3ff) << 13 : 0;
	r = exp == 0 ? subnormal : exp == 0x7c00 ? special : normal;
	return rk_bits_f32(r | (uint32_t)(h & 0x8000) << 16);
}

static inline __attribute__((always_inline)) uint16_t rk_f32_to_f16(float f)
{
	uint32_t u = rk_f32_bits(f);
	uint32_t a = u & 0x7fffffff;
	/* Normal result: rebias, then round to nearest-even on the 13 dropped bits. */
	uint32_t n = a - (112u << 23);
	uint32_t normal = (n + 0xfff + ((n >> 13) & 1)) >> 13;
	/*
	 * Subnormal result: the value times 2^24 rounded to an integer, i.e. the
	 * significand shifted right by 126 - exponent: 14 and up in that range,
	 * clamped at 31 (all round to zero). Lanes that take another answer
	 * still need a shift within 1..31.
	 */
	uint32_t m = (a & 0x7fffff) | 0x800000;
	uint32_t sh = 126 - (a >> 23);
	uint32_t subnormal, r;

	sh = sh - 1 > 30 ? 31 : sh;
	subnormal = (m + ((1u << (sh - 1)) - 1) + ((m >> sh) & 1)) >> sh;
	r = a >= 0x38800000 ? normal : subnormal;
	/* 65520 and up round to inf; NaN keeps its top payload bits, quieted. */
	r = a >= 0x477ff000 ? 0x7c00 : r;
	r = a > 0x7f800000 ? 0x7e00 | ((a >> 13) & 0x3ff) : r;
	return (uint16_t)(r | ((u >> 16) & 0x8000));
}

static inline __attribute__((always_inline)) float rk_bf16_to_f32(uint16_t b)
{
	return rk_bits_f32((uint32_t)b << 16);
}

static inline __attribute__((always_inline)) uint16_t rk_f32_to_bf16(float f)
{
	uint32_t u = rk_f32_bits(f);
	uint32_t rounded = (u + 0x7fff + ((u >> 16) & 1)) >> 16;
	uint32_t nan = (u >> 16) | 0x40;

	return (uint16_t)((u & 0x7fffffff) > 0x7f800000 ? nan : rounded);
}

/*
 * f32/f64 results leave with every NaN quiet. Compilers do not keep a
 * signaling NaN signaling (clang may turn "if (avg) x /= n" into a division
 * by 1), so results are made deterministic in the integer domain instead.
 */
static inline __attribute__((always_inline)) float rk_quiet_f32(float f)
{
	uint32_t u = rk_f32_bits(f);

	return rk_bits_f32((u & 0x7fffffff) > 0x7f800000 ? u | 0x400000 : u);
}

static inline __attribute__((always_inline)) double rk_quiet_f64(double d)
{
	uint64_t u;

	memcpy(&u, &d, sizeof(u));
	if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull)
		u |= 0x0008000000000000ull;
	memcpy(&d, &u, sizeof(d));
	return d;
}

/* Combining steps; a is the accumulator, b the next input. */
#define RK_SUM(a, b)	((a) + (b))
#define RK_PROD(a, b)	((a) * (b))
#define RK_MIN(a, b)	((b) < (a) ? (b) : (a))
#define RK_MAX(a, b)	((b) > (a) ? (b) : (a))

/* Loading, finishing and storing: a kernel sees in[k][i] as WIDEN(x). */
#define RK_SAME(x)	(x)
#define RK_FDIV(x)	((x) / (__typeof__(x))nin)
#define RK_UDIV(x)	((x) / nin)
#define RK_SDIV(x)	((int64_t)(x) / (int64_t)nin)

/*
 * out may be exactly an in[k] but never overlaps one otherwise, so a loop
 * that writes out[i] after reading in[k][i] has no dependence between
 * iterations; this tells the vectorizer so (it would otherwise need run-time
 * overlap checks, which fail, or fall back to scalar, for in-place calls).
 */
#ifdef __clang__
#define RK_SAME_INDEX_ONLY _Pragma("clang loop vectorize(assume_safety)")
/* ... which is not a demand: a loop left scalar (as under ASan) is fine. */
#pragma clang diagnostic ignored "-Wpass-failed"
#else
#define RK_SAME_INDEX_ONLY _Pragma("GCC ivdep")
#endif

/*
 * One kernel: element type T (an rk_ type), accumulator type A. A block is
 * RK_BLOCK elements, or a multiple of RK_VEC, so that gcc's -O2 (very cheap)
 * vectorizer sees trip counts that need no scalar epilogue; the last
 * count % RK_VEC elements form a short block of their own. In a block, the
 * first two inputs are combined into acc, the middle ones folded into it,
 * and the last one is combined on the way out; one or two inputs go
 * straight from in to out.
 */
#define RK_KERNEL(isa, name, T, A, WIDEN, COMBINE, FINISH, NARROW)			\
static inline __attribute__((always_inline)) void					\
rk_##isa##_##name##_block(A *acc, void *out, const void *const *in, unsigned int nin,	\
			  size_t base, size_t n)					\
{											\
	const T *a = (const T *)in[0] + base;						\
	const T *a1 = (const T *)in[nin > 1 ? 1 : 0] + base;	/* used if nin > 2 */	\
	const T *b = (const T *)in[nin - 1] + base;					\
	T *o = (T *)out + base;								\
	size_t i;									\
	unsigned int k;									\
											\
	if (nin == 1) {									\
		RK_SAME_INDEX_ONLY							\
		for (i = 0; i < n; i++)							\
			o[i] = NARROW(FINISH(WIDEN(a[i])));				\
		return;									\
	}										\
	if (nin == 2) {									\
		RK_SAME_INDEX_ONLY							\
		for (i = 0; i < n; i++) {						\
			A x = WIDEN(a[i]), y = WIDEN(b[i]);				\
											\
			o[i] = NARROW(FINISH(COMBINE(x, y)));				\
		}									\
		return;									\
	}										\
	for (i = 0; i < n; i++) {							\
		A x = WIDEN(a[i]), y = WIDEN(a1[i]);					\
											\
		acc[i] = COMBINE(x, y);							\
	}										\
	for (k = 2; k < nin - 1; k++) {							\
		const T *ak = (const T *)in[k] + base;					\
											\
		for (i = 0; i < n; i++) {						\
			A y = WIDEN(ak[i]);						\
											\
			acc[i] = COMBINE(acc[i], y);					\
		}									\
	}										\
	RK_SAME_INDEX_ONLY								\
	for (i = 0; i < n; i++) {							\
		A y = WIDEN(b[i]);							\
											\
		o[i] = NARROW(FINISH(COMBINE(acc[i], y)));				\
	}										\
}											\
											\
static RK_TARGET_##isa void rk_##isa##_##name(void *out, const void *const *in,		\
					      unsigned int nin, size_t count)		\
{											\
	A acc[RK_BLOCK] __attribute__((aligned(64)));					\
	size_t base = 0, n;								\
											\
	while (count - base >= RK_VEC) {						\
		n = count - base < RK_BLOCK ? count - base : RK_BLOCK;			\
		n &= ~(size_t)(RK_VEC - 1);						\
		rk_##isa##_##name##_block(acc, out, in, nin, base, n);			\
		base += n;								\
	}										\
	if (base < count)								\
		rk_##isa##_##name##_block(acc, out, in, nin, base, count - base);	\
}

/* Floats: f16/bf16 combine in f32; avg is the sum divided by nin. */
#define RK_FLOAT_KERNELS(isa, name, T, A, WIDEN, NARROW)				\
	RK_KERNEL(isa, name##_sum, T, A, WIDEN, RK_SUM, RK_SAME, NARROW)		\
	RK_KERNEL(isa, name##_prod, T, A, WIDEN, RK_PROD, RK_SAME, NARROW)		\
	RK_KERNEL(isa, name##_min, T, A, WIDEN, RK_MIN, RK_SAME, NARROW)		\
	RK_KERNEL(isa, name##_max, T, A, WIDEN, RK_MAX, RK_SAME, NARROW)		\
	RK_KERNEL(isa, name##_avg, T, A, WIDEN, RK_SUM, RK_FDIV, NARROW)

/*
 * Integers: sum and prod wrap, computed in the unsigned type of the same
 * width (so i8 shares u8's kernels); min/max compare in the element's own
 * type; avg sums in uint64_t (a negative element converts to it sign-extended,
 * modulo 2^64), then divides with the element's signedness, truncating toward
 * zero.
 */
#define RK_WRAP_KERNELS(isa, bits)							\
	RK_KERNEL(isa, uint##bits##_sum, rk_uint##bits, uint##bits##_t, RK_SAME, RK_SUM,	\
		  RK_SAME, RK_SAME)							\
	RK_KERNEL(isa, uint##bits##_prod, rk_uint##bits, uint##bits##_t, RK_SAME, RK_PROD,	\
		  RK_SAME, RK_SAME)

#define RK_ORDER_KERNELS(isa, name)							\
	RK_KERNEL(isa, name##_min, rk_##name, name##_t, RK_SAME, RK_MIN, RK_SAME,	\
		  RK_SAME)								\
	RK_KERNEL(isa, name##_max, rk_##name, name##_t, RK_SAME, RK_MAX, RK_SAME,	\
		  RK_SAME)

#define RK_SAVG_KERNEL(isa, name)							\
	RK_KERNEL(isa, name##_avg, rk_##name, uint64_t, RK_SAME, RK_SUM, RK_SDIV,	\
		  (name##_t))
#define RK_UAVG_KERNEL(isa, name)							\
	RK_KERNEL(isa, name##_avg, rk_##name, uint64_t, RK_SAME, RK_SUM, RK_UDIV,	\
		  (name##_t))

#define RK_KERNELS(isa)									\
	RK_FLOAT_KERNELS(isa, f32, rk_f32, float, RK_SAME, rk_quiet_f32)		\
	RK_FLOAT_KERNELS(isa, f64, rk_f64, double, RK_SAME, rk_quiet_f64)		\
	RK_FLOAT_KERNELS(isa, bf16, rk_h16, float, rk_bf16_to_f32, rk_f32_to_bf16)	\
	RK_WRAP_KERNELS(isa, 8)								\
	RK_WRAP_KERNELS(isa, 32)							\
	RK_WRAP_KERNELS(isa, 64)							\
	RK_ORDER_KERNELS(isa, int8)							\
	RK_ORDER_KERNELS(isa, uint8)							\
	RK_ORDER_KERNELS(isa, int32)							\
	RK_ORDER_KERNELS(isa, uint32)							\
	RK_ORDER_KERNELS(isa, int64)							\
	RK_ORDER_KERNELS(isa, uint64)							\
	RK_SAVG_KERNEL(isa, int8)							\
	RK_UAVG_KERNEL(isa, uint8)							\
	RK_SAVG_KERNEL(isa, int32)							\
	RK_UAVG_KERNEL(isa, uint32)							\
	RK_SAVG_KERNEL(isa, int64)							\
	RK_UAVG_KERNEL(isa, uint64)

#define RK_FLOAT_ROW(isa, name)								\
	{ rk_##isa##_##name##_sum, rk_##isa##_##name##_prod, rk_##isa##_##name##_min,	\
	  rk_##isa##_##name##_max, rk_##isa##_##name##_avg }
#define RK_INT_ROW(isa, name, bits)							\
	{ rk_##isa##_uint##bits##_sum, rk_##isa##_uint##bits##_prod, rk_##isa##_##name##_min,	\
	  rk_##isa##_##name##_max, rk_##isa##_##name##_avg }

/* Rows in enum kcoll_dtype order, columns in enum kcoll_redop order. */
#define RK_TABLE(isa)									\
	{										\
		[KCOLL_F32] = RK_FLOAT_ROW(isa, f32),					\
		[KCOLL_F64] = RK_FLOAT_ROW(isa, f64),					\
		[KCOLL_F16] = RK_FLOAT_ROW(isa, f16),					\
		[KCOLL_BF16] = RK_FLOAT_ROW(isa, bf16),					\
		[KCOLL_I8] = RK_INT_ROW(isa, int8, 8),					\
		[KCOLL_U8] = RK_INT_ROW(isa, uint8, 8),					\
		[KCOLL_I32] = RK_INT_ROW(isa, int32, 32),				\
		[KCOLL_U32] = RK_INT_ROW(isa, uint32, 32),				\
		[KCOLL_I64] = RK_INT_ROW(isa, int64, 64),				\
		[KCOLL_U64] = RK_INT_ROW(isa, uint64, 64),				\
	}

_Static_assert(KCOLL_SUM == 0 && KCOLL_PROD == 1 && KCOLL_MIN == 2 && KCOLL_MAX == 3 &&
	       KCOLL_AVG == 4 && KCOLL_REDOP_MAX == 5, "RK_*_ROW lists ops in enum order");

struct rk_impl {
	const char *name;
	int (*supported)(void);
	rk_fn *fn[KCOLL_DTYPE_MAX][KCOLL_REDOP_MAX];
};

/* The baseline of the target (SSE2 on x86-64): always supported. */
#define RK_TARGET_generic
RK_KERNELS(generic)
RK_FLOAT_KERNELS(generic, f16, rk_h16, float, rk_f16_to_f32, rk_f32_to_f16)

static int rk_always(void)
{
	return 1;
}

#if defined(__x86_64__) || defined(__i386__)
#define RK_TARGET_avx2 __attribute__((target("avx2,f16c")))
/*
 * gcc: AVX-512 instructions on 256-bit vectors for the vectorized loops, as
 * gcc's own tuning for AVX-512 CPUs does; zmm loops streamed from DRAM ran
 * about 15% slower (Zen 4), the same in cache. The explicit f16 conversions
 * below still use zmm. clang 14 has no attribute for this.
 */
#ifdef __clang__
#define RK_TARGET_avx512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#else
#define RK_TARGET_avx512 \
	__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,prefer-vector-width=256")))
#endif
RK_KERNELS(avx2)
RK_KERNELS(avx512)

/*
 * f16 on x86: the conversions in hardware (F16C, or its AVX-512F form),
 * 8 or 16 lanes an instruction. They are exact IEEE conversions: widening
 * is exact, narrowing rounds to nearest-even by the immediate (not by MXCSR),
 * keeps subnormals (an f32 subnormal, which DAZ would zero, rounds to zero
 * anyway) and quiets NaN keeping the top payload bits, so they agree bit for
 * bit with rk_f16_to_f32/rk_f32_to_f16, which finish the last few elements.
 * Inputs are widened a block at a time into a float buffer and combined with
 * the plain float loops.
 */
static inline __attribute__((always_inline)) RK_TARGET_avx2 void
rk_avx2_widen_f16(float *dst, const rk_h16 *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
	for (; i < n; i++)
		dst[i] = rk_f16_to_f32(src[i]);
}

static inline __attribute__((always_inline)) RK_TARGET_avx2 void
rk_avx2_narrow_f16(rk_h16 *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(dst + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		dst[i] = rk_f32_to_f16(src[i]);
}

static inline __attribute__((always_inline)) RK_TARGET_avx512 void
rk_avx512_widen_f16(float *dst, const rk_h16 *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i,
				 _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
	for (; i < n; i++)
		dst[i] = rk_f16_to_f32(src[i]);
}

static inline __attribute__((always_inline)) RK_TARGET_avx512 void
rk_avx512_narrow_f16(rk_h16 *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(dst + i),
				    _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		dst[i] = rk_f32_to_f16(src[i]);
}

/* Like RK_KERNEL, for f16 with the hardware conversions. */
#define RK_F16C_KERNEL(isa, op, COMBINE, FINISH)					\
static inline __attribute__((always_inline)) RK_TARGET_##isa void			\
rk_##isa##_f16_##op##_block(float *acc, float *x, void *out, const void *const *in,	\
			    unsigned int nin, size_t base, size_t n)			\
{											\
	size_t i;									\
	unsigned int k;									\
											\
	rk_##isa##_widen_f16(acc, (const rk_h16 *)in[0] + base, n);			\
	for (k = 1; k < nin; k++) {							\
		rk_##isa##_widen_f16(x, (const rk_h16 *)in[k] + base, n);		\
		for (i = 0; i < n; i++)							\
			acc[i] = COMBINE(acc[i], x[i]);					\
	}										\
	for (i = 0; i < n; i++)								\
		acc[i] = FINISH(acc[i]);						\
	rk_##isa##_narrow_f16((rk_h16 *)out + base, acc, n);				\
}											\
											\
static RK_TARGET_##isa void rk_##isa##_f16_##op(void *out, const void *const *in,	\
						unsigned int nin, size_t count)		\
{											\
	float acc[RK_BLOCK] __attribute__((aligned(64)));				\
	float x[RK_BLOCK] __attribute__((aligned(64)));					\
	size_t base = 0, n;								\
											\
	while (count - base >= RK_VEC) {						\
		n = count - base < RK_BLOCK ? count - base : RK_BLOCK;			\
		n &= ~(size_t)(RK_VEC - 1);						\
		rk_##isa##_f16_##op##_block(acc, x, out, in, nin, base, n);		\
		base += n;								\
	}										\
	if (base < count)								\
		rk_##isa##_f16_##op##_block(acc, x, out, in, nin, base, count - base);	\
}

#define RK_F16C_KERNELS(isa)								\
	RK_F16C_KERNEL(isa, sum, RK_SUM, RK_SAME)					\
	RK_F16C_KERNEL(isa, prod, RK_PROD, RK_SAME)					\
	RK_F16C_KERNEL(isa, min, RK_MIN, RK_SAME)					\
	RK_F16C_KERNEL(isa, max, RK_MAX, RK_SAME)					\
	RK_F16C_KERNEL(isa, avg, RK_SUM, RK_FDIV)

RK_F16C_KERNELS(avx2)
RK_F16C_KERNELS(avx512)

static int rk_has_avx2(void)
{
	unsigned int eax, ebx, ecx, edx;

	__builtin_cpu_init();
	/* clang 14's __builtin_cpu_supports has no "f16c": ask CPUID leaf 1 */
	return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
	       (ecx & bit_F16C);
}

/* The x86-64-v4 subset: bw for byte/word lanes, dq for 64-bit multiplies. */
static int rk_has_avx512(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}
#endif

/* Best last: with no choice forced, the last supported one wins. */
static const struct rk_impl rk_impls[] = {
	{ "generic", rk_always, RK_TABLE(generic) },
#if defined(__x86_64__) || defined(__i386__)
	{ "avx2", rk_has_avx2, RK_TABLE(avx2) },
	{ "avx512", rk_has_avx512, RK_TABLE(avx512) },
#endif
};

#define RK_NR_IMPLS (sizeof(rk_impls) / sizeof(rk_impls[0]))

static _Atomic(const struct rk_impl *) rk_chosen;
static pthread_once_t rk_choose_once = PTHREAD_ONCE_INIT;

static void rk_choose(void)
{
	const char *want = kcoll_knob_str("KCOLL_REDUCE_IMPL");
	const struct rk_impl *best = NULL, *forced = NULL;
	size_t i;

	for (i = 0; i < RK_NR_IMPLS; i++) {
		if (!rk_impls[i].supported())
			continue;
		best = &rk_impls[i];
		if (!strcmp(want, rk_impls[i].name))
			forced = best;
	}
	if (*want && !forced) {
		for (i = 0; i < RK_NR_IMPLS && strcmp(want, rk_impls[i].name); i++)
			;
		kc_warn("KCOLL_REDUCE_IMPL=%s: %s; using %s", want,
			i < RK_NR_IMPLS ? "not supported by this CPU" : "no such implementation",
			best->name);
	}
	atomic_store_explicit(&rk_chosen, forced ? forced : best, memory_order_release);
}

static const struct rk_impl *rk_impl(void)
{
	const struct rk_impl *impl = atomic_load_explicit(&rk_chosen, memory_order_acquire);

	if (!impl) {
		pthread_once(&rk_choose_once, rk_choose);
		impl = atomic_load_explicit(&rk_chosen, memory_order_acquire);
	}
	return impl;
}

const char *kcoll_reduce_impl(void)
{
	return rk_impl()->name;
}

int kcoll_reduce_n(enum kcoll_dtype dtype, enum kcoll_redop op, void *out,
		   const void *const *in, unsigned int nin, size_t count)
{
	if ((unsigned int)dtype >= KCOLL_DTYPE_MAX || (unsigned int)op >= KCOLL_REDOP_MAX || !nin)
		return -EINVAL;
	if (count)
		rk_impl()->fn[dtype][op](out, in, nin, count);
	return 0;
}

/* ---- avg in pieces (reduce.h) ------------------------------------------- */

static int rk_is_float(enum kcoll_dtype dt)
{
	return dt == KCOLL_F32 || dt == KCOLL_F64 || dt == KCOLL_F16 || dt == KCOLL_BF16;
}

enum kcoll_dtype kcoll_avg_sum_dtype(enum kcoll_dtype dt)
{
	if (rk_is_float(dt))
		return dt;
	return dt == KCOLL_I8 || dt == KCOLL_I32 || dt == KCOLL_I64 ? KCOLL_I64 : KCOLL_U64;
}

static int64_t rk_load_int(enum kcoll_dtype dt, const void *p, size_t i)
{
	switch (dt) {
	case KCOLL_I8: return ((const int8_t *)p)[i];
	case KCOLL_U8: return ((const uint8_t *)p)[i];
	case KCOLL_I32: return ((const int32_t *)p)[i];
	case KCOLL_U32: return ((const uint32_t *)p)[i];
	default: return ((const int64_t *)p)[i];
	}
}

void kcoll_avg_widen_add(enum kcoll_dtype dt, void *sum, const void *in, size_t count, int first)
{
	uint64_t *acc = sum;

	/* Unsigned: the bits of the wrapping u64 sum are those of the i64 one. */
	for (size_t i = 0; i < count; i++)
		acc[i] = (first ? 0 : acc[i]) + (uint64_t)rk_load_int(dt, in, i);
}

void kcoll_avg_finish(enum kcoll_dtype dt, void *buf, size_t count, unsigned int nin)
{
	for (size_t i = 0; i < count; i++) {
		int64_t s = rk_is_float(dt) ? 0 : ((int64_t *)buf)[i];
		uint64_t u = (uint64_t)s;

		switch (dt) {
		case KCOLL_F32: ((float *)buf)[i] /= (float)nin; break;
		case KCOLL_F64: ((double *)buf)[i] /= (double)nin; break;
		case KCOLL_F16:
			((uint16_t *)buf)[i] = kcoll_f32_to_f16(kcoll_f16_to_f32(((uint16_t *)buf)[i]) / (float)nin);
			break;
		case KCOLL_BF16:
			((uint16_t *)buf)[i] = kcoll_f32_to_bf16(kcoll_bf16_to_f32(((uint16_t *)buf)[i]) / (float)nin);
			break;
		/* Element i is written at or below where sum i was read. */
		case KCOLL_I8: ((int8_t *)buf)[i] = (int8_t)(s / nin); break;
		case KCOLL_U8: ((uint8_t *)buf)[i] = (uint8_t)(u / nin); break;
		case KCOLL_I32: ((int32_t *)buf)[i] = (int32_t)(s / nin); break;
		case KCOLL_U32: ((uint32_t *)buf)[i] = (uint32_t)(u / nin); break;
		case KCOLL_I64: ((int64_t *)buf)[i] = s / (int64_t)nin; break;
		case KCOLL_U64: ((uint64_t *)buf)[i] = u / nin; break;
		default: break;
		}
	}
}
