/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR MIT) */
/*
 * C4: the anomaly detector (C4D) and flow planner (C4P) of one communicator.
 *
 * Freestanding: no libc, no OS call, no allocation, no floating point, so
 * kcolld (user/common/c4.c) and kcoll.ko can build the very same code. The
 * caller owns the state (struct kcoll_c4, ~200 KiB: allocate it), serialises
 * calls on one instance, and passes the time (any monotonic nanosecond clock).
 *
 * Inputs, all optional:
 *   - a local rank submitted its n-th op / its op completed (think time:
 *     how long a rank took to submit after its previous op completed);
 *   - per-rank summaries of the other hosts' ranks (sent by their daemons);
 *   - link observations (struct kcoll_c4_linkobs): bytes moved over a peer
 *     host on a local link and the time they took. kcolld feeds the counters
 *     of its own data streams; per-flow BPF statistics fit the same struct;
 *   - "the data path waits on host h since t" (hang evidence).
 *
 * Classes (docs/c4.md): communication hang (data from a host does not come
 * though every rank submitted), non-communication hang (a rank never
 * submitted the op the others wait in), communication slow (a link much
 * slower than the median of its peers, collective traffic being homogeneous,
 * and than its own usual rate),
 * non-communication slow (a straggler: a rank's think time well above the
 * median, by median/MAD). Raising needs min_samples and raise_evals
 * consecutive bad evaluations, clearing clear_evals good ones (hysteresis).
 */
#ifndef KCOLL_C4_H
#define KCOLL_C4_H

#ifdef __KERNEL__
#include <linux/types.h>
#else
#include <stdbool.h>
#include <stdint.h>
#endif

#define KCOLL_C4_MAX_RANKS	256
#define KCOLL_C4_MAX_HOSTS	64
#define KCOLL_C4_MAX_LINKS	4	/* networks (local interfaces) per host */
#define KCOLL_C4_MAX_STREAMS	8
#define KCOLL_C4_WIN		16	/* samples kept per link and per rank */
#define KCOLL_C4_BPF_WIN	8	/* BPF flow-statistics samples kept per link */
#define KCOLL_C4_EVQ		128	/* events kept (a ring) */
#define KCOLL_C4_NONE		0xffffffffu

enum kcoll_c4_kind {
	KCOLL_C4_COMM_HANG = 1,
	KCOLL_C4_NONCOMM_HANG = 2,
	KCOLL_C4_COMM_SLOW = 3,
	KCOLL_C4_NONCOMM_SLOW = 4,	/* straggler */
};

enum kcoll_c4_dir { KCOLL_C4_RX = 0, KCOLL_C4_TX = 1 };

struct kcoll_c4_params {
	uint32_t slow_ratio_pct;	/* slow: the median's rate > this % of a link's (sysfs) */
	uint32_t hang_ms;		/* hang: no progress / no submission this long (sysfs) */
	uint32_t straggler_ms;		/* straggler: think time this much above the median */
	uint32_t mad_k;			/* ... and above mad_k median absolute deviations */
	uint32_t min_samples;		/* per link or rank before it is judged */
	uint32_t raise_evals;		/* consecutive bad evaluations to raise */
	uint32_t clear_evals;		/* consecutive good evaluations to clear */
	uint32_t window_ms;		/* link samples older than this are dropped */
	uint32_t heal_hold_ms;		/* planner: a cleared link is used again after this */
	uint32_t probe_ms;		/* a slow link that carries nothing keeps its verdict this
					 * long, then clears: the planner tries it again */
	uint32_t min_obs_bytes;		/* link observations add up to a sample of this many */
	uint32_t min_obs_busy_ms;	/* bytes, or of this much busy time (whichever first) */
	uint32_t min_busy_pct;		/* a link is judged slow only if busy this % of the time
					 * (a bottleneck; after idle gaps TCP restarts slowly) */
	uint32_t bpf_window_ms;		/* BPF flow statistics: the rate over this much time */
};

/* The defaults (kcollctl set / sysfs change them). */
void kcoll_c4_params_default(struct kcoll_c4_params *p);

