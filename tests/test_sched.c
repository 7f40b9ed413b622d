// SPDX-License-Identifier: MIT
/*
 * The inter-host schedules (user/daemon/schedule.c) on their own: every host
 * of a communicator is a thread of this process, and the step engine
 * (step.c) carries each step's sends to the peers' receives over the
 * in-process loopback transport (xport_loop.c), with pieces as large as a
 * transfer. Every call of the engine is recorded on its way in (the link
 * wraps kd_step_run: tests/build.mk). For 1..9 hosts and every algorithm:
 *   - all-reduce (ring, recursive doubling, Rabenseifner, direct, auto):
 *     i32 sums exact on every host; f32 sums of random values bit-identical
 *     on every host (the lower host's data first, whatever the algorithm)
 *     and within rounding of the true sum; the input read in place (in0)
 *     where mh.c fuses it
 *   - reduce-scatter and all-gather with one rank per host, two contiguous
 *     ranks per host and ranks dealt round-robin (non-contiguous segments)
 *   - broadcast from every root, direct (small) and scatter + ring (large)
 *   - barrier, and zero-byte collectives (a barrier)
 * Every step's receive must meet a send of the same step number and length
 * (the engine checks each piece's header), and no send may be left
 * unreceived. The step sequences of a fixed set of
 * cases are recorded: they must equal tests/sched.golden, so that a change
 * of any schedule is seen (test_sched --record FILE writes a new one).
 */
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "kcoll/tap.h"

#include "kcolld.h"
#include "mh.h"
#include "xport.h"
#include "loopmh.h"
#include "reduce.h"
#include "schedule.h"
#include "step.h"

#define MAXH	9

/* ---- recording the steps ------------------------------------------------ */

static struct {
	char *rec[MAXH];	/* each host's recorded steps (NULL: not recording) */
	size_t rec_len[MAXH], rec_cap[MAXH];
} lb;

static void record(uint32_t h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void record(uint32_t h, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!lb.rec[h])
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(lb.rec[h] + lb.rec_len[h], lb.rec_cap[h] - lb.rec_len[h], fmt, ap);
		va_end(ap);
		if ((size_t)n < lb.rec_cap[h] - lb.rec_len[h])
			break;
		lb.rec_cap[h] *= 2;
		lb.rec[h] = realloc(lb.rec[h], lb.rec_cap[h]);
		if (!lb.rec[h])
			abort();
	}
	lb.rec_len[h] += (size_t)n;
}

static void record_ranges(uint32_t h, const struct kd_xfer *x)
{
	for (uint32_t k = 0; k < x->nr; k++)
		record(h, " %lu+%lu", (unsigned long)x->r[k].off, (unsigned long)x->r[k].len);
}

/* The engine, as schedule.c calls it: record the steps, then run them. */
int __real_kd_step_run(struct kd_mh *mh, struct kd_op *op, const struct kd_step *st, uint32_t n,
		       uint32_t first, bool chain, uint32_t *bad_host);
int __wrap_kd_step_run(struct kd_mh *mh, struct kd_op *op, const struct kd_step *st, uint32_t n,
		       uint32_t first, bool chain, uint32_t *bad_host);
int __wrap_kd_step_run(struct kd_mh *mh, struct kd_op *op, const struct kd_step *st, uint32_t n,
		       uint32_t first, bool chain, uint32_t *bad_host)
{
	uint32_t me = mh->self;

	for (uint32_t t = 0; t < n; t++) {
		record(me, "h%u s%u%s", me, first + t, st[t].reduce ? " reduce" : "");
		for (uint32_t i = 0; i < st[t].nsend; i++) {
			record(me, " | to %u%s:", st[t].send[i].host, st[t].send[i].base ? " (base)" : "");
			record_ranges(me, &st[t].send[i]);
		}
		for (uint32_t i = 0; i < st[t].nrecv; i++) {
			const struct kd_xfer *x = &st[t].recv[i];

			record(me, " | from %u%s%s:", x->host, x->dst ? " (dst)" : "", x->src ? " (src)" : "");
			record_ranges(me, x);
		}
		record(me, "\n");
	}
	return __real_kd_step_run(mh, op, st, n, first, chain, bad_host);
}

/* ---- running one op on H hosts ----------------------------------------- */

