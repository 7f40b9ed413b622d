/* SPDX-License-Identifier: MIT */
/*
 * What C4's files in kcolld share, private to them (c4d.h is their API for
 * the rest of kcolld; docs/c4.md has the long form). Each calls only the
 * files above it in this list, as scripts/layering.py checks
 * (docs/architecture.md, "Layers"):
 *
 *   c4d_text.c   what a verdict says (text, JSON, link names) and the event
 *                log (kcollctl events)
 *   c4d_plan.c   the stream plan between a host pair, foreign flows'
 *                steering, kcollctl plan
 *   c4d_view.c   the communicator's view: every host's verdicts (KD_P_C4_VIEW),
 *                kcollctl anomalies, the status summary
 *   c4d.c        the detector: a communicator's attach and detach, its
 *                inputs (ranks, peers' reports, links, BPF), the tick, the
 *                hooks table
 *
 * Control thread, but where a function says otherwise (comm->lock,
 * mh->plan_lock).
 */
#ifndef KCOLLD_C4D_INT_H
#define KCOLLD_C4D_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcoll/c4.h>

#include "wire.h"

struct kd_comm;
struct kd_mh;
struct kd_op;
struct kd_phdr;
struct kd_p_c4_view;

#define KD_C4_REMOTE	16		/* active anomalies kept per peer host */

/* A peer host's last KD_P_C4_VIEW: its active anomalies and its data path's wait. */
struct kd_c4_remote {
	uint32_t n;
	struct kcoll_c4_event e[KD_C4_REMOTE];
	int64_t wall_ms[KD_C4_REMOTE];		/* raised, the observer's wall clock */
	int64_t heard_ms[KD_C4_REMOTE];		/* first in a view from it, our wall clock */
	uint32_t wait_host, wait_link, wait_ms;
	uint64_t wait_seq;
	int64_t at;				/* received (0: never) */
};

struct kd_c4 {
	struct kcoll_c4 core;			/* comm->lock */
	struct kd_c4_remote remote[KD_MAX_HOSTS];	/* control thread */
	uint64_t view_sig;			/* of the last view sent to the peers */
	struct kcoll_c4_plan plan;		/* control thread */
	uint64_t seen_bytes[KD_MAX_HOSTS][KD_MAX_STREAMS][2];
	uint64_t seen_busy[KD_MAX_HOSTS][KD_MAX_STREAMS][2];
	uint64_t consumed;			/* last core event logged */
	uint32_t peer_state[KD_MAX_HOSTS];	/* last reported to kcoll.ko's peers table */
	bool trace;				/* this comm writes the trace */
};

/* The renderers' append: n the length so far, cap buf's size; n may pass
 * cap (what did not fit), so callers clamp. */
#define PUT(...)                                                              \
	do {                                                                  \
		int w_ = snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__); \
		if (w_ > 0)                                                   \
			n += (size_t)w_;                                      \
	} while (0)

/* c4d_text.c */
const char *c4d_hname(const struct kd_mh *mh, uint32_t h);
const char *c4d_kind_key(uint32_t k);
void c4d_link_str(const struct kd_mh *mh, uint32_t h, uint32_t l, char *buf, size_t len);
size_t c4d_event_text(const struct kd_mh *mh, const struct kcoll_c4_event *e, char *b, size_t cap);
size_t c4d_jstr(char *b, size_t cap, const char *s);
size_t c4d_event_json(const struct kd_mh *mh, const struct kcoll_c4_event *e, char *buf, size_t cap);
int64_t c4d_wall_ms(void);
void c4d_log_event(struct kd_comm *comm, const struct kcoll_c4_event *e, uint32_t observer, int64_t when);
size_t c4d_render_events(uint64_t since, char *buf, size_t cap, int json, bool local);

/* c4d_plan.c */
void kd_c4_op_start(struct kd_mh *mh, struct kd_op *op);
void c4d_plan_propose(struct kd_comm *comm, uint32_t h, uint32_t mine, int64_t now);
void kd_c4_on_plan(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h);
uint32_t c4d_plan_avoid(const struct kd_mh *mh, const struct kcoll_c4_plan *pl, uint32_t h);
void c4d_plan_log(struct kd_comm *comm, struct kd_c4 *c, const struct kcoll_c4_plan *old);
void c4d_steer_foreign(struct kd_mh *mh, const struct kcoll_c4_plan *pl, bool enforce, int64_t now,
		       uint32_t *recv_ready);
size_t c4d_render_plan(char *buf, size_t cap, int json);

/* c4d_view.c */
bool c4d_stalled_wait(struct kd_mh *mh, const struct kd_c4 *c, int64_t now, struct kd_p_c4_view *w);
uint64_t c4d_view_sig(const struct kcoll_c4_event *act, uint32_t na, const struct kd_p_c4_view *v);
void c4d_view_send(struct kd_mh *mh, const struct kcoll_c4_event *act, uint32_t na,
		   const struct kd_p_c4_view *w, int64_t now);
void kd_c4_on_view(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h);
uint32_t kd_c4_summary(struct kd_comm *comm, uint64_t *seen);
size_t c4d_render_anomalies(char *buf, size_t cap, int json, bool local);

#endif /* KCOLLD_C4D_INT_H */
