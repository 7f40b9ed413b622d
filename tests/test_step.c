// SPDX-License-Identifier: MIT
/*
 * The step engine (user/daemon/step.c) over the loopback transport
 * (xport_loop.c): every host of a communicator is a thread of this process,
 * and the schedules of schedule.c run through the engine exactly as in
 * kcolld, over 1..3 streams and small pieces (so transfers are cut, spread
 * over streams and chained piece by piece). For 1..9 hosts, every result
 * byte is checked against a reference computed here:
 *   - all-reduce with every algorithm (auto, ring, recursive doubling,
 *     Rabenseifner, direct): i32, f32, f64, i64, u8 (sum wraps), max; sizes
 *     0, 1, 7, 1001 and 65537 elements (not divisible by the host count);
 *     the input read in place (in0); a C4 plan leaving a stream unused
 *   - reduce-scatter and all-gather, ranks one per host, two per host and
 *     dealt round-robin; broadcast from several roots, direct and
 *     scatter + ring; barrier
 * and the engine's failure paths:
 *   - a piece whose payload is damaged on the way: the byte check sees it
 *     (the proof that this test can fail)
 *   - a damaged header (another step): the receiver fails with -EPROTO
 *     naming the sender; a host running another op (signature): -EBADMSG
 *   - the comm aborted while hosts wait for a silent one: -ECANCELED
 *   - a host that never answers: -ETIMEDOUT naming it
 * and, over the loopback with several sends in flight per stream
 * (kd_xport_loop_deep: TX events only once the receiver took the piece):
 *   - the same byte checks (chained ring steps, direct, recursive doubling)
 *   - a transport that reports two TX events of a stream swapped, or one
 *     twice: the engine fails the op with -EPROTO instead of counting a
 *     piece twice or taking one for another
 *   - C4 busy time: the overlapping sends' intervals count once (the busy
 *     time of a stream and direction is at most the op's wall time)
 * and over the TCP transport (xport_tcp.c) on loopback TCP connections:
 *   - the byte checks again (every algorithm, the input in place where the
 *     algorithm reads it so, chained ring steps, reduce-scatter, all-gather,
 *     broadcast), and afterwards no byte left unread on any connection
 *   - the transport alone: a send's buffer is free at its TX event (rewritten
 *     then, the receiver still gets the bytes sent)
 *   - a host whose connections close before the op: the others fail with
 *     -ECONNRESET naming it, at once rather than at the timeout; one whose
 *     connections carry junk where a piece header belongs: -EPROTO naming it
 * Every sent piece must have been received when an op succeeds.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "kcoll/tap.h"

#include "kcolld.h"
#include "mh.h"
#include "reduce.h"
#include "schedule.h"
#include "step.h"
#include "xport.h"
#include "loopmh.h"

#define MAXH	9

/* How one run is set up, beyond the op. */
struct cfg {
	uint32_t nstreams;
	size_t piece;
	uint32_t avoid;		/* streams every host pair leaves unused (C4 plan) */
	int silent;		/* this host never runs (-1: none) */
	int64_t timeout_ns;
	uint32_t corrupt_nth;	/* kd_loop_fabric_corrupt (0: none) */
	bool corrupt_payload;
	int other_sig;		/* this host runs another op (-1: none) */
	bool cancel;		/* abort the comm once the others wait */
	const struct kd_xport_ops *xp;	/* NULL: kd_xport_loop */
	uint32_t fault;		/* kd_loop_fabric_fault (0: none) */
	bool tcp;		/* kd_xport_tcp over loopback TCP connections (xp ignored);
				 * the silent host's ends are closed before the run */
	bool junk;		/* ... or carry a piece header of junk, left open */
};

static const struct cfg CFG = { .nstreams = 2, .piece = 4096, .silent = -1, .timeout_ns = 10000000000LL,
				.other_sig = -1 };

struct host {
	struct kd_mh mh;
	struct kd_sched_op sop;
	struct kd_op *op;
	int r;
	uint32_t bad;
	pthread_t t;
	int64_t t0, t1;		/* kd_sched_run's start and end */
};

/* C4 observation of the last run, over all hosts, streams and directions. */
static struct {
	uint64_t bytes;		/* observed */
	uint32_t over;		/* (host, peer, stream, direction)s busy longer than the op ran */
	char worst[160];
} obs;

static struct kd_comm comm;
static struct host hs[MAXH];
static uint32_t nh;

/* A failed host aborts the comm, as kcolld does: the others stop waiting. */
static void abort_all(void)
{
	uint64_t one = 1;

	__atomic_store_n(&comm.limit_seq, 0, __ATOMIC_RELAXED);
	for (uint32_t h = 0; h < nh; h++)
		if (write(hs[h].mh.abort_fd, &one, sizeof(one)) < 0)
			abort();
}