struct host {
	struct kd_mh mh;
	struct kd_sched_op sop;
	int r;
	uint32_t bad;
	pthread_t t;
};

static struct kd_comm comm;
static struct kd_op op = { .comm = &comm, .seq = 1 };
static struct host hs[MAXH];
static uint32_t nh;

static void *host_main(void *arg)
{
	struct host *h = arg;
	uint64_t one = 1;

	h->r = kd_sched_run(&h->mh, &op, &h->sop, &h->bad);
	if (h->r) {
		/* As kcolld aborts the comm: the others stop waiting. */
		__atomic_store_n(&comm.limit_seq, 0, __ATOMIC_RELAXED);
		for (uint32_t g = 0; g < nh; g++)
			if (write(hs[g].mh.abort_fd, &one, sizeof(one)) < 0)
				abort();
	}
	return NULL;
}

/* Runs sop (per host: acc[h], in0[h] or NULL) on H hosts; 0 when every host
 * returned 0 and no message is left over, else -1 with *why set. */
static int run(uint32_t H, enum kd_algo algo, enum kcoll_dtype dt, enum kcoll_redop redop,
	       const struct kd_sched_op *sop, uint8_t **acc, const uint8_t **in0, uint16_t *rank_host,
	       char *why, size_t cap)
{
	struct kd_loop_fabric *f = kd_loop_fabric_new(H, 1);
	int rc = 0;

	if (!f)
		abort();
	memset(hs, 0, sizeof(hs));
	nh = H;
	snprintf(comm.name, sizeof(comm.name), "sched");
	comm.timeout_ns = 10000000000LL;
	comm.limit_seq = UINT64_MAX;
	for (uint32_t h = 0; h < H; h++) {
		struct kd_mh *mh = &hs[h].mh;

		loopmh_init(mh, h, H, 1, f);
		mh->algo = algo;
		mh->piece = 64u << 20;	/* a transfer in one piece */
		mh->sig = 0x5ced;
		mh->acc = acc[h];
		mh->dtype = dt;
		mh->redop = redop;
		mh->esz = kcoll_dtype_size(dt);
		mh->rank_host = rank_host;
		hs[h].sop = *sop;
		hs[h].sop.in0 = in0 ? in0[h] : NULL;
	}
	for (uint32_t h = 0; h < H; h++)
		if (pthread_create(&hs[h].t, NULL, host_main, &hs[h]))
			abort();
	*why = 0;
	for (uint32_t h = 0; h < H; h++)
		pthread_join(hs[h].t, NULL);
	for (uint32_t h = 0; h < H; h++) {
		struct kd_mh *mh = &hs[h].mh;

		if (hs[h].r && !rc) {
			snprintf(why, cap, "host %u: %s (host at fault %d)", h, strerror(-hs[h].r), (int)hs[h].bad);
			rc = -1;
		}
		loopmh_fini(mh);
	}
	if (!rc && kd_loop_fabric_pending(f)) {
		snprintf(why, cap, "%u send(s) were never received", kd_loop_fabric_pending(f));
		rc = -1;
	}
	kd_loop_fabric_free(f);
	return rc;
}

/* ---- the cases ------------------------------------------------------------ */

static const char *const algo_name[] = { "auto", "ring", "rd", "rabenseifner", "direct" };

static int32_t ival(uint32_t h, size_t i)
{
	return (int32_t)((h * 7919u + i * 104729u) % 2001u) - 1000;
}

static float fval(uint32_t h, size_t i)
{
	uint32_t x = (uint32_t)(h * 2654435761u) ^ (uint32_t)(i * 40503u + 1);

	x ^= x >> 13;
	x *= 0x5bd1e995u;
	x ^= x >> 15;
	return (float)(x % 100000u) / 977.0f - 40.0f;
}

