/* SPDX-License-Identifier: MIT */
/* The inter-host algorithms of multi-host ops (schedule.c). */
#ifndef KCOLLD_SCHEDULE_H
#define KCOLLD_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mh.h"	/* struct kd_step */

#define KD_SCHED_SMALL_BYTES	(64u << 10)	/* auto: recursive doubling up to here */

/* One op's phase 2, as every host of the communicator runs it. */
struct kd_sched_op {
	uint32_t opcode;	/* KCOLL_OP_* */
	uint64_t bytes;		/* the accumulator's bytes (0: a barrier checks the op agrees) */
	uint64_t block;		/* reduce-scatter, all-gather: one rank's block, accumulator bytes */
	size_t esz;		/* broadcast: element size (segments are whole elements) */
	uint32_t nranks;	/* reduce-scatter, all-gather: ranks (mh->rank_host places them) */
	uint32_t root_host;	/* broadcast: the root's host */
	const uint8_t *in0;	/* the single local rank's input, read in place; NULL: mh->acc */
};

/* The all-reduce algorithm mh->algo means for bytes (auto: by size and host
 * count; direct too large for its scratch: ring). */
enum kd_algo kd_sched_algo(const struct kd_mh *mh, uint64_t bytes);

/* Does algorithm a on nhosts hosts take kd_sched_op.in0 (ring, direct,
 * Rabenseifner on a power of two)? The others want the input in mh->acc. */
bool kd_sched_reads_in0(enum kd_algo a, uint32_t nhosts);

/*
 * Run s over mh->xport on mh->acc (mh->dtype, redop and esz set; mh->snap is
 * scratch it may grow; mh->algo picks the all-reduce algorithm, auto by
 * size). 0, or -errno with *bad_host the host at fault (KCOLL_RANK_NONE).
 */
int kd_sched_run(struct kd_mh *mh, struct kd_op *op, const struct kd_sched_op *s, uint32_t *bad_host);

#endif /* KCOLLD_SCHEDULE_H */
