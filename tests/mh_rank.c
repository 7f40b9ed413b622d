// SPDX-License-Identifier: MIT
/*
 * One rank of a multi-host test (tests/t_multihost.sh starts one per rank,
 * each in its host's network namespace, talking to its host's kcolld through
 * $KCOLL_SOCKET). Not a test_* program: tests/run.sh does not run it alone.
 *
 *   mh_rank id [--corrupt-token]        print a fresh unique id, hex (the token
 *                                       flipped: an id no daemon issued)
 *   mh_rank coll ID NRANKS RANK         every collective x dtypes x counts
 *   mh_rank algo ID NRANKS RANK         the all-reduce subset run under each KCOLL_ALGO
 *   mh_rank check ID NRANKS RANK        a short list: one of each collective
 *   mh_rank big ID NRANKS RANK [COUNT]  one in-place f32 all-reduce (default 2^26 + 3
 *                                       elements: just over 256 MiB)
 *   mh_rank init ID NRANKS RANK         comm init only: its result and how long it took
 *   mh_rank loop ID NRANKS RANK DIR [NEXT]
 *           checked i32 all-reduces until one fails; writes DIR/pid.RANK at
 *           start and DIR/ready.RANK once three went through (both hold its
 *           pid), so the script knows whom to strike and when.
 *           With NEXT: after the failure destroy the communicator, wait for
 *           the file NEXT ("ID NRANKS NEWRANK_OF_RANK_0 NEWRANK_OF_RANK_1 ...",
 *           -1 for a rank that leaves) and run a short case list on the new one.
 *   mh_rank traffic ID NRANKS RANK DIR [COUNT [MAX_S]]
 *           checked i32 all-reduces of COUNT (2^18) until a rank finds DIR/stop
 *           (a 1-element MAX all-reduce after each: all stop after the same op)
 *           or MAX_S (300) s passed; DIR/ready.RANK after the first op. Alarm:
 *           MAX_S + 120 s (the other modes' 170 s would cut a long loop).
 *
 * Every rank computes the expected result of every case itself from the
 * deterministic inputs of all ranks. The inputs are chosen so that every
 * reduction is exact (integers or short binary fractions, powers of two for
 * products, no zeros for min/max), so any order the daemons combine them in
 * must give the scalar reference's bits.
 *
 * Output, one line each, for the script to parse:
 *   group cases=N bad=M name=NAME       after a case list (then "# ..." details)
 *   fault err=E name=ENAME err_rank=R t_ms=T later=E2 later_name=N2 later_err_rank=R2 iters=I
 *   init err=E name=ENAME ms=T
 *   traffic ops=N bad=B err=E name=ENAME err_rank=R ms=T
 * Exit status: 0 all checks passed, 1 a check failed, 2 could not set up.
 * One program of about 1000 lines, on purpose: every mode shares the set-up,
 * the rendezvous files and the checked ops, which the VM scripts run as one
 * binary.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>

#include "reduce.h"
#include "test_util.h"

#define MAX_RANKS	16
#define MAX_CASES	256
#define WAIT_MS		60000	/* per op: the daemon's own timeouts must come first */
#define LOOP_COUNT	(1u << 20)
#define BIG_COUNT	((1ul << 26) + 3)

struct tcase {
	const char *group;
	int opcode;
	int dtype, op;
	size_t count;
	int inplace;
	int mem;
	int root;	/* broadcast: the root; barrier: the rank that arrives late */
};

struct result {
	int bad;
	char why[160];
};

static struct tcase cases[MAX_CASES];
static struct result results[MAX_CASES];
static int ncases;

