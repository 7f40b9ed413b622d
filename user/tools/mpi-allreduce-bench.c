/* SPDX-License-Identifier: MIT */
/*
 * mpi-coll-bench: the MPI anchor for kcoll-bench. Same options (where MPI has
 * the meaning), same nccl-tests style table, same --json schema, so the two
 * can be plotted and compared side by side:
 *
 *	mpirun -np 4 mpi-coll-bench allreduce -b 1K -e 64M -f 4 -d f32 -o sum
 *
 * Each iteration is one blocking MPI call; time = slowest rank's mean after a
 * barrier. Check values follow kcoll-bench's rules (small integers, exact in
 * every dtype). MPI has no f16/bf16 and no average, so those are refused.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#define BENCH_MAX_CHECK_RANKS	12

enum bench_coll { BENCH_ALLREDUCE, BENCH_REDUCESCATTER, BENCH_ALLGATHER, BENCH_BROADCAST };

static const char *const bench_coll_names[] = {
	[BENCH_ALLREDUCE] = "allreduce",
	[BENCH_REDUCESCATTER] = "reducescatter",
	[BENCH_ALLGATHER] = "allgather",
	[BENCH_BROADCAST] = "broadcast",
};

/* The kcoll names (kcoll_dtype_name / kcoll_redop_name) of what MPI has. */
static const struct bench_type {
	const char *name;
	MPI_Datatype mpi;
	size_t size;
	bool is_float, is_unsigned;
} bench_types[] = {
	{ "f32", MPI_FLOAT, 4, true, false },
	{ "f64", MPI_DOUBLE, 8, true, false },
	{ "i8", MPI_INT8_T, 1, false, false },
	{ "u8", MPI_UINT8_T, 1, false, true },
	{ "i32", MPI_INT32_T, 4, false, false },
	{ "u32", MPI_UINT32_T, 4, false, true },
	{ "i64", MPI_INT64_T, 8, false, false },
	{ "u64", MPI_UINT64_T, 8, false, true },
};

enum bench_op { BENCH_SUM, BENCH_PROD, BENCH_MIN, BENCH_MAX };

static const struct bench_redop {
	const char *name;
	MPI_Op mpi;
} bench_ops[] = {
	[BENCH_SUM] = { "sum", MPI_SUM },
	[BENCH_PROD] = { "prod", MPI_PROD },
	[BENCH_MIN] = { "min", MPI_MIN },
	[BENCH_MAX] = { "max", MPI_MAX },
};

struct bench_opts {
	enum bench_coll coll;
	int nranks, rank;
	size_t min_bytes, max_bytes;
	unsigned long factor;
	int iters, warmup;
	bool check;
	const struct bench_type *type;
	enum bench_op op;
	int root;
	bool inplace, json;
};

struct bench_row {
	size_t bytes, count;
	double time_us[2], algbw[2], busbw[2];
	long long wrong[2];	/* -1: not checked */
};

static const char *prog = "mpi-coll-bench";

static void usage(FILE *f)
{
	fprintf(f,
"usage: mpirun -np N %s allreduce|reducescatter|allgather|broadcast [options]\n"
"  -N, --nranks N        must equal mpirun's -np (accepted for kcoll-bench parity)\n"
"  -b, --minbytes SIZE   smallest size; K/M/G suffixes (x1024)   [8]\n"
"  -e, --maxbytes SIZE   largest size                            [64M]\n"
"  -f, --stepfactor F    multiply the size by F each step        [2]\n"
"  -n, --iters N         timed iterations per size               [20]\n"
"  -w, --warmup_iters N  untimed iterations per size             [5]\n"
"  -c, --check 0|1       verify every element of a checked run   [1]\n"
"  -d, --datatype T      f32 f64 i8 u8 i32 u32 i64 u64           [f32]\n"
"  -o, --op OP           sum prod min max                        [sum]\n"
"  -r, --root R          broadcast root                          [0]\n"
"      --inplace         also measure with MPI_IN_PLACE (extra columns)\n"
"      --json            print one JSON document instead of the table\n"
"  -h, --help            this text\n",
		prog);
}

