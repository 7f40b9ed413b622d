// SPDX-License-Identifier: MIT
/*
 * The reduction engine: the f16/bf16 conversions against independent oracles
 * (exhaustively where the domain is 2^16), kcoll_reduce_ref against
 * hand-computed answers, and every implementation of kcoll_reduce_n against
 * kcoll_reduce_ref, bit for bit, over every dtype x op.
 *
 * The implementation is chosen once per process, so each one is exercised in
 * a child process started with KCOLL_REDUCE_IMPL set; the parent itself never
 * calls kcoll_reduce_n. Children continue the parent's TAP numbering and send
 * their counters back through a pipe.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "kcoll/tap.h"
#include "reduce.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_NIN 8
/* Two full 1024-element blocks, one 64-multiple block and a short tail. */
#define MAX_COUNT 2115
#define SLACK 16

static const char *const dtype_names[] = {
	"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64",
};
static const char *const op_names[] = { "sum", "prod", "min", "max", "avg" };
static const char *const impl_names[] = { "generic", "avx2", "avx512" };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

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

static size_t dtype_size(enum kcoll_dtype dt)
{
	static const size_t sizes[] = { 4, 8, 2, 2, 1, 1, 4, 4, 8, 8 };

	return sizes[dt];
}

/* Element i of a buffer as raw bits, and back (any alignment). */
static uint64_t get_elem(enum kcoll_dtype dt, const void *p, size_t i)
{
	size_t sz = dtype_size(dt);
	uint8_t u8;
	uint16_t u16;
	uint32_t u32;
	uint64_t u64;

	switch (sz) {
	case 1: memcpy(&u8, (const char *)p + i, 1); return u8;
	case 2: memcpy(&u16, (const char *)p + 2 * i, 2); return u16;
	case 4: memcpy(&u32, (const char *)p + 4 * i, 4); return u32;
	default: memcpy(&u64, (const char *)p + 8 * i, 8); return u64;
	}
}

static void put_elem(enum kcoll_dtype dt, void *p, size_t i, uint64_t v)
{
	size_t sz = dtype_size(dt);
	uint8_t u8 = (uint8_t)v;
	uint16_t u16 = (uint16_t)v;
	uint32_t u32 = (uint32_t)v;

	switch (sz) {
	case 1: memcpy((char *)p + i, &u8, 1); break;
	case 2: memcpy((char *)p + 2 * i, &u16, 2); break;
	case 4: memcpy((char *)p + 4 * i, &u32, 4); break;
	default: memcpy((char *)p + 8 * i, &v, 8); break;
	}
}

static int is_nan_bits(enum kcoll_dtype dt, uint64_t v)
{
	switch (dt) {
	case KCOLL_F32: return (v & 0x7fffffff) > 0x7f800000;
	case KCOLL_F64: return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
	case KCOLL_F16: return (v & 0x7fff) > 0x7c00;
	case KCOLL_BF16: return (v & 0x7fff) > 0x7f80;
	default: return 0;
	}
}

/* ---- conversions ----------------------------------------------------- */

/* The value of an f16, from the format's definition. */
static double f16_value(unsigned int h)
{
	unsigned int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	double v = exp == 0x1f ? INFINITY :	/* NaNs are not asked for */
		   exp ? ldexp(1024 + man, (int)exp - 25) : ldexp(man, -24);

	return h & 0x8000 ? -v : v;
}

static double bf16_value(unsigned int b)
{
	return bits_f32((uint32_t)b << 16);
}

/*
 * Round-to-nearest-even by search: the largest non-negative code whose value
 * is <= |x|, then a comparison with the midpoint to the next code. 'top' is
 * the code of +inf, taken as the next binade's first value for rounding.
 */
static unsigned int rne_oracle(double (*value)(unsigned int), unsigned int top, double top_value,
			       float x)
{
	double a = fabs(x), lo_v, hi_v, mid;
	unsigned int sign = signbit(x) ? 0x8000 : 0, lo = 0, hi = top, m;

	if (a >= top_value)
		return sign | top;
	while (hi - lo > 1) {	/* value(lo) <= a < value(hi) */
		m = (lo + hi) / 2;
		if ((m == top ? top_value : value(m)) <= a)
			lo = m;
		else
			hi = m;
	}
	lo_v = value(lo);
	hi_v = hi == top ? top_value : value(hi);
	mid = (lo_v + hi_v) / 2;
	if (a == lo_v || a < mid)
		return sign | lo;
	if (a > mid)
		return sign | hi;
	return sign | (lo & 1 ? hi : lo);
}

static unsigned int f16_oracle(float x)
{
	return rne_oracle(f16_value, 0x7c00, 65536.0, x);
}

static unsigned int bf16_oracle(float x)
{
	return rne_oracle(bf16_value, 0x7f80, ldexp(1, 128), x);
}