static bool abort_on_fail;

static void *host_main(void *arg)
{
	struct host *h = arg;

	h->t0 = kd_now_ns();
	h->r = kd_sched_run(&h->mh, h->op, &h->sop, &h->bad);
	h->t1 = kd_now_ns();
	if (h->r && abort_on_fail)
		abort_all();
	return NULL;
}

/* ---- TCP on loopback ------------------------------------------------------- */

/* A connected TCP pair on 127.0.0.1, non-blocking with TCP_NODELAY as
 * net.c leaves its data streams. */
static void tcp_pair(int fd[2])
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1) ||
	    getsockname(l, (struct sockaddr *)&a, &al))
		abort();
	fd[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd[0] < 0 || connect(fd[0], (struct sockaddr *)&a, sizeof(a)))
		abort();
	fd[1] = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	if (fd[1] < 0)
		abort();
	close(l);
	for (int e = 0; e < 2; e++)
		if (setsockopt(fd[e], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) ||
		    fcntl(fd[e], F_SETFL, O_NONBLOCK))
			abort();
}

/* A mesh of nstreams connections per host pair, as net.c builds. */
static void tcp_mesh(uint32_t H, uint32_t S)
{
	for (uint32_t h = 0; h < H; h++)
		for (uint32_t g = h + 1; g < H; g++)
			for (uint32_t s = 0; s < S; s++) {
				int fd[2];

				tcp_pair(fd);
				hs[h].mh.hosts[g].data[s] = fd[0];
				hs[g].mh.hosts[h].data[s] = fd[1];
			}
}

/* Close host h's ends (-1 after). */
static void tcp_close_host(uint32_t H, uint32_t S, uint32_t h)
{
	for (uint32_t g = 0; g < H; g++)
		for (uint32_t s = 0; g != h && s < S; s++)
			if (hs[h].mh.hosts[g].data[s] >= 0) {
				close(hs[h].mh.hosts[g].data[s]);
				hs[h].mh.hosts[g].data[s] = -1;
			}
}

/* Host h writes one piece header's worth of junk to every peer. */
static void tcp_junk_host(uint32_t H, uint32_t S, uint32_t h)
{
	uint8_t junk[sizeof(struct kd_p_data)];

	memset(junk, 0x5a, sizeof(junk));
	for (uint32_t g = 0; g < H; g++)
		for (uint32_t s = 0; g != h && s < S; s++)
			if (write(hs[h].mh.hosts[g].data[s], junk, sizeof(junk)) != (ssize_t)sizeof(junk))
				abort();
}

/* Bytes waiting to be read on all hosts' connections. */
static int tcp_unread(uint32_t H, uint32_t S)
{
	int left = 0;

	for (uint32_t h = 0; h < H; h++)
		for (uint32_t g = 0; g < H; g++)
			for (uint32_t s = 0; g != h && s < S; s++) {
				int n = 0;

				if (hs[h].mh.hosts[g].data[s] >= 0 &&
				    ioctl(hs[h].mh.hosts[g].data[s], FIONREAD, &n) == 0)
					left += n;
			}
	return left;
}

/* Runs sop (per host: acc[h], in0[h] or NULL) on H hosts. Returns 0 when
 * every running host returned 0 and every piece sent was received, else -1
 * with *why set; r[h] and bad[h] what each host returned. */