/* Every rank parses the same argv, so every rank leaves the same way. */
static void __attribute__((noreturn, format(printf, 2, 3)))
usage_error(const struct bench_opts *o, const char *fmt, ...)
{
	va_list ap;

	if (o->rank == 0) {
		fprintf(stderr, "%s: ", prog);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fprintf(stderr, "\n");
		usage(stderr);
	}
	MPI_Finalize();
	exit(2);
}

static int parse_size(const char *s, size_t *out)
{
	unsigned long long v, mult = 1;
	char *end;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -EINVAL;
	switch (*end) {
	case 'G': case 'g': mult <<= 10; /* fall through */
	case 'M': case 'm': mult <<= 10; /* fall through */
	case 'K': case 'k': mult <<= 10; end++; break;
	case '\0': break;
	default: return -EINVAL;
	}
	if (!strcmp(end, "B") || (mult > 1 && !strcmp(end, "iB")))
		end += strlen(end);
	if (*end || v > SIZE_MAX / mult)
		return -EINVAL;
	*out = v * mult;
	return 0;
}

static long parse_long(const struct bench_opts *o, const char *s, const char *what, long lo,
		       long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		usage_error(o, "%s must be an integer in [%ld, %ld], not '%s'", what, lo, hi, s);
	return v;
}

static bool coll_has_redop(enum bench_coll c)
{
	return c == BENCH_ALLREDUCE || c == BENCH_REDUCESCATTER;
}

static double busbw_factor(enum bench_coll c, int n)
{
	switch (c) {
	case BENCH_ALLREDUCE: return 2.0 * (n - 1) / n;
	case BENCH_REDUCESCATTER:
	case BENCH_ALLGATHER: return (double)(n - 1) / n;
	default: return 1.0;
	}
}

/* As kcoll-bench: size = the larger buffer, rounded down to whole elements. */
static void coll_counts(const struct bench_opts *o, size_t bytes, size_t *param, size_t *send_n,
			size_t *recv_n)
{
	size_t elt = o->type->size, per;

	switch (o->coll) {
	case BENCH_REDUCESCATTER:
	case BENCH_ALLGATHER:
		per = bytes / elt / o->nranks;
		if (!per)
			per = 1;
		*param = per;
		*send_n = o->coll == BENCH_REDUCESCATTER ? per * o->nranks : per;
		*recv_n = o->coll == BENCH_REDUCESCATTER ? per : per * o->nranks;
		break;
	default:
		per = bytes / elt;
		*param = *send_n = *recv_n = per ? per : 1;
		break;
	}
}

/* ---- check values: the same rules as kcoll-bench ------------------------ */

static long in_val(const struct bench_opts *o, int r, size_t i)
{
	long s = o->type->is_unsigned ? 0 : 1;

	if (!coll_has_redop(o->coll))
		return (long)((r * 17 + i * 5) % 101) - 50 * s;
	if (o->op == BENCH_PROD) {
		if ((i + r) % 3 == 0)
			return 2;
		return s && (i + 2 * r) % 4 == 1 ? -1 : 1;
	}
	return (long)((i * 7 + r * 3) % 11) - 5 * s;
}

static long expect_reduced(const struct bench_opts *o, size_t i)
{
	long acc = in_val(o, 0, i);

	for (int r = 1; r < o->nranks; r++) {
		long v = in_val(o, r, i);

		switch (o->op) {
		case BENCH_SUM: acc += v; break;
		case BENCH_PROD: acc *= v; break;
		case BENCH_MIN: acc = v < acc ? v : acc; break;
		case BENCH_MAX: acc = v > acc ? v : acc; break;
		}
	}
	return acc;
}

static void put_elem(const struct bench_opts *o, void *buf, size_t i, long v)
{
	switch (o->type->size) {
	case 1: ((int8_t *)buf)[i] = (int8_t)v; break;
	case 4:
		if (o->type->is_float)
			((float *)buf)[i] = (float)v;
		else
			((int32_t *)buf)[i] = (int32_t)v;
		break;
	default:
		if (o->type->is_float)
			((double *)buf)[i] = (double)v;
		else
			((int64_t *)buf)[i] = v;
		break;
	}
}