/*
 * One observation of the traffic with a peer host over one local link.
 * Two sources fill it:
 *   - the daemon's data streams (flags 0): bytes of large pieces and the
 *     time they took (busy time, idle gaps excluded): the timing evidence;
 *   - BPF flow statistics (KCOLL_C4_OBS_BPF): the payload bytes the tc
 *     classifiers counted since the previous observation, busy_ns = the
 *     wall-clock interval they cover (BPF cannot tell busy from idle), the
 *     TCP retransmissions in that interval and the flows' smoothed RTT.
 *     They never raise an anomaly by themselves (a whole collective slowing
 *     down lowers every link's wall-clock rate); they corroborate the timing
 *     evidence of the same (peer, link, direction) and are shown with it.
 */
struct kcoll_c4_linkobs {
	uint32_t host;		/* the peer's host index */
	uint32_t link;		/* local link (network) index */
	uint32_t dir;		/* enum kcoll_c4_dir */
	uint32_t flags;		/* KCOLL_C4_OBS_* */
	uint64_t bytes;		/* moved in this observation */
	uint64_t busy_ns;	/* the time those bytes took (not idle time); BPF: the interval */
	uint64_t t_ns;		/* when observed */
	uint32_t retrans;	/* TCP retransmissions in the interval (BPF), 0 unknown */
	uint32_t srtt_us;	/* smoothed RTT (BPF), 0 unknown */
};

#define KCOLL_C4_OBS_BPF	(1u << 0)	/* from BPF flow statistics */

/* BPF flow statistics of one (peer, link, direction), judged at evaluation. */
struct kcoll_c4_bpf {
	uint64_t bytes[KCOLL_C4_BPF_WIN], dt[KCOLL_C4_BPF_WIN], t[KCOLL_C4_BPF_WIN];
	uint32_t retr[KCOLL_C4_BPF_WIN];
	uint32_t n, pos;
	uint32_t srtt_us;	/* the last one seen (0: unknown) */
	uint32_t usual_srtt_us;	/* average while the link kept up */
	uint64_t rate;		/* last evaluation: payload B/s over bpf_window_ms (wall clock) */
	uint64_t usual;		/* average while the link kept up (0: not learnt yet) */
	uint32_t retrans;	/* last evaluation: retransmissions within bpf_window_ms */
	uint32_t state;		/* last evaluation: KCOLL_C4_BPF_* bits */
	uint32_t shifted;	/* evaluations in a row at another level while the timing is good */
};

/* kcoll_c4_bpf.state and kcoll_c4_event.bpf_flags */
#define KCOLL_C4_BPF_SEEN	(1u << 0)	/* BPF statistics cover this key */
#define KCOLL_C4_BPF_COLLAPSED	(1u << 1)	/* rate below usual * 100 / slow_ratio_pct */
#define KCOLL_C4_BPF_RETRANS	(1u << 2)	/* retransmissions within the window */
#define KCOLL_C4_BPF_RTT_UP	(1u << 3)	/* srtt above usual * slow_ratio_pct / 100 */
#define KCOLL_C4_BPF_CORROB	(1u << 4)	/* event: BPF corroborates the timing evidence */

/* What a daemon tells its peers about one of its ranks. */
struct kcoll_c4_rankrep {
	uint32_t rank;
	uint32_t age_ms;	/* since its last submission (or since the comm formed) */
	uint64_t nsub;		/* ops it submitted */
	uint32_t think_us;	/* median think time over its window */
	uint32_t nthink;	/* samples behind think_us */
};