static int run(uint32_t H, const struct cfg *cf, enum kd_algo algo, enum kcoll_dtype dt, enum kcoll_redop redop,
	       const struct kd_sched_op *sop, uint8_t **acc, const uint8_t **in0, uint16_t *rank_host, int *r,
	       uint32_t *bad, char *why, size_t cap)
{
	static struct kd_op op;
	struct kd_loop_fabric *f = kd_loop_fabric_new(H, cf->nstreams);
	int rc = 0, unread = 0;

	if (!f)
		abort();
	memset(hs, 0, sizeof(hs));
	nh = H;
	snprintf(comm.name, sizeof(comm.name), "test");
	comm.timeout_ns = cf->timeout_ns;
	comm.limit_seq = UINT64_MAX;
	op.comm = &comm;
	op.seq = 1;
	abort_on_fail = !cf->cancel && cf->silent < 0;
	if (cf->corrupt_nth)
		kd_loop_fabric_corrupt(f, cf->corrupt_nth, cf->corrupt_payload);
	if (cf->fault)
		kd_loop_fabric_fault(f, (enum kd_loop_fault)cf->fault);
	memset(&obs, 0, sizeof(obs));
	for (uint32_t h = 0; h < H; h++) {
		struct kd_mh *mh = &hs[h].mh;

		loopmh_init(mh, h, H, cf->nstreams, f);
		mh->algo = algo;
		for (uint32_t g = 0; g < H; g++)
			mh->hosts[g].avoid = cf->avoid;
		if (cf->xp)
			mh->xport = cf->xp;
		if (cf->tcp)
			mh->xport = &kd_xport_tcp;
		mh->acc = acc[h];
		mh->piece = cf->piece;
		mh->sig = (int)h == cf->other_sig ? 0x5eed : 0xc0ffee;
		mh->dtype = dt;
		mh->redop = redop;
		mh->esz = kcoll_dtype_size(dt);
		mh->rank_host = rank_host;
		hs[h].op = &op;
		hs[h].sop = *sop;
		hs[h].sop.in0 = in0 ? in0[h] : NULL;
	}
	if (cf->tcp) {
		tcp_mesh(H, cf->nstreams);
		if (cf->silent >= 0 && cf->junk)
			tcp_junk_host(H, cf->nstreams, (uint32_t)cf->silent);
		else if (cf->silent >= 0)
			tcp_close_host(H, cf->nstreams, (uint32_t)cf->silent);
	}
	for (uint32_t h = 0; h < H; h++)
		if ((int)h != cf->silent && pthread_create(&hs[h].t, NULL, host_main, &hs[h]))
			abort();
	if (cf->cancel) {
		struct timespec ts = { 0, 200000000 };

		nanosleep(&ts, NULL);	/* the others are waiting for the silent host */
		abort_all();
	}
	*why = 0;
	for (uint32_t h = 0; h < H; h++)
		if ((int)h != cf->silent)
			pthread_join(hs[h].t, NULL);
	if (cf->tcp && cf->silent < 0)
		unread = tcp_unread(H, cf->nstreams);
	for (uint32_t h = 0; cf->tcp && h < H; h++)
		tcp_close_host(H, cf->nstreams, h);
	/* All joined first: a failing host writes every host's abort_fd. */
	for (uint32_t h = 0; h < H; h++) {
		struct kd_mh *mh = &hs[h].mh;

		r[h] = hs[h].r;
		bad[h] = hs[h].bad;
		if (hs[h].r && !rc) {
			snprintf(why, cap, "host %u: %s (host at fault %d)", h, strerror(-hs[h].r), (int)hs[h].bad);
			rc = -1;
		}
		for (uint32_t g = 0; g < H; g++)
			for (uint32_t s = 0; s < KD_MAX_STREAMS; s++)
				for (int d = 0; d < 2; d++) {
					uint64_t busy = atomic_load(&mh->hosts[g].obs_busy[s][d]);

					obs.bytes += atomic_load(&mh->hosts[g].obs_bytes[s][d]);
					if (busy > (uint64_t)(hs[h].t1 - hs[h].t0)) {
						obs.over++;
						snprintf(obs.worst, sizeof(obs.worst), "host %u to %u stream %u %s: "
							 "busy %llu us in an op of %llu us", h, g, s, d ? "tx" : "rx",
							 (unsigned long long)busy / 1000,
							 (unsigned long long)(hs[h].t1 - hs[h].t0) / 1000);
					}
				}
		loopmh_fini(mh);
	}
	if (!rc && unread) {
		snprintf(why, cap, "%d byte(s) left unread on the connections", unread);
		rc = -1;
	}
	if (!rc && kd_loop_fabric_pending(f)) {
		snprintf(why, cap, "%u piece(s) sent were never received", kd_loop_fabric_pending(f));
		rc = -1;
	}
	kd_loop_fabric_free(f);
	return rc;
}

/* ---- values and their reference results ------------------------------------ */

static const char *const algo_name[] = { "auto", "ring", "rd", "rabenseifner", "direct" };

/* Small integers, exact in every type (u8: 0..200). */
static int64_t val(uint32_t h, size_t i, enum kcoll_dtype dt)
{
	int64_t v = (int64_t)((h * 7919u + i * 104729u + 13) % 201u);

	return dt == KCOLL_U8 ? v : v - 100;
}

static void put(enum kcoll_dtype dt, uint8_t *p, size_t i, int64_t v)
{
	switch (dt) {
	case KCOLL_F32: ((float *)p)[i] = (float)v; break;
	case KCOLL_F64: ((double *)p)[i] = (double)v; break;
	case KCOLL_I32: ((int32_t *)p)[i] = (int32_t)v; break;
	case KCOLL_I64: ((int64_t *)p)[i] = v; break;
	case KCOLL_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
	default: abort();
	}
}