static int64_t now_ms(void)
{
	struct timespec ts;

	/* Wall clock: the script compares it with the moment it struck. */
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void add(const char *group, int opcode, int dtype, int op, size_t count, int inplace,
		int mem, int root)
{
	if (ncases == MAX_CASES) {
		fprintf(stderr, "mh_rank: too many cases\n");
		exit(2);
	}
	cases[ncases++] = (struct tcase){ group, opcode, dtype, op, count, inplace, mem, root };
}

/*
 * Element i of rank r's input to case salt. Floats: sums of up to 16 ranks
 * stay exact (f32/f64 k/1024 with |k| < 2^20; f16 integers |k| <= 64; bf16
 * |k| <= 8), products are of +-{0.5, 1, 2}; no zero, so min/max never meet
 * -0 against +0 (where the rank order would decide). Integers wrap, which
 * is exact in any order.
 */
static void fill(void *buf, int dtype, int op, size_t count, int rank, unsigned int salt)
{
	for (size_t i = 0; i < count; i++) {
		uint64_t h = mix(((uint64_t)salt << 40) ^ ((uint64_t)rank << 32) ^ i);
		int64_t k;
		double f;

		switch (dtype) {
		case KCOLL_F32: case KCOLL_F64: k = (int64_t)(h % 2097151) - 1048575; break;
		case KCOLL_F16: k = (int64_t)(h % 129) - 64; break;
		default: k = (int64_t)(h % 17) - 8; break;
		}
		f = dtype == KCOLL_F32 || dtype == KCOLL_F64 ? (k ? k : 1) / 1024.0 : (k ? k : 1);
		if (op == KCOLL_PROD)
			f = ((h >> 8) & 1 ? -1.0 : 1.0) * ((h >> 9) % 3 == 0 ? 0.5 : (h >> 9) % 3 == 1 ? 1 : 2);
		switch (dtype) {
		case KCOLL_F32: ((float *)buf)[i] = (float)f; break;
		case KCOLL_F64: ((double *)buf)[i] = f; break;
		case KCOLL_F16: ((uint16_t *)buf)[i] = kcoll_f32_to_f16((float)f); break;
		case KCOLL_BF16: ((uint16_t *)buf)[i] = kcoll_f32_to_bf16((float)f); break;
		case KCOLL_I8: case KCOLL_U8: ((uint8_t *)buf)[i] = h; break;
		case KCOLL_I32: case KCOLL_U32: ((uint32_t *)buf)[i] = h; break;
		default: ((uint64_t *)buf)[i] = h; break;
		}
	}
}

static size_t send_count(const struct tcase *t, int n)
{
	return coll_send_count(t->opcode, t->count, n);
}

static size_t recv_count(const struct tcase *t, int n)
{
	return coll_recv_count(t->opcode, t->count, n);
}

static int expected(const struct tcase *t, int n, int rank, uint8_t *exp, uint8_t **ins)
{
	for (int r = 0; r < n; r++)
		fill(ins[r], t->dtype, t->op, send_count(t, n), r, t - cases);
	return coll_expected(t->opcode, t->dtype, t->op, t->count, t->root, n, rank, ins, exp);
}

static void __attribute__((format(printf, 3, 4))) fail(struct result *res, int code, const char *fmt, ...)
{
	va_list ap;

	if (res->bad)
		return;
	res->bad = code;
	va_start(ap, fmt);
	vsnprintf(res->why, sizeof(res->why), fmt, ap);
	va_end(ap);
}

/* Wait for an op the library accepted (sub == 0): its result (or the
 * submission's) and blamed rank. *req is read only after the submission
 * ran, hence the pointer. */
static int wait_op(int sub, struct kcoll_req **req, int *err_rank)
{
	int r = sub ? sub : kcoll_wait(*req, WAIT_MS);

	*err_rank = sub ? -1 : kcoll_req_err_rank(*req);
	return r;
}

/* This kernel's boot id, hashed: ranks with the same one share a kernel
 * (netns hosts on one machine) and so CLOCK_MONOTONIC. Unreadable: a value
 * of this process alone, so that no clock is ever compared. */
static uint64_t boot_key(void)
{
	char id[64] = "";
	uint64_t h = 1469598103934665603ull;
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

	if (!f || !fgets(id, sizeof(id), f) || !id[0]) {
		if (f)
			fclose(f);
		return ((uint64_t)getpid() << 32) ^ (uint64_t)now_ms();
	}
	fclose(f);
	for (const char *c = id; *c; c++)
		h = (h ^ (uint8_t)*c) * 1099511628211ull;
	return h;
}

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * All ranks but t->root enter at once; the late one must hold them back.
 * Where every rank runs on one kernel the check is causal and does not care
 * how the machine's load staggers the ranks: no rank may leave before the
 * last one entered (the times are gathered after the barrier). Across
 * kernels (the VM pair) clocks cannot be compared, so a rank that is not
 * the late one must have waited a good part of its 300 ms.
 */
static void run_barrier(struct kcoll_comm *c, int rank, const struct tcase *t, struct result *res)
{
	struct stamp { uint64_t boot; int64_t in, out; } me, all[MAX_RANKS];
	struct kcoll_req *req = NULL;
	int n = kcoll_comm_size(c), last = 0;
	int r, er;

	me.boot = boot_key();
	if (rank == t->root)
		usleep(300000);
	me.in = mono_ns();
	r = wait_op(kcoll_barrier(c, &req), &req, &er);
	me.out = mono_ns();
	if (r) {
		fail(res, r, "barrier failed: %s (err_rank %d)", en(r), er);
		return;
	}
	req = NULL;
	r = wait_op(kcoll_allgather(c, &me, all, sizeof(me), KCOLL_U8, &req), &req, &er);
	if (r) {
		fail(res, r, "allgather of the barrier's times failed: %s (err_rank %d)", en(r), er);
		return;
	}
	for (int i = 1; i < n && i < MAX_RANKS; i++) {
		if (all[i].boot != all[0].boot)
			last = -1;
		else if (last >= 0 && all[i].in > all[last].in)
			last = i;
	}
	if (last >= 0 && me.out < all[last].in)
		fail(res, 3, "barrier let rank %d out %lld us before rank %d entered", rank,
		     (long long)(all[last].in - me.out) / 1000, last);
	else if (last < 0 && rank != t->root && me.out - me.in < 150000000)
		fail(res, 3, "barrier let rank %d through after %lld ms, before late rank %d arrived (300 ms)",
		     rank, (long long)(me.out - me.in) / 1000000, t->root);
}

static void run_case(struct kcoll *k, struct kcoll_comm *c, int n, int rank, int ci)
{
	const struct tcase *t = &cases[ci];
	struct result *res = &results[ci];
	size_t esz = kcoll_dtype_size(t->dtype);
	size_t sbytes = send_count(t, n) * esz, rbytes = recv_count(t, n) * esz;
	size_t pad = 64;
	uint8_t *sraw = NULL, *rraw = NULL, *exp, *ins[MAX_RANKS];
	uint8_t *sbuf, *rbuf;
	struct kcoll_req *req = NULL;
	int r, er;

	if (t->opcode == KCOLL_OP_BARRIER) {
		run_barrier(c, rank, t, res);
		return;
	}
	exp = calloc(1, rbytes + 1);
	for (int i = 0; i < n; i++)
		ins[i] = malloc(sbytes + 1);
	r = expected(t, n, rank, exp, ins);
	if (r) {
		fail(res, r, "reference failed");
		goto out;
	}
	if (alloc(k, t->mem, sbytes + pad, (void **)&sraw) || alloc(k, t->mem, rbytes + pad, (void **)&rraw)) {
		fail(res, -ENOMEM, "buffer allocation failed");
		goto out;
	}
	sbuf = sraw;
	rbuf = rraw;
	memset(rraw, 0xA5, rbytes + pad);
	coll_place(k, t->mem, t->opcode, t->inplace, rank, t->root, t->count, esz, ins[rank], sbytes,
		   &sbuf, &rbuf, &rraw);
	r = submit_coll(c, t->opcode, sbuf, rbuf, t->count, t->dtype, t->op, t->root, &req);
	r = wait_op(r, &req, &er);
	if (r) {
		fail(res, r, "operation failed: %s (err_rank %d)", en(r), er);
		goto out;
	}
	if (memcmp(rbuf, exp, rbytes)) {
		size_t i = 0;

		while (i < rbytes && rbuf[i] == exp[i])
			i++;
		fail(res, 1, "result differs from the reference at element %zu", i / esz);
		goto out;
	}
	if (rraw && !t->inplace) {
		for (size_t i = rbytes; i < rbytes + pad; i++) {
			if (rraw[i] != 0xA5) {
				fail(res, 2, "wrote past the receive buffer (byte %zu)", i);
				break;
			}
		}
	}
out:
	if (sraw)
		release(k, t->mem, sraw);
	if (rraw)
		release(k, t->mem, rraw);
	for (int i = 0; i < n; i++)
		free(ins[i]);
	free(exp);
}

/*
 * Several all-reduces in flight at once, submitted before any is waited
 * for: the daemons must keep each communicator's ops in order across hosts.
 */
#define CHAIN	6
static void run_chain(struct kcoll_comm *c, int n, int rank, struct result *res)
{
	static const size_t counts[CHAIN] = { 1, 65537, 7, 1003, 262147, 3 };
	struct kcoll_req *req[CHAIN] = { NULL };
	int32_t *buf[CHAIN];
	int sub[CHAIN];

	for (int j = 0; j < CHAIN; j++) {
		buf[j] = malloc(counts[j] * sizeof(int32_t));
		fill(buf[j], KCOLL_I32, KCOLL_SUM, counts[j], rank, 900 + j);
		sub[j] = kcoll_allreduce(c, buf[j], buf[j], counts[j], KCOLL_I32, KCOLL_SUM, &req[j]);
	}
	for (int j = 0; j < CHAIN; j++) {
		uint32_t *want = calloc(counts[j], sizeof(uint32_t));
		uint32_t *in = malloc(counts[j] * sizeof(uint32_t));
		int er, r = wait_op(sub[j], &req[j], &er);

		if (r)
			fail(res, r, "op %d of %d in flight: %s (err_rank %d)", j, CHAIN, en(r), er);
		for (int q = 0; !r && q < n; q++) {
			fill(in, KCOLL_I32, KCOLL_SUM, counts[j], q, 900 + j);
			for (size_t i = 0; i < counts[j]; i++)
				want[i] += in[i];
		}
		if (!r && memcmp(want, buf[j], counts[j] * sizeof(uint32_t)))
			fail(res, 1, "op %d of %d in flight (count %zu): result differs from the reference",
			     j, CHAIN, counts[j]);
		free(in);
		free(want);
		free(buf[j]);
	}
}

/* Print one line per group (in order of first appearance): the script turns
 * each into a TAP line. */
static int report(void)
{
	int bad_total = 0;

	for (int i = 0; i < ncases; i++) {
		const char *group = cases[i].group;
		int seen = 0, bad = 0, shown = 0;

		for (int j = 0; j < i; j++)
			if (!strcmp(cases[j].group, group))
				seen = 1;
		if (seen)
			continue;
		for (int j = i; j < ncases; j++) {
			const struct tcase *t = &cases[j];

			if (strcmp(t->group, group))
				continue;
			seen++;
			if (!results[j].bad)
				continue;
			bad++;
			if (shown++ < 3)
				printf("# %s %s/%s count=%zu inplace=%d mem=%s root=%d: %s\n", group,
				       kcoll_dtype_name(t->dtype), kcoll_redop_name(t->op), t->count,
				       t->inplace, t->mem ? "host" : "shm", t->root, results[j].why);
		}
		printf("group cases=%d bad=%d name=%s\n", seen, bad, group);
		bad_total += bad;
	}
	fflush(stdout);
	return bad_total ? 1 : 0;
}

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

static void build_coll(int n)
{
	static const size_t counts[] = { 0, 1, 7, 1003, 262147 };
	static const int sum_dtypes[] = { KCOLL_F32, KCOLL_F64, KCOLL_I32, KCOLL_BF16, KCOLL_F16, KCOLL_U8 };
	static const struct { int dtype, op; } ops[] = {
		{ KCOLL_F32, KCOLL_MIN }, { KCOLL_F32, KCOLL_MAX }, { KCOLL_F32, KCOLL_PROD },
		{ KCOLL_F32, KCOLL_AVG }, { KCOLL_F64, KCOLL_MAX }, { KCOLL_F64, KCOLL_PROD },
		{ KCOLL_I32, KCOLL_MIN }, { KCOLL_I32, KCOLL_MAX }, { KCOLL_I32, KCOLL_PROD },
		{ KCOLL_BF16, KCOLL_MAX }, { KCOLL_BF16, KCOLL_PROD },
		{ KCOLL_F16, KCOLL_MIN }, { KCOLL_U8, KCOLL_MAX }, { KCOLL_I8, KCOLL_MIN },
		{ KCOLL_U64, KCOLL_SUM }, { KCOLL_I64, KCOLL_MAX },
	};
	/* Broadcast roots: the last rank (last host), the middle one (a host in
	 * between), rank 1 and 0. */
	int roots[4] = { n - 1, n / 2, 1 % n, 0 };
	int v = 0;

	ncases = 0;
	for (unsigned int d = 0; d < ARRAY_SIZE(sum_dtypes); d++)
		for (unsigned int k = 0; k < ARRAY_SIZE(counts); k++, v++)
			add("allreduce sum: f32 f64 i32 bf16 f16 u8 x counts 0 1 7 1003 262147",
			    KCOLL_OP_ALLREDUCE, sum_dtypes[d], KCOLL_SUM, counts[k], v & 1, (v >> 1) & 1, 0);
	for (unsigned int o = 0; o < ARRAY_SIZE(ops); o++, v++) {
		add("allreduce min/max/prod/avg", KCOLL_OP_ALLREDUCE, ops[o].dtype, ops[o].op,
		    o & 1 ? 7 : 1003, v & 1, (v >> 1) & 1, 0);
	}
	/* docs/reduce.md: integers average their 64-bit sum, truncated. */
	add("allreduce i32/u8 avg", KCOLL_OP_ALLREDUCE, KCOLL_I32, KCOLL_AVG, 1003, 0, MEM_SHM, 0);
	add("allreduce i32/u8 avg", KCOLL_OP_ALLREDUCE, KCOLL_U8, KCOLL_AVG, 7, 1, MEM_HOST, 0);
	for (size_t cnt = 1; cnt <= 5; cnt++, v++)
		add("allreduce tiny counts 1..5", KCOLL_OP_ALLREDUCE, KCOLL_F32, KCOLL_SUM, cnt, v & 1,
		    (v >> 1) & 1, 0);
	for (unsigned int d = 0; d < ARRAY_SIZE(sum_dtypes); d++)
		for (unsigned int k = 0; k < ARRAY_SIZE(counts); k++, v++) {
			/* the largest only for f32: reduce-scatter sends count * nranks */
			if (counts[k] > 100000 && sum_dtypes[d] != KCOLL_F32)
				continue;
			add("reduce-scatter sum: f32 f64 i32 bf16 f16 u8", KCOLL_OP_REDUCE_SCATTER,
			    sum_dtypes[d], KCOLL_SUM, counts[k], v & 1, (v >> 1) & 1, 0);
		}
	add("reduce-scatter min/max/prod", KCOLL_OP_REDUCE_SCATTER, KCOLL_I32, KCOLL_MAX, 1003, 0, 0, 0);
	add("reduce-scatter min/max/prod", KCOLL_OP_REDUCE_SCATTER, KCOLL_F16, KCOLL_MIN, 7, 1, 1, 0);
	add("reduce-scatter min/max/prod", KCOLL_OP_REDUCE_SCATTER, KCOLL_F64, KCOLL_PROD, 1003, 1, 0, 0);
	add("reduce-scatter min/max/prod", KCOLL_OP_REDUCE_SCATTER, KCOLL_U8, KCOLL_PROD, 1, 0, 1, 0);
	for (unsigned int k = 0; k < ARRAY_SIZE(counts); k++) {
		static const int ag[] = { KCOLL_U8, KCOLL_F32, KCOLL_I32, KCOLL_F64 };

		for (unsigned int d = 0; d < ARRAY_SIZE(ag); d++, v++) {
			if (counts[k] > 100000 && ag[d] == KCOLL_F64)
				continue;
			add("allgather: u8 f32 i32 f64", KCOLL_OP_ALLGATHER, ag[d], KCOLL_SUM, counts[k],
			    v & 1, (v >> 1) & 1, 0);
		}
	}
	for (unsigned int k = 0; k < ARRAY_SIZE(counts); k++) {
		static const int bc[] = { KCOLL_F32, KCOLL_BF16, KCOLL_U8, KCOLL_F64 };

		for (unsigned int j = 0; j < ARRAY_SIZE(roots); j++, v++)
			add("broadcast, roots last, middle, 1, 0", KCOLL_OP_BROADCAST, bc[(k + j) % 4],
			    KCOLL_SUM, counts[k], v & 1, (v >> 1) & 1, roots[j]);
	}
	add("barrier holds every rank until the late one arrives", KCOLL_OP_BARRIER, KCOLL_U8, KCOLL_SUM,
	    0, 0, 0, n - 1);
	add("barrier holds every rank until the late one arrives", KCOLL_OP_BARRIER, KCOLL_U8, KCOLL_SUM,
	    0, 0, 0, 0);
}

static void build_algo(void)
{
	static const size_t counts[] = { 1, 7, 1003, 65537, 262147, 1048579 };

	ncases = 0;
	for (unsigned int k = 0; k < ARRAY_SIZE(counts); k++) {
		add("allreduce f32 sum", KCOLL_OP_ALLREDUCE, KCOLL_F32, KCOLL_SUM, counts[k], k & 1,
		    (k >> 1) & 1, 0);
		if (counts[k] < 1000000)
			add("allreduce i32 max, bf16 sum", KCOLL_OP_ALLREDUCE, k & 1 ? KCOLL_I32 : KCOLL_BF16,
			    k & 1 ? KCOLL_MAX : KCOLL_SUM, counts[k], !(k & 1), 0, 0);
	}
}

/* A short check of a fresh communicator (the survivors' after a fault). */
static void build_check(const char *group, int n)
{
	ncases = 0;
	add(group, KCOLL_OP_ALLREDUCE, KCOLL_F32, KCOLL_SUM, 1003, 0, MEM_HOST, 0);
	add(group, KCOLL_OP_ALLREDUCE, KCOLL_I32, KCOLL_SUM, 262147, 1, MEM_SHM, 0);
	add(group, KCOLL_OP_REDUCE_SCATTER, KCOLL_F64, KCOLL_MAX, 1003, 0, MEM_SHM, 0);
	add(group, KCOLL_OP_ALLGATHER, KCOLL_U8, KCOLL_SUM, 7, 0, MEM_HOST, 0);
	add(group, KCOLL_OP_BROADCAST, KCOLL_BF16, KCOLL_SUM, 1003, 1, MEM_HOST, n - 1);
	add(group, KCOLL_OP_BARRIER, KCOLL_U8, KCOLL_SUM, 0, 0, 0, n / 2);
}

static int parse_id(const char *hex, kcoll_unique_id_t *id)
{
	if (strlen(hex) != 2 * sizeof(id->bytes))
		return -EINVAL;
	for (size_t i = 0; i < sizeof(id->bytes); i++) {
		unsigned int b;

		if (sscanf(hex + 2 * i, "%2x", &b) != 1)
			return -EINVAL;
		id->bytes[i] = b;
	}
	return 0;
}

/* Join the communicator on connection k (its result, said on stdout). */
static int join(struct kcoll *k, const kcoll_unique_id_t *id, int n, int rank, struct kcoll_comm **c)
{
	int r = kcoll_comm_init_rank(k, id, n, rank, c);

	if (r)
		printf("# rank %d: comm init (%d ranks): %s\n", rank, n, kcoll_strerror(r));
	return r;
}

static int setup(const kcoll_unique_id_t *id, int n, int rank, struct kcoll **k, struct kcoll_comm **c)
{
	int r = kcoll_connect(NULL, k);

	if (r) {
		printf("# rank %d: connect to $KCOLL_SOCKET: %s\n", rank, kcoll_strerror(r));
		return r;
	}
	r = join(*k, id, n, rank, c);
	if (r)
		kcoll_disconnect(*k);
	return r;
}

static int mode_id(int corrupt)
{
	kcoll_unique_id_t id;
	struct kcoll *k;
	int r;

	r = kcoll_connect(NULL, &k);
	if (r) {
		fprintf(stderr, "mh_rank: connect to $KCOLL_SOCKET: %s\n", kcoll_strerror(r));
		return 2;
	}
	r = kcoll_get_unique_id(k, &id);
	kcoll_disconnect(k);
	if (r) {
		fprintf(stderr, "mh_rank: unique id: %s\n", kcoll_strerror(r));
		return 2;
	}
	if (corrupt)
		id.bytes[offsetof(struct kcoll_id, token)] ^= 0x5a;
	for (size_t i = 0; i < sizeof(id.bytes); i++)
		printf("%02x", id.bytes[i]);
	printf("\n");
	return 0;
}

static int mode_cases(const kcoll_unique_id_t *id, int n, int rank, const char *mode)
{
	struct kcoll_comm *c;
	struct kcoll *k;
	int r;

	if (!strcmp(mode, "algo"))
		build_algo();
	else if (!strcmp(mode, "check"))
		build_check("one of each collective", n);
	else
		build_coll(n);
	if (setup(id, n, rank, &k, &c))
		return 2;
	for (int i = 0; i < ncases; i++)
		run_case(k, c, n, rank, i);
	r = report();
	if (!strcmp(mode, "coll")) {
		struct result chain = { 0 };

		run_chain(c, n, rank, &chain);
		if (chain.bad)
			printf("# pipelined: %s\n", chain.why);
		printf("group cases=1 bad=%d name=%d all-reduces in flight at once complete in order\n",
		       !!chain.bad, CHAIN);
		r |= !!chain.bad;
	}
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	return r;
}

/* Rank r's element i (an integer below 2001): the sum is exact in f32. */
static float big_val(int rank, size_t i)
{
	return (float)((i * 7 + (size_t)rank * 13) % 2001) - 1000.0f;
}

/* reg: a malloc'ed buffer made zero-copy through kcoll.ko (kcoll_mem_register) */
static int mode_big(const kcoll_unique_id_t *id, int n, int rank, size_t count, bool reg)
{
	struct kcoll_req *req = NULL;
	struct kcoll_comm *c;
	struct kcoll *k;
	size_t bad = 0, first = 0;
	int64_t t0;
	float *buf;
	int r, er;

	if (setup(id, n, rank, &k, &c))
		return 2;
	if (reg) {
		buf = aligned_alloc(4096, (count * sizeof(float) + 4095) & ~(size_t)4095);
		r = buf ? kcoll_mem_register(k, buf, count * sizeof(float)) : -ENOMEM;
	} else {
		r = kcoll_mem_alloc(k, count * sizeof(float), (void **)&buf);
	}
	if (r) {
		printf("# rank %d: %s %zu MiB: %s\n", rank, reg ? "kcoll_mem_register" : "kcoll_mem_alloc",
		       count * 4 >> 20, en(r));
		return 2;
	}
	for (size_t i = 0; i < count; i++)
		buf[i] = big_val(rank, i);
	t0 = now_ms();
	r = wait_op(kcoll_allreduce(c, buf, buf, count, KCOLL_F32, KCOLL_SUM, &req), &req, &er);
	if (r) {
		printf("# rank %d: all-reduce of %zu f32: %s (err_rank %d)\n", rank, count, en(r), er);
		bad = 1;
	}
	printf("# rank %d: %zu MiB all-reduced in %lld ms\n", rank, count * 4 >> 20,
	       (long long)(now_ms() - t0));
	for (size_t i = 0; !r && i < count; i++) {
		float want = 0;

		for (int q = 0; q < n; q++)
			want += big_val(q, i);
		if (buf[i] != want && !bad++)
			first = i;
	}
	if (!r && bad)
		printf("# rank %d: %zu elements differ from the reference, the first at %zu\n", rank, bad,
		       first);
	printf("group cases=1 bad=%d name=in-place f32 all-reduce of %zu elements (%zu MiB)\n", !!bad,
	       count, count * 4 >> 20);
	if (reg) {
		kcoll_mem_deregister(k, buf);
		free(buf);
	} else {
		kcoll_mem_free(k, buf);
	}
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	return bad ? 1 : 0;
}

/*
 * Registered buffers freed and allocated again, over and over: the daemon
 * unmaps each region when it is freed and maps the next one, usually at the
 * same address, so a transport that caches registrations by address (RDMA
 * zero-copy) must drop them in between or it sends the old pages. Each
 * round has its own data; in-place and out-of-place rounds alternate.
 */
static int32_t remap_val(int rank, long it, size_t i)
{
	return (int32_t)((uint32_t)i * 2654435761u + (uint32_t)rank * 40503u + (uint32_t)it * 977u);
}

static int mode_remap(const kcoll_unique_id_t *id, int n, int rank, long iters, size_t count)
{
	struct kcoll_req *req = NULL;
	struct kcoll_comm *c;
	struct kcoll *k;
	void *prev = NULL;
	long same = 0, bad = 0;
	int r = 0, er;

	if (setup(id, n, rank, &k, &c))
		return 2;
	for (long it = 0; it < iters && !r; it++) {
		int inplace = !(it & 1);
		int32_t *s, *d = NULL;
		size_t wrong = 0, first = 0;

		r = kcoll_mem_alloc(k, count * sizeof(int32_t), (void **)&s);
		if (!r && !inplace)
			r = kcoll_mem_alloc(k, count * sizeof(int32_t), (void **)&d);
		if (r) {
			printf("# rank %d: round %ld: kcoll_mem_alloc: %s\n", rank, it, en(r));
			bad++;
			break;
		}
		same += (void *)s == prev;
		prev = s;
		if (inplace)
			d = s;
		for (size_t i = 0; i < count; i++) {
			s[i] = remap_val(rank, it, i);
			if (!inplace)
				d[i] = -1;
		}
		r = wait_op(kcoll_allreduce(c, s, d, count, KCOLL_I32, KCOLL_SUM, &req), &req, &er);
		if (r) {
			printf("# rank %d: round %ld: all-reduce: %s (err_rank %d)\n", rank, it, en(r), er);
			bad++;
		}
		for (size_t i = 0; !r && i < count; i++) {
			uint32_t want = 0;

			for (int q = 0; q < n; q++)
				want += (uint32_t)remap_val(q, it, i);
			if ((uint32_t)d[i] != want && !wrong++)
				first = i;
		}
		if (wrong) {
			printf("# rank %d: round %ld (%s): %zu elements wrong, the first at %zu\n", rank, it,
			       inplace ? "in place" : "out of place", wrong, first);
			bad++;
		}
		if (!inplace)
			kcoll_mem_free(k, d);
		kcoll_mem_free(k, s);
	}
	printf("# rank %d: %ld rounds, the send buffer came back at the same address %ld times\n", rank, iters,
	       same);
	printf("group cases=%ld bad=%ld name=registered buffers freed and allocated again, %zu i32 each\n",
	       iters, bad, count);
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	return bad ? 1 : 0;
}

static int mode_init(const kcoll_unique_id_t *id, int n, int rank)
{
	struct kcoll_comm *c;
	struct kcoll *k;
	int64_t t0;
	int r;

	r = kcoll_connect(NULL, &k);
	if (r) {
		printf("# rank %d: connect to $KCOLL_SOCKET: %s\n", rank, kcoll_strerror(r));
		return 2;
	}
	t0 = now_ms();
	r = kcoll_comm_init_rank(k, id, n, rank, &c);
	printf("init err=%d name=%s ms=%lld\n", r, en(r), (long long)(now_ms() - t0));
	if (!r)
		kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	return 0;
}

/*
 * Peers leaving while the last rank still has an op to run that they did
 * their part in: two all-reduces, then a broadcast from rank 0 that every
 * rank but the last gets at once (the root's daemon sends to every host);
 * the last rank submits it 1.5 s late. Ranks 0 .. n-2 then leave, each one
 * 0.5 s after the one before, so each later leaver has already heard that
 * the communicator ends after this op. The last rank's broadcast must still
 * complete with the root's data: the leavers' connections closing are
 * goodbyes, not deaths.
 */
static int mode_leave(const kcoll_unique_id_t *id, int n, int rank)
{
	enum { COUNT = 16384 };
	static int32_t buf[COUNT];
	struct kcoll_req *req = NULL;
	struct kcoll_comm *c;
	struct kcoll *k;
	int r = 0, er = -1, bad = 0;

	if (setup(id, n, rank, &k, &c))
		return 2;
	for (int i = 0; i < 2 && !r; i++) {
		int32_t v = rank;

		r = wait_op(kcoll_allreduce(c, &v, &v, 1, KCOLL_I32, KCOLL_SUM, &req), &req, &er);
	}
	if (r) {
		printf("# rank %d: warm-up all-reduce: %s (err_rank %d)\n", rank, en(r), er);
		bad = 1;
		goto out;
	}
	for (int i = 0; i < COUNT; i++)
		buf[i] = rank == 0 ? i * 7 + 1 : -1;
	if (rank == n - 1)
		usleep(1500 * 1000);
	r = wait_op(kcoll_broadcast(c, buf, COUNT, KCOLL_I32, 0, &req), &req, &er);
	for (int i = 0; !r && i < COUNT; i++)
		if (buf[i] != i * 7 + 1) {
			printf("# rank %d: broadcast element %d is %d, not %d\n", rank, i, buf[i], i * 7 + 1);
			bad = 1;
			break;
		}
	if (r) {
		printf("# rank %d: broadcast: %s (err_rank %d)\n", rank, en(r), er);
		bad = 1;
	}
	if (rank < n - 1)
		usleep((useconds_t)rank * 500 * 1000);
out:
	printf("group cases=1 bad=%d name=ranks leave one by one while the last one still has to run an op they "
	       "did their part in (a broadcast it submits 1.5 s late): it completes with the root's data\n", bad);
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	return bad;
}

/* DIR/NAME.RANK holding our pid, complete when it appears. */
static void write_pid(const char *dir, const char *name, int rank)
{
	char tmp[4096], path[4096];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s/.%s.%d", dir, name, rank);
	snprintf(path, sizeof(path), "%s/%s.%d", dir, name, rank);
	f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "%d\n", (int)getpid());
	if (fclose(f) == 0)
		rename(tmp, path);
}

