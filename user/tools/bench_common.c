/* SPDX-License-Identifier: MIT */
/* The command line, sweep, check values and output every collective benchmark shares. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"

/* A byte pattern no check value decodes to (f32/f16/bf16: non-integers). */
#define BENCH_POISON 0xa5

static const char *const coll_names[] = {
	[BENCH_ALLREDUCE] = "allreduce",
	[BENCH_REDUCESCATTER] = "reducescatter",
	[BENCH_ALLGATHER] = "allgather",
	[BENCH_BROADCAST] = "broadcast",
	[BENCH_MEMCPY] = "memcpy",
};

static const struct {
	const char *name;
	size_t size;
} dtypes[] = {
	[BENCH_F32] = { "f32", 4 }, [BENCH_F64] = { "f64", 8 }, [BENCH_F16] = { "f16", 2 },
	[BENCH_BF16] = { "bf16", 2 }, [BENCH_I8] = { "i8", 1 }, [BENCH_U8] = { "u8", 1 },
	[BENCH_I32] = { "i32", 4 }, [BENCH_U32] = { "u32", 4 }, [BENCH_I64] = { "i64", 8 },
	[BENCH_U64] = { "u64", 8 },
};

static const char *const op_names[] = {
	[BENCH_SUM] = "sum", [BENCH_PROD] = "prod", [BENCH_MIN] = "min",
	[BENCH_MAX] = "max", [BENCH_AVG] = "avg",
};

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

const char *bench_coll_name(enum bench_coll c)
{
	return (size_t)c < ARRAY_LEN(coll_names) ? coll_names[c] : "?";
}

const char *bench_dtype_name(enum bench_dtype t)
{
	return (size_t)t < ARRAY_LEN(dtypes) ? dtypes[t].name : "?";
}

size_t bench_dtype_size(enum bench_dtype t)
{
	return (size_t)t < ARRAY_LEN(dtypes) ? dtypes[t].size : 0;
}

const char *bench_op_name(enum bench_op op)
{
	return (size_t)op < ARRAY_LEN(op_names) ? op_names[op] : "?";
}

int bench_dtype_parse(const char *s, enum bench_dtype *out)
{
	for (size_t i = 0; i < ARRAY_LEN(dtypes); i++) {
		if (!strcmp(s, dtypes[i].name)) {
			*out = (enum bench_dtype)i;
			return 0;
		}
	}
	return -EINVAL;
}

int bench_op_parse(const char *s, enum bench_op *out)
{
	for (size_t i = 0; i < ARRAY_LEN(op_names); i++) {
		if (!strcmp(s, op_names[i])) {
			*out = (enum bench_op)i;
			return 0;
		}
	}
	return -EINVAL;
}

bool bench_coll_has_redop(enum bench_coll c)
{
	return c == BENCH_ALLREDUCE || c == BENCH_REDUCESCATTER;
}

/* ---- command line --------------------------------------------------------- */

static void __attribute__((noreturn)) leave(const struct bench_prog *p, int status)
{
	if (p->finish)
		p->finish();
	exit(status);
}

void bench_usage_error(const struct bench_prog *p, const char *fmt, ...)
{
	va_list ap;

	if (!p->quiet) {
		fprintf(stderr, "%s: ", p->name);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fprintf(stderr, "\n");
		p->usage(stderr);
	}
	leave(p, 2);
}

long bench_parse_long(const struct bench_prog *p, const char *s, const char *what, long lo,
		      long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		bench_usage_error(p, "%s must be an integer in [%ld, %ld], not '%s'", what, lo, hi, s);
	return v;
}

int bench_parse_size(const char *s, size_t *out)
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

void bench_opts_init(struct bench_opts *o, int nranks)
{
	*o = (struct bench_opts){ .nranks = nranks, .min_bytes = 8, .max_bytes = 64 << 20,
				  .factor = 2, .iters = 20, .warmup = 5, .check = true,
				  .dtype = BENCH_F32, .op = BENCH_SUM };
}