static int64_t want(uint32_t H, size_t i, enum kcoll_dtype dt, enum kcoll_redop redop)
{
	int64_t w = val(0, i, dt);

	for (uint32_t h = 1; h < H; h++)
		w = redop == KCOLL_MAX ? (val(h, i, dt) > w ? val(h, i, dt) : w) : w + val(h, i, dt);
	return w;
}

/* Bytes of acc that differ from the encoded reference. */
static size_t wrong_bytes(const uint8_t *acc, const uint8_t *ref, size_t bytes)
{
	size_t n = 0;

	for (size_t b = 0; b < bytes; b++)
		n += acc[b] != ref[b];
	return n;
}

struct ar {
	uint32_t H;
	enum kd_algo algo;
	enum kcoll_dtype dt;
	enum kcoll_redop redop;
	size_t count;
	bool fused;
};

/* All-reduce; returns the wrong bytes over all hosts (SIZE_MAX: failed). */
static size_t allreduce(const struct ar *a, const struct cfg *cf, int *r, uint32_t *bad, char *why, size_t cap)
{
	size_t esz = kcoll_dtype_size(a->dt), bytes = a->count * esz, wrong = 0;
	uint8_t *acc[MAXH], *in[MAXH], *ref = malloc(bytes + 1);
	const uint8_t *in0[MAXH];
	struct kd_sched_op sop = { .opcode = KCOLL_OP_ALLREDUCE, .bytes = bytes, .esz = esz };

	for (size_t i = 0; i < a->count; i++)
		put(a->dt, ref, i, want(a->H, i, a->dt, a->redop));
	for (uint32_t h = 0; h < a->H; h++) {
		acc[h] = malloc(bytes + 1);
		in[h] = malloc(bytes + 1);
		for (size_t i = 0; i < a->count; i++)
			put(a->dt, in[h], i, val(h, i, a->dt));
		if (a->fused)
			memset(acc[h], 0xa5, bytes);	/* garbage: only in0 may be read */
		else
			memcpy(acc[h], in[h], bytes);
		in0[h] = in[h];
	}
	int rc = run(a->H, cf, a->algo, a->dt, a->redop, &sop, acc, a->fused ? in0 : NULL, NULL, r, bad, why,
		     cap);

	for (uint32_t h = 0; h < a->H; h++) {
		if (!rc)
			wrong += wrong_bytes(acc[h], ref, bytes);
		free(acc[h]);
		free(in[h]);
	}
	free(ref);
	return rc ? SIZE_MAX : wrong;
}

static void case_allreduce(const struct ar *a, const struct cfg *cf, const char *note)
{
	int r[MAXH];
	uint32_t bad[MAXH];
	char why[300];
	size_t wrong = allreduce(a, cf, r, bad, why, sizeof(why));

	tap_ok(!wrong, "all-reduce %s, %u host(s), %zu %s %s, %u stream(s), %zu B pieces%s%s: %s%s (wrong bytes %zu)",
	       algo_name[a->algo], a->H, a->count, kcoll_dtype_name(a->dt), kcoll_redop_name(a->redop),
	       cf->nstreams, cf->piece, a->fused ? ", input in place" : "", note,
	       wrong == SIZE_MAX ? "failed: " : "every byte right on every host", wrong == SIZE_MAX ? why : "",
	       wrong == SIZE_MAX ? 0 : wrong);
}

enum layout { ONE_PER_HOST, TWO_CONTIGUOUS, ROUND_ROBIN };
static const char *const layout_name[] = { "one rank per host", "two contiguous ranks per host",
					   "ranks dealt round-robin" };