static void test_f16_exhaustive(void)
{
	unsigned int h, bad_val = 0, bad_trip = 0;

	for (h = 0; h < 0x10000; h++) {
		float f = kcoll_f16_to_f32((unsigned short)h);
		int nan = (h & 0x7fff) > 0x7c00;
		uint32_t want = ((uint32_t)(h & 0x8000) << 16) | 0x7fc00000 | (h & 0x3ff) << 13;
		unsigned int back = kcoll_f32_to_f16(f);

		if (nan ? f32_bits(f) != want :
			  (double)f != f16_value(h) || !!signbit(f) != !!(h & 0x8000)) {
			if (!bad_val++)
				tap_diag("f16 0x%04x -> f32 0x%08x", h, f32_bits(f));
		}
		if (back != (nan ? h | 0x200 : h)) {
			if (!bad_trip++)
				tap_diag("f16 0x%04x -> f32 -> f16 0x%04x", h, back);
		}
	}
	tap_ok(!bad_val, "f16 -> f32: all 65536 inputs exact, NaN quiet with payload (%u bad)", bad_val);
	tap_ok(!bad_trip, "f16 -> f32 -> f16 round trip: all 65536 inputs (%u bad)", bad_trip);
}

static void test_bf16_exhaustive(void)
{
	unsigned int b, bad_val = 0, bad_trip = 0;

	for (b = 0; b < 0x10000; b++) {
		float f = kcoll_bf16_to_f32((unsigned short)b);
		int nan = (b & 0x7fff) > 0x7f80;
		uint32_t want = (uint32_t)b << 16 | (nan ? 0x400000 : 0);
		unsigned int back = kcoll_f32_to_bf16(f);

		if (f32_bits(f) != want && !bad_val++)
			tap_diag("bf16 0x%04x -> f32 0x%08x", b, f32_bits(f));
		if (back != (nan ? b | 0x40 : b) && !bad_trip++)
			tap_diag("bf16 0x%04x -> f32 -> bf16 0x%04x", b, back);
	}
	tap_ok(!bad_val, "bf16 -> f32: all 65536 inputs exact, NaN quiet (%u bad)", bad_val);
	tap_ok(!bad_trip, "bf16 -> f32 -> bf16 round trip: all 65536 inputs (%u bad)", bad_trip);
}

struct narrow_check {
	const char *name;
	unsigned short (*convert)(float);
	unsigned int (*oracle)(float);
	double (*value)(unsigned int);
	unsigned int top;	/* +inf */
	unsigned int nan_quiet;	/* quiet bit of the narrow format */
	unsigned int nan_shift;	/* payload: f32 mantissa >> nan_shift */
	unsigned int bad;
};

static void narrow_one(struct narrow_check *c, float x)
{
	uint32_t u = f32_bits(x);
	unsigned int got = c->convert(x), want;

	if ((u & 0x7fffffff) > 0x7f800000)
		want = (u >> 16 & 0x8000) | c->top | c->nan_quiet | ((u & 0x7fffff) >> c->nan_shift);
	else
		want = c->oracle(x);
	if (got != want && !c->bad++)
		tap_diag("f32 0x%08x (%a) -> %s 0x%04x, want 0x%04x", u, x, c->name, got, want);
}

/*
 * f32 -> narrow against the oracle: around every midpoint and every value of
 * the narrow format (both signs), special values, and random f32 inputs.
 */
static void test_narrow(struct narrow_check *c)
{
	static const uint32_t specials[] = {
		0x00000000, 0x00000001, 0x007fffff, 0x00800000, 0x33000000, 0x33000001,
		0x337fffff, 0x33800000, 0x33c00000, 0x387fc000, 0x387fe000, 0x38800000,
		0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x47800000, 0x7f7fffff,
		0x7f7f8000, 0x7f7f7fff, 0x7f800000, 0x7f800001, 0x7fa00000, 0x7fc00000,
		0x7fffffff, 0x7f802000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001,
	};
	unsigned int h, i, s;

	for (h = 0; h < c->top; h++) {
		for (s = 0; s < 2; s++) {
			float sign = s ? -1.0f : 1.0f;
			float v = (float)c->value(h), mid = (float)((c->value(h) + c->value(h + 1)) / 2);

			if (h + 1 == c->top)	/* the midpoint below inf */
				mid = (float)((c->value(h) + (c->top == 0x7c00 ? 65536.0 :
							      ldexp(1, 128))) / 2);
			narrow_one(c, sign * v);
			narrow_one(c, sign * nextafterf(v, INFINITY));
			narrow_one(c, sign * mid);
			narrow_one(c, sign * nextafterf(mid, 0));
			narrow_one(c, sign * nextafterf(mid, INFINITY));
		}
	}
	for (i = 0; i < ARRAY_SIZE(specials); i++) {
		narrow_one(c, bits_f32(specials[i]));
		narrow_one(c, bits_f32(specials[i] | 0x80000000));
	}
	for (i = 0; i < 200000; i++) {
		uint32_t u = (uint32_t)rnd();

		narrow_one(c, bits_f32(u));
		/* exponents around the f16 range: normal, subnormal, overflow */
		narrow_one(c, bits_f32((u & 0x807fffff) | (uint32_t)(96 + (u >> 8) % 50) << 23));
	}
	tap_ok(!c->bad, "f32 -> %s rounds to nearest-even: midpoints, specials, random (%u bad)",
	       c->name, c->bad);
}