struct kcoll_c4_event {
	uint64_t id;		/* 1, 2, ...: kcollctl events --follow resumes from one */
	uint64_t t_ns;
	uint32_t kind;		/* enum kcoll_c4_kind */
	uint32_t raised;	/* 1 raised, 0 cleared */
	uint32_t rank;		/* KCOLL_C4_NONE: not one rank */
	uint32_t host;
	uint32_t link;		/* KCOLL_C4_NONE: not a link */
	uint32_t via_host;	/* comm slow: the peer whose traffic showed it */
	uint64_t value;		/* slow: B/s; hang: ms waited; straggler: think us */
	uint64_t ref;		/* slow: the peers' median B/s; straggler: median us */
	uint64_t spread;	/* straggler: MAD us; slow: slow/total keys on the link */
	uint32_t nsamples;
	uint32_t seq_lo;	/* hangs: the op (low 32 bits of its sequence) */
	/* comm slow: BPF flow statistics of the same (via_host, link, bpf_dir) */
	uint32_t bpf_flags;	/* KCOLL_C4_BPF_*; 0: no BPF statistics */
	uint32_t bpf_dir;	/* enum kcoll_c4_dir of the evidence key */
	uint64_t bpf_rate;	/* payload B/s over bpf_window_ms (wall clock) */
	uint64_t bpf_usual;	/* its usual rate */
	uint32_t bpf_retrans;	/* retransmissions within bpf_window_ms */
	uint32_t bpf_srtt_us;	/* smoothed RTT now ... */
	uint32_t bpf_usual_srtt_us;	/* ... and usually */
	uint32_t pad;
};

struct kcoll_c4_rank {
	uint64_t nsub;
	uint64_t last_sub_ns;	/* local: last submission */
	uint64_t last_done_ns;	/* local: last completion */
	uint64_t rep_ns;	/* remote: when its summary arrived (0: none) */
	uint32_t rep_age_ms, rep_think_us, rep_nthink;
	uint32_t think_us[KCOLL_C4_WIN];
	uint32_t nthink, think_pos;
	bool local;
	bool straggler, hung;
	uint8_t bad, good;
};

struct kcoll_c4_link {
	uint64_t bytes[KCOLL_C4_WIN], busy[KCOLL_C4_WIN], t[KCOLL_C4_WIN];
	uint32_t n, pos;
	uint64_t rate;		/* last evaluation, B/s (0: not judged) */
	uint64_t usual;		/* its usual rate: average while it kept up with the median */
	uint64_t last_t;	/* its last observation */
	uint64_t cleared_t;	/* when its slow verdict last cleared (0: never): the
				 * link's keys are on probation after (c4.c) */
	/* observations added up until they make a sample (min_obs_*) */
	uint64_t acc_bytes, acc_busy, acc_t;
	bool slow;
	bool covered;		/* slow while the verdict was "our own link": it does not
				 * blame the peer when our verdict clears before it does */
	uint8_t bad, good;
};

/* A (host, link) the detector blames, and the planner avoids. */
struct kcoll_c4_culprit {
	bool slow;
	uint64_t since_ns, cleared_ns;
	uint32_t via_host;
	struct kcoll_c4_event ev;	/* the raise event */
};

struct kcoll_c4 {
	struct kcoll_c4_params p;
	uint32_t nranks, nhosts, self, nlinks;
	uint64_t start_ns;
	uint8_t rank_host[KCOLL_C4_MAX_RANKS];
	struct kcoll_c4_rank rank[KCOLL_C4_MAX_RANKS];
	struct kcoll_c4_link link[KCOLL_C4_MAX_HOSTS][KCOLL_C4_MAX_LINKS][2];
	struct kcoll_c4_bpf bpf[KCOLL_C4_MAX_HOSTS][KCOLL_C4_MAX_LINKS][2];
	struct kcoll_c4_culprit culprit[KCOLL_C4_MAX_HOSTS][KCOLL_C4_MAX_LINKS];
	/* the data path's wait */
	uint32_t wait_host, wait_link;
	uint64_t wait_since, wait_seq;
	bool comm_hung[KCOLL_C4_MAX_HOSTS];
	struct kcoll_c4_event hang_ev[KCOLL_C4_MAX_HOSTS];
	struct kcoll_c4_event rank_ev[KCOLL_C4_MAX_RANKS];	/* active rank anomaly */
	struct kcoll_c4_event ev[KCOLL_C4_EVQ];
	uint64_t next_id;
	/* evaluation scratch, off the stack (kernel stacks are small) */
	uint64_t tmp_v[KCOLL_C4_MAX_HOSTS * KCOLL_C4_MAX_LINKS * 2];
	uint64_t tmp_think[KCOLL_C4_MAX_RANKS];
	uint32_t tmp_n[KCOLL_C4_MAX_RANKS];
	uint32_t tmp_nsamp[KCOLL_C4_MAX_HOSTS][KCOLL_C4_MAX_LINKS][2];
	uint32_t tmp_busy[KCOLL_C4_MAX_HOSTS][KCOLL_C4_MAX_LINKS][2];
};

