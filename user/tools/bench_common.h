/* SPDX-License-Identifier: MIT */
/*
 * What every collective benchmark shares (kcoll-bench, the MPI and Gloo
 * anchors): the command line, the sweep of sizes and element counts, the check
 * values, and the nccl-tests style table and JSON document, so that the
 * programs cannot drift apart. Plain C, no kcoll or MPI includes; each program
 * keeps only its own calls.
 *
 * Check values are small integers chosen per rank and element so that every
 * result (sum, prod, min, max, avg) is exactly representable in every dtype,
 * bf16 and i8 included, for up to BENCH_MAX_CHECK_RANKS ranks.
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BENCH_MAX_CHECK_RANKS	12	/* check values stay exact in i8/bf16 up to here */

enum bench_coll {
	BENCH_ALLREDUCE,
	BENCH_REDUCESCATTER,
	BENCH_ALLGATHER,
	BENCH_BROADCAST,
	BENCH_MEMCPY,		/* one-process DRAM reference; only where bench_prog allows it */
};

/* Named as kcoll names them (kcoll_dtype_name, kcoll_redop_name). */
enum bench_dtype {
	BENCH_F32, BENCH_F64, BENCH_F16, BENCH_BF16, BENCH_I8,
	BENCH_U8, BENCH_I32, BENCH_U32, BENCH_I64, BENCH_U64,
};

enum bench_op { BENCH_SUM, BENCH_PROD, BENCH_MIN, BENCH_MAX, BENCH_AVG };

const char *bench_coll_name(enum bench_coll c);
const char *bench_dtype_name(enum bench_dtype t);
size_t bench_dtype_size(enum bench_dtype t);
const char *bench_op_name(enum bench_op op);
/* Exact names only; 0 or -EINVAL. */
int bench_dtype_parse(const char *s, enum bench_dtype *out);
int bench_op_parse(const char *s, enum bench_op *out);
bool bench_coll_has_redop(enum bench_coll c);

/* f16/bf16 <-> f32; a program that offers those dtypes supplies all four. */
struct bench_half_conv {
	float (*f16_to_f32)(unsigned short h);
	unsigned short (*f32_to_f16)(float f);
	float (*bf16_to_f32)(unsigned short b);
	unsigned short (*f32_to_bf16)(float f);
};

struct bench_opts {
	enum bench_coll coll;
	int nranks;
	size_t min_bytes, max_bytes;
	unsigned long factor;
	int iters, warmup;
	bool check;
	enum bench_dtype dtype;
	enum bench_op op;
	int root;
	bool inplace, json;
	const struct bench_half_conv *half;	/* NULL: the program refuses f16/bf16 */
};

/* ---- command line --------------------------------------------------------- */

/* Long-only options; a program numbers its own from BENCH_OPT_PROG. */
enum { BENCH_OPT_INPLACE = 256, BENCH_OPT_JSON, BENCH_OPT_PROG };

/* A program's getopt tables begin with these, then add its own options. */
#define BENCH_SHORTOPTS ":N:b:e:f:n:w:c:d:o:r:h"
#define BENCH_LONGOPTS							\
	{ "nranks", required_argument, NULL, 'N' },			\
	{ "minbytes", required_argument, NULL, 'b' },			\
	{ "maxbytes", required_argument, NULL, 'e' },			\
	{ "stepfactor", required_argument, NULL, 'f' },			\
	{ "iters", required_argument, NULL, 'n' },			\
	{ "warmup_iters", required_argument, NULL, 'w' },		\
	{ "check", required_argument, NULL, 'c' },			\
	{ "datatype", required_argument, NULL, 'd' },			\
	{ "op", required_argument, NULL, 'o' },				\
	{ "root", required_argument, NULL, 'r' },			\
	{ "inplace", no_argument, NULL, BENCH_OPT_INPLACE },		\
	{ "json", no_argument, NULL, BENCH_OPT_JSON },			\
	{ "help", no_argument, NULL, 'h' }

/* The --help lines of -b to -c, which mean the same in every program. */
#define BENCH_USAGE_SWEEP							\
"  -b, --minbytes SIZE   smallest size; K/M/G suffixes (x1024)   [8]\n"	\
"  -e, --maxbytes SIZE   largest size                            [64M]\n"	\
"  -f, --stepfactor F    multiply the size by F each step        [2]\n"	\
"  -n, --iters N         timed iterations per size               [20]\n"	\
"  -w, --warmup_iters N  untimed iterations per size             [5]\n"	\
"  -c, --check 0|1       verify every element of a checked run   [1]\n"

/*
 * One program's command line. bench_parse_args handles -b -e -f -n -w -c
 * --inplace --json -h itself and hands every other option (-N -d -o -r, whose
 * ranges and names depend on the library, and the program's own) to parse_opt.
 */