/* ---- data -------------------------------------------------------------- */

static uint64_t random_f32(void)
{
	uint64_t r = rnd();
	static const uint32_t specials[] = {
		0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa12345, 0xff812345, 0x7f800000,
		0xff800000, 0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00800000,
		0x7f7fffff, 0xff7fffff, 0x3f800000, 0xbf800000,
	};

	switch (r & 7) {
	case 0: return specials[(r >> 8) % ARRAY_SIZE(specials)];
	case 1: return (uint32_t)(r >> 32);	/* any bits */
	case 2: return (r >> 32) & 0x807fffff;	/* subnormal */
	default:	/* moderate: sums and products stay finite and round */
		return ((r >> 32) & 0x807fffff) | (uint32_t)(112 + (r >> 8) % 32) << 23;
	}
}

static uint64_t random_f64(void)
{
	uint64_t r = rnd(), b = rnd();
	static const uint64_t specials[] = {
		0x7ff8000000000000ull, 0xfff8000000000000ull, 0x7ff0000000000001ull,
		0x7ff4000000abcdefull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
		0, 0x8000000000000000ull, 1, 0x800fffffffffffffull, 0x0010000000000000ull,
		0x7fefffffffffffffull, 0x3ff0000000000000ull,
	};

	switch (r & 7) {
	case 0: return specials[(r >> 8) % ARRAY_SIZE(specials)];
	case 1: return b;
	case 2: return b & 0x800fffffffffffffull;
	default: return (b & 0x800fffffffffffffull) | (uint64_t)(1008 + (r >> 8) % 32) << 52;
	}
}

static uint64_t random_elem(enum kcoll_dtype dt)
{
	uint64_t r = rnd();
	static const uint64_t int_specials[] = { 0, 1, 2, (uint64_t)-1, (uint64_t)-2 };
	unsigned int bits = (unsigned int)dtype_size(dt) * 8;
	uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
	uint64_t smin = 1ull << (bits - 1);

	switch (dt) {
	case KCOLL_F32: return random_f32();
	case KCOLL_F64: return random_f64();
	case KCOLL_F16:
		return (r & 3) ? (r >> 8) & 0xffff :
			((r >> 8) & 0x83ff) | (uint64_t)(10 + (r >> 24) % 10) << 10;
	case KCOLL_BF16:
		/* f32's upper half: the same mix of specials and moderate values */
		return (random_f32() >> 16) ^ ((r & 1) ? 0 : (r >> 8) & 0x7f);
	default:
		switch (r & 7) {
		case 0: return int_specials[(r >> 8) % ARRAY_SIZE(int_specials)] & mask;
		case 1: return smin;		/* INT_MIN */
		case 2: return smin - 1;	/* INT_MAX */
		case 3: return (r >> 8) & 0xf;	/* small: products stay interesting */
		case 4: return ((r >> 8) & 0xf) * mask & mask;	/* small negatives */
		default: return (r >> 8) & mask;
		}
	}
}

static unsigned char *pool[MAX_NIN];	/* random inputs, MAX_COUNT elements + slack */

static void fill_pool(enum kcoll_dtype dt)
{
	size_t sz = dtype_size(dt), i;
	unsigned int k;

	for (k = 0; k < MAX_NIN; k++) {
		memset(pool[k], 0xa5, MAX_COUNT * 8 + SLACK);
		for (i = 0; i < (MAX_COUNT * 8 + SLACK) / sz; i++)
			put_elem(dt, pool[k], i, random_elem(dt));
	}
}

/* ---- kcoll_reduce_n vs kcoll_reduce_ref ------------------------------------ */

/*
 * Results agree bit for bit, except where sum/prod/avg produce NaN on both
 * sides: which NaN wins when two meet is not specified (a compiler may
 * commute a + b, and x86 returns the first operand's NaN).
 */
static int same_result(enum kcoll_dtype dt, enum kcoll_redop op, uint64_t a, uint64_t b)
{
	if (a == b)
		return 1;
	return op != KCOLL_MIN && op != KCOLL_MAX && is_nan_bits(dt, a) && is_nan_bits(dt, b);
}

enum alias { ALIAS_NONE, ALIAS_FIRST, ALIAS_LAST, ALIAS_MAX };
static const char *const alias_names[] = { "out apart", "out == in[0]", "out == in[nin-1]" };

static unsigned char *want_buf, *got_buf;