static void case_rsag(uint32_t H, bool rs, enum layout l, size_t count, const struct cfg *cf)
{
	uint16_t rank_host[2 * MAXH + 1];
	uint32_t nranks, bad[MAXH];
	int r[MAXH];
	size_t block = count * 4, bytes, wrong = 0;
	uint8_t *acc[MAXH];
	char why[300];

	nranks = l == ONE_PER_HOST ? H : 2 * H + (l == ROUND_ROBIN);
	for (uint32_t k = 0; k < nranks; k++)
		rank_host[k] = l == ONE_PER_HOST ? k : l == TWO_CONTIGUOUS ? k / 2 : k % H;
	bytes = block * nranks;
	struct kd_sched_op sop = { .opcode = rs ? KCOLL_OP_REDUCE_SCATTER : KCOLL_OP_ALLGATHER, .bytes = bytes,
				   .block = block, .esz = 4, .nranks = nranks };

	for (uint32_t h = 0; h < H; h++) {
		acc[h] = malloc(bytes + 1);
		memset(acc[h], 0xa5, bytes);
		for (uint32_t k = 0; k < nranks; k++)
			for (size_t i = 0; i < count; i++)
				if (rs || rank_host[k] == h)	/* all-gather: only our ranks' blocks */
					put(KCOLL_I32, acc[h], k * count + i, val(h, k * count + i, KCOLL_I32));
	}
	int rc = run(H, cf, KD_ALGO_AUTO, KCOLL_I32, KCOLL_SUM, &sop, acc, NULL, rank_host, r, bad, why,
		     sizeof(why));

	for (uint32_t h = 0; !rc && h < H; h++)
		for (uint32_t k = 0; k < nranks; k++) {
			if (rs && rank_host[k] != h)
				continue;	/* reduce-scatter: host h holds its ranks' blocks */
			for (size_t i = 0; i < count; i++) {
				size_t e = k * count + i;
				int64_t w = rs ? want(H, e, KCOLL_I32, KCOLL_SUM) : val(rank_host[k], e, KCOLL_I32);

				wrong += ((int32_t *)acc[h])[e] != (int32_t)w;
			}
		}
	tap_ok(!rc && !wrong, "%s, %u host(s), %s (%u ranks), %zu i32 per rank, %u stream(s)%s: %s%s (wrong %zu)",
	       rs ? "reduce-scatter" : "all-gather", H, layout_name[l], nranks, count, cf->nstreams,
	       cf->tcp ? ", TCP" : "", rc ? "failed: " : "every byte right", rc ? why : "", wrong);
	for (uint32_t h = 0; h < H; h++)
		free(acc[h]);
}

static void case_broadcast(uint32_t H, uint32_t root, size_t count, const struct cfg *cf)
{
	size_t bytes = count * 4, wrong = 0;
	uint8_t *acc[MAXH];
	uint32_t bad[MAXH];
	int r[MAXH];
	char why[300];
	struct kd_sched_op sop = { .opcode = KCOLL_OP_BROADCAST, .bytes = bytes, .esz = 4, .root_host = root };

	for (uint32_t h = 0; h < H; h++) {
		acc[h] = malloc(bytes + 1);
		for (size_t i = 0; i < count; i++)
			((int32_t *)acc[h])[i] = h == root ? (int32_t)val(root, i, KCOLL_I32) : -7;
	}
	int rc = run(H, cf, KD_ALGO_AUTO, KCOLL_I32, KCOLL_SUM, &sop, acc, NULL, NULL, r, bad, why, sizeof(why));

	for (uint32_t h = 0; !rc && h < H; h++)
		for (size_t i = 0; i < count; i++)
			wrong += ((int32_t *)acc[h])[i] != (int32_t)val(root, i, KCOLL_I32);
	tap_ok(!rc && !wrong, "broadcast, %u host(s), root host %u, %zu i32, %u stream(s)%s: %s%s (wrong %zu)", H,
	       root, count, cf->nstreams, cf->tcp ? ", TCP" : "", rc ? "failed: " : "every byte right", rc ? why : "", wrong);
	for (uint32_t h = 0; h < H; h++)
		free(acc[h]);
}

static void case_barrier(uint32_t H, const struct cfg *cf)
{
	uint8_t *acc[MAXH] = { 0 };
	uint16_t rank_host[MAXH];
	uint32_t bad[MAXH];
	int r[MAXH];
	char why[300];
	struct kd_sched_op sop = { .opcode = KCOLL_OP_BARRIER, .esz = 4, .nranks = H };

	for (uint32_t h = 0; h < H; h++)
		rank_host[h] = (uint16_t)h;
	int rc = run(H, cf, KD_ALGO_AUTO, KCOLL_I32, KCOLL_SUM, &sop, acc, NULL, rank_host, r, bad, why,
		     sizeof(why));

	tap_ok(!rc, "barrier, %u host(s): %s%s", H, rc ? "failed: " : "completes, every piece received",
	       rc ? why : "");
}

/* ---- failures --------------------------------------------------------------- */

static void case_corrupt_payload(void)
{
	struct ar a = { .H = 4, .algo = KD_ALGO_RING, .dt = KCOLL_I32, .redop = KCOLL_SUM, .count = 65537 };
	struct cfg cf = CFG;
	int r[MAXH];
	uint32_t bad[MAXH];
	char why[300];
	size_t wrong;

	cf.corrupt_nth = 5;
	cf.corrupt_payload = true;
	wrong = allreduce(&a, &cf, r, bad, why, sizeof(why));
	tap_ok(wrong && wrong != SIZE_MAX, "a piece damaged on the way (one payload bit) is caught by the byte "
	       "check: %zu wrong byte(s)%s%s", wrong == SIZE_MAX ? 0 : wrong, wrong == SIZE_MAX ? "; failed: " : "",
	       wrong == SIZE_MAX ? why : "");
}

