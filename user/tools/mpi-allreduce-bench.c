/* SPDX-License-Identifier: MIT */
/*
 * mpi-coll-bench: the MPI anchor for kcoll-bench. Same options (where MPI has
 * the meaning), same nccl-tests style table, same --json schema, so the two
 * can be plotted and compared side by side:
 *
 *	mpirun -np 4 mpi-coll-bench allreduce -b 1K -e 64M -f 4 -d f32 -o sum
 *
 * Each iteration is one blocking MPI call; time = slowest rank's mean after a
 * barrier. Options, check values and output are bench_common's, shared with
 * kcoll-bench. MPI has no f16/bf16 and no average, so those are refused.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mpi.h>

#include "bench_common.h"

/* What MPI has of bench_common's dtypes and ops. */
static const struct mpi_type {
	enum bench_dtype dtype;
	MPI_Datatype mpi;
} mpi_types[] = {
	{ BENCH_F32, MPI_FLOAT },
	{ BENCH_F64, MPI_DOUBLE },
	{ BENCH_I8, MPI_INT8_T },
	{ BENCH_U8, MPI_UINT8_T },
	{ BENCH_I32, MPI_INT32_T },
	{ BENCH_U32, MPI_UINT32_T },
	{ BENCH_I64, MPI_INT64_T },
	{ BENCH_U64, MPI_UINT64_T },
};

static const struct mpi_op {
	enum bench_op op;
	MPI_Op mpi;
} mpi_ops[] = {
	{ BENCH_SUM, MPI_SUM },
	{ BENCH_PROD, MPI_PROD },
	{ BENCH_MIN, MPI_MIN },
	{ BENCH_MAX, MPI_MAX },
};

/* The shared options and what MPI makes of them. */
struct mpi_opts {
	struct bench_opts b;
	int rank;
	MPI_Datatype type;
	MPI_Op op;
};

static const struct mpi_type *mpi_type_of(enum bench_dtype dtype)
{
	for (size_t i = 0; i < sizeof(mpi_types) / sizeof(mpi_types[0]); i++)
		if (mpi_types[i].dtype == dtype)
			return &mpi_types[i];
	return NULL;
}

static const struct mpi_op *mpi_op_of(enum bench_op op)
{
	for (size_t i = 0; i < sizeof(mpi_ops) / sizeof(mpi_ops[0]); i++)
		if (mpi_ops[i].op == op)
			return &mpi_ops[i];
	return NULL;
}

static void usage(FILE *f);
static void parse_opt(const struct bench_prog *p, void *ctx, struct bench_opts *o, int c,
		      const char *arg);

/* --alloc-mem: buffers from MPI_Alloc_mem instead of aligned_alloc */
static bool use_alloc_mem;
/* --huge-pages: aligned_alloc buffers advised MADV_HUGEPAGE before first touch
 * (an anchor for libkcoll's KCOLL_THP_MIN_BYTES: MPI alone on huge pages) */
static bool use_huge_pages;

static void *buffer_alloc(size_t bytes)
{
	const uintptr_t huge = 2u << 20;
	void *p = NULL;

	if (!use_alloc_mem) {
		p = aligned_alloc(4096, bytes);
		if (p && use_huge_pages) {
			uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
			uintptr_t hi = ((uintptr_t)p + bytes) & ~(huge - 1);

			if (hi > lo && madvise((void *)lo, hi - lo, MADV_HUGEPAGE))
				fprintf(stderr, "mpi-coll-bench: MADV_HUGEPAGE: %s\n", strerror(errno));
		}
		return p;
	}
	if (MPI_Alloc_mem((MPI_Aint)bytes, MPI_INFO_NULL, &p) != MPI_SUCCESS)
		return NULL;
	return p;
}

static void buffer_free(void *p)
{
	if (!p)
		return;
	if (use_alloc_mem)
		MPI_Free_mem(p);
	else
		free(p);
}

/* Every rank parses the same argv, so every rank leaves the same way. */
static void finish(void)
{
	MPI_Finalize();
}

enum { OPT_ALLOC_MEM = BENCH_OPT_PROG, OPT_HUGE_PAGES };

static const struct option longopts[] = {
	BENCH_LONGOPTS,
	{ "alloc-mem", no_argument, NULL, OPT_ALLOC_MEM },
	{ "huge-pages", no_argument, NULL, OPT_HUGE_PAGES },
	{ 0 }
};