/* Returns 0, or 1 after a diagnostic naming the first mismatch. */
static int compare_case(const char *impl, enum kcoll_dtype dt, enum kcoll_redop op,
			unsigned int nin, size_t count, size_t off, enum alias alias)
{
	const void *in[MAX_NIN], *ref_in[MAX_NIN];
	size_t sz = dtype_size(dt), i;
	unsigned char *out = got_buf + off;
	unsigned int k, victim = alias == ALIAS_FIRST ? 0 : nin - 1;
	int ret;

	for (k = 0; k < nin; k++) {
		/* a different misalignment per input: off, off + 1 element, ... */
		ref_in[k] = in[k] = pool[k] + (off + k * sz) % SLACK;
	}
	memset(want_buf, 0x5a, MAX_COUNT * 8 + SLACK);
	memset(got_buf, 0x5a, MAX_COUNT * 8 + SLACK);
	if (kcoll_reduce_ref(dt, op, want_buf + off, ref_in, nin, count)) {
		tap_diag("%s: kcoll_reduce_ref failed", impl);
		return 1;
	}
	if (alias != ALIAS_NONE) {
		memcpy(out, in[victim], count * sz);
		in[victim] = out;
	}
	ret = kcoll_reduce_n(dt, op, out, in, nin, count);
	if (ret) {
		tap_diag("%s: kcoll_reduce_n returned %d", impl, ret);
		return 1;
	}
	for (i = 0; i < count; i++) {
		uint64_t w = get_elem(dt, want_buf + off, i), g = get_elem(dt, out, i);

		if (!same_result(dt, op, w, g)) {
			tap_diag("%s %s %s nin %u count %zu offset %zu %s: element %zu is 0x%llx, "
				 "reference 0x%llx", impl, dtype_names[dt], op_names[op], nin, count,
				 off, alias_names[alias], i, (unsigned long long)g,
				 (unsigned long long)w);
			for (k = 0; k < nin; k++)
				tap_diag("  in[%u][%zu] = 0x%llx", k, i,
					 (unsigned long long)get_elem(dt, ref_in[k], i));
			return 1;
		}
	}
	/* nothing written past the end (or before the start) */
	for (i = 0; i < MAX_COUNT * 8 + SLACK; i++) {
		if ((i < off || i >= off + count * sz) && got_buf[i] != 0x5a) {
			tap_diag("%s %s %s nin %u count %zu: byte %zu outside out was written",
				 impl, dtype_names[dt], op_names[op], nin, count, i);
			return 1;
		}
	}
	return 0;
}

static void test_against_ref(const char *impl)
{
	static const size_t counts[] = { 0, 1, 7, 64, 1003, MAX_COUNT };
	unsigned int dt, op, nin, c, a, cases, bad;
	size_t off;

	for (dt = 0; dt < KCOLL_DTYPE_MAX; dt++) {
		fill_pool(dt);
		for (op = 0; op < KCOLL_REDOP_MAX; op++) {
			cases = bad = 0;
			for (nin = 1; nin <= MAX_NIN && !bad; nin++)
				for (c = 0; c < ARRAY_SIZE(counts) && !bad; c++)
					for (a = 0; a < ALIAS_MAX && !bad; a++) {
						/* element-aligned, and odd byte offsets */
						size_t offs[] = { 0, dtype_size(dt), 3 };

						for (off = 0; off < ARRAY_SIZE(offs) && !bad; off++) {
							bad = compare_case(impl, dt, op, nin, counts[c],
									   offs[off], a);
							cases++;
						}
					}
			tap_ok(!bad, "%s: %s %s equals the reference (%u cases: nin 1-8, "
			       "counts 0-%u, offsets, aliasing)", impl, dtype_names[dt],
			       op_names[op], cases, MAX_COUNT);
		}
	}
}

/*
 * avg in pieces (kcolld's multi-host path): the inputs split between "hosts"
 * at every point, each host's part summed (64-bit for integers), the partial
 * sums summed, divided once: bit for bit the one-call avg, for the integer
 * types, f32 and f64 (whose sums keep the input order). f16/bf16 round each
 * partial sum, so for them only the division is checked.
 */