/* All-reduce of count elements on H hosts; fused: the input read in place. */
static void case_allreduce(uint32_t H, enum kd_algo algo, enum kcoll_dtype dt, size_t count, bool fused)
{
	size_t esz = kcoll_dtype_size(dt), bytes = count * esz;
	uint8_t *acc[MAXH], *in[MAXH];
	const uint8_t *in0[MAXH];
	char why[300];
	size_t wrong = 0, differ = 0, far = 0;
	struct kd_sched_op sop = { .opcode = KCOLL_OP_ALLREDUCE, .bytes = bytes, .esz = esz };

	for (uint32_t h = 0; h < H; h++) {
		acc[h] = malloc(bytes + 1);
		in[h] = malloc(bytes + 1);
		for (size_t i = 0; i < count; i++) {
			if (dt == KCOLL_I32)
				((int32_t *)in[h])[i] = ival(h, i);
			else
				((float *)in[h])[i] = fval(h, i);
		}
		if (fused)
			memset(acc[h], 0xa5, bytes);	/* garbage: only in0 may be read */
		else
			memcpy(acc[h], in[h], bytes);
		in0[h] = in[h];
	}
	int r = run(H, algo, dt, KCOLL_SUM, &sop, acc, fused ? in0 : NULL, NULL, why, sizeof(why));

	for (size_t i = 0; !r && i < count; i++) {
		if (dt == KCOLL_I32) {
			int32_t want = 0;

			for (uint32_t h = 0; h < H; h++)
				want += ival(h, i);
			for (uint32_t h = 0; h < H; h++)
				wrong += ((int32_t *)acc[h])[i] != want;
		} else {
			double want = 0;

			for (uint32_t h = 0; h < H; h++)
				want += fval(h, i);
			for (uint32_t h = 1; h < H; h++)
				differ += memcmp(acc[h] + i * esz, acc[0] + i * esz, esz) != 0;
			far += fabs(((float *)acc[0])[i] - want) > 1e-4 * (fabs(want) + H * 50);
		}
	}
	tap_ok(!r && !wrong && !differ && !far,
	       "all-reduce %s, %u host(s), %zu %s%s: %s%s (wrong %zu, bits differ between hosts %zu, off the "
	       "true sum %zu)", algo_name[algo], H, count, dt == KCOLL_I32 ? "i32 exact" : "f32",
	       fused ? ", input in place" : "", r ? "failed: " : "every host right", r ? why : "", wrong,
	       differ, far);
	for (uint32_t h = 0; h < H; h++) {
		free(acc[h]);
		free(in[h]);
	}
}

enum layout { ONE_PER_HOST, TWO_CONTIGUOUS, ROUND_ROBIN };
static const char *const layout_name[] = { "one rank per host", "two contiguous ranks per host",
					   "ranks dealt round-robin" };

static uint32_t place(enum layout l, uint32_t H, uint32_t *nranks, uint16_t *rank_host)
{
	*nranks = l == ONE_PER_HOST ? H : 2 * H + (l == ROUND_ROBIN);
	for (uint32_t r = 0; r < *nranks; r++)
		rank_host[r] = l == ONE_PER_HOST ? r : l == TWO_CONTIGUOUS ? r / 2 : r % H;
	return *nranks;
}

/* Reduce-scatter (rs) or all-gather of count elements per rank block. */
static void case_rsag(uint32_t H, bool rs, enum layout l, size_t count, bool fused)
{
	uint16_t rank_host[2 * MAXH + 1];
	uint32_t nranks;
	size_t block = count * 4, bytes;
	uint8_t *acc[MAXH], *in[MAXH];
	const uint8_t *in0[MAXH];
	char why[300];
	size_t wrong = 0;

	place(l, H, &nranks, rank_host);
	bytes = block * nranks;
	struct kd_sched_op sop = { .opcode = rs ? KCOLL_OP_REDUCE_SCATTER : KCOLL_OP_ALLGATHER, .bytes = bytes,
				   .block = block, .esz = 4, .nranks = nranks };

	for (uint32_t h = 0; h < H; h++) {
		acc[h] = malloc(bytes + 1);
		in[h] = malloc(bytes + 1);
		memset(in[h], 0xa5, bytes);
		for (uint32_t rk = 0; rk < nranks; rk++)
			for (size_t i = 0; i < count; i++)
				if (rs || rank_host[rk] == h)	/* all-gather: only our ranks' blocks */
					((int32_t *)in[h])[rk * count + i] = ival(h, rk * count + i);
		if (fused)
			memset(acc[h], 0x5a, bytes);
		else
			memcpy(acc[h], in[h], bytes);
		in0[h] = in[h];
	}
	int r = run(H, KD_ALGO_AUTO, KCOLL_I32, KCOLL_SUM, &sop, acc, fused ? in0 : NULL, rank_host, why,
		    sizeof(why));

	for (uint32_t h = 0; !r && h < H; h++)
		for (uint32_t rk = 0; rk < nranks; rk++) {
			if (rs && rank_host[rk] != h)
				continue;	/* reduce-scatter: host h holds its ranks' blocks */
			for (size_t i = 0; i < count; i++) {
				size_t e = rk * count + i;
				int32_t want = 0;

				if (rs)
					for (uint32_t g = 0; g < H; g++)
						want += ival(g, e);
				else
					want = ival(rank_host[rk], e);
				wrong += ((int32_t *)acc[h])[e] != want;
			}
		}
	tap_ok(!r && !wrong, "%s, %u host(s), %s (%u ranks), %zu i32 per rank%s: %s%s (wrong %zu)",
	       rs ? "reduce-scatter" : "all-gather", H, layout_name[l], nranks, count,
	       fused ? ", input in place" : "", r ? "failed: " : "every host right", r ? why : "", wrong);
	for (uint32_t h = 0; h < H; h++) {
		free(acc[h]);
		free(in[h]);
	}
}