/* quiet on every rank but 0: set in main */
static struct bench_prog prog = {
	.name = "mpi-coll-bench",
	.usage = usage,
	.finish = finish,
	.shortopts = BENCH_SHORTOPTS,
	.longopts = longopts,
	.parse_opt = parse_opt,
};

static void usage(FILE *f)
{
	fprintf(f,
"usage: mpirun -np N %s allreduce|reducescatter|allgather|broadcast [options]\n"
"  -N, --nranks N        must equal mpirun's -np (accepted for kcoll-bench parity)\n"
BENCH_USAGE_SWEEP
"  -d, --datatype T      f32 f64 i8 u8 i32 u32 i64 u64           [f32]\n"
"  -o, --op OP           sum prod min max                        [sum]\n"
"  -r, --root R          broadcast root                          [0]\n"
"      --inplace         also measure with MPI_IN_PLACE (extra columns)\n"
"      --json            print one JSON document instead of the table\n"
"      --alloc-mem       buffers from MPI_Alloc_mem (default: aligned_alloc)\n"
"      --huge-pages      aligned_alloc buffers advised MADV_HUGEPAGE before first use\n"
"  -h, --help            this text\n",
		prog.name);
}

/* -N, -d, -o and -r: what MPI can do. */
static void parse_opt(const struct bench_prog *p, void *ctx, struct bench_opts *o, int c,
		      const char *arg)
{
	switch (c) {
	case 'N':
		if (bench_parse_long(p, arg, "-N", 1, INT_MAX) != o->nranks)
			bench_usage_error(p, "-N %s but mpirun started %d ranks", arg, o->nranks);
		break;
	case 'd':
		if (bench_dtype_parse(arg, &o->dtype) || !mpi_type_of(o->dtype))
			bench_usage_error(p, "datatype '%s' is not one MPI has", arg);
		break;
	case 'o':
		if (bench_op_parse(arg, &o->op) || !mpi_op_of(o->op))
			bench_usage_error(p, "reduction op '%s' is not one MPI has", arg);
		break;
	case 'r': o->root = bench_parse_long(p, arg, "-r", 0, INT_MAX); break;
	case OPT_ALLOC_MEM: use_alloc_mem = true; break;
	case OPT_HUGE_PAGES: use_huge_pages = true; break;
	}
}

static void parse_args(int argc, char **argv, struct mpi_opts *m)
{
	struct bench_opts *o = &m->b;

	bench_opts_init(o, o->nranks);
	bench_parse_args(&prog, argc, argv, o, m);
	if (o->check && o->nranks > BENCH_MAX_CHECK_RANKS)
		bench_usage_error(&prog, "-c 1 supports at most %d ranks; use -c 0",
				  BENCH_MAX_CHECK_RANKS);
	/* MPI counts are int */
	if (o->max_bytes / bench_dtype_size(o->dtype) > INT_MAX)
		bench_usage_error(&prog, "-e %zu is more elements than MPI's int count allows",
				  o->max_bytes);
	m->type = mpi_type_of(o->dtype)->mpi;
	m->op = mpi_op_of(o->op)->mpi;
}

static void run_coll(const struct mpi_opts *m, void *send, void *recv, bool inplace,
		     size_t param)
{
	const void *in = inplace ? MPI_IN_PLACE : send;
	MPI_Datatype t = m->type;

	switch (m->b.coll) {
	case BENCH_ALLREDUCE:
		MPI_Allreduce(in, recv, (int)param, t, m->op, MPI_COMM_WORLD);
		break;
	case BENCH_REDUCESCATTER:
		MPI_Reduce_scatter_block(in, recv, (int)param, t, m->op, MPI_COMM_WORLD);
		break;
	case BENCH_ALLGATHER:
		MPI_Allgather(in, (int)param, t, recv, (int)param, t, MPI_COMM_WORLD);
		break;
	default:
		MPI_Bcast(recv, (int)param, t, m->b.root, MPI_COMM_WORLD);
		break;
	}
}

/*
 * One column at one size on every rank; the row's figures land on rank 0.
 * MPI_IN_PLACE: all-gather input in this rank's slice of recv; reduce-scatter
 * input is the whole of recv and the result lands at its start.
 */