void bench_parse_args(const struct bench_prog *p, int argc, char **argv, struct bench_opts *o,
		      void *ctx)
{
	enum bench_coll last = p->with_memcpy ? BENCH_MEMCPY : BENCH_BROADCAST;
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, p->shortopts, p->longopts, NULL)) != -1) {
		switch (c) {
		case 'b':
			if (bench_parse_size(optarg, &o->min_bytes) || !o->min_bytes)
				bench_usage_error(p, "bad size for -b: '%s'", optarg);
			break;
		case 'e':
			if (bench_parse_size(optarg, &o->max_bytes) || !o->max_bytes)
				bench_usage_error(p, "bad size for -e: '%s'", optarg);
			break;
		case 'f': o->factor = bench_parse_long(p, optarg, "-f", 1, 1 << 20); break;
		case 'n': o->iters = bench_parse_long(p, optarg, "-n", 1, INT_MAX); break;
		case 'w': o->warmup = bench_parse_long(p, optarg, "-w", 0, INT_MAX); break;
		case 'c': o->check = bench_parse_long(p, optarg, "-c", 0, 1); break;
		case BENCH_OPT_INPLACE: o->inplace = true; break;
		case BENCH_OPT_JSON: o->json = true; break;
		case 'h':
			if (!p->quiet)
				p->usage(stdout);
			leave(p, 0);
		case ':': bench_usage_error(p, "option '%s' needs a value", argv[optind - 1]);
		case '?': bench_usage_error(p, "unknown option '%s'", argv[optind - 1]);
		default: p->parse_opt(p, ctx, o, c, optarg); break;
		}
	}
	if (optind != argc - 1)
		bench_usage_error(p, optind == argc ? "which collective?" : "one collective, please");
	for (c = 0; c <= (int)last; c++)
		if (!strcmp(argv[optind], coll_names[c]))
			break;
	if (c > (int)last)
		bench_usage_error(p, "unknown collective '%s'", argv[optind]);
	o->coll = c;
	if (o->coll == BENCH_MEMCPY) {
		o->nranks = 1;
		o->check = false;
		o->inplace = false;
	}
	if (o->min_bytes > o->max_bytes)
		bench_usage_error(p, "-b %zu is larger than -e %zu", o->min_bytes, o->max_bytes);
	if (o->factor < 2 && o->min_bytes != o->max_bytes)
		bench_usage_error(p, "-f must be at least 2 unless -b equals -e");
	if (o->coll == BENCH_BROADCAST && o->root >= o->nranks)
		bench_usage_error(p, "root %d is not a rank of %d", o->root, o->nranks);
}

/* ---- sizes and counts ------------------------------------------------------ */

void bench_counts(const struct bench_opts *o, size_t bytes, struct bench_counts *n)
{
	size_t elt = bench_dtype_size(o->dtype), per;

	switch (o->coll) {
	case BENCH_REDUCESCATTER:
	case BENCH_ALLGATHER:
		per = bytes / elt / o->nranks;
		if (!per)
			per = 1;
		n->param = per;
		n->send_n = o->coll == BENCH_REDUCESCATTER ? per * o->nranks : per;
		n->recv_n = o->coll == BENCH_REDUCESCATTER ? per : per * o->nranks;
		break;
	default:
		per = bytes / elt;
		n->param = n->send_n = n->recv_n = per ? per : 1;
		break;
	}
	n->bytes = (n->send_n > n->recv_n ? n->send_n : n->recv_n) * elt;
}

int bench_count_rows(const struct bench_opts *o)
{
	int n = 0;

	for (size_t s = o->min_bytes; s <= o->max_bytes; s *= o->factor) {
		n++;
		if (o->factor < 2 || s > SIZE_MAX / o->factor)
			break;
	}
	return n;
}

/* ---- check values ---------------------------------------------------------- */

static bool dtype_unsigned(enum bench_dtype t)
{
	return t == BENCH_U8 || t == BENCH_U32 || t == BENCH_U64;
}

/*
 * Input of rank r at element i. Ranges (n <= 12 ranks): sum/min/max in
 * [-5, 5] (unsigned [0, 10]), so |sum| <= 120; prod: +-1 or 2 with at most
 * four 2s among 12 ranks; avg: base + d(r) where the d(r) sum to zero, so the
 * average is exactly the integer base; data movement: [-50, 50] / [0, 100].
 */
static long in_val(const struct bench_opts *o, int r, size_t i)
{
	long s = dtype_unsigned(o->dtype) ? 0 : 1;
	long n = o->nranks, d;

	if (!bench_coll_has_redop(o->coll))
		return (long)((r * 17 + i * 5) % 101) - 50 * s;
	switch (o->op) {
	case BENCH_PROD:
		if ((i + r) % 3 == 0)
			return 2;
		return s && (i + 2 * r) % 4 == 1 ? -1 : 1;
	case BENCH_AVG:
		d = r < n - 1 ? r : -(n - 1) * (n - 2) / 2;
		/* unsigned: lift the base so the most negative d(r) stays >= 0 */
		return (long)(i % 7) + (s ? -3 : (n - 1) * (n - 2) / 2) + d;
	default:
		return (long)((i * 7 + r * 3) % 11) - 5 * s;
	}
}