static void case_bad_header(bool sig)
{
	struct ar a = { .H = 3, .algo = KD_ALGO_DIRECT, .dt = KCOLL_I32, .redop = KCOLL_SUM, .count = 1001 };
	struct cfg cf = CFG;
	int r[MAXH], want_err = sig ? -EBADMSG : -EPROTO, hit = -1;
	uint32_t bad[MAXH];
	char why[300];
	bool named = false;

	if (sig)
		cf.other_sig = 2;
	else
		cf.corrupt_nth = 1;
	allreduce(&a, &cf, r, bad, why, sizeof(why));
	for (uint32_t h = 0; h < a.H; h++)
		if (r[h] == want_err) {
			hit = (int)h;
			/* Another op: its receivers name host 2 (or host 2 names one of them). */
			named = bad[h] < a.H && bad[h] != h && (!sig || h == 2 || bad[h] == 2);
			break;
		}
	tap_ok(hit >= 0 && named, "%s: a receiver fails with %s naming the sender (host %d, blamed %d)",
	       sig ? "a host running another op (its signature differs)" : "a piece's header damaged (another step)",
	       sig ? "-EBADMSG" : "-EPROTO", hit, hit >= 0 ? (int)bad[hit] : -1);
}

/* Host 2 of 3 never runs: the others time out naming it, or the comm is
 * aborted while they wait, or (over TCP) its connections closed before the
 * op, or they carry a header of junk instead of a piece: the others fail
 * at once naming it. */
enum silent { SILENT_TIMEOUT, SILENT_CANCEL, SILENT_TCP_CLOSED, SILENT_TCP_JUNK };

static void case_silent(enum silent how, enum kd_algo algo)
{
	static const char *const what[] = { "a host that never answers",
					    "the comm aborted while hosts wait for a silent one",
					    "host 2's TCP connections closed",
					    "host 2's TCP connections carry a header of junk" };
	static const int want[] = { -ETIMEDOUT, -ECANCELED, -ECONNRESET, -EPROTO };
	static const char *const want_name[] = { "-ETIMEDOUT", "-ECANCELED", "-ECONNRESET", "-EPROTO" };
	struct ar a = { .H = 3, .algo = algo, .dt = KCOLL_I32, .redop = KCOLL_SUM, .count = 1001 };
	struct cfg cf = CFG;
	int r[MAXH];
	uint32_t bad[MAXH];
	char why[300];
	bool ok = true;

	cf.silent = 2;
	cf.cancel = how == SILENT_CANCEL;
	cf.tcp = how == SILENT_TCP_CLOSED || how == SILENT_TCP_JUNK;
	cf.junk = how == SILENT_TCP_JUNK;
	if (how == SILENT_TIMEOUT)
		cf.timeout_ns = 100000000;	/* + the engine's 2 s backstop */
	if (cf.tcp)
		a.count = 100003;
	allreduce(&a, &cf, r, bad, why, sizeof(why));
	for (uint32_t h = 0; h < 2; h++)
		ok &= r[h] == want[how] && (cf.cancel || bad[h] == 2);
	tap_ok(ok, "%s, all-reduce %s: hosts 0 and 1 return %s%s (got %d %d, blamed %d %d)", what[how],
	       algo_name[algo], want_name[how], cf.cancel ? "" : " naming host 2", r[0], r[1],
	       (int)bad[0], (int)bad[1]);
}

/* A transport bug (TX events swapped or doubled) with sends in flight. */
static void case_tx_fault(uint32_t fault)
{
	struct ar a = { .H = 2, .algo = KD_ALGO_RING, .dt = KCOLL_I32, .redop = KCOLL_SUM, .count = 65537 };
	struct cfg cf = CFG;
	int r[MAXH];
	uint32_t bad[MAXH];
	char why[300];
	bool hit = false;

	cf.xp = &kd_xport_loop_deep;
	cf.nstreams = 1;
	cf.fault = fault;
	allreduce(&a, &cf, r, bad, why, sizeof(why));
	for (uint32_t h = 0; h < a.H; h++)
		hit |= r[h] == -EPROTO;
	tap_ok(hit, "TX events %s by the transport: the engine fails the op with -EPROTO (got %d %d)",
	       fault == KD_LOOP_TX_SWAP ? "of two sends swapped" : "reported twice", r[0], r[1]);
}

