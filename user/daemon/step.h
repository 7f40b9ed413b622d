/* SPDX-License-Identifier: MIT */
/*
 * The step engine (step.c): runs the steps of an inter-host algorithm
 * (struct kd_step, built by schedule.c) over the communicator's transport
 * (mh->xport, xport.h), for every transport.
 */
#ifndef KCOLLD_STEP_H
#define KCOLLD_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kd_mh;
struct kd_op;
struct kd_step;

/*
 * Run n steps numbered first.. of op on mh (mh->piece, sig, dtype, redop and
 * esz set for the op). Unchained: every transfer of a step at once, the
 * steps in order. Chained (ring phases: one send and one receive per step,
 * the send of step t being the segment received in step t - 1): piece j of
 * step t leaves as soon as piece j of step t - 1 has arrived and been
 * reduced. Opens the transport on first use (mh->xpriv). Returns 0 or a
 * negative errno with *bad_host the host it failed on or waited for
 * (KCOLL_RANK_NONE: none): -ECANCELED when the comm was aborted,
 * -ETIMEDOUT when nothing moved for the comm's timeout plus 2 s.
 */
int kd_step_run(struct kd_mh *mh, struct kd_op *op, const struct kd_step *st, uint32_t n,
		uint32_t first, bool chain, uint32_t *bad_host);

/* Close mh's transport context (the net thread has stopped). */
void kd_step_close(struct kd_mh *mh);

/* kcollctl status: the transport's own state for mh; bytes written. */
size_t kd_step_render(struct kd_mh *mh, char *buf, size_t cap, int json);

#endif /* KCOLLD_STEP_H */