static long expect_reduced(const struct bench_opts *o, size_t i)
{
	long acc = in_val(o, 0, i);

	for (int r = 1; r < o->nranks; r++) {
		long v = in_val(o, r, i);

		switch (o->op) {
		case BENCH_SUM:
		case BENCH_AVG: acc += v; break;
		case BENCH_PROD: acc *= v; break;
		case BENCH_MIN: acc = v < acc ? v : acc; break;
		case BENCH_MAX: acc = v > acc ? v : acc; break;
		}
	}
	return o->op == BENCH_AVG ? acc / o->nranks : acc;
}

static void put_elem(const struct bench_opts *o, void *buf, size_t i, long v)
{
	switch (o->dtype) {
	case BENCH_F32: ((float *)buf)[i] = (float)v; break;
	case BENCH_F64: ((double *)buf)[i] = (double)v; break;
	case BENCH_F16: ((uint16_t *)buf)[i] = o->half->f32_to_f16((float)v); break;
	case BENCH_BF16: ((uint16_t *)buf)[i] = o->half->f32_to_bf16((float)v); break;
	case BENCH_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
	case BENCH_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
	case BENCH_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
	case BENCH_U32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
	case BENCH_I64: ((int64_t *)buf)[i] = v; break;
	case BENCH_U64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
	}
}

/* Exact for every value put_elem can store; NaN never equals anything. */
static double get_elem(const struct bench_opts *o, const void *buf, size_t i)
{
	switch (o->dtype) {
	case BENCH_F32: return ((const float *)buf)[i];
	case BENCH_F64: return ((const double *)buf)[i];
	case BENCH_F16: return o->half->f16_to_f32(((const uint16_t *)buf)[i]);
	case BENCH_BF16: return o->half->bf16_to_f32(((const uint16_t *)buf)[i]);
	case BENCH_I8: return ((const int8_t *)buf)[i];
	case BENCH_U8: return ((const uint8_t *)buf)[i];
	case BENCH_I32: return ((const int32_t *)buf)[i];
	case BENCH_U32: return ((const uint32_t *)buf)[i];
	case BENCH_I64: return (double)((const int64_t *)buf)[i];
	case BENCH_U64: return (double)((const uint64_t *)buf)[i];
	}
	return 0;
}

void bench_fill_input(const struct bench_opts *o, void *buf, int r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		put_elem(o, buf, i, in_val(o, r, i));
}

void *bench_rank_slice(const struct bench_opts *o, void *buf, int r, size_t param)
{
	return (char *)buf + (size_t)r * param * bench_dtype_size(o->dtype);
}

void bench_check_prepare(const struct bench_opts *o, int r, void *send, void *recv, bool inplace,
			 const struct bench_counts *n)
{
	memset(recv, BENCH_POISON, n->bytes);
	switch (o->coll) {
	case BENCH_ALLGATHER:
		bench_fill_input(o, inplace ? bench_rank_slice(o, recv, r, n->param) : send, r,
				 n->param);
		break;
	case BENCH_BROADCAST:
		if (r == o->root)
			bench_fill_input(o, recv, r, n->param);
		break;
	default:
		bench_fill_input(o, inplace ? recv : send, r, n->send_n);
		break;
	}
}

long long bench_check_result(const struct bench_opts *o, int r, const void *out,
			     const struct bench_counts *n)
{
	long long wrong = 0;

	for (size_t i = 0; i < n->recv_n; i++) {
		long want;

		switch (o->coll) {
		case BENCH_ALLREDUCE: want = expect_reduced(o, i); break;
		case BENCH_REDUCESCATTER: want = expect_reduced(o, r * n->param + i); break;
		case BENCH_ALLGATHER: want = in_val(o, (int)(i / n->param), i % n->param); break;
		default: want = in_val(o, o->root, i); break;
		}
		if (get_elem(o, out, i) != (double)want)
			wrong++;
	}
	return wrong;
}

/* ---- results ----------------------------------------------------------------- */

static double busbw_factor(enum bench_coll c, int n)
{
	switch (c) {
	case BENCH_ALLREDUCE: return 2.0 * (n - 1) / n;
	case BENCH_REDUCESCATTER:
	case BENCH_ALLGATHER: return (double)(n - 1) / n;
	default: return 1.0;
	}
}

