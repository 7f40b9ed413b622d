/* SPDX-License-Identifier: MIT */
/*
 * kcoll-bench: sweep one collective over N local ranks served by kcolld and
 * print an nccl-tests style table (or one JSON document).
 *
 * The parent asks the daemon for a communicator id, then forks N ranks; each
 * rank connects on its own, joins, and for every size runs: an optional
 * checked pass, warmup, a barrier, then timed iterations (each one submitted
 * and waited for, so the mean includes the full round trip). Ranks leave their
 * mean and wrong-element count in a MAP_SHARED page created before fork;
 * rank 0 reports the slowest rank's mean. `kcoll-bench memcpy` times plain
 * memcpy in one process as a DRAM reference for the same table.
 *
 * Check values are small integers chosen per rank and element so that every
 * result (sum, prod, min, max, avg) is exactly representable in every dtype,
 * bf16 and i8 included, for up to 12 ranks.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "reduce.h"

#define BENCH_MAX_RANKS		64
#define BENCH_MAX_CHECK_RANKS	12	/* check values stay exact in i8/bf16 up to here */
#define BENCH_WAIT_MS		60000	/* one operation; far beyond any healthy run */
#define BENCH_PROGRESS_AFTER_S	2.0	/* sweeps shorter than this print no progress */

enum bench_coll {
	BENCH_ALLREDUCE,
	BENCH_REDUCESCATTER,
	BENCH_ALLGATHER,
	BENCH_BROADCAST,
	BENCH_MEMCPY,
};

static const char *const bench_coll_names[] = {
	[BENCH_ALLREDUCE] = "allreduce",
	[BENCH_REDUCESCATTER] = "reducescatter",
	[BENCH_ALLGATHER] = "allgather",
	[BENCH_BROADCAST] = "broadcast",
	[BENCH_MEMCPY] = "memcpy",
};

struct bench_opts {
	enum bench_coll coll;
	int nranks;
	size_t min_bytes, max_bytes;
	unsigned long factor;
	int iters, warmup;
	bool check;
	enum kcoll_dtype dtype;
	enum kcoll_redop op;
	int root;
	bool mem_host;
	bool inplace;
	bool json;
	const char *socket;
};

/* One measured size, filled by rank 0 from every rank's slot. */
struct bench_row {
	size_t bytes;		/* total buffer size as nccl-tests counts it */
	size_t count;		/* the count argument of the call */
	double time_us[2];	/* [0] out of place, [1] in place */
	double algbw[2], busbw[2];
	long long wrong[2];	/* -1: not checked */
};

/* Per rank, per size; one cache line each so ranks never share a line. */
struct bench_slot {
	double time_us[2];
	long long wrong[2];
} __attribute__((aligned(64)));

/* The MAP_SHARED page(s) created before fork. */
struct bench_shared {
	int nrows_done;
	struct bench_row *rows;		/* nrows entries, inside this mapping */
	struct bench_slot *slots;	/* nranks entries, inside this mapping */
};

/* What one rank needs to run the collective. */
struct bench_rank {
	const struct bench_opts *o;
	struct kcoll_comm *comm;
	int rank;
	void *send, *recv;
	size_t elt;
};

static const char *prog = "kcoll-bench";

static void usage(FILE *f)
{
	fprintf(f,
"usage: %s allreduce|reducescatter|allgather|broadcast|memcpy [options]\n"
"  -N, --nranks N        local ranks (forked processes)          [2]\n"
"  -b, --minbytes SIZE   smallest size; K/M/G suffixes (x1024)   [8]\n"
"  -e, --maxbytes SIZE   largest size                            [64M]\n"
"  -f, --stepfactor F    multiply the size by F each step        [2]\n"
"  -n, --iters N         timed iterations per size               [20]\n"
"  -w, --warmup_iters N  untimed iterations per size             [5]\n"
"  -c, --check 0|1       verify every element of a checked run   [1]\n"
"  -d, --datatype T      f32 f64 f16 bf16 i8 u8 i32 u32 i64 u64  [f32]\n"
"  -o, --op OP           sum prod min max avg                    [sum]\n"
"  -r, --root R          broadcast root                          [0]\n"
"      --mem shm|host    kcoll_mem_alloc'ed (zero-copy) or malloc'ed buffers [shm]\n"
"      --inplace         also measure in place (extra columns)\n"
"      --json            print one JSON document instead of the table\n"
"  -s, --socket PATH     kcolld socket [$KCOLL_SOCKET or " KCOLL_DEFAULT_SOCKET "]\n"
"  -h, --help            this text\n"
"Exit status: 0 success, 1 wrong results or a failed run, 2 bad usage.\n",
		prog);
}