static double get_elem(const struct bench_opts *o, const void *buf, size_t i)
{
	switch (o->type->size) {
	case 1:
		if (o->type->is_unsigned)
			return ((const uint8_t *)buf)[i];
		return ((const int8_t *)buf)[i];
	case 4:
		if (o->type->is_float)
			return ((const float *)buf)[i];
		if (o->type->is_unsigned)
			return ((const uint32_t *)buf)[i];
		return ((const int32_t *)buf)[i];
	default:
		if (o->type->is_float)
			return ((const double *)buf)[i];
		if (o->type->is_unsigned)
			return (double)((const uint64_t *)buf)[i];
		return (double)((const int64_t *)buf)[i];
	}
}

static void fill_input(const struct bench_opts *o, void *buf, size_t n)
{
	for (size_t i = 0; i < n; i++)
		put_elem(o, buf, i, in_val(o, o->rank, i));
}

#define BENCH_POISON 0xa5

/* MPI_IN_PLACE: all-gather input in this rank's slice of recv; reduce-scatter
 * input is the whole of recv and the result lands at its start. */
static void check_prepare(const struct bench_opts *o, void *send, void *recv, bool inplace,
			  size_t param, size_t send_n, size_t recv_n)
{
	size_t elt = o->type->size;

	memset(recv, BENCH_POISON, (send_n > recv_n ? send_n : recv_n) * elt);
	if (o->coll == BENCH_ALLGATHER)
		fill_input(o, inplace ? (char *)recv + (size_t)o->rank * param * elt : send, param);
	else if (o->coll == BENCH_BROADCAST && o->rank == o->root)
		fill_input(o, recv, param);
	else if (o->coll != BENCH_BROADCAST)
		fill_input(o, inplace ? recv : send, send_n);
}

static long long check_result(const struct bench_opts *o, const void *recv, size_t param,
			      size_t recv_n)
{
	long long wrong = 0;

	for (size_t i = 0; i < recv_n; i++) {
		long want;

		switch (o->coll) {
		case BENCH_ALLREDUCE: want = expect_reduced(o, i); break;
		case BENCH_REDUCESCATTER: want = expect_reduced(o, o->rank * param + i); break;
		case BENCH_ALLGATHER: want = in_val(o, (int)(i / param), i % param); break;
		default: want = in_val(o, o->root, i); break;
		}
		if (get_elem(o, recv, i) != (double)want)
			wrong++;
	}
	return wrong;
}

static void run_coll(const struct bench_opts *o, void *send, void *recv, bool inplace,
		     size_t param)
{
	const void *in = inplace ? MPI_IN_PLACE : send;
	MPI_Datatype t = o->type->mpi;

	switch (o->coll) {
	case BENCH_ALLREDUCE:
		MPI_Allreduce(in, recv, (int)param, t, bench_ops[o->op].mpi, MPI_COMM_WORLD);
		break;
	case BENCH_REDUCESCATTER:
		MPI_Reduce_scatter_block(in, recv, (int)param, t, bench_ops[o->op].mpi,
					 MPI_COMM_WORLD);
		break;
	case BENCH_ALLGATHER:
		MPI_Allgather(in, (int)param, t, recv, (int)param, t, MPI_COMM_WORLD);
		break;
	default:
		MPI_Bcast(recv, (int)param, t, o->root, MPI_COMM_WORLD);
		break;
	}
}