static void measure(const struct mpi_opts *m, void *send, void *recv, bool inplace,
		    const struct bench_counts *n, struct bench_row *row)
{
	const struct bench_opts *o = &m->b;
	long long wrong = -1, total = -1;
	double t0, mean, slowest = 0;

	if (o->check) {
		bench_check_prepare(o, m->rank, send, recv, inplace, n);
		run_coll(m, send, recv, inplace, n->param);
		wrong = bench_check_result(o, m->rank, recv, n);
		MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
	}
	for (int i = 0; i < o->warmup; i++)
		run_coll(m, send, recv, inplace, n->param);
	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (int i = 0; i < o->iters; i++)
		run_coll(m, send, recv, inplace, n->param);
	mean = (MPI_Wtime() - t0) * 1e6 / o->iters;
	MPI_Reduce(&mean, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
	bench_row_set(o, row, inplace, slowest, total);
}

/* The first line of MPI_Get_library_version, safe inside a JSON string. */
static void library_name(char *out, size_t outlen)
{
	char v[MPI_MAX_LIBRARY_VERSION_STRING];
	size_t j = 0;
	int len;

	MPI_Get_library_version(v, &len);
	for (int i = 0; i < len && v[i] && v[i] != '\n' && j + 1 < outlen; i++)
		if (v[i] != '"' && v[i] != '\\' && (unsigned char)v[i] >= 0x20)
			out[j++] = v[i];
	out[j] = '\0';
}

int main(int argc, char **argv)
{
	struct mpi_opts m = { 0 };
	const struct bench_opts *o = &m.b;
	struct bench_env env = { .tool = prog.name, .system = "openmpi", .mem = "host" };
	struct bench_counts n;
	struct bench_row *rows;
	char lib[256], host[256] = "unknown", about[600];
	size_t elt, bytes;
	long long wrong;
	void *send, *recv;
	int nrows;

	MPI_Init(&argc, &argv);
	MPI_Comm_size(MPI_COMM_WORLD, &m.b.nranks);
	MPI_Comm_rank(MPI_COMM_WORLD, &m.rank);
	prog.quiet = m.rank != 0;
	parse_args(argc, argv, &m);
	gethostname(host, sizeof(host) - 1);
	library_name(lib, sizeof(lib));
	env.version = lib;
	env.host = host;

	nrows = bench_count_rows(o);
	rows = calloc(nrows, sizeof(*rows));
	elt = bench_dtype_size(o->dtype);
	bench_counts(o, o->max_bytes, &n);
	send = buffer_alloc((n.bytes + 4095) & ~(size_t)4095);
	recv = buffer_alloc((n.bytes + 4095) & ~(size_t)4095);
	if (!rows || !send || !recv) {
		fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes\n", prog.name, m.rank,
			n.bytes);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	bench_fill_input(o, send, m.rank, n.bytes / elt);
	bench_fill_input(o, recv, m.rank, n.bytes / elt);
	if (m.rank == 0 && !o->json) {
		snprintf(about, sizeof(about), "%s on %s%s", lib, host,
			 use_alloc_mem ? ", buffers from MPI_Alloc_mem" :
			 use_huge_pages ? ", buffers on huge pages (MADV_HUGEPAGE)" : "");
		bench_print_header(o, &env, about);
	}

	bytes = o->min_bytes;
	for (int k = 0; k < nrows; k++, bytes *= o->factor) {
		bench_counts(o, bytes, &n);
		rows[k].bytes = n.bytes;
		rows[k].count = n.param;
		for (int ip = 0; ip <= (int)o->inplace; ip++)
			measure(&m, send, recv, ip, &n, &rows[k]);
		if (m.rank == 0 && !o->json)
			bench_print_row(o, &rows[k]);
	}
	wrong = bench_wrong_total(o, rows, nrows);
	if (m.rank == 0) {
		if (o->json)
			bench_print_json(o, &env, rows, nrows, true);
		else
			bench_print_footer(o, rows, nrows);
		if (wrong)
			fprintf(stderr, "%s: %lld wrong elements\n", prog.name, wrong);
	}
	buffer_free(send);
	buffer_free(recv);
	free(rows);
	MPI_Finalize();
	return wrong ? 1 : 0;
}