/* Several sends in flight: their busy time counted once. */
static void case_busy_union(void)
{
	struct ar a = { .H = 2, .algo = KD_ALGO_RING, .dt = KCOLL_I32, .redop = KCOLL_SUM,
			.count = 4u << 20 };
	struct cfg cf = CFG;
	int r[MAXH];
	uint32_t bad[MAXH];
	char why[300];
	size_t wrong;

	cf.xp = &kd_xport_loop_deep;
	cf.nstreams = 1;
	cf.piece = KD_C4_OBS_MIN;
	wrong = allreduce(&a, &cf, r, bad, why, sizeof(why));
	tap_ok(!wrong && obs.bytes && !obs.over, "%d sends in flight per stream: C4 busy time at most the op's "
	       "wall time on every stream (%llu bytes observed, %u over%s%s)%s%s", KD_LOOP_DEPTH,
	       (unsigned long long)obs.bytes, obs.over, obs.over ? ": " : "", obs.worst,
	       wrong == SIZE_MAX ? "; failed: " : "", wrong == SIZE_MAX ? why : "");
}

/* ---- the TCP transport alone ------------------------------------------------ */

/* Host self of 2, one stream on fd. */
static void *tcp_end(uint32_t self, int fd)
{
	int fds[2 * KD_MAX_STREAMS];
	const char *names[2] = { "h0", "h1" };
	struct kd_xport_env env = { .nhosts = 2, .self = self, .nstreams = 1, .piece = 1 << 20, .fds = fds,
				    .name = "test", .host_names = names, .timeout_ns = 1000000000LL };
	size_t piece = env.piece;
	void *ctx;

	for (uint32_t i = 0; i < 2 * KD_MAX_STREAMS; i++)
		fds[i] = -1;
	fds[(1 - self) * KD_MAX_STREAMS] = fd;
	if (kd_xport_tcp.open(&env, &ctx, &piece))
		abort();
	return ctx;
}

/* Poll ctx until one event comes: its err (-EPROTO if not of this kind), or
 * -ETIMEDOUT after about 5 s. */
static int tcp_event(void *ctx, uint32_t kind)
{
	for (int i = 0; i < 5000; i++) {
		struct kd_xev ev;
		struct pollfd pfd[4];
		bool moved = false;
		int n = kd_xport_tcp.poll(ctx, &ev, 1, &moved);

		if (n < 0)
			return n;
		if (n == 1)
			return ev.kind == kind ? ev.err : -EPROTO;
		poll(pfd, kd_xport_tcp.wait_fds(ctx, pfd, 4), 1);
	}
	return -ETIMEDOUT;
}