static void test_avg_pieces(void)
{
	static const size_t count = 1003;
	unsigned char *sum = malloc(count * 8), *part = malloc(count * 8);

	for (unsigned int dt = 0; dt < KCOLL_DTYPE_MAX; dt++) {
		enum kcoll_dtype sdt = kcoll_avg_sum_dtype(dt);
		size_t sz = dtype_size(dt);
		unsigned int bad = 0, cases = 0;
		int is_int = dt >= KCOLL_I8;

		if (dt == KCOLL_F16 || dt == KCOLL_BF16) {
			/* 3 / 2 = 1.5 and -7 / 4 = -1.75, exact in both types */
			float x[2] = { 3.0f, -7.0f }, want[2] = { 1.5f, -1.75f };
			unsigned short h[2];

			for (int i = 0; i < 2; i++)
				h[i] = dt == KCOLL_F16 ? kcoll_f32_to_f16(x[i]) : kcoll_f32_to_bf16(x[i]);
			kcoll_avg_finish(dt, h, 1, 2);
			kcoll_avg_finish(dt, h + 1, 1, 4);
			for (int i = 0; i < 2; i++) {
				float g = dt == KCOLL_F16 ? kcoll_f16_to_f32(h[i]) : kcoll_bf16_to_f32(h[i]);

				bad += g != want[i];
			}
			tap_ok(!bad && sdt == dt, "avg in pieces: %s sums stay %s, the division is "
			       "done in f32", dtype_names[dt], dtype_names[dt]);
			continue;
		}
		fill_pool(dt);
		for (unsigned int nin = 1; nin <= MAX_NIN; nin++) {
			const void *in[MAX_NIN];

			for (unsigned int k = 0; k < nin; k++)
				in[k] = pool[k];
			kcoll_reduce_ref(dt, KCOLL_AVG, want_buf, in, nin, count);
			/* hosts: inputs [0, cut) and [cut, nin) */
			for (unsigned int cut = 1; cut <= nin; cut++, cases++) {
				if (is_int) {
					for (unsigned int k = 0; k < nin; k++)
						kcoll_avg_widen_add(dt, k < cut ? sum : part, in[k], count,
								    k == 0 || k == cut);
					if (cut < nin) {
						const void *two[2] = { sum, part };

						kcoll_reduce_ref(sdt, KCOLL_SUM, sum, two, 2, count);
					}
				} else {
					kcoll_reduce_ref(dt, KCOLL_SUM, sum, in, cut, count);
					if (cut < nin) {
						const void *two[2] = { sum, NULL };

						kcoll_reduce_ref(dt, KCOLL_SUM, part, in + cut, nin - cut,
								 count);
						two[1] = part;
						/* (a + b + c) + d is the one-call order only
						 * when the second part is one input: other
						 * cuts are not compared for floats */
						kcoll_reduce_ref(dt, KCOLL_SUM, sum, two, 2, count);
					}
				}
				kcoll_avg_finish(dt, sum, count, nin);
				if (memcmp(sum, want_buf, count * sz) &&
				    (is_int || cut == nin || nin - cut == 1)) {
					bad++;
					tap_diag("%s nin %u cut %u differs", dtype_names[dt], nin, cut);
				}
			}
		}
		tap_ok(!bad, "avg in pieces: %s sums in %s, divided once, equal the one-call avg "
		       "(%u splits of 1-8 inputs)", dtype_names[dt], dtype_names[sdt], cases);
	}
	free(sum);
	free(part);
}

/*
 * The kernels' own f16/bf16 conversions, exhaustively: every code through a
 * one-input sum (widen, narrow), and every code plus half its ulp (exact in
 * f32, a tie when narrowed).
 */
static void test_half_codes(const char *impl, enum kcoll_dtype dt)
{
	static uint16_t a[0x10000], b[0x10000], want[0x10000], got[0x10000];
	const void *in[2] = { a, b };
	unsigned int i, bad = 0, man_bits = dt == KCOLL_F16 ? 10 : 7;
	int nin;

	for (i = 0; i < 0x10000; i++) {
		unsigned int exp = (i & 0x7fff) >> man_bits, half;

		/* half an ulp of a normal code: man_bits + 1 binades down, or a subnormal */
		if (exp > man_bits + 1)
			half = (exp - man_bits - 1) << man_bits;
		else if (exp >= 2)
			half = 1u << (exp - 2);
		else
			half = i & 1;	/* a subnormal's half ulp is below the format */
		a[i] = (uint16_t)i;
		b[i] = (uint16_t)((i & 0x8000) | half);
	}
	for (nin = 1; nin <= 2; nin++) {
		kcoll_reduce_ref(dt, KCOLL_SUM, want, in, nin, 0x10000);
		kcoll_reduce_n(dt, KCOLL_SUM, got, in, nin, 0x10000);
		for (i = 0; i < 0x10000; i++) {
			if (!same_result(dt, KCOLL_SUM, want[i], got[i]) && !bad++)
				tap_diag("%s %s nin %d: 0x%04x + 0x%04x = 0x%04x, reference 0x%04x",
					 impl, dtype_names[dt], nin, a[i], b[i], got[i], want[i]);
		}
	}
	tap_ok(!bad, "%s: %s every code, and every code plus half an ulp (ties), "
	       "equal the reference", impl, dtype_names[dt]);
}

/*
 * The f16 conversions must not depend on MXCSR (the x86 kernels use F16C,
 * the reference does not): with flush-to-zero and denormals-are-zero set,
 * f16 results still equal the reference. f16 values, subnormals included,
 * widen to normal f32, so these sums never meet a mode-dependent operand.
 * (bf16 subnormals are f32 subnormals: DAZ changes the arithmetic itself, and
 * compilers assume the default modes, so no such promise is made for them.)
 */
static void test_f16_ftz(const char *impl)
{
#if defined(__x86_64__) || defined(__i386__)
	unsigned int csr = _mm_getcsr();

	_mm_setcsr(csr | 0x8040);	/* FTZ | DAZ */
	test_half_codes(impl, KCOLL_F16);
	_mm_setcsr(csr);
	tap_diag("%s: the line above ran with MXCSR FTZ and DAZ set", impl);
#else
	tap_skip("%s: FTZ/DAZ are x86 modes", impl);
#endif
}

/* ---- known answers ----------------------------------------------------- */

struct known {
	const char *what;
	enum kcoll_dtype dt;
	enum kcoll_redop op;
	unsigned int nin;
	uint64_t in[4];
	uint64_t want;
};