/* Wait for the script's NEXT file: the new id and this rank's new rank. */
static int read_next(const char *path, int rank, kcoll_unique_id_t *id, int *n, int *newrank)
{
	int64_t deadline = now_ms() + 60000;
	char hex[2 * KCOLL_UNIQUE_ID_BYTES + 2];
	FILE *f;
	int r = 0;

	while (!(f = fopen(path, "r"))) {
		if (now_ms() > deadline)
			return -ETIMEDOUT;
		usleep(20000);
	}
	if (fscanf(f, "%257s %d", hex, n) != 2 || parse_id(hex, id) || *n < 1 || *n > MAX_RANKS)
		r = -EINVAL;
	for (int i = 0; !r && i <= rank; i++)
		if (fscanf(f, "%d", newrank) != 1 || *newrank >= *n)
			r = -EINVAL;
	fclose(f);
	return r;
}

/* Checked i32 sum all-reduce number 'it' of count elements: its status;
 * *bad set when an element is wrong. */
static int checked_op(struct kcoll_comm *c, int32_t *s, int32_t *d, size_t count, int n, int rank, long it,
		      int *err_rank, int *bad)
{
	uint32_t ranks = (uint32_t)(n * (n - 1) / 2) * 40503u, base = (uint32_t)it * 977u;
	struct kcoll_req *req = NULL;
	int r;

	for (size_t i = 0; i < count; i++)
		s[i] = (int32_t)((uint32_t)i * 2654435761u + (uint32_t)rank * 40503u + base);
	r = wait_op(kcoll_allreduce(c, s, d, count, KCOLL_I32, KCOLL_SUM, &req), &req, err_rank);
	for (size_t i = 0; !r && i < count; i++) {
		if ((uint32_t)d[i] != (uint32_t)n * ((uint32_t)i * 2654435761u + base) + ranks) {
			printf("# rank %d: op %ld: element %zu wrong\n", rank, it, i);
			*bad = 1;
			break;
		}
	}
	return r;
}