/* xport.h: a send's payload is the caller's again at its TX event. */
static void case_tcp_tx_free(void)
{
	const size_t len = 128 << 10;
	uint8_t *buf = malloc(len), *got = malloc(len);
	struct kd_p_data h = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_DATA,
					.len = (uint32_t)(sizeof(h) + len) }, .seq = 1 };
	int fd[2], big = 1 << 20, rt, rr = -1, n0 = -1, n1 = -1;
	size_t same = 0;
	void *a, *b;

	tcp_pair(fd);
	/* Room for the whole piece in the sockets: the TX event comes before
	 * the receiver reads a byte. */
	setsockopt(fd[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(fd[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	a = tcp_end(0, fd[0]);
	b = tcp_end(1, fd[1]);
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	rt = kd_xport_tcp.send(a, 1, 0, &h, buf, len, NULL, 1);
	rt = rt ? rt : tcp_event(a, KD_XEV_TX);
	memset(buf, 0xee, len);	/* the caller's again: reused at once */
	if (!rt && !kd_xport_tcp.recv(b, 0, 0, got, len, 2))
		rr = tcp_event(b, KD_XEV_RX);
	for (size_t i = 0; !rr && i < len; i++)
		same += got[i] == (uint8_t)(i * 7 + 1);
	ioctl(fd[0], FIONREAD, &n0);
	ioctl(fd[1], FIONREAD, &n1);
	tap_ok(!rt && !rr && same == len && !n0 && !n1,
	       "tcp: a 128 KiB piece's buffer rewritten right after its TX event, before the receiver read "
	       "it: the receiver gets the bytes sent (send/TX %d, RX %d, %zu of %zu bytes right, unread %d %d)",
	       rt, rr, same, len, n0, n1);
	kd_xport_tcp.close(a);
	kd_xport_tcp.close(b);
	close(fd[0]);
	close(fd[1]);
	free(buf);
	free(got);
}

int main(void)
{
	static const size_t counts[] = { 0, 1, 7, 1001, 65537 };
	static const struct { enum kcoll_dtype dt; enum kcoll_redop op; size_t count; } more[] = {
		{ KCOLL_F32, KCOLL_SUM, 4099 }, { KCOLL_F64, KCOLL_MAX, 1001 },
		{ KCOLL_I64, KCOLL_SUM, 777 }, { KCOLL_U8, KCOLL_SUM, 1003 },
	};

	for (uint32_t H = 1; H <= MAXH; H++) {
		struct cfg cf = CFG;

		for (int a = KD_ALGO_AUTO; a <= KD_ALGO_DIRECT; a++) {
			cf.nstreams = 1 + (H + (uint32_t)a) % 3;
			for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
				struct ar x = { H, (enum kd_algo)a, KCOLL_I32, KCOLL_SUM, counts[c], false };

				case_allreduce(&x, &cf, "");
			}
			for (size_t m = 0; m < sizeof(more) / sizeof(more[0]); m++) {
				struct ar x = { H, (enum kd_algo)a, more[m].dt, more[m].op, more[m].count, false };

				case_allreduce(&x, &cf, "");
			}
		}
		cf.nstreams = 3;
		{
			struct ar x = { H, KD_ALGO_RING, KCOLL_I32, KCOLL_SUM, 65537, true };

			case_allreduce(&x, &cf, "");
			x.algo = KD_ALGO_DIRECT;
			x.count = 4099;
			case_allreduce(&x, &cf, "");
			x.algo = KD_ALGO_RING;
			x.fused = false;
			x.count = 100003;
			cf.avoid = 1u << 1;
			case_allreduce(&x, &cf, ", stream 1 left unused by the C4 plan");
			cf.avoid = 0;
			cf.piece = 1 << 20;
			case_allreduce(&x, &cf, "");
			cf.piece = 4096;
		}
		for (int l = ONE_PER_HOST; l <= ROUND_ROBIN; l++) {
			cf.nstreams = 1 + (uint32_t)l;
			case_rsag(H, true, (enum layout)l, 1031, &cf);
			case_rsag(H, false, (enum layout)l, 1031, &cf);
		}
		cf.nstreams = 2;
		for (uint32_t root = 0; root < H; root += (H > 3 ? H / 3 : 1))
			case_broadcast(H, root, 333, &cf);
		case_broadcast(H, H - 1, 70001, &cf);
		case_barrier(H, &cf);
	}
	for (uint32_t H = 2; H <= 5; H++) {
		struct cfg cf = CFG;

		cf.xp = &kd_xport_loop_deep;
		for (int a = KD_ALGO_RING; a <= KD_ALGO_DIRECT; a++) {
			cf.nstreams = 1 + (H + (uint32_t)a) % 3;
			for (size_t c = 3; c < sizeof(counts) / sizeof(counts[0]); c++) {
				struct ar x = { H, (enum kd_algo)a, KCOLL_I32, KCOLL_SUM, counts[c], false };

				case_allreduce(&x, &cf, ", 4 sends in flight per stream");
			}
		}
		case_broadcast(H, 0, 70001, &cf);
	}
	/* The TCP transport on loopback connections. */
	for (uint32_t H = 2; H <= 5; H++) {
		struct cfg cf = CFG;

		cf.tcp = true;
		for (int a = KD_ALGO_RING; a <= KD_ALGO_DIRECT; a++) {
			bool in0 = kd_sched_reads_in0((enum kd_algo)a, H);

			cf.nstreams = 1 + (H + (uint32_t)a) % 3;
			for (int fused = 0; fused <= in0; fused++) {
				struct ar x = { H, (enum kd_algo)a, KCOLL_I32, KCOLL_SUM, 65537, fused };

				case_allreduce(&x, &cf, ", TCP");
			}
		}
		cf.nstreams = 2;
		case_rsag(H, true, TWO_CONTIGUOUS, 10031, &cf);
		case_rsag(H, false, TWO_CONTIGUOUS, 10031, &cf);
		case_broadcast(H, H - 1, 70001, &cf);
	}
	case_tcp_tx_free();
	case_silent(SILENT_TCP_CLOSED, KD_ALGO_RING);
	case_silent(SILENT_TCP_CLOSED, KD_ALGO_DIRECT);
	case_silent(SILENT_TCP_JUNK, KD_ALGO_DIRECT);
	case_tx_fault(KD_LOOP_TX_SWAP);
	case_tx_fault(KD_LOOP_TX_DUP);
	case_busy_union();
	case_corrupt_payload();
	case_bad_header(false);
	case_bad_header(true);
	case_silent(SILENT_CANCEL, KD_ALGO_DIRECT);
	case_silent(SILENT_TIMEOUT, KD_ALGO_DIRECT);
	return tap_done();
}