/* f32 bit patterns used below */
#define F32_1		0x3f800000
#define F32_2		0x40000000
#define F32_3		0x40400000
#define F32_1E8		0x4cbebc20
#define F32_M1E8	0xccbebc20
#define F32_1_5		0x3fc00000
#define F32_2P24	0x4b800000	/* 16777216 */
#define F32_2P24_3	0x4aaaaaab	/* 5592405.5, the nearest f32 to 2^24 / 3 */

static const struct known knowns[] = {
	{ "bf16 1 + 2^-8 ties to even (down)", KCOLL_BF16, KCOLL_SUM, 2, { 0x3f80, 0x3b80 }, 0x3f80 },
	{ "bf16 (1 + 2^-7) + 2^-8 ties to even (up)", KCOLL_BF16, KCOLL_SUM, 2,
	  { 0x3f81, 0x3b80 }, 0x3f82 },
	{ "bf16 max + max overflows to inf", KCOLL_BF16, KCOLL_SUM, 2, { 0x7f7f, 0x7f7f }, 0x7f80 },
	{ "f16 65504 + 16 = 65520 ties to inf", KCOLL_F16, KCOLL_SUM, 2, { 0x7bff, 0x4c00 }, 0x7c00 },
	{ "f16 65504 + 8 stays 65504", KCOLL_F16, KCOLL_SUM, 2, { 0x7bff, 0x4800 }, 0x7bff },
	{ "f16 256 * 256 overflows to inf", KCOLL_F16, KCOLL_PROD, 2, { 0x5c00, 0x5c00 }, 0x7c00 },
	{ "f16 -256 * 256 * 2 overflows to -inf", KCOLL_F16, KCOLL_PROD, 3,
	  { 0xdc00, 0x5c00, 0x4000 }, 0xfc00 },
	{ "f16 subnormals add exactly", KCOLL_F16, KCOLL_SUM, 3, { 0x0001, 0x0001, 0x03ff }, 0x0401 },
	{ "f16 avg 2^-24 / 2 ties to zero", KCOLL_F16, KCOLL_AVG, 2, { 0x0001, 0x0000 }, 0x0000 },
	{ "f16 avg 3 * 2^-24 / 2 ties to even", KCOLL_F16, KCOLL_AVG, 2, { 0x0003, 0x0000 }, 0x0002 },
	{ "f16 sNaN payload propagates, quieted", KCOLL_F16, KCOLL_SUM, 3,
	  { 0x3c00, 0xfd01, 0x3c00 }, 0xff01 },
	{ "bf16 sNaN payload propagates, quieted", KCOLL_BF16, KCOLL_PROD, 3,
	  { 0x3f80, 0x7f81, 0x4000 }, 0x7fc1 },
	{ "f32 sNaN payload propagates, quieted", KCOLL_F32, KCOLL_SUM, 3,
	  { F32_1, 0x7fa00001, F32_2 }, 0x7fe00001 },
	{ "f32 sum in input order: (1 + 1e8) - 1e8 = 0", KCOLL_F32, KCOLL_SUM, 3,
	  { F32_1, F32_1E8, F32_M1E8 }, 0 },
	{ "f32 sum in input order: (1e8 - 1e8) + 1 = 1", KCOLL_F32, KCOLL_SUM, 3,
	  { F32_1E8, F32_M1E8, F32_1 }, F32_1 },
	{ "f32 avg 1, 2 = 1.5", KCOLL_F32, KCOLL_AVG, 2, { F32_1, F32_2 }, F32_1_5 },
	{ "f32 avg divides the rounded sum", KCOLL_F32, KCOLL_AVG, 3,
	  { F32_2P24, F32_1, F32_1 }, F32_2P24_3 },
	{ "f32 min keeps a NaN accumulator", KCOLL_F32, KCOLL_MIN, 2, { 0x7fc00000, F32_1 },
	  0x7fc00000 },
	{ "f32 min skips a NaN input", KCOLL_F32, KCOLL_MIN, 2, { F32_1, 0x7fc00000 }, F32_1 },
	{ "f32 max skips a NaN input", KCOLL_F32, KCOLL_MAX, 3, { F32_1, 0xffc00000, F32_3 },
	  F32_3 },
	{ "f32 min(-0, +0) keeps the first", KCOLL_F32, KCOLL_MIN, 2, { 0x80000000, 0 }, 0x80000000 },
	{ "f32 max(+0, -0) keeps the first", KCOLL_F32, KCOLL_MAX, 2, { 0, 0x80000000 }, 0 },
	{ "f64 1 + 2^-53 ties to 1", KCOLL_F64, KCOLL_SUM, 2,
	  { 0x3ff0000000000000ull, 0x3ca0000000000000ull }, 0x3ff0000000000000ull },
	{ "i8 127 + 1 wraps to -128", KCOLL_I8, KCOLL_SUM, 2, { 127, 1 }, 0x80 },
	{ "i8 16 * 16 wraps to 0", KCOLL_I8, KCOLL_PROD, 2, { 16, 16 }, 0 },
	{ "i8 -128 * -1 wraps to -128", KCOLL_I8, KCOLL_PROD, 2, { 0x80, 0xff }, 0x80 },
	{ "i8 min is signed", KCOLL_I8, KCOLL_MIN, 3, { 5, 0x80, 0x7f }, 0x80 },
	{ "u8 max is unsigned", KCOLL_U8, KCOLL_MAX, 3, { 5, 0x80, 0x7f }, 0x80 },
	{ "u8 255 + 1 wraps to 0", KCOLL_U8, KCOLL_SUM, 2, { 255, 1 }, 0 },
	{ "u8 avg 255, 255, 255 sums wide", KCOLL_U8, KCOLL_AVG, 3, { 255, 255, 255 }, 255 },
	{ "i8 avg -128, -128, -127 = -127 (toward zero)", KCOLL_I8, KCOLL_AVG, 3,
	  { 0x80, 0x80, 0x81 }, 0x81 },
	{ "i32 avg -7, 0 = -3 (toward zero)", KCOLL_I32, KCOLL_AVG, 2, { 0xfffffff9, 0 }, 0xfffffffd },
	{ "i32 avg 7, 0 = 3", KCOLL_I32, KCOLL_AVG, 2, { 7, 0 }, 3 },
	{ "i32 avg INT_MAX x 3 sums in 64 bits", KCOLL_I32, KCOLL_AVG, 3,
	  { 0x7fffffff, 0x7fffffff, 0x7fffffff }, 0x7fffffff },
	{ "u32 prod wraps", KCOLL_U32, KCOLL_PROD, 2, { 0x10000, 0x10001 }, 0x10000 },
	{ "i64 min is signed", KCOLL_I64, KCOLL_MIN, 2, { 1, 0x8000000000000000ull },
	  0x8000000000000000ull },
	{ "u64 min is unsigned", KCOLL_U64, KCOLL_MIN, 2, { 1, 0x8000000000000000ull }, 1 },
	{ "u64 avg: the 64-bit sum wraps (documented)", KCOLL_U64, KCOLL_AVG, 2,
	  { ~0ull, 1 }, 0 },
	{ "i64 avg: INT64_MAX x 2 wraps to -2, / 2 = -1 (documented)", KCOLL_I64, KCOLL_AVG, 2,
	  { 0x7fffffffffffffffull, 0x7fffffffffffffffull }, ~0ull },
	{ "i64 prod wraps", KCOLL_I64, KCOLL_PROD, 3, { 1ull << 40, 1ull << 20, 1ull << 4 }, 0 },
};

