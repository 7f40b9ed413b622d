// SPDX-License-Identifier: MIT
/*
 * Daemon integration: every collective against the running kcolld, with 1..8
 * ranks as separate processes, checked bit for bit against the scalar
 * reference (kcoll_reduce_ref) computed locally from the same inputs.
 *
 * For each rank count one group of processes runs the same case list in the
 * same order on one communicator; each rank records failures in a shared
 * table and the parent prints one TAP line per (ranks, case group).
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "reduce.h"
#include "test_util.h"

#define MAX_RANKS	8
#define MAX_CASES	512

struct tcase {
	const char *group;
	int opcode;
	int dtype, op;
	size_t count;
	int inplace;
	int mem;
	int misalign;	/* bytes added to every buffer address */
	int root;
};

struct result {
	int bad[MAX_RANKS];		/* 0 ok, else first failing index + 1 or -errno */
	char why[MAX_RANKS][96];
};

static struct tcase cases[MAX_CASES];
static int ncases;
static struct result *results;	/* shared with the children */

static void add(const char *group, int opcode, int dtype, int op, size_t count, int inplace,
		int mem, int misalign, int root)
{
	if (ncases == MAX_CASES) {
		fprintf(stderr, "test_coll: too many cases\n");
		exit(1);
	}
	cases[ncases++] = (struct tcase){ group, opcode, dtype, op, count, inplace, mem, misalign, root };
}

/* Deterministic input of rank r, element i: exact-ish values that exercise
 * rounding (floats) and wrap-around (integers). */
static void fill(void *buf, int dtype, size_t count, int rank, int salt)
{
	fill_range(buf, dtype, count, rank, salt, 1000000, 1024.0, 256.0);
}

static size_t send_count(const struct tcase *t, int n)
{
	return coll_send_count(t->opcode, t->count, n);
}

static size_t recv_count(const struct tcase *t, int n)
{
	return coll_recv_count(t->opcode, t->count, n);
}

/* The expected receive buffer of 'rank' into exp (recv_count elements). */
static int expected(const struct tcase *t, int n, int rank, uint8_t *exp, uint8_t **ins)
{
	size_t sc = send_count(t, n);

	for (int r = 0; r < n; r++)
		fill(ins[r], t->dtype, sc, r, t - cases);
	return coll_expected(t->opcode, t->dtype, t->op, t->count, t->root, n, rank, ins, exp);
}