static void case_broadcast(uint32_t H, uint32_t root, size_t count)
{
	size_t bytes = count * 4;
	uint8_t *acc[MAXH];
	char why[300];
	size_t wrong = 0;
	struct kd_sched_op sop = { .opcode = KCOLL_OP_BROADCAST, .bytes = bytes, .esz = 4, .root_host = root };

	for (uint32_t h = 0; h < H; h++) {
		acc[h] = malloc(bytes + 1);
		for (size_t i = 0; i < count; i++)
			((int32_t *)acc[h])[i] = h == root ? ival(root, i) : -7;
	}
	int r = run(H, KD_ALGO_AUTO, KCOLL_I32, KCOLL_SUM, &sop, acc, NULL, NULL, why, sizeof(why));

	for (uint32_t h = 0; !r && h < H; h++)
		for (size_t i = 0; i < count; i++)
			wrong += ((int32_t *)acc[h])[i] != ival(root, i);
	tap_ok(!r && !wrong, "broadcast, %u host(s), root host %u, %zu i32 (%s): %s%s (wrong %zu)", H, root,
	       count, bytes <= (256u << 10) || H == 2 ? "direct" : "scatter + ring", r ? "failed: " : "every host right",
	       r ? why : "", wrong);
	for (uint32_t h = 0; h < H; h++)
		free(acc[h]);
}

static void case_barrier(uint32_t H, uint32_t opcode)
{
	uint8_t *acc[MAXH] = { 0 };
	char why[300];
	struct kd_sched_op sop = { .opcode = opcode, .esz = 4, .nranks = H };
	uint16_t rank_host[MAXH];

	for (uint32_t h = 0; h < H; h++)
		rank_host[h] = (uint16_t)h;
	int r = run(H, KD_ALGO_AUTO, KCOLL_I32, KCOLL_SUM, &sop, acc, NULL, rank_host, why, sizeof(why));

	tap_ok(!r, "%s, %u host(s): %s%s", opcode == KCOLL_OP_BARRIER ? "barrier" : "zero-byte collective (a barrier)",
	       H, r ? "failed: " : "completes, every send received", r ? why : "");
}

/* ---- recording -------------------------------------------------------------- */

static void rec_start(uint32_t H)
{
	for (uint32_t h = 0; h < H; h++) {
		lb.rec_cap[h] = 4096;
		lb.rec_len[h] = 0;
		lb.rec[h] = malloc(lb.rec_cap[h]);
		if (!lb.rec[h])
			abort();
		lb.rec[h][0] = 0;
	}
}

static void rec_end(FILE *out, uint32_t H, const char *title)
{
	fprintf(out, "# %s\n", title);
	for (uint32_t h = 0; h < H; h++) {
		fputs(lb.rec[h], out);
		free(lb.rec[h]);
		lb.rec[h] = NULL;
	}
}

/* The recorded cases: every algorithm and collective, 1..9 hosts, sizes
 * that leave remainders. */
