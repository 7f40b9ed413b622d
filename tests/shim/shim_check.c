/* SPDX-License-Identifier: MIT */
/*
 * shim_check: a plain MPI program for tests/t_shim.sh, run with and without
 * LD_PRELOAD=libkcoll_mpi.so; the two runs must print the same lines.
 *
 *	mpirun -np N shim_check check   every intercepted call: types, ops,
 *	                                sizes below/above the threshold,
 *	                                MPI_IN_PLACE, WORLD/dup/split comms;
 *	                                rank 0 prints "<case> <rank> <fnv64>"
 *	mpirun -np N shim_check loop K  dup+split, large all-reduce, free, K
 *	                                times; prints the fd counts and runs
 *	                                $SHIM_CHECK_PROBE (rank 0) before freeing
 *	                                the last pair and after the loop, with
 *	                                SHIM_CHECK_WHEN=live / after
 *
 * Inputs are small integers, so float sums, products, minima and maxima are
 * exact in any order: the comparison is bitwise for every type. One case
 * more sums fractions (f32, f64), where the order of additions shows in the
 * last bits: it prints whether every element is within a relative 1e-5
 * (f32) / 1e-12 (f64) of the exact sum, not the bits.
 *	mpirun -np 1 shim_check overhead [N]
 *	                                the cost of the shim's pass-through
 *	                                path: N calls each of MPI_X (through
 *	                                the shim when preloaded) and PMPI_X
 *	                                (never) on MPI_COMM_SELF, 8 B, in
 *	                                alternating blocks; prints ns per call
 *	                                (medians of the blocks) and the
 *	                                difference. Timing only, no assertion.
 *
 * SHIM_CHECK_THREAD=1: start with MPI_Init_thread(MPI_THREAD_FUNNELED).
 * SHIM_CHECK_COMMS=world,split,...: check only these communicators (all are
 * still made and freed); default all five.
 */
#include <math.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include <mpi.h>

struct type {
	const char *name;
	MPI_Datatype t;
	int size;
	int is_signed;
	int is_float;
};

static struct type types[] = {
	{ "float", MPI_FLOAT, 4, 1, 1 },
	{ "double", MPI_DOUBLE, 8, 1, 1 },
	{ "int", MPI_INT, 4, 1, 0 },
	{ "unsigned", MPI_UNSIGNED, 4, 0, 0 },
	{ "int8", MPI_INT8_T, 1, 1, 0 },
	{ "uint8", MPI_UINT8_T, 1, 0, 0 },
	{ "schar", MPI_SIGNED_CHAR, 1, 1, 0 },
	{ "uchar", MPI_UNSIGNED_CHAR, 1, 0, 0 },
	{ "int64", MPI_INT64_T, 8, 1, 0 },
	{ "uint64", MPI_UINT64_T, 8, 0, 0 },
	{ "long", MPI_LONG, sizeof(long), 1, 0 },
	{ "ulong", MPI_UNSIGNED_LONG, sizeof(long), 0, 0 },
	{ "longlong", MPI_LONG_LONG, 8, 1, 0 },
	{ "short", MPI_SHORT, 2, 1, 0 },	/* no kcoll type: always PMPI */
};
#define NTYPES (int)(sizeof(types) / sizeof(types[0]))

static struct {
	const char *name;
	MPI_Op op;
} ops[] = { { "sum", MPI_SUM }, { "prod", MPI_PROD }, { "min", MPI_MIN }, { "max", MPI_MAX } };

static int world_rank, world_size;

/* Element i of rank r's input for op: small integers whose reduction over 4
 * ranks fits every type (prod: 1s and 2s, at most 2^4). */
static long long value(int op, int r, size_t i, int is_signed)
{
	long long v;

	switch (op) {
	case 1: return 1 + ((i + r) % 3 == 0);
	case 0: v = (long long)((i * 7 + r * 13) % 25); break;
	default: v = (long long)((i * 31 + r * 17) % 101); break;
	}
	return is_signed ? v - (op == 0 ? 12 : 50) : v;
}