/* One column at one size on every rank; the row's figures land on rank 0. */
static void measure(const struct bench_opts *o, void *send, void *recv, bool inplace,
		    size_t param, size_t send_n, size_t recv_n, struct bench_row *row)
{
	long long wrong = -1, total = -1;
	double t0, mean, slowest = 0;

	if (o->check) {
		check_prepare(o, send, recv, inplace, param, send_n, recv_n);
		run_coll(o, send, recv, inplace, param);
		wrong = check_result(o, recv, param, recv_n);
		MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
	}
	for (int i = 0; i < o->warmup; i++)
		run_coll(o, send, recv, inplace, param);
	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (int i = 0; i < o->iters; i++)
		run_coll(o, send, recv, inplace, param);
	mean = (MPI_Wtime() - t0) * 1e6 / o->iters;
	MPI_Reduce(&mean, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
	row->time_us[inplace] = slowest;
	row->algbw[inplace] = slowest > 0 ? row->bytes / slowest / 1e3 : 0;
	row->busbw[inplace] = row->algbw[inplace] * busbw_factor(o->coll, o->nranks);
	row->wrong[inplace] = total;
}

/* ---- output: the same layout as kcoll-bench ------------------------------ */

static const char *redop_label(const struct bench_opts *o)
{
	return coll_has_redop(o->coll) ? bench_ops[o->op].name : "none";
}

static int root_label(const struct bench_opts *o)
{
	return o->coll == BENCH_BROADCAST ? o->root : -1;
}

static void print_header(const struct bench_opts *o, const char *lib, const char *host)
{
	int ncols = o->inplace ? 2 : 1;

	printf("# %s %s: nranks %d minBytes %zu maxBytes %zu step: %lu(factor) warmup iters: %d "
	       "iters: %d validation: %d mem: host\n",
	       prog, bench_coll_names[o->coll], o->nranks, o->min_bytes, o->max_bytes, o->factor,
	       o->warmup, o->iters, o->check);
	printf("# %s on %s\n#\n", lib, host);
	printf("#%11s  %12s  %8s  %6s  %6s", "", "", "", "", "");
	printf("           out-of-place           ");
	if (ncols == 2)
		printf("           in-place           ");
	printf("\n#%11s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
	for (int c = 0; c < ncols; c++)
		printf("  %7s  %6s  %6s %6s", "time", "algbw", "busbw", "#wrong");
	printf("\n#%11s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
	for (int c = 0; c < ncols; c++)
		printf("  %7s  %6s  %6s  %5s", "(us)", "(GB/s)", "(GB/s)", "");
	printf("\n");
}

static void print_row(const struct bench_opts *o, const struct bench_row *row)
{
	printf("%12zu  %12zu  %8s  %6s  %6d", row->bytes, row->count, o->type->name,
	       redop_label(o), root_label(o));
	for (int c = 0; c <= (int)o->inplace; c++) {
		char t[32], w[32];
		double us = row->time_us[c];

		snprintf(t, sizeof(t), us >= 10000 ? "%.0f" : us >= 100 ? "%.1f" : "%.2f", us);
		if (row->wrong[c] < 0)
			snprintf(w, sizeof(w), "N/A");
		else
			snprintf(w, sizeof(w), "%lld", row->wrong[c]);
		printf("  %7s  %6.2f  %6.2f  %5s", t, row->algbw[c], row->busbw[c], w);
	}
	printf("\n");
	fflush(stdout);
}

static void json_col(const struct bench_row *row, int c)
{
	printf("\"time_us\": %.3f, \"algbw\": %.4f, \"busbw\": %.4f, \"wrong\": ", row->time_us[c],
	       row->algbw[c], row->busbw[c]);
	if (row->wrong[c] < 0)
		printf("null");
	else
		printf("%lld", row->wrong[c]);
}

static void print_json(const struct bench_opts *o, const struct bench_row *rows, int nrows,
		       double avg, const char *lib, const char *host)
{
	char date[32];
	time_t t = time(NULL);

	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
	printf("{\n  \"tool\": \"%s\", \"system\": \"openmpi\", \"version\": \"%s\",\n", prog, lib);
	printf("  \"collective\": \"%s\", \"N\": %d, \"dtype\": \"%s\", \"op\": \"%s\", "
	       "\"root\": %d,\n", bench_coll_names[o->coll], o->nranks, o->type->name,
	       redop_label(o), root_label(o));
	printf("  \"mem\": \"host\", \"inplace\": %s, \"check\": %d, \"iters\": %d, \"warmup\": %d,\n",
	       o->inplace ? "true" : "false", o->check, o->iters, o->warmup);
	printf("  \"host\": \"%s\", \"date\": \"%s\", \"complete\": true,\n", host, date);
	printf("  \"rows\": [");
	for (int k = 0; k < nrows; k++) {
		const struct bench_row *row = &rows[k];

		printf("%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
		       "\"root\": %d, ", k ? "," : "", row->bytes, row->count, o->type->name,
		       redop_label(o), root_label(o));
		json_col(row, 0);
		if (o->inplace) {
			printf(", \"inplace\": {");
			json_col(row, 1);
			printf("}");
		}
		printf("}");
	}
	printf("\n  ],\n  \"avg_busbw\": %.4f\n}\n", avg);
}

/* ---- main --------------------------------------------------------------- */

static void parse_args(int argc, char **argv, struct bench_opts *o)
{
	enum { OPT_INPLACE = 256, OPT_JSON };
	static const struct option longopts[] = {
		{ "nranks", required_argument, NULL, 'N' },
		{ "minbytes", required_argument, NULL, 'b' },
		{ "maxbytes", required_argument, NULL, 'e' },
		{ "stepfactor", required_argument, NULL, 'f' },
		{ "iters", required_argument, NULL, 'n' },
		{ "warmup_iters", required_argument, NULL, 'w' },
		{ "check", required_argument, NULL, 'c' },
		{ "datatype", required_argument, NULL, 'd' },
		{ "op", required_argument, NULL, 'o' },
		{ "root", required_argument, NULL, 'r' },
		{ "inplace", no_argument, NULL, OPT_INPLACE },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	size_t i;
	int c;

	o->min_bytes = 8;
	o->max_bytes = 64 << 20;
	o->factor = 2;
	o->iters = 20;
	o->warmup = 5;
	o->check = true;
	o->type = &bench_types[0];
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":N:b:e:f:n:w:c:d:o:r:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'N':
			if (parse_long(o, optarg, "-N", 1, INT_MAX) != o->nranks)
				usage_error(o, "-N %s but mpirun started %d ranks", optarg,
					    o->nranks);
			break;
		case 'b':
			if (parse_size(optarg, &o->min_bytes) || !o->min_bytes)
				usage_error(o, "bad size for -b: '%s'", optarg);
			break;
		case 'e':
			if (parse_size(optarg, &o->max_bytes) || !o->max_bytes)
				usage_error(o, "bad size for -e: '%s'", optarg);
			break;
		case 'f': o->factor = parse_long(o, optarg, "-f", 1, 1 << 20); break;
		case 'n': o->iters = parse_long(o, optarg, "-n", 1, INT_MAX); break;
		case 'w': o->warmup = parse_long(o, optarg, "-w", 0, INT_MAX); break;
		case 'c': o->check = parse_long(o, optarg, "-c", 0, 1); break;
		case 'd':
			for (i = 0; i < sizeof(bench_types) / sizeof(bench_types[0]); i++)
				if (!strcmp(optarg, bench_types[i].name))
					break;
			if (i == sizeof(bench_types) / sizeof(bench_types[0]))
				usage_error(o, "datatype '%s' is not one MPI has", optarg);
			o->type = &bench_types[i];
			break;
		case 'o':
			for (i = 0; i < sizeof(bench_ops) / sizeof(bench_ops[0]); i++)
				if (!strcmp(optarg, bench_ops[i].name))
					break;
			if (i == sizeof(bench_ops) / sizeof(bench_ops[0]))
				usage_error(o, "reduction op '%s' is not one MPI has", optarg);
			o->op = i;
			break;
		case 'r': o->root = parse_long(o, optarg, "-r", 0, INT_MAX); break;
		case OPT_INPLACE: o->inplace = true; break;
		case OPT_JSON: o->json = true; break;
		case 'h':
			if (o->rank == 0)
				usage(stdout);
			MPI_Finalize();
			exit(0);
		case ':': usage_error(o, "option '%s' needs a value", argv[optind - 1]);
		default: usage_error(o, "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc - 1)
		usage_error(o, optind == argc ? "which collective?" : "one collective, please");
	for (c = 0; c <= BENCH_BROADCAST; c++)
		if (!strcmp(argv[optind], bench_coll_names[c]))
			break;
	if (c > BENCH_BROADCAST)
		usage_error(o, "unknown collective '%s'", argv[optind]);
	o->coll = c;
	if (o->min_bytes > o->max_bytes)
		usage_error(o, "-b %zu is larger than -e %zu", o->min_bytes, o->max_bytes);
	if (o->factor < 2 && o->min_bytes != o->max_bytes)
		usage_error(o, "-f must be at least 2 unless -b equals -e");
	if (o->coll == BENCH_BROADCAST && o->root >= o->nranks)
		usage_error(o, "root %d is not a rank of %d", o->root, o->nranks);
	if (o->check && o->nranks > BENCH_MAX_CHECK_RANKS)
		usage_error(o, "-c 1 supports at most %d ranks; use -c 0", BENCH_MAX_CHECK_RANKS);
	/* MPI counts are int */
	if (o->max_bytes / o->type->size > INT_MAX)
		usage_error(o, "-e %zu is more elements than MPI's int count allows", o->max_bytes);
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
	struct bench_opts o = { 0 };
	struct bench_row *rows;
	char lib[256], host[256] = "unknown";
	size_t param, send_n, recv_n, buf_bytes, bytes;
	double avg = 0;
	long long wrong = 0;
	void *send, *recv;
	int nrows = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_size(MPI_COMM_WORLD, &o.nranks);
	MPI_Comm_rank(MPI_COMM_WORLD, &o.rank);
	parse_args(argc, argv, &o);
	gethostname(host, sizeof(host) - 1);
	library_name(lib, sizeof(lib));

	for (size_t s = o.min_bytes; s <= o.max_bytes; s *= o.factor) {
		nrows++;
		if (o.factor < 2 || s > SIZE_MAX / o.factor)
			break;
	}
	rows = calloc(nrows, sizeof(*rows));
	coll_counts(&o, o.max_bytes, &param, &send_n, &recv_n);
	buf_bytes = (send_n > recv_n ? send_n : recv_n) * o.type->size;
	send = aligned_alloc(4096, (buf_bytes + 4095) & ~(size_t)4095);
	recv = aligned_alloc(4096, (buf_bytes + 4095) & ~(size_t)4095);
	if (!rows || !send || !recv) {
		fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes\n", prog, o.rank,
			buf_bytes);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	fill_input(&o, send, buf_bytes / o.type->size);
	fill_input(&o, recv, buf_bytes / o.type->size);
	if (o.rank == 0 && !o.json)
		print_header(&o, lib, host);

	bytes = o.min_bytes;
	for (int k = 0; k < nrows; k++, bytes *= o.factor) {
		coll_counts(&o, bytes, &param, &send_n, &recv_n);
		rows[k].bytes = (send_n > recv_n ? send_n : recv_n) * o.type->size;
		rows[k].count = param;
		for (int ip = 0; ip <= (int)o.inplace; ip++) {
			measure(&o, send, recv, ip, param, send_n, recv_n, &rows[k]);
			avg += rows[k].busbw[ip];
			wrong += rows[k].wrong[ip] > 0 ? rows[k].wrong[ip] : 0;
		}
		if (o.rank == 0 && !o.json)
			print_row(&o, &rows[k]);
	}
	avg /= nrows * (o.inplace ? 2 : 1);
	if (o.rank == 0) {
		if (o.json)
			print_json(&o, rows, nrows, avg, lib, host);
		else
			printf("# Avg bus bandwidth    : %g\n#\n", avg);
		if (wrong)
			fprintf(stderr, "%s: %lld wrong elements\n", prog, wrong);
	}
	free(send);
	free(recv);
	free(rows);
	MPI_Finalize();
	return wrong ? 1 : 0;
}