static void recorded(FILE *out)
{
	char title[160];

	for (uint32_t H = 1; H <= MAXH; H++) {
		for (int a = KD_ALGO_RING; a <= KD_ALGO_DIRECT; a++) {
			snprintf(title, sizeof(title), "all-reduce %s, %u hosts, 1001 i32", algo_name[a], H);
			rec_start(H);
			case_allreduce(H, (enum kd_algo)a, KCOLL_I32, 1001, false);
			rec_end(out, H, title);
		}
		for (int rs = 0; rs < 2; rs++) {
			snprintf(title, sizeof(title), "%s, %u hosts, ranks dealt round-robin, 13 i32 per rank",
				 rs ? "reduce-scatter" : "all-gather", H);
			rec_start(H);
			case_rsag(H, rs, ROUND_ROBIN, 13, false);
			rec_end(out, H, title);
		}
		snprintf(title, sizeof(title), "broadcast, %u hosts, root %u, 70001 i32", H, H / 2);
		rec_start(H);
		case_broadcast(H, H / 2, 70001);
		rec_end(out, H, title);
		snprintf(title, sizeof(title), "barrier, %u hosts", H);
		rec_start(H);
		case_barrier(H, KCOLL_OP_BARRIER);
		rec_end(out, H, title);
	}
}

static char *slurp(FILE *f, size_t *len)
{
	size_t cap = 1 << 16, n = 0, got;
	char *buf = malloc(cap);

	while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
		n += got;
		if (n == cap)
			buf = realloc(buf, cap *= 2);
	}
	*len = n;
	return buf;
}

int main(int argc, char **argv)
{
	const char *golden = getenv("KCOLL_TOP") ? NULL : "tests/sched.golden";
	char gpath[4096];
	FILE *rec;

	if (argc == 3 && !strcmp(argv[1], "--record")) {
		rec = fopen(argv[2], "w");
		if (!rec) {
			perror(argv[2]);
			return 2;
		}
		recorded(rec);
		fclose(rec);
		return tap_done();
	}
	if (!golden) {
		snprintf(gpath, sizeof(gpath), "%s/tests/sched.golden", getenv("KCOLL_TOP"));
		golden = gpath;
	}

	for (uint32_t H = 1; H <= MAXH; H++) {
		for (int a = KD_ALGO_AUTO; a <= KD_ALGO_DIRECT; a++) {
			case_allreduce(H, (enum kd_algo)a, KCOLL_I32, 7, false);
			case_allreduce(H, (enum kd_algo)a, KCOLL_I32, 65537, false);
			case_allreduce(H, (enum kd_algo)a, KCOLL_F32, 4099, false);
		}
		/* mh.c reads one local rank's input in place for these. */
		case_allreduce(H, KD_ALGO_RING, KCOLL_I32, 65537, true);
		case_allreduce(H, KD_ALGO_DIRECT, KCOLL_I32, 4099, true);
		if (!(H & (H - 1)))
			case_allreduce(H, KD_ALGO_RABENSEIFNER, KCOLL_I32, 65537, true);
		for (int l = ONE_PER_HOST; l <= ROUND_ROBIN; l++) {
			case_rsag(H, true, (enum layout)l, 1031, false);
			case_rsag(H, false, (enum layout)l, 1031, false);
		}
		case_rsag(H, true, ONE_PER_HOST, 1031, true);
		for (uint32_t root = 0; root < H; root += (H > 3 ? H / 3 : 1))
			case_broadcast(H, root, 333);
		case_broadcast(H, H - 1, 70001);
		case_barrier(H, KCOLL_OP_BARRIER);
		case_barrier(H, KCOLL_OP_ALLGATHER);
	}

	/* The recorded step sequences against the golden file. */
	char *path = NULL;
	size_t len = 0, glen = 0;
	FILE *mem = open_memstream(&path, &len);
	FILE *g = fopen(golden, "r");

	recorded(mem);
	fclose(mem);
	if (!g) {
		tap_ok(0, "the step sequences match %s: cannot open it (%s): write it with test_sched --record %s",
		       golden, strerror(errno), golden);
	} else {
		char *want = slurp(g, &glen);
		size_t at = 0, line = 1;

		fclose(g);
		while (at < len && at < glen && path[at] == want[at])
			line += path[at++] == '\n';
		if (len == glen && at == len)
			tap_ok(1, "the step sequences of every algorithm for 1..9 hosts match %s (%zu bytes)",
			       golden, len);
		else
			tap_ok(0, "the step sequences of every algorithm for 1..9 hosts match %s: first difference "
			       "on line %zu (a schedule changed: if on purpose, test_sched --record %s)", golden,
			       line, golden);
		free(want);
	}
	free(path);
	return tap_done();
}