static void fill(const struct type *t, void *buf, size_t n, int op, int r)
{
	for (size_t i = 0; i < n; i++) {
		long long v = value(op, r, i, t->is_signed);

		if (t->t == MPI_FLOAT)
			((float *)buf)[i] = (float)v;
		else if (t->t == MPI_DOUBLE)
			((double *)buf)[i] = (double)v;
		else if (t->size == 1)
			((int8_t *)buf)[i] = (int8_t)v;
		else if (t->size == 2)
			((int16_t *)buf)[i] = (int16_t)v;
		else if (t->size == 4)
			((int32_t *)buf)[i] = (int32_t)v;
		else
			((int64_t *)buf)[i] = (int64_t)v;
	}
}

static uint64_t fnv(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ULL;
	return h;
}

/* Every world rank's hash of buf, printed by world rank 0. The gather is not
 * intercepted, so it never depends on the shim. */
static void report(const char *name, const void *buf, size_t n)
{
	uint64_t h = fnv(buf, n), all[64];

	MPI_Gather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
	if (world_rank == 0)
		for (int r = 0; r < world_size; r++)
			printf("%s %d %016llx\n", name, r, (unsigned long long)all[r]);
}

/* Counts in elements: well below, just above and well above 64 KiB. */
static const size_t bytes_sizes[] = { 1000, 72 * 1024 + 8, 1024 * 1024 + 24 };
#define NSIZES (int)(sizeof(bytes_sizes) / sizeof(bytes_sizes[0]))

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		MPI_Abort(MPI_COMM_WORLD, 2);
	return p;
}

static void user_sum(void *in, void *inout, int *len, MPI_Datatype *t)
{
	for (int i = 0; i < *len; i++)
		((int *)inout)[i] += ((int *)in)[i];
}

static void check_allreduce(MPI_Comm comm, const char *cname, int s, int ti, int oi, int inplace)
{
	const struct type *t = &types[ti];
	size_t n = bytes_sizes[s] / t->size;
	char *send = xmalloc(n * t->size), *recv = xmalloc(n * t->size), name[160];
	int rank;

	MPI_Comm_rank(comm, &rank);
	fill(t, send, n, oi, rank);
	if (inplace) {
		memcpy(recv, send, n * t->size);
		MPI_Allreduce(MPI_IN_PLACE, recv, (int)n, t->t, ops[oi].op, comm);
	} else {
		memset(recv, 0x5a, n * t->size);
		MPI_Allreduce(send, recv, (int)n, t->t, ops[oi].op, comm);
	}
	snprintf(name, sizeof(name), "allreduce/%s/%zu/%s/%s%s", cname, bytes_sizes[s], t->name,
		 ops[oi].name, inplace ? "/inplace" : "");
	report(name, recv, n * t->size);
	free(send);
	free(recv);
}

static void check_reduce_scatter(MPI_Comm comm, const char *cname, int s, int ti, int oi,
				 int inplace)
{
	const struct type *t = &types[ti];
	int rank, size;
	size_t n, block;
	char *send, *recv, name[160];

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	block = bytes_sizes[s] / t->size / size;
	n = block * size;
	send = xmalloc(n * t->size);
	recv = xmalloc(n * t->size);
	fill(t, send, n, oi, rank);
	if (inplace) {
		memcpy(recv, send, n * t->size);
		MPI_Reduce_scatter_block(MPI_IN_PLACE, recv, (int)block, t->t, ops[oi].op, comm);
	} else {
		memset(recv, 0x5a, n * t->size);
		MPI_Reduce_scatter_block(send, recv, (int)block, t->t, ops[oi].op, comm);
	}
	snprintf(name, sizeof(name), "reduce_scatter_block/%s/%zu/%s/%s%s", cname,
		 bytes_sizes[s], t->name, ops[oi].name, inplace ? "/inplace" : "");
	/* only the first block is defined in place */
	report(name, recv, block * t->size);
	free(send);
	free(recv);
}

