/* SPDX-License-Identifier: MIT */
/*
 * Element-wise reductions for every kcoll dtype x redop.
 *
 * Semantics (docs/reduce.md has the long form):
 *  - out[i] = in[0][i] op in[1][i] op ... op in[nin-1][i], applied strictly in
 *    input order, so the result does not depend on vector width or chunking;
 *  - f16/bf16 are widened to f32, combined in f32, rounded once to nearest-even;
 *  - integer sum/prod wrap (two's complement); integer avg sums in 64 bits
 *    and divides truncating toward zero; float avg is the sum divided by nin;
 *  - min/max use (b < a ? b : a) / (b > a ? b : a): NaN handling follows that.
 * kcoll_reduce_n dispatches at run time to the best implementation the CPU
 * supports; kcoll_reduce_ref is the scalar reference it is tested against.
 */
#ifndef KCOLL_REDUCE_H
#define KCOLL_REDUCE_H

#include <stddef.h>
#include <linux/kcoll.h>

/*
 * out may be exactly any in[k] (in place) but must not otherwise overlap one;
 * no alignment is needed. Returns 0, or -EINVAL for an unknown dtype/op or
 * nin == 0; count == 0 does nothing. Every NaN result is quiet.
 */
int kcoll_reduce_n(enum kcoll_dtype dtype, enum kcoll_redop op, void *out,
		   const void *const *in, unsigned int nin, size_t count);
int kcoll_reduce_ref(enum kcoll_dtype dtype, enum kcoll_redop op, void *out,
		     const void *const *in, unsigned int nin, size_t count);
/* Which implementation kcoll_reduce_n uses on this CPU ("avx2", "generic"...);
 * chosen at the first call, KCOLL_REDUCE_IMPL can force one. */
const char *kcoll_reduce_impl(void);

/*
 * avg in pieces (kcolld's multi-host path): the inputs are summed where they
 * are, the sums travel and are summed again, and the total is divided once
 * at the end, giving what kcoll_reduce_n's avg gives with every input at once
 * (bit for bit for integers, f32 and f64 summed in the same order; f16/bf16
 * round each partial sum to the type, see docs/reduce.md).
 *  - kcoll_avg_sum_dtype(dt): the type the sums are kept in: i64 for signed,
 *    u64 for unsigned integers (as the one-host avg sums), dt for floats.
 *  - kcoll_avg_widen_add(dt, sum, in, count, first): sum[i] (i64/u64) =
 *    (first ? 0 : sum[i]) + in[i] of type dt (integers only).
 *  - kcoll_avg_finish(dt, buf, count, nin): buf[i] = buf[i] / nin. For
 *    integers buf holds the 64-bit sums and the quotients (truncated toward
 *    zero) are packed back to dt at its start; floats are divided in place
 *    (f16/bf16 in f32).
 */
enum kcoll_dtype kcoll_avg_sum_dtype(enum kcoll_dtype dt);
void kcoll_avg_widen_add(enum kcoll_dtype dt, void *sum, const void *in, size_t count, int first);
void kcoll_avg_finish(enum kcoll_dtype dt, void *buf, size_t count, unsigned int nin);

/* f16/bf16 <-> f32, round to nearest-even, NaN preserved (quiet). */
float kcoll_f16_to_f32(unsigned short h);
unsigned short kcoll_f32_to_f16(float f);
float kcoll_bf16_to_f32(unsigned short b);
unsigned short kcoll_f32_to_bf16(float f);

#endif /* KCOLL_REDUCE_H */