static int mode_loop(const kcoll_unique_id_t *id, int n, int rank, const char *dir, const char *next)
{
	int32_t *s = malloc(LOOP_COUNT * sizeof(int32_t)), *d = malloc(LOOP_COUNT * sizeof(int32_t));
	int64_t deadline = now_ms() + 90000, t_err;
	int r = 0, er = -1, r2, er2, bad = 0, newrank, n2;
	struct kcoll_req *req = NULL;
	struct kcoll_comm *c;
	kcoll_unique_id_t id2;
	struct kcoll *k;
	long it;

	write_pid(dir, "pid", rank);
	if (setup(id, n, rank, &k, &c))
		return 2;
	for (it = 0; now_ms() < deadline; it++) {
		r = checked_op(c, s, d, LOOP_COUNT, n, rank, it, &er, &bad);
		if (r)
			break;
		if (it == 2)
			write_pid(dir, "ready", rank);
	}
	t_err = now_ms();
	/* What the communicator does with the next op after the failure. */
	r2 = wait_op(kcoll_allreduce(c, s, d, 1003, KCOLL_I32, KCOLL_SUM, &req), &req, &er2);
	printf("fault err=%d name=%s err_rank=%d t_ms=%lld later=%d later_name=%s later_err_rank=%d iters=%ld\n",
	       r, en(r), er, (long long)t_err, r2, en(r2), er2, it);
	free(s);
	free(d);
	kcoll_comm_destroy(c);
	if (!next)
		goto out;
	r = read_next(next, rank, &id2, &n2, &newrank);
	if (r) {
		printf("# rank %d: no usable %s: %s\n", rank, next, en(r));
		bad = 1;
		goto out;
	}
	if (newrank < 0)
		goto out;
	/* Same process, same connection to the same daemon: a new communicator. */
	build_check("recover", n2);
	if (join(k, &id2, n2, newrank, &c)) {
		printf("group cases=1 bad=1 name=recover\n");
		bad = 1;
		goto out;
	}
	for (int i = 0; i < ncases; i++)
		run_case(k, c, n2, newrank, i);
	bad |= report();
	kcoll_comm_destroy(c);
out:
	kcoll_disconnect(k);
	return bad;
}