/* mixed: send as MPI_BYTE, receive as t (the same signature in bytes). */
static void check_allgather(MPI_Comm comm, const char *cname, int s, int ti, int mode)
{
	const struct type *t = &types[ti];
	int rank, size;
	size_t block, n;
	char *send, *recv, name[160];
	static const char *modes[] = { "", "/inplace", "/bytes" };

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	block = bytes_sizes[s] / t->size / size;
	n = block * size;
	send = xmalloc(block * t->size);
	recv = xmalloc(n * t->size);
	fill(t, send, block, 0, rank);
	memset(recv, 0x5a, n * t->size);
	if (mode == 1) {
		memcpy(recv + rank * block * t->size, send, block * t->size);
		MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)block, t->t, comm);
	} else if (mode == 2) {
		MPI_Allgather(send, (int)(block * t->size), MPI_BYTE, recv, (int)block, t->t, comm);
	} else {
		MPI_Allgather(send, (int)block, t->t, recv, (int)block, t->t, comm);
	}
	snprintf(name, sizeof(name), "allgather/%s/%zu/%s%s", cname, bytes_sizes[s], t->name,
		 modes[mode]);
	report(name, recv, n * t->size);
	free(send);
	free(recv);
}

static void check_bcast(MPI_Comm comm, const char *cname, int s, int ti, int root)
{
	const struct type *t = &types[ti];
	size_t n = bytes_sizes[s] / t->size;
	char *buf = xmalloc(n * t->size), name[160];
	int rank;

	MPI_Comm_rank(comm, &rank);
	fill(t, buf, n, 0, rank);
	MPI_Bcast(buf, (int)n, t->t, root, comm);
	snprintf(name, sizeof(name), "bcast/%s/%zu/%s/root%d", cname, bytes_sizes[s], t->name,
		 root);
	report(name, buf, n * t->size);
	free(buf);
}

/* What the shim must leave to PMPI: a user op and a derived type. */
static void check_ineligible(MPI_Comm comm, const char *cname)
{
	size_t n = bytes_sizes[NSIZES - 1] / sizeof(int);
	int *send = xmalloc(n * sizeof(int)), *recv = xmalloc(n * sizeof(int)), rank;
	MPI_Datatype pair;
	MPI_Op op;
	char name[160];

	MPI_Comm_rank(comm, &rank);
	fill(&types[2], send, n, 0, rank);
	MPI_Op_create(user_sum, 1, &op);
	MPI_Allreduce(send, recv, (int)n, MPI_INT, op, comm);
	snprintf(name, sizeof(name), "allreduce/%s/user-op", cname);
	report(name, recv, n * sizeof(int));
	MPI_Op_free(&op);
	MPI_Type_contiguous(2, MPI_INT, &pair);
	MPI_Type_commit(&pair);
	MPI_Bcast(send, (int)n / 2, pair, 0, comm);
	snprintf(name, sizeof(name), "bcast/%s/derived", cname);
	report(name, send, n * sizeof(int));
	MPI_Type_free(&pair);
	free(send);
	free(recv);
}

/*
 * The non-blocking forms, started in one order (as MPI requires) and
 * completed in a rank-dependent one: Waitall on even ranks, Test then Wait
 * one by one, last first, on odd ranks.
 */
static void check_nonblocking(MPI_Comm comm, const char *cname)
{
	size_t n = bytes_sizes[NSIZES - 1] / sizeof(int), block;
	int *send, *sum, *rs, *ag, *bc, rank, size, done = 0;
	MPI_Request req[5];
	MPI_Status st[5];
	char name[160];

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	block = n / size;
	send = xmalloc(n * sizeof(int));
	sum = xmalloc(n * sizeof(int));
	rs = xmalloc(block * sizeof(int));
	ag = xmalloc(n * sizeof(int));
	bc = xmalloc(n * sizeof(int));
	fill(&types[2], send, n, 0, rank);
	fill(&types[2], bc, n, 2, rank);
	MPI_Iallreduce(send, sum, (int)n, MPI_INT, MPI_SUM, comm, &req[0]);
	MPI_Ireduce_scatter_block(send, rs, (int)block, MPI_INT, MPI_MAX, comm, &req[1]);
	MPI_Iallgather(send, (int)block, MPI_INT, ag, (int)block, MPI_INT, comm, &req[2]);
	MPI_Ibcast(bc, (int)n, MPI_INT, size - 1, comm, &req[3]);
	MPI_Ibarrier(comm, &req[4]);
	if (rank % 2 == 0) {
		MPI_Waitall(5, req, st);
	} else {
		for (int i = 4; i >= 0; i--) {
			MPI_Test(&req[i], &done, MPI_STATUS_IGNORE);
			if (!done)
				MPI_Wait(&req[i], MPI_STATUS_IGNORE);
		}
	}
	snprintf(name, sizeof(name), "iallreduce/%s", cname);
	report(name, sum, n * sizeof(int));
	snprintf(name, sizeof(name), "ireduce_scatter_block/%s", cname);
	report(name, rs, block * sizeof(int));
	snprintf(name, sizeof(name), "iallgather/%s", cname);
	report(name, ag, block * size * sizeof(int));
	snprintf(name, sizeof(name), "ibcast/%s", cname);
	report(name, bc, n * sizeof(int));
	free(send);
	free(sum);
	free(rs);
	free(ag);
	free(bc);
}