/* rank_host[nranks]: host index of each rank; the local ranks are marked by
 * kcoll_c4_local. nlinks: networks this host has. -EINVAL on bad sizes. */
int kcoll_c4_init(struct kcoll_c4 *c, const struct kcoll_c4_params *p, uint32_t nranks,
		  uint32_t nhosts, uint32_t self, uint32_t nlinks, const uint16_t *rank_host,
		  uint64_t now);
int kcoll_c4_local(struct kcoll_c4 *c, uint32_t rank);
int kcoll_c4_set_params(struct kcoll_c4 *c, const struct kcoll_c4_params *p);

/* A local rank submitted op seq (0-based) / saw op seq complete. */
int kcoll_c4_submit(struct kcoll_c4 *c, uint32_t rank, uint64_t seq, uint64_t now);
int kcoll_c4_complete(struct kcoll_c4 *c, uint32_t rank, uint64_t now);
/* Summary of a local rank to send to the peers; a peer's summary arrived. */
int kcoll_c4_rank_summary(const struct kcoll_c4 *c, uint32_t rank, uint64_t now,
			  struct kcoll_c4_rankrep *out);
int kcoll_c4_rank_report(struct kcoll_c4 *c, const struct kcoll_c4_rankrep *r, uint64_t now);
int kcoll_c4_link_obs(struct kcoll_c4 *c, const struct kcoll_c4_linkobs *o);
/* The data path of op seq has moved nothing since 'since', waiting for host
 * on link (KCOLL_C4_NONE: it does not wait). */
void kcoll_c4_wait(struct kcoll_c4 *c, uint32_t host, uint32_t link, uint64_t since, uint64_t seq);

/* Judge everything; returns the number of new events (raised or cleared). */
int kcoll_c4_evaluate(struct kcoll_c4 *c, uint64_t now);

/* Events with id > since, oldest first, at most max; returns how many. */
uint32_t kcoll_c4_events(const struct kcoll_c4 *c, uint64_t since, struct kcoll_c4_event *out,
			 uint32_t max);
/* Anomalies raised now (one event each), at most max; returns how many. */
uint32_t kcoll_c4_active(const struct kcoll_c4 *c, struct kcoll_c4_event *out, uint32_t max);
const char *kcoll_c4_kind_name(uint32_t kind);

/* ---- planner ------------------------------------------------------------ */

enum kcoll_c4_why {
	KCOLL_C4_WHY_SPREAD = 0,	/* default: streams spread over the shared links */
	KCOLL_C4_WHY_AVOID = 1,		/* moved off a degraded link */
	KCOLL_C4_WHY_HOLD = 2,		/* its link healed, not yet for heal_hold_ms */
	KCOLL_C4_WHY_NO_CHOICE = 3,	/* every shared link is degraded: spread anyway */
};

struct kcoll_c4_plan {
	uint32_t nstreams;
	uint64_t version;		/* bumped when an assignment changes */
	uint8_t link[KCOLL_C4_MAX_HOSTS][KCOLL_C4_MAX_STREAMS];
	uint8_t why[KCOLL_C4_MAX_HOSTS][KCOLL_C4_MAX_STREAMS];
	uint8_t avoided[KCOLL_C4_MAX_HOSTS][KCOLL_C4_MAX_STREAMS];	/* the link it left */
};

/*
 * Assign stream s of each peer h to a local link: shared[h] is the bitmap of
 * links both hosts are on. Healthy links share the streams round robin
 * (stream s -> the (s mod n)-th healthy link, the default placement when all
 * are healthy); a link the detector blames on either end is avoided, and used
 * again heal_hold_ms after it cleared. Returns 1 if the plan changed, 0 if
 * not, -EINVAL on bad sizes.
 */
int kcoll_c4_plan(const struct kcoll_c4 *c, const uint32_t *shared, uint32_t nstreams,
		  uint64_t now, struct kcoll_c4_plan *pl);
const char *kcoll_c4_why_name(uint32_t why);

#endif /* KCOLL_C4_H */