/* Each known answer, repeated over MAX_COUNT elements (vector body and tail). */
static void test_known(const char *impl,
		       int (*reduce)(enum kcoll_dtype, enum kcoll_redop, void *,
				     const void *const *, unsigned int, size_t))
{
	const void *in[4];
	unsigned int j, k, bad;
	size_t i;

	for (j = 0; j < ARRAY_SIZE(knowns); j++) {
		const struct known *t = &knowns[j];

		for (k = 0; k < t->nin; k++) {
			for (i = 0; i < MAX_COUNT; i++)
				put_elem(t->dt, pool[k], i, t->in[k]);
			in[k] = pool[k];
		}
		memset(got_buf, 0, MAX_COUNT * 8);
		bad = reduce(t->dt, t->op, got_buf, in, t->nin, MAX_COUNT) != 0;
		for (i = 0; i < MAX_COUNT && !bad; i++) {
			if (get_elem(t->dt, got_buf, i) != t->want) {
				tap_diag("element %zu is 0x%llx, want 0x%llx", i,
					 (unsigned long long)get_elem(t->dt, got_buf, i),
					 (unsigned long long)t->want);
				bad = 1;
			}
		}
		tap_ok(!bad, "%s: %s", impl, t->what);
	}
}

static void test_einval(void)
{
	float a[1] = { 1 }, out[1] = { 7 };
	const void *in[1] = { a };
	const void *none[1] = { NULL };

	tap_ok(kcoll_reduce_n(KCOLL_DTYPE_MAX, KCOLL_SUM, out, in, 1, 1) == -EINVAL,
	       "unknown dtype: -EINVAL");
	tap_ok(kcoll_reduce_n((enum kcoll_dtype)-1, KCOLL_SUM, out, in, 1, 1) == -EINVAL,
	       "negative dtype: -EINVAL");
	tap_ok(kcoll_reduce_n(KCOLL_F32, KCOLL_REDOP_MAX, out, in, 1, 1) == -EINVAL,
	       "unknown op: -EINVAL");
	tap_ok(kcoll_reduce_n(KCOLL_F32, KCOLL_SUM, out, in, 0, 1) == -EINVAL, "nin 0: -EINVAL");
	tap_ok(kcoll_reduce_n(KCOLL_F32, KCOLL_SUM, NULL, none, 1, 0) == 0 && out[0] == 7,
	       "count 0: returns 0, touches nothing");
	tap_ok(kcoll_reduce_ref(KCOLL_DTYPE_MAX, KCOLL_SUM, out, in, 1, 1) == -EINVAL &&
	       kcoll_reduce_ref(KCOLL_F32, KCOLL_REDOP_MAX, out, in, 1, 1) == -EINVAL &&
	       kcoll_reduce_ref(KCOLL_F32, KCOLL_SUM, out, in, 0, 1) == -EINVAL &&
	       kcoll_reduce_ref(KCOLL_F32, KCOLL_SUM, NULL, none, 1, 0) == 0,
	       "reference: the same -EINVAL rules, count 0 is a no-op");
}