/* Fractions summed in f32 and f64: within the tolerance of the exact sum? */
static void check_float_tolerance(MPI_Comm comm, const char *cname)
{
	size_t n = bytes_sizes[NSIZES - 1] / sizeof(double);
	float *f = xmalloc(n * sizeof(float));
	double *d = xmalloc(n * sizeof(double));
	int rank, size, bad[2] = { 0, 0 };

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	for (size_t i = 0; i < n; i++) {
		d[i] = 0.1 * (double)(i % 97) + 0.37 * rank + 1e-3 * (double)(i % 13);
		f[i] = (float)d[i];
	}
	MPI_Allreduce(MPI_IN_PLACE, f, (int)n, MPI_FLOAT, MPI_SUM, comm);
	MPI_Allreduce(MPI_IN_PLACE, d, (int)n, MPI_DOUBLE, MPI_SUM, comm);
	for (size_t i = 0; i < n; i++) {
		double exact = 0, fexact = 0;

		for (int r = 0; r < size; r++) {
			double v = 0.1 * (double)(i % 97) + 0.37 * r + 1e-3 * (double)(i % 13);

			exact += v;
			fexact += (float)v;
		}
		bad[0] |= fabs(f[i] - fexact) > 1e-5 * fabs(fexact);
		bad[1] |= fabs(d[i] - exact) > 1e-12 * fabs(exact);
	}
	MPI_Allreduce(MPI_IN_PLACE, bad, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (world_rank == 0)
		printf("tolerance/%s float %s double %s\n", cname, bad[0] ? "BAD" : "ok",
		       bad[1] ? "BAD" : "ok");
	free(f);
	free(d);
}

/* Is cname in $SHIM_CHECK_COMMS (unset: every communicator)? */
static int wanted(const char *cname)
{
	const char *list = getenv("SHIM_CHECK_COMMS"), *p;
	size_t len = strlen(cname);

	if (!list || !*list)
		return 1;
	for (p = list; (p = strstr(p, cname)); p += len)
		if ((p == list || p[-1] == ',') && (p[len] == ',' || p[len] == 0))
			return 1;
	return 0;
}

static void check_comm(MPI_Comm comm, const char *cname)
{
	int size, k = 0;

	if (!wanted(cname))
		return;
	MPI_Comm_size(comm, &size);
	for (int s = 0; s < NSIZES; s++)
		for (int ti = 0; ti < NTYPES; ti++)
			for (int oi = 0; oi < 4; oi++, k++) {
				/* the largest size: every type x op; otherwise rotate */
				if (s < NSIZES - 1 && k % 3)
					continue;
				check_allreduce(comm, cname, s, ti, oi, 0);
				check_allreduce(comm, cname, s, ti, oi, 1);
				if (k % 2 == 0)
					check_reduce_scatter(comm, cname, s, ti, oi, k % 4 == 0);
			}
	for (int s = 0; s < NSIZES; s++)
		for (int ti = 0; ti < NTYPES; ti += 3) {
			check_allgather(comm, cname, s, ti, (s + ti) % 3);
			check_bcast(comm, cname, s, ti, (s + ti) % size);
		}
	check_ineligible(comm, cname);
	check_nonblocking(comm, cname);
	check_float_tolerance(comm, cname);
	MPI_Barrier(comm);
}

/*
 * Buffers from MPI_Alloc_mem (kcoll_mem_alloc under the shim: zero copy for
 * kcolld): an all-reduce out of place and in place, a reduce-scatter, an
 * all-gather and a broadcast on them, then MPI_Free_mem.
 */
static void check_alloc_mem(MPI_Comm comm, const char *cname)
{
	size_t n = bytes_sizes[NSIZES - 1] / sizeof(int), block;
	int *send = NULL, *recv = NULL, rank, size;
	char name[160];

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	block = n / size;
	if (MPI_Alloc_mem((MPI_Aint)(n * sizeof(int)), MPI_INFO_NULL, &send) != MPI_SUCCESS ||
	    MPI_Alloc_mem((MPI_Aint)(n * sizeof(int)), MPI_INFO_NULL, &recv) != MPI_SUCCESS)
		MPI_Abort(MPI_COMM_WORLD, 2);
	fill(&types[2], send, n, 0, rank);
	MPI_Allreduce(send, recv, (int)n, MPI_INT, MPI_SUM, comm);
	snprintf(name, sizeof(name), "alloc_mem/allreduce/%s", cname);
	report(name, recv, n * sizeof(int));
	MPI_Allreduce(MPI_IN_PLACE, recv, (int)n, MPI_INT, MPI_MAX, comm);
	snprintf(name, sizeof(name), "alloc_mem/allreduce/%s/inplace", cname);
	report(name, recv, n * sizeof(int));
	MPI_Reduce_scatter_block(send, recv, (int)block, MPI_INT, MPI_MIN, comm);
	snprintf(name, sizeof(name), "alloc_mem/reduce_scatter_block/%s", cname);
	report(name, recv, block * sizeof(int));
	MPI_Allgather(send, (int)block, MPI_INT, recv, (int)block, MPI_INT, comm);
	snprintf(name, sizeof(name), "alloc_mem/allgather/%s", cname);
	report(name, recv, block * size * sizeof(int));
	MPI_Bcast(send, (int)n, MPI_INT, size - 1, comm);
	snprintf(name, sizeof(name), "alloc_mem/bcast/%s", cname);
	report(name, send, n * sizeof(int));
	MPI_Free_mem(recv);
	MPI_Free_mem(send);
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3;	/* ., .. and the DIR's own fd */
}

/* rank 0 runs $SHIM_CHECK_PROBE (a status query) with everyone waiting;
 * $SHIM_CHECK_WHEN tells it which point of the loop this is (live, after). */
static void probe(const char *when)
{
	const char *cmd = getenv("SHIM_CHECK_PROBE");

	MPI_Barrier(MPI_COMM_WORLD);
	if (world_rank == 0 && cmd && *cmd) {
		printf("probe %s: ", when);
		fflush(stdout);
		setenv("SHIM_CHECK_WHEN", when, 1);
		if (system(cmd) != 0)
			printf("probe failed\n");
		printf("\n");
		fflush(stdout);
	}
	MPI_Barrier(MPI_COMM_WORLD);
}

static void loop(int iters)
{
	size_t n = bytes_sizes[NSIZES - 1] / sizeof(float);
	float *buf = xmalloc(n * sizeof(float));
	int fds_first = 0, fds_last = 0, bad = 0;

	for (int it = 0; it < iters; it++) {
		MPI_Comm dup, split;

		MPI_Comm_dup(MPI_COMM_WORLD, &dup);
		MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, -world_rank, &split);
		fill(&types[0], buf, n, 0, world_rank);
		MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, dup);
		MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_MAX, split);
		if (it == 0)
			report("loop/first", buf, n * sizeof(float));
		if (it == iters - 1)
			probe("live");
		MPI_Comm_free(&split);
		MPI_Comm_free(&dup);
		if (it == 0)
			fds_first = count_fds();
	}
	fds_last = count_fds();
	report("loop/last", buf, n * sizeof(float));
	bad = fds_last != fds_first;
	MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (world_rank == 0)
		printf("fds %s (after the first iteration %d, after %d: %d on rank 0)\n",
		       bad ? "grew" : "steady", fds_first, iters, fds_last);
	probe("after");
	free(buf);
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* One call of collective c (0 allreduce, 1 reduce_scatter_block,
 * 2 allgather, 3 bcast), through MPI_ (pmpi 0) or PMPI_ (pmpi 1). */