static int mode_traffic(const kcoll_unique_id_t *id, int n, int rank, const char *dir, size_t count,
			long max_s)
{
	int32_t *s = malloc(count * sizeof(int32_t)), *d = malloc(count * sizeof(int32_t));
	int64_t t0 = now_ms(), deadline = t0 + max_s * 1000;
	int r = 0, er = -1, bad = 0;
	struct kcoll_req *req = NULL;
	struct kcoll_comm *c;
	struct kcoll *k;
	char stop[4096];
	long it;

	snprintf(stop, sizeof(stop), "%s/stop", dir);
	if (!s || !d || setup(id, n, rank, &k, &c))
		return 2;
	for (it = 0;; it++) {
		int32_t seen = access(stop, F_OK) == 0 || now_ms() >= deadline, any = 0;

		r = checked_op(c, s, d, count, n, rank, it, &er, &bad);
		if (r)
			break;
		if (it == 0)
			write_pid(dir, "ready", rank);
		r = wait_op(kcoll_allreduce(c, &seen, &any, 1, KCOLL_I32, KCOLL_MAX, &req), &req, &er);
		if (r || any)
			break;
	}
	printf("traffic ops=%ld bad=%d err=%d name=%s err_rank=%d ms=%lld\n", it + (r ? 0 : 1), bad, r,
	       en(r), er, (long long)(now_ms() - t0));
	free(s);
	free(d);
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	return r || bad;
}