/* ---- one implementation per child process ---------------------------------- */

struct child_report {
	int tap_n, tap_failed;
	char impl[32];
};

/*
 * Run body() in a child with KCOLL_REDUCE_IMPL=want (NULL: unset); the
 * child's TAP lines continue our numbering. Returns the implementation the
 * child ended up with ("" if it died).
 */
static const char *in_child(const char *want, void (*body)(const char *want, const char *impl))
{
	static struct child_report rep;
	int fds[2], status;
	pid_t pid;

	fflush(stdout);
	if (pipe(fds) || (pid = fork()) < 0) {
		tap_ok(0, "pipe/fork: %s", strerror(errno));
		return "";
	}
	if (!pid) {
		close(fds[0]);
		if (want)
			setenv("KCOLL_REDUCE_IMPL", want, 1);
		else
			unsetenv("KCOLL_REDUCE_IMPL");
		memset(&rep, 0, sizeof(rep));
		snprintf(rep.impl, sizeof(rep.impl), "%s", kcoll_reduce_impl());
		body(want, rep.impl);
		rep.tap_n = tap_n;
		rep.tap_failed = tap_failed;
		fflush(stdout);
		_exit(write(fds[1], &rep, sizeof(rep)) == sizeof(rep) ? 0 : 1);
	}
	close(fds[1]);
	memset(&rep, 0, sizeof(rep));
	if (read(fds[0], &rep, sizeof(rep)) != sizeof(rep))
		rep.impl[0] = 0;
	close(fds[0]);
	waitpid(pid, &status, 0);
	if (!rep.impl[0] || !WIFEXITED(status) || WEXITSTATUS(status)) {
		tap_ok(0, "child for KCOLL_REDUCE_IMPL=%s died (status 0x%x)", want ? want : "",
		       status);
		return "";
	}
	tap_n = rep.tap_n;
	tap_failed = rep.tap_failed;
	return rep.impl;
}

static char default_impl[32];

static void run_default(const char *want, const char *impl)
{
	tap_diag("kcoll_reduce_impl() with KCOLL_REDUCE_IMPL unset: %s", impl);
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(impl_names) && strcmp(impl, impl_names[i]); i++)
		;
	tap_ok(i < ARRAY_SIZE(impl_names), "the default implementation is a known one: %s", impl);
	test_einval();
}

static void run_bogus(const char *want, const char *impl)
{
	tap_ok(!strcmp(impl, default_impl), "KCOLL_REDUCE_IMPL=%s falls back to %s (got %s)", want,
	       default_impl, impl);
}

static void run_forced(const char *want, const char *impl)
{
	if (strcmp(impl, want)) {
		tap_ok(!strcmp(impl, default_impl),
		       "KCOLL_REDUCE_IMPL=%s, which this CPU lacks: falls back to %s (got %s)",
		       want, default_impl, impl);
		tap_skip("%s: not supported by this CPU", want);
		return;
	}
	tap_ok(1, "KCOLL_REDUCE_IMPL=%s is used", want);
	test_known(impl, kcoll_reduce_n);
	test_half_codes(impl, KCOLL_F16);
	test_half_codes(impl, KCOLL_BF16);
	test_f16_ftz(impl);
	test_against_ref(impl);
}

int main(void)
{
	struct narrow_check f16 = { "f16", kcoll_f32_to_f16, f16_oracle, f16_value, 0x7c00, 0x200, 13, 0 };
	struct narrow_check bf16 = { "bf16", kcoll_f32_to_bf16, bf16_oracle, bf16_value, 0x7f80, 0x40,
				     16, 0 };
	unsigned int k, i;

	for (k = 0; k < MAX_NIN; k++)
		pool[k] = malloc(MAX_COUNT * 8 + SLACK);
	want_buf = malloc(MAX_COUNT * 8 + SLACK);
	got_buf = malloc(MAX_COUNT * 8 + SLACK);

	test_f16_exhaustive();
	test_bf16_exhaustive();
	test_narrow(&f16);
	test_narrow(&bf16);
	test_known("reference", kcoll_reduce_ref);
	test_avg_pieces();

	snprintf(default_impl, sizeof(default_impl), "%s", in_child(NULL, run_default));
	in_child("no-such-impl", run_bogus);
	for (i = 0; i < ARRAY_SIZE(impl_names); i++)
		in_child(impl_names[i], run_forced);

	for (k = 0; k < MAX_NIN; k++)
		free(pool[k]);
	free(want_buf);
	free(got_buf);
	return tap_done();
}