static void __attribute__((noreturn, format(printf, 1, 2))) usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	usage(stderr);
	exit(2);
}

/* "64M" -> 67108864. Binary suffixes, as nccl-tests. */
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

static long parse_long(const char *s, const char *what, long lo, long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		usage_error("%s must be an integer in [%ld, %ld], not '%s'", what, lo, hi, s);
	return v;
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
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

/*
 * Element counts for one requested size, as nccl-tests defines them: the size
 * is the larger of the two buffers, and reduce-scatter/all-gather split it into
 * nranks equal slices. Rounded down to whole elements, at least one.
 */
static void coll_counts(const struct bench_opts *o, size_t elt, size_t bytes, size_t *param,
			size_t *send_n, size_t *recv_n)
{
	size_t per;

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

/* ---- check values ----------------------------------------------------- */

static bool dtype_unsigned(enum kcoll_dtype t)
{
	return t == KCOLL_U8 || t == KCOLL_U32 || t == KCOLL_U64;
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

	if (!coll_has_redop(o->coll))
		return (long)((r * 17 + i * 5) % 101) - 50 * s;
	switch (o->op) {
	case KCOLL_PROD:
		if ((i + r) % 3 == 0)
			return 2;
		return s && (i + 2 * r) % 4 == 1 ? -1 : 1;
	case KCOLL_AVG:
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
		case KCOLL_SUM:
		case KCOLL_AVG: acc += v; break;
		case KCOLL_PROD: acc *= v; break;
		case KCOLL_MIN: acc = v < acc ? v : acc; break;
		case KCOLL_MAX: acc = v > acc ? v : acc; break;
		default: break;
		}
	}
	return o->op == KCOLL_AVG ? acc / o->nranks : acc;
}

static void put_elem(void *buf, enum kcoll_dtype t, size_t i, long v)
{
	switch (t) {
	case KCOLL_F32: ((float *)buf)[i] = (float)v; break;
	case KCOLL_F64: ((double *)buf)[i] = (double)v; break;
	case KCOLL_F16: ((uint16_t *)buf)[i] = kcoll_f32_to_f16((float)v); break;
	case KCOLL_BF16: ((uint16_t *)buf)[i] = kcoll_f32_to_bf16((float)v); break;
	case KCOLL_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
	case KCOLL_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
	case KCOLL_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
	case KCOLL_U32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
	case KCOLL_I64: ((int64_t *)buf)[i] = v; break;
	case KCOLL_U64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
	default: break;
	}
}

/* Exact for every value put_elem can store; NaN never equals anything. */
static double get_elem(const void *buf, enum kcoll_dtype t, size_t i)
{
	switch (t) {
	case KCOLL_F32: return ((const float *)buf)[i];
	case KCOLL_F64: return ((const double *)buf)[i];
	case KCOLL_F16: return kcoll_f16_to_f32(((const uint16_t *)buf)[i]);
	case KCOLL_BF16: return kcoll_bf16_to_f32(((const uint16_t *)buf)[i]);
	case KCOLL_I8: return ((const int8_t *)buf)[i];
	case KCOLL_U8: return ((const uint8_t *)buf)[i];
	case KCOLL_I32: return ((const int32_t *)buf)[i];
	case KCOLL_U32: return ((const uint32_t *)buf)[i];
	case KCOLL_I64: return (double)((const int64_t *)buf)[i];
	case KCOLL_U64: return (double)((const uint64_t *)buf)[i];
	default: return 0;
	}
}

/* The first n inputs of rank r. */
static void fill_input(const struct bench_opts *o, void *buf, int r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		put_elem(buf, o->dtype, i, in_val(o, r, i));
}

/* A byte pattern no check value decodes to (f32/f16/bf16: non-integers). */
#define BENCH_POISON 0xa5

/*
 * In place follows kcoll.h (as NCCL): recv holds the whole vector, and this
 * rank's slice of it is the all-gather input or the reduce-scatter output.
 */
static void *rank_slice(const struct bench_rank *b, size_t param)
{
	return (char *)b->recv + (size_t)b->rank * param * b->elt;
}

/* Prepare the buffers of a checked run. */
static void check_prepare(struct bench_rank *b, bool inplace, size_t param, size_t send_n,
			  size_t recv_n)
{
	const struct bench_opts *o = b->o;
	void *in = inplace ? b->recv : b->send;

	memset(b->recv, BENCH_POISON, (send_n > recv_n ? send_n : recv_n) * b->elt);
	switch (o->coll) {
	case BENCH_ALLGATHER:
		if (inplace)
			in = rank_slice(b, param);
		fill_input(o, in, b->rank, param);
		break;
	case BENCH_BROADCAST:
		if (b->rank == o->root)
			fill_input(o, b->recv, b->rank, param);
		break;
	default:
		fill_input(o, in, b->rank, send_n);
		break;
	}
}

static long long check_result(const struct bench_rank *b, bool inplace, size_t param,
			      size_t recv_n)
{
	const struct bench_opts *o = b->o;
	const void *out = inplace && o->coll == BENCH_REDUCESCATTER ? rank_slice(b, param) : b->recv;
	long long wrong = 0;

	for (size_t i = 0; i < recv_n; i++) {
		long want;

		switch (o->coll) {
		case BENCH_ALLREDUCE: want = expect_reduced(o, i); break;
		case BENCH_REDUCESCATTER: want = expect_reduced(o, b->rank * param + i); break;
		case BENCH_ALLGATHER: want = in_val(o, (int)(i / param), i % param); break;
		default: want = in_val(o, o->root, i); break;
		}
		if (get_elem(out, o->dtype, i) != (double)want)
			wrong++;
	}
	return wrong;
}

/* ---- one rank ------------------------------------------------------- */

static int __attribute__((format(printf, 3, 4))) rank_fail(int rank, int err, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: rank %d: ", prog, rank);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, ": %s\n", kcoll_strerror(err));
	return err;
}

static int wait_req(struct bench_rank *b, struct kcoll_req *req, const char *what)
{
	int r = kcoll_wait(req, BENCH_WAIT_MS);

	if (r == -ETIMEDOUT)
		return rank_fail(b->rank, r, "%s still pending after %d s", what,
				 BENCH_WAIT_MS / 1000);
	if (r) {
		int blamed = kcoll_req_err_rank(req);

		if (blamed >= 0)
			return rank_fail(b->rank, r, "%s failed (daemon blames rank %d)", what,
					 blamed);
		return rank_fail(b->rank, r, "%s failed", what);
	}
	return 0;
}

static int run_coll(struct bench_rank *b, bool inplace, size_t param)
{
	const struct bench_opts *o = b->o;
	struct kcoll_req *req;
	int r;

	switch (o->coll) {
	case BENCH_ALLREDUCE:
		r = kcoll_allreduce(b->comm, inplace ? b->recv : b->send, b->recv, param,
				    o->dtype, o->op, &req);
		break;
	case BENCH_REDUCESCATTER:
		r = kcoll_reduce_scatter(b->comm, inplace ? b->recv : b->send,
					 inplace ? rank_slice(b, param) : b->recv, param,
					 o->dtype, o->op, &req);
		break;
	case BENCH_ALLGATHER:
		r = kcoll_allgather(b->comm, inplace ? rank_slice(b, param) : b->send, b->recv,
				    param, o->dtype, &req);
		break;
	default:
		/* kcoll_broadcast has one buffer: both columns time the same call */
		r = kcoll_broadcast(b->comm, b->recv, param, o->dtype, o->root, &req);
		break;
	}
	if (r)
		return rank_fail(b->rank, r, "submitting %s of %zu elements",
				 bench_coll_names[o->coll], param);
	return wait_req(b, req, bench_coll_names[o->coll]);
}

static int barrier(struct bench_rank *b)
{
	struct kcoll_req *req;
	int r = kcoll_barrier(b->comm, &req);

	if (r)
		return rank_fail(b->rank, r, "submitting a barrier");
	return wait_req(b, req, "barrier");
}

/* One column (out of place or in place) at one size: check, warm up, time. */
static int measure(struct bench_rank *b, bool inplace, size_t param, size_t send_n, size_t recv_n,
		   struct bench_slot *slot)
{
	const struct bench_opts *o = b->o;
	long long wrong = -1;
	double t0;
	int r;

	if (o->check) {
		check_prepare(b, inplace, param, send_n, recv_n);
		r = run_coll(b, inplace, param);
		if (r)
			return r;
		wrong = check_result(b, inplace, param, recv_n);
	}
	for (int i = 0; i < o->warmup; i++) {
		r = run_coll(b, inplace, param);
		if (r)
			return r;
	}
	r = barrier(b);
	if (r)
		return r;
	t0 = now_us();
	for (int i = 0; i < o->iters; i++) {
		r = run_coll(b, inplace, param);
		if (r)
			return r;
	}
	/* Only now: rank 0 may still be reading the previous size's slots
	 * until it has joined the barrier above. */
	slot->time_us[inplace] = (now_us() - t0) / o->iters;
	slot->wrong[inplace] = wrong;
	return 0;
}

static void progress(const struct bench_opts *o, double start_us, int done, int nrows,
		     size_t bytes)
{
	static bool shown;

	if (!isatty(STDERR_FILENO) || (!o->json && isatty(STDOUT_FILENO)))
		return;
	if (!shown && (now_us() - start_us) / 1e6 < BENCH_PROGRESS_AFTER_S)
		return;
	shown = true;
	fprintf(stderr, "\r%s %s: %d/%d sizes done (%zu bytes)%s", prog,
		bench_coll_names[o->coll], done, nrows, bytes, done == nrows ? "\n" : "");
}

static void print_row(const struct bench_opts *o, const struct bench_row *row);

/* Fill rows[k] from every rank's slot; rank 0 only, after a barrier. */
static void collect_row(const struct bench_opts *o, struct bench_shared *sh, int k, size_t bytes,
			size_t param)
{
	struct bench_row *row = &sh->rows[k];
	int ncols = o->inplace ? 2 : 1;

	row->bytes = bytes;
	row->count = param;
	for (int c = 0; c < ncols; c++) {
		double t = 0;
		long long w = 0;

		for (int r = 0; r < o->nranks; r++) {
			const struct bench_slot *s = &sh->slots[r];

			t = s->time_us[c] > t ? s->time_us[c] : t;
			w = s->wrong[c] < 0 || w < 0 ? -1 : w + s->wrong[c];
		}
		row->time_us[c] = t;
		row->algbw[c] = t > 0 ? bytes / t / 1e3 : 0;
		row->busbw[c] = row->algbw[c] * busbw_factor(o->coll, o->nranks);
		row->wrong[c] = w;
	}
	sh->nrows_done = k + 1;
	if (!o->json) {
		print_row(o, row);
		fflush(stdout);
	}
}

static int rank_main(const struct bench_opts *o, const kcoll_unique_id_t *id, int rank,
		     struct bench_shared *sh, int nrows)
{
	struct kcoll_connect_opts copts = { .size = sizeof(copts), .socket_path = o->socket };
	struct bench_rank b = { .o = o, .rank = rank, .elt = kcoll_dtype_size(o->dtype) };
	size_t param, send_n, recv_n, bytes, buf_bytes;
	struct kcoll *k;
	double start = now_us();
	int r;

	r = kcoll_connect(&copts, &k);
	if (r)
		return rank_fail(rank, r, "connecting to kcolld");
	r = kcoll_comm_init_rank(k, id, o->nranks, rank, &b.comm);
	if (r) {
		rank_fail(rank, r, "joining a %d-rank communicator", o->nranks);
		goto err_disconnect;
	}
	coll_counts(o, b.elt, o->max_bytes, &param, &send_n, &recv_n);
	/* Both buffers hold the larger side, so in place fits in recv. */
	buf_bytes = (send_n > recv_n ? send_n : recv_n) * b.elt;
	if (o->mem_host) {
		size_t len = (buf_bytes + 4095) & ~(size_t)4095;

		b.send = aligned_alloc(4096, len);
		b.recv = aligned_alloc(4096, len);
		if (!b.send || !b.recv) {
			r = rank_fail(rank, -ENOMEM, "allocating 2 x %zu bytes", buf_bytes);
			goto err_free;
		}
	} else {
		r = kcoll_mem_alloc(k, buf_bytes, &b.send);
		if (r) {
			rank_fail(rank, r, "kcoll_mem_alloc(%zu)", buf_bytes);
			goto err_destroy;
		}
		r = kcoll_mem_alloc(k, buf_bytes, &b.recv);
		if (r) {
			rank_fail(rank, r, "kcoll_mem_alloc(%zu)", buf_bytes);
			goto err_free;
		}
	}
	/* Valid, finite inputs even when unchecked: denormals or NaNs would time differently. */
	fill_input(o, b.send, rank, buf_bytes / b.elt);
	fill_input(o, b.recv, rank, buf_bytes / b.elt);

	bytes = o->min_bytes;
	for (int row = 0; row < nrows; row++, bytes *= o->factor) {
		coll_counts(o, b.elt, bytes, &param, &send_n, &recv_n);
		for (int ip = 0; ip <= (int)o->inplace; ip++) {
			r = measure(&b, ip, param, send_n, recv_n, &sh->slots[rank]);
			if (r)
				goto err_free;
		}
		/* Every slot is written before rank 0 reads them, and rank 0 has
		 * read them before any rank passes the next size's first barrier. */
		r = barrier(&b);
		if (r)
			goto err_free;
		if (rank == 0) {
			collect_row(o, sh, row, (send_n > recv_n ? send_n : recv_n) * b.elt,
				    param);
			progress(o, start, row + 1, nrows, bytes);
		}
	}
	r = 0;
err_free:
	if (o->mem_host) {
		free(b.send);
		free(b.recv);
	} else {
		if (b.recv)
			kcoll_mem_free(k, b.recv);
		if (b.send)
			kcoll_mem_free(k, b.send);
	}
err_destroy:
	kcoll_comm_destroy(b.comm);
err_disconnect:
	kcoll_disconnect(k);
	return r;
}

/* ---- memcpy reference ------------------------------------------------ */

static int memcpy_main(const struct bench_opts *o, struct bench_shared *sh, int nrows)
{
	size_t elt = kcoll_dtype_size(o->dtype);
	size_t len = (o->max_bytes + 4095) & ~(size_t)4095;
	char *src = aligned_alloc(4096, len), *dst = aligned_alloc(4096, len);
	double start = now_us();
	size_t bytes = o->min_bytes;

	if (!src || !dst) {
		fprintf(stderr, "%s: cannot allocate 2 x %zu bytes\n", prog, len);
		free(src);
		free(dst);
		return -ENOMEM;
	}
	memset(src, 1, len);
	memset(dst, 2, len);
	for (int row = 0; row < nrows; row++, bytes *= o->factor) {
		double t0;

		for (int i = 0; i < o->warmup; i++)
			memcpy(dst, src, bytes);
		t0 = now_us();
		for (int i = 0; i < o->iters; i++) {
			memcpy(dst, src, bytes);
			/* keep the copies: the compiler may not drop or merge them */
			__asm__ volatile("" : : "r"(dst) : "memory");
		}
		sh->slots[0].time_us[0] = sh->slots[0].time_us[1] = (now_us() - t0) / o->iters;
		sh->slots[0].wrong[0] = sh->slots[0].wrong[1] = -1;
		collect_row(o, sh, row, bytes, bytes / elt);
		progress(o, start, row + 1, nrows, bytes);
	}
	free(src);
	free(dst);
	return 0;
}

/* ---- output ---------------------------------------------------------- */

static const char *redop_label(const struct bench_opts *o)
{
	return coll_has_redop(o->coll) ? kcoll_redop_name(o->op) : "none";
}

static int root_label(const struct bench_opts *o)
{
	return o->coll == BENCH_BROADCAST ? o->root : -1;
}

static void print_header(const struct bench_opts *o, const char *host)
{
	int ncols = o->inplace ? 2 : 1;

	printf("# %s %s: nranks %d minBytes %zu maxBytes %zu step: %lu(factor) warmup iters: %d "
	       "iters: %d validation: %d mem: %s\n",
	       prog, bench_coll_names[o->coll], o->nranks, o->min_bytes, o->max_bytes, o->factor,
	       o->warmup, o->iters, o->check, o->mem_host ? "host" : "shm");
	if (o->coll == BENCH_MEMCPY)
		printf("# one process, plain memcpy on %s (no daemon)\n", host);
	else
		printf("# libkcoll %s on %s, socket %s\n", kcoll_version(), host,
		       o->socket ? o->socket :
		       getenv("KCOLL_SOCKET") ? getenv("KCOLL_SOCKET") : KCOLL_DEFAULT_SOCKET);
	printf("#\n");
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
	printf("%12zu  %12zu  %8s  %6s  %6d", row->bytes, row->count, kcoll_dtype_name(o->dtype),
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
}

static double avg_busbw(const struct bench_opts *o, const struct bench_shared *sh)
{
	double sum = 0;
	int n = 0;

	for (int k = 0; k < sh->nrows_done; k++)
		for (int c = 0; c <= (int)o->inplace; c++, n++)
			sum += sh->rows[k].busbw[c];
	return n ? sum / n : 0;
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

static void print_json(const struct bench_opts *o, const struct bench_shared *sh, const char *host,
		       bool complete)
{
	char date[32];
	time_t t = time(NULL);

	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
	printf("{\n  \"tool\": \"%s\", \"system\": \"%s\", \"version\": \"%s\",\n", prog,
	       o->coll == BENCH_MEMCPY ? "memcpy" : "kcoll", kcoll_version());
	printf("  \"collective\": \"%s\", \"N\": %d, \"dtype\": \"%s\", \"op\": \"%s\", "
	       "\"root\": %d,\n", bench_coll_names[o->coll], o->nranks, kcoll_dtype_name(o->dtype),
	       redop_label(o), root_label(o));
	printf("  \"mem\": \"%s\", \"inplace\": %s, \"check\": %d, \"iters\": %d, \"warmup\": %d,\n",
	       o->mem_host ? "host" : "shm", o->inplace ? "true" : "false", o->check, o->iters,
	       o->warmup);
	printf("  \"host\": \"%s\", \"date\": \"%s\", \"complete\": %s,\n", host, date,
	       complete ? "true" : "false");
	printf("  \"rows\": [");
	for (int k = 0; k < sh->nrows_done; k++) {
		const struct bench_row *row = &sh->rows[k];

		printf("%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
		       "\"root\": %d, ", k ? "," : "", row->bytes, row->count,
		       kcoll_dtype_name(o->dtype), redop_label(o), root_label(o));
		json_col(row, 0);
		if (o->inplace) {
			printf(", \"inplace\": {");
			json_col(row, 1);
			printf("}");
		}
		printf("}");
	}
	printf("\n  ],\n  \"avg_busbw\": %.4f\n}\n", avg_busbw(o, sh));
}

/* ---- parent --------------------------------------------------------- */

static void parse_args(int argc, char **argv, struct bench_opts *o)
{
	enum { OPT_MEM = 256, OPT_INPLACE, OPT_JSON };
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
		{ "socket", required_argument, NULL, 's' },
		{ "mem", required_argument, NULL, OPT_MEM },
		{ "inplace", no_argument, NULL, OPT_INPLACE },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	const char *coll;
	int c;

	*o = (struct bench_opts){ .nranks = 2, .min_bytes = 8, .max_bytes = 64 << 20, .factor = 2,
				  .iters = 20, .warmup = 5, .check = true, .dtype = KCOLL_F32,
				  .op = KCOLL_SUM };
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":N:b:e:f:n:w:c:d:o:r:s:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'N': o->nranks = parse_long(optarg, "-N", 1, BENCH_MAX_RANKS); break;
		case 'b':
			if (parse_size(optarg, &o->min_bytes) || !o->min_bytes)
				usage_error("bad size for -b: '%s'", optarg);
			break;
		case 'e':
			if (parse_size(optarg, &o->max_bytes) || !o->max_bytes)
				usage_error("bad size for -e: '%s'", optarg);
			break;
		case 'f': o->factor = parse_long(optarg, "-f", 1, 1 << 20); break;
		case 'n': o->iters = parse_long(optarg, "-n", 1, INT_MAX); break;
		case 'w': o->warmup = parse_long(optarg, "-w", 0, INT_MAX); break;
		case 'c': o->check = parse_long(optarg, "-c", 0, 1); break;
		case 'd':
			if (kcoll_dtype_parse(optarg, &o->dtype))
				usage_error("unknown datatype '%s'", optarg);
			break;
		case 'o':
			if (kcoll_redop_parse(optarg, &o->op))
				usage_error("unknown reduction op '%s'", optarg);
			break;
		case 'r': o->root = parse_long(optarg, "-r", 0, BENCH_MAX_RANKS - 1); break;
		case 's': o->socket = optarg; break;
		case OPT_MEM:
			if (!strcmp(optarg, "host"))
				o->mem_host = true;
			else if (strcmp(optarg, "shm"))
				usage_error("--mem takes shm or host, not '%s'", optarg);
			break;
		case OPT_INPLACE: o->inplace = true; break;
		case OPT_JSON: o->json = true; break;
		case 'h': usage(stdout); exit(0);
		case ':': usage_error("option '%s' needs a value", argv[optind - 1]);
		default: usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc - 1)
		usage_error(optind == argc ? "which collective?" : "one collective, please");
	coll = argv[optind];
	for (c = 0; c <= BENCH_MEMCPY; c++)
		if (!strcmp(coll, bench_coll_names[c]))
			break;
	if (c > BENCH_MEMCPY)
		usage_error("unknown collective '%s'", coll);
	o->coll = c;
	if (o->coll == BENCH_MEMCPY) {
		o->nranks = 1;
		o->check = false;
		o->inplace = false;
	}
	if (o->min_bytes > o->max_bytes)
		usage_error("-b %zu is larger than -e %zu", o->min_bytes, o->max_bytes);
	if (o->factor < 2 && o->min_bytes != o->max_bytes)
		usage_error("-f must be at least 2 unless -b equals -e");
	if (o->coll == BENCH_BROADCAST && o->root >= o->nranks)
		usage_error("root %d is not a rank of %d", o->root, o->nranks);
	if (o->check && o->nranks > BENCH_MAX_CHECK_RANKS)
		usage_error("-c 1 supports at most %d ranks (exact check values); use -c 0",
			    BENCH_MAX_CHECK_RANKS);
}

static int count_rows(const struct bench_opts *o)
{
	int n = 0;

	for (size_t s = o->min_bytes; s <= o->max_bytes; s *= o->factor) {
		n++;
		if (o->factor < 2 || s > SIZE_MAX / o->factor)
			break;
	}
	return n;
}

static struct bench_shared *shared_create(int nrows, int nranks)
{
	size_t rows_off = (sizeof(struct bench_shared) + 63) & ~(size_t)63;
	size_t slots_off = rows_off + ((nrows * sizeof(struct bench_row) + 63) & ~(size_t)63);
	size_t len = slots_off + nranks * sizeof(struct bench_slot);
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct bench_shared *sh = (struct bench_shared *)p;

	if (p == MAP_FAILED)
		return NULL;
	sh->rows = (struct bench_row *)(p + rows_off);
	sh->slots = (struct bench_slot *)(p + slots_off);
	return sh;
}

/* Wait for all ranks; on the first failure stop the rest. 0 if all exited 0. */
static int reap(pid_t *pids, int n)
{
	int alive = n, failed = 0;

	while (alive > 0) {
		int st;
		pid_t p = wait(&st);

		if (p < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		for (int i = 0; i < n; i++) {
			if (pids[i] != p)
				continue;
			pids[i] = 0;
			alive--;
			if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
				break;
			if (WIFSIGNALED(st) && !failed)
				fprintf(stderr, "%s: rank %d killed by signal %d\n", prog, i,
					WTERMSIG(st));
			if (!failed++)
				for (int j = 0; j < n; j++)
					if (pids[j] > 0)
						kill(pids[j], SIGTERM);
			break;
		}
	}
	return failed ? -1 : 0;
}

int main(int argc, char **argv)
{
	struct kcoll_connect_opts copts = { .size = sizeof(copts) };
	struct bench_opts o;
	struct bench_shared *sh;
	kcoll_unique_id_t id;
	struct kcoll *k = NULL;
	pid_t pids[BENCH_MAX_RANKS];
	char host[256] = "unknown";
	long long wrong = 0;
	int nrows, r, rc;

	parse_args(argc, argv, &o);
	gethostname(host, sizeof(host) - 1);
	nrows = count_rows(&o);
	sh = shared_create(nrows, o.nranks);
	if (!sh) {
		perror("kcoll-bench: mmap");
		return 1;
	}

	if (o.coll != BENCH_MEMCPY) {
		copts.socket_path = o.socket;
		r = kcoll_connect(&copts, &k);
		if (r) {
			const char *sock = o.socket ? o.socket : getenv("KCOLL_SOCKET");

			fprintf(stderr, "%s: cannot reach kcolld at %s: %s\n", prog,
				sock ? sock : KCOLL_DEFAULT_SOCKET, kcoll_strerror(r));
			fprintf(stderr, "%s: is the daemon running? start it with 'kcolld -f -s SOCKET' "
				"and pass -s SOCKET or set KCOLL_SOCKET\n", prog);
			return 1;
		}
		r = kcoll_get_unique_id(k, &id);
		if (r) {
			fprintf(stderr, "%s: kcoll_get_unique_id: %s\n", prog, kcoll_strerror(r));
			kcoll_disconnect(k);
			return 1;
		}
	}
	if (!o.json)
		print_header(&o, host);
	fflush(stdout);

	if (o.coll == BENCH_MEMCPY) {
		rc = memcpy_main(&o, sh, nrows) ? 1 : 0;
	} else {
		int started = 0;

		for (; started < o.nranks; started++) {
			pids[started] = fork();
			if (pids[started] < 0) {
				perror("kcoll-bench: fork");
				break;
			}
			if (pids[started] == 0)
				_exit(rank_main(&o, &id, started, sh, nrows) ? 1 : 0);
		}
		if (started < o.nranks)
			for (int j = 0; j < started; j++)
				kill(pids[j], SIGTERM);
		rc = reap(pids, started) || started < o.nranks ? 1 : 0;
		kcoll_disconnect(k);
	}

	for (int i = 0; i < sh->nrows_done; i++)
		for (int c = 0; c <= (int)o.inplace; c++)
			wrong += sh->rows[i].wrong[c] > 0 ? sh->rows[i].wrong[c] : 0;
	if (o.json) {
		print_json(&o, sh, host, rc == 0);
	} else {
		printf("# Avg bus bandwidth    : %g\n#\n", avg_busbw(&o, sh));
	}
	if (wrong) {
		fprintf(stderr, "%s: %lld wrong elements\n", prog, wrong);
		rc = 1;
	}
	if (rc && sh->nrows_done < nrows)
		fprintf(stderr, "%s: stopped after %d of %d sizes\n", prog, sh->nrows_done, nrows);
	return rc;
}