static int usage(void)
{
	fprintf(stderr,
		"usage: mh_rank id [--corrupt-token]\n"
		"       mh_rank coll|algo|check|init|leave ID NRANKS RANK\n"
		"       mh_rank big|bigreg ID NRANKS RANK [COUNT]   (bigreg: malloc + kcoll_mem_register)\n"
		"       mh_rank remap ID NRANKS RANK [ROUNDS [COUNT]]\n"
		"       mh_rank loop ID NRANKS RANK DIR [NEXT]\n"
		"       mh_rank traffic ID NRANKS RANK DIR [COUNT [MAX_S]]  (COUNT <= 2^28, MAX_S <= 3600)\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	kcoll_unique_id_t id;
	int n, rank;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "id"))
		return mode_id(argc > 2 && !strcmp(argv[2], "--corrupt-token"));
	if (argc < 5)
		return usage();
	n = atoi(argv[3]);
	rank = atoi(argv[4]);
	if (parse_id(argv[2], &id) || n < 1 || n > MAX_RANKS || rank < 0 || rank >= n) {
		fprintf(stderr, "mh_rank: ID must be %d hex digits, 1 <= NRANKS <= %d, 0 <= RANK < NRANKS\n",
			2 * KCOLL_UNIQUE_ID_BYTES, MAX_RANKS);
		return 2;
	}
	/* A hung daemon must fail the test, not hang the script. */
	if (!strcmp(mode, "traffic") && argc > 5) {
		size_t count = argc > 6 ? strtoul(argv[6], NULL, 0) : 1u << 18;
		long max_s = argc > 7 ? strtol(argv[7], NULL, 0) : 300;

		if (!count || count > (1u << 28) || max_s < 1 || max_s > 3600)
			return usage();
		alarm((unsigned)max_s + WAIT_MS / 1000 + 60);	/* past the last op's own bound */
		return mode_traffic(&id, n, rank, argv[5], count, max_s);
	}
	alarm(170);
	if (!strcmp(mode, "coll") || !strcmp(mode, "algo") || !strcmp(mode, "check"))
		return mode_cases(&id, n, rank, mode);
	if (!strcmp(mode, "big") || !strcmp(mode, "bigreg"))
		return mode_big(&id, n, rank, argc > 5 ? strtoul(argv[5], NULL, 0) : BIG_COUNT,
				!strcmp(mode, "bigreg"));
	if (!strcmp(mode, "remap"))
		return mode_remap(&id, n, rank, argc > 5 ? strtol(argv[5], NULL, 0) : 12,
				  argc > 6 ? strtoul(argv[6], NULL, 0) : 262147);
	if (!strcmp(mode, "init"))
		return mode_init(&id, n, rank);
	if (!strcmp(mode, "leave"))
		return mode_leave(&id, n, rank);
	if (!strcmp(mode, "loop") && argc > 5)
		return mode_loop(&id, n, rank, argv[5], argc > 6 ? argv[6] : NULL);
	return usage();
}