void bench_row_set(const struct bench_opts *o, struct bench_row *row, int col, double time_us,
		   long long wrong)
{
	row->time_us[col] = time_us;
	row->algbw[col] = time_us > 0 ? row->bytes / time_us / 1e3 : 0;
	row->busbw[col] = row->algbw[col] * busbw_factor(o->coll, o->nranks);
	row->wrong[col] = wrong;
}

long long bench_wrong_total(const struct bench_opts *o, const struct bench_row *rows, int nrows)
{
	long long wrong = 0;

	for (int k = 0; k < nrows; k++)
		for (int c = 0; c <= (int)o->inplace; c++)
			wrong += rows[k].wrong[c] > 0 ? rows[k].wrong[c] : 0;
	return wrong;
}

static double avg_busbw(const struct bench_opts *o, const struct bench_row *rows, int nrows)
{
	double sum = 0;
	int n = 0;

	for (int k = 0; k < nrows; k++)
		for (int c = 0; c <= (int)o->inplace; c++, n++)
			sum += rows[k].busbw[c];
	return n ? sum / n : 0;
}

static const char *redop_label(const struct bench_opts *o)
{
	return bench_coll_has_redop(o->coll) ? bench_op_name(o->op) : "none";
}

static int root_label(const struct bench_opts *o)
{
	return o->coll == BENCH_BROADCAST ? o->root : -1;
}

void bench_print_header(const struct bench_opts *o, const struct bench_env *env,
			const char *about)
{
	int ncols = o->inplace ? 2 : 1;

	printf("# %s %s: nranks %d minBytes %zu maxBytes %zu step: %lu(factor) warmup iters: %d "
	       "iters: %d validation: %d mem: %s\n",
	       env->tool, bench_coll_name(o->coll), o->nranks, o->min_bytes, o->max_bytes,
	       o->factor, o->warmup, o->iters, o->check, env->mem);
	printf("# %s\n#\n", about);
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

void bench_print_row(const struct bench_opts *o, const struct bench_row *row)
{
	printf("%12zu  %12zu  %8s  %6s  %6d", row->bytes, row->count, bench_dtype_name(o->dtype),
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

void bench_print_footer(const struct bench_opts *o, const struct bench_row *rows, int nrows)
{
	printf("# Avg bus bandwidth    : %g\n#\n", avg_busbw(o, rows, nrows));
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

/* A JSON string, or null for NULL. */
static void json_str(const char *s)
{
	if (!s) {
		printf("null");
		return;
	}
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

static void json_topology(const struct bench_opts *o, const struct bench_env *env)
{
	if (env->hosts <= 0)
		return;
	printf("  \"hosts\": %d, \"ranks_per_host\": ", env->hosts);
	if (env->ranks_per_host > 0)
		printf("%d", env->ranks_per_host);
	else
		printf("null");
	printf(", \"rank_hosts\": [");
	for (int r = 0; r < o->nranks; r++) {
		printf("%s", r ? ", " : "");
		json_str(env->rank_hosts ? env->rank_hosts[r] : NULL);
	}
	printf("],\n");
}

void bench_print_json(const struct bench_opts *o, const struct bench_env *env,
		      const struct bench_row *rows, int nrows, bool complete)
{
	char date[32];
	time_t t = time(NULL);

	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
	printf("{\n  \"tool\": \"%s\", \"system\": \"%s\", \"version\": \"%s\",\n", env->tool,
	       env->system, env->version);
	printf("  \"collective\": \"%s\", \"N\": %d, \"dtype\": \"%s\", \"op\": \"%s\", "
	       "\"root\": %d,\n", bench_coll_name(o->coll), o->nranks, bench_dtype_name(o->dtype),
	       redop_label(o), root_label(o));
	printf("  \"mem\": \"%s\", \"inplace\": %s, \"check\": %d, \"iters\": %d, \"warmup\": %d,\n",
	       env->mem, o->inplace ? "true" : "false", o->check, o->iters, o->warmup);
	printf("  \"host\": \"%s\", \"date\": \"%s\", \"complete\": %s,\n", env->host, date,
	       complete ? "true" : "false");
	json_topology(o, env);
	printf("  \"rows\": [");
	for (int k = 0; k < nrows; k++) {
		const struct bench_row *row = &rows[k];

		printf("%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
		       "\"root\": %d, ", k ? "," : "", row->bytes, row->count,
		       bench_dtype_name(o->dtype), redop_label(o), root_label(o));
		json_col(row, 0);
		if (o->inplace) {
			printf(", \"inplace\": {");
			json_col(row, 1);
			printf("}");
		}
		printf("}");
	}
	printf("\n  ],\n  \"avg_busbw\": %.4f\n}\n", avg_busbw(o, rows, nrows));
}