static void overhead_call(int c, int pmpi, float *in, float *out)
{
	MPI_Comm s = MPI_COMM_SELF;

	switch (c * 2 + pmpi) {
	case 0: MPI_Allreduce(in, out, 2, MPI_FLOAT, MPI_SUM, s); break;
	case 1: PMPI_Allreduce(in, out, 2, MPI_FLOAT, MPI_SUM, s); break;
	case 2: MPI_Reduce_scatter_block(in, out, 2, MPI_FLOAT, MPI_SUM, s); break;
	case 3: PMPI_Reduce_scatter_block(in, out, 2, MPI_FLOAT, MPI_SUM, s); break;
	case 4: MPI_Allgather(in, 2, MPI_FLOAT, out, 2, MPI_FLOAT, s); break;
	case 5: PMPI_Allgather(in, 2, MPI_FLOAT, out, 2, MPI_FLOAT, s); break;
	case 6: MPI_Bcast(out, 2, MPI_FLOAT, 0, s); break;
	default: PMPI_Bcast(out, 2, MPI_FLOAT, 0, s); break;
	}
}

static void overhead(long n)
{
	static const char *const names[] = { "MPI_Allreduce", "MPI_Reduce_scatter_block",
					     "MPI_Allgather", "MPI_Bcast" };
	enum { BLOCKS = 21 };
	float in[2] = { 1, 2 }, out[2];
	double t[2][BLOCKS];

	if (n < 1000)
		n = 1000;
	for (int c = 0; c < 4; c++) {
		for (int b = 0; b < BLOCKS; b++) {
			for (int pmpi = 0; pmpi < 2; pmpi++) {
				int p = b % 2 ? !pmpi : pmpi;	/* alternate which goes first */
				double t0 = now_ns();

				for (long i = 0; i < n / BLOCKS; i++)
					overhead_call(c, p, in, out);
				t[p][b] = (now_ns() - t0) / (n / BLOCKS);
			}
		}
		qsort(t[0], BLOCKS, sizeof(double), cmp_double);
		qsort(t[1], BLOCKS, sizeof(double), cmp_double);
		printf("overhead %s 8 B, MPI_COMM_SELF: MPI_ %.1f ns, PMPI_ %.1f ns, "
		       "difference %.1f ns per call\n", names[c], t[0][BLOCKS / 2],
		       t[1][BLOCKS / 2], t[0][BLOCKS / 2] - t[1][BLOCKS / 2]);
	}
}