static void fail(struct result *res, int rank, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void fail(struct result *res, int rank, int code, const char *fmt, ...)
{
	va_list ap;

	if (res->bad[rank])
		return;
	res->bad[rank] = code;
	va_start(ap, fmt);
	vsnprintf(res->why[rank], sizeof(res->why[rank]), fmt, ap);
	va_end(ap);
}

static void run_case(struct kcoll *k, struct kcoll_comm *c, int n, int rank, int ci)
{
	const struct tcase *t = &cases[ci];
	struct result *res = &results[ci];
	size_t esz = kcoll_dtype_size(t->dtype);
	size_t sbytes = send_count(t, n) * esz, rbytes = recv_count(t, n) * esz;
	size_t pad = 64 + t->misalign;
	uint8_t *sraw = NULL, *rraw = NULL, *exp, *ins[MAX_RANKS];
	uint8_t *sbuf, *rbuf;
	struct kcoll_req *req;
	int r;

	exp = calloc(1, rbytes + 1);
	for (int i = 0; i < n; i++)
		ins[i] = malloc(sbytes + 1);
	r = expected(t, n, rank, exp, ins);
	if (r) {
		fail(res, rank, r, "reference failed");
		goto out;
	}
	if (alloc(k, t->mem, sbytes + pad, (void **)&sraw) || alloc(k, t->mem, rbytes + pad, (void **)&rraw)) {
		fail(res, rank, -ENOMEM, "buffer allocation failed");
		goto out;
	}
	sbuf = sraw + t->misalign;
	rbuf = rraw + t->misalign;
	memset(rraw, 0xA5, rbytes + pad);
	coll_place(k, t->mem, t->opcode, t->inplace, rank, t->root, t->count, esz, ins[rank], sbytes,
		   &sbuf, &rbuf, &rraw);
	r = submit_coll(c, t->opcode, sbuf, rbuf, t->count, t->dtype, t->op, t->root, &req);
	if (!r)
		r = kcoll_wait(req, 20000);
	if (r) {
		fail(res, rank, r, "operation failed: %s", kcoll_strerror(r));
		goto out;
	}
	if (memcmp(rbuf, exp, rbytes)) {
		size_t i = 0;

		while (i < rbytes && rbuf[i] == exp[i])
			i++;
		fail(res, rank, 1, "result differs from the reference at byte %zu (element %zu)", i, i / esz);
		goto out;
	}
	/* Nothing written outside the result (the 0xA5 guard bytes). */
	if (rraw && !t->inplace) {
		for (size_t i = 0; i < pad; i++) {
			size_t at = i < (size_t)t->misalign ? i : rbytes + i;

			if (at < rbytes + pad && rraw[at] != 0xA5) {
				fail(res, rank, 2, "wrote outside the receive buffer (byte %zu)", at);
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

static int rank_main(int n, int rank, const kcoll_unique_id_t *id)
{
	struct kcoll_comm *c;
	struct kcoll *k;
	int r;

	alarm(120);	/* a hung daemon must fail the test, not the CI job */
	r = kcoll_connect(NULL, &k);
	if (!r)
		r = kcoll_comm_init_rank(k, id, n, rank, &c);
	if (r) {
		for (int i = 0; i < ncases; i++)
			fail(&results[i], rank, r, "setup failed: %s", kcoll_strerror(r));
		return 1;
	}
	for (int i = 0; i < ncases; i++)
		run_case(k, c, n, rank, i);
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	return 0;
}

static void build_cases(int n)
{
	static const size_t counts[] = { 0, 1, 7, 1003, 262147 };
	static const int colls[] = { KCOLL_OP_ALLREDUCE, KCOLL_OP_REDUCE_SCATTER, KCOLL_OP_ALLGATHER,
				     KCOLL_OP_BROADCAST };
	static const char *const names[] = { "allreduce", "reducescatter", "allgather", "broadcast" };
	int v = 0;

	ncases = 0;
	/* Every dtype x op through all-reduce and reduce-scatter, rotating
	 * memory kind, alignment and in-place so every mix occurs. */
	for (int dt = 0; dt < KCOLL_DTYPE_MAX; dt++)
		for (int op = 0; op < KCOLL_REDOP_MAX; op++, v++)
			add("allreduce dtype x op", KCOLL_OP_ALLREDUCE, dt, op, 1003 + (v % 5), v & 1,
			    (v >> 1) & 1, v % 3, 0);
	for (int dt = 0; dt < KCOLL_DTYPE_MAX; dt++)
		for (int op = 0; op < KCOLL_REDOP_MAX; op++, v++)
			add("reducescatter dtype x op", KCOLL_OP_REDUCE_SCATTER, dt, op, 257 + (v % 3),
			    (v >> 1) & 1, v & 1, (v + 1) % 3, 0);
	/* Each collective: odd and zero counts, both memory kinds, in place, misaligned. */
	for (unsigned int ci = 0; ci < 4; ci++) {
		for (unsigned int k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
			for (int mem = 0; mem < 2; mem++) {
				for (int inplace = 0; inplace < 2; inplace++) {
					size_t cnt = counts[k];

					/* Keep the multi-chunk cases to a few, they dominate run time. */
					if (cnt > 100000 && (n > 4 || inplace))
						continue;
					add(names[ci], colls[ci], ci == 2 ? KCOLL_I8 : KCOLL_F32,
					    colls[ci] == KCOLL_OP_ALLGATHER ||
					    colls[ci] == KCOLL_OP_BROADCAST ? 0 : KCOLL_SUM,
					    cnt, inplace, mem, (int)(k % 3), colls[ci] == KCOLL_OP_BROADCAST ?
					    (int)((k + mem) % n) : 0);
				}
			}
		}
	}
}

static void report(int n)
{
	const char *group = NULL;
	int first = 0;

	for (int i = 0; i <= ncases; i++) {
		if (i < ncases && group && !strcmp(group, cases[i].group))
			continue;
		if (group) {
			int bad = 0, shown = 0;

			for (int j = first; j < i; j++) {
				for (int r = 0; r < n; r++) {
					if (!results[j].bad[r])
						continue;
					bad++;
					if (shown++ < 3) {
						const struct tcase *t = &cases[j];

						tap_diag("n=%d %s %s/%s count=%zu inplace=%d mem=%s misalign=%d rank %d: %s",
							 n, t->group, kcoll_dtype_name(t->dtype),
							 kcoll_redop_name(t->op), t->count, t->inplace,
							 t->mem ? "host" : "shm", t->misalign, r, results[j].why[r]);
					}
				}
			}
			tap_ok(!bad, "%d ranks: %s (%d cases)", n, group, i - first);
		}
		if (i < ncases) {
			group = cases[i].group;
			first = i;
		}
	}
}

int main(void)
{
	struct kcoll *k;
	int r;

	results = mmap(NULL, sizeof(*results) * MAX_CASES, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (results == MAP_FAILED)
		return 1;
	r = kcoll_connect(NULL, &k);
	if (r) {
		tap_ok(0, "connect to kcolld at $KCOLL_SOCKET: %s", kcoll_strerror(r));
		return tap_done();
	}
	for (int n = 1; n <= MAX_RANKS; n++) {
		kcoll_unique_id_t id;
		pid_t pids[MAX_RANKS];
		int ok = 1;

		build_cases(n);
		memset(results, 0, sizeof(*results) * MAX_CASES);
		if (kcoll_get_unique_id(k, &id))
			return 1;
		for (int rank = 0; rank < n; rank++) {
			pids[rank] = fork();
			if (pids[rank] == 0)
				_exit(rank_main(n, rank, &id));
		}
		for (int rank = 0; rank < n; rank++) {
			int st;

			waitpid(pids[rank], &st, 0);
			if (!WIFEXITED(st) || WEXITSTATUS(st))
				ok = 0;
		}
		tap_ok(ok, "%d ranks: every rank process exited cleanly", n);
		report(n);
	}
	kcoll_disconnect(k);
	return tap_done();
}
