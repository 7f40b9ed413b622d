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

/* f16/bf16 <-> f32, round to nearest-even, NaN preserved (quiet). */
float kcoll_f16_to_f32(unsigned short h);
unsigned short kcoll_f32_to_f16(float f);
float kcoll_bf16_to_f32(unsigned short b);
unsigned short kcoll_f32_to_bf16(float f);

#endif /* KCOLL_REDUCE_H */