int main(int argc, char **argv)
{
	MPI_Comm dup, split, rev, created;
	MPI_Group world_group, tail_group;
	const char *mode = argc > 1 ? argv[1] : "check", *thread = getenv("SHIM_CHECK_THREAD");
	int first = 0, provided;

	if (thread && !strcmp(thread, "1"))
		MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
	else
		MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world_size);
	if (world_size > 64)
		MPI_Abort(MPI_COMM_WORLD, 2);
	if (!strcmp(mode, "overhead")) {
		if (world_rank == 0)
			overhead(argc > 2 ? atol(argv[2]) : 2100000);
		MPI_Finalize();
		return 0;
	}
	if (!strcmp(mode, "loop")) {
		loop(argc > 2 ? atoi(argv[2]) : 200);
		MPI_Finalize();
		return 0;
	}
	check_comm(MPI_COMM_WORLD, "world");
	check_alloc_mem(MPI_COMM_WORLD, "world");
	MPI_Comm_dup(MPI_COMM_WORLD, &dup);
	check_comm(dup, "dup");
	/* halves (size 1 for 2 or 3 ranks: stays on PMPI), and reversed order */
	MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &split);
	check_comm(split, "split");
	MPI_Comm_split(dup, 0, world_size - world_rank, &rev);
	check_comm(rev, "reversed");
	/* every rank but rank 0 (with one rank: all of it) */
	MPI_Comm_group(MPI_COMM_WORLD, &world_group);
	MPI_Group_excl(world_group, world_size > 1, &first, &tail_group);
	MPI_Comm_create(MPI_COMM_WORLD, tail_group, &created);
	if (created != MPI_COMM_NULL) {
		check_comm(created, "created");
		MPI_Comm_free(&created);
	} else {
		check_comm(MPI_COMM_SELF, "created");
	}
	MPI_Group_free(&tail_group);
	MPI_Group_free(&world_group);
	MPI_Comm_free(&rev);
	MPI_Comm_free(&split);
	MPI_Comm_free(&dup);
	MPI_Finalize();
	return 0;
}