struct bench_prog {
	const char *name;
	void (*usage)(FILE *f);			/* the whole --help text */
	void (*finish)(void);			/* before exit on --help or bad usage; may be NULL */
	bool quiet;				/* print no usage: another rank of the job does */
	bool with_memcpy;			/* accept the memcpy reference */
	const char *shortopts;			/* BENCH_SHORTOPTS and the program's own */
	const struct option *longopts;		/* BENCH_LONGOPTS, the program's own, { 0 } */
	void (*parse_opt)(const struct bench_prog *p, void *ctx, struct bench_opts *o, int c,
			  const char *arg);
};

/* The defaults the usage texts list; nranks is the program's. */
void bench_opts_init(struct bench_opts *o, int nranks);
/* Parse argv into o (set up by bench_opts_init); exits 2 on bad usage, 0 after --help. */
void bench_parse_args(const struct bench_prog *p, int argc, char **argv, struct bench_opts *o,
		      void *ctx);
void __attribute__((noreturn, format(printf, 2, 3)))
bench_usage_error(const struct bench_prog *p, const char *fmt, ...);
/* "64M", "64MiB", "64MB" -> 67108864: binary suffixes, as nccl-tests. 0 or -EINVAL. */
int bench_parse_size(const char *s, size_t *out);
long bench_parse_long(const struct bench_prog *p, const char *s, const char *what, long lo,
		      long hi);

/* ---- sizes and counts ------------------------------------------------------ */

/*
 * One requested size as nccl-tests defines it: the size is the larger of the
 * two buffers, and reduce-scatter/all-gather split it into nranks equal
 * slices. Rounded down to whole elements, at least one.
 */
struct bench_counts {
	size_t param;		/* the count argument of the call */
	size_t send_n, recv_n;	/* elements in each buffer */
	size_t bytes;		/* the larger buffer in bytes: what the row reports */
};

void bench_counts(const struct bench_opts *o, size_t bytes, struct bench_counts *n);
/* How many sizes the sweep from min_bytes to max_bytes has. */
int bench_count_rows(const struct bench_opts *o);

/* ---- check values ---------------------------------------------------------- */

/* The first n inputs of rank r. */
void bench_fill_input(const struct bench_opts *o, void *buf, int r, size_t n);
/* Rank r's slice of a whole vector of param-element slices. */
void *bench_rank_slice(const struct bench_opts *o, void *buf, int r, size_t param);
/*
 * Poison recv (the larger side) and fill the input of a checked run. In place,
 * the input is recv: all of it, or for all-gather rank r's slice of it.
 */
void bench_check_prepare(const struct bench_opts *o, int r, void *send, void *recv, bool inplace,
			 const struct bench_counts *n);
/* Wrong elements in rank r's result at out (recv_n of them). */
long long bench_check_result(const struct bench_opts *o, int r, const void *out,
			     const struct bench_counts *n);

/* ---- results ----------------------------------------------------------------- */

/* One measured size; column [0] out of place, [1] in place. */
struct bench_row {
	size_t bytes;		/* total buffer size as nccl-tests counts it */
	size_t count;		/* the count argument of the call */
	double time_us[2];
	double algbw[2], busbw[2];
	long long wrong[2];	/* -1: not checked */
};

/* Column col of row (bytes set) from the slowest rank's mean and the job's wrong count. */
void bench_row_set(const struct bench_opts *o, struct bench_row *row, int col, double time_us,
		   long long wrong);
/* Wrong elements over all rows and columns; unchecked ones count 0. */
long long bench_wrong_total(const struct bench_opts *o, const struct bench_row *rows, int nrows);

/* What the table and the JSON say besides the options. */
struct bench_env {
	const char *tool;	/* the program */
	const char *system;	/* what it measures: "kcoll", "openmpi", "memcpy"... */
	const char *version;	/* of that library */
	const char *mem;	/* where the buffers live: "shm", "host" */
	const char *host;
	/* Where the ranks ran; all zero: the JSON leaves these out. */
	int hosts;			/* > 0: "hosts", "ranks_per_host", "rank_hosts" */
	int ranks_per_host;		/* 0: not the same on every host (null) */
	const char *const *rank_hosts;	/* nranks names (NULL entries: unknown), or NULL */
};

/* about: the second header line, e.g. "<library> on <host>". */
void bench_print_header(const struct bench_opts *o, const struct bench_env *env,
			const char *about);
/* One table row, flushed so a long sweep shows progress. */
void bench_print_row(const struct bench_opts *o, const struct bench_row *row);
/* The closing average line of the table. */
void bench_print_footer(const struct bench_opts *o, const struct bench_row *rows, int nrows);
/* The whole JSON document; complete: every size of the sweep ran. */
void bench_print_json(const struct bench_opts *o, const struct bench_env *env,
		      const struct bench_row *rows, int nrows, bool complete);

#ifdef __cplusplus
}
#endif

#endif /* BENCH_COMMON_H */
