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
 * Options, check values, the table and the JSON document are bench_common's,
 * shared with the MPI and Gloo anchors.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "bench_common.h"
#include "reduce.h"

#define BENCH_MAX_RANKS		64
#define BENCH_WAIT_MS		60000	/* one operation; far beyond any healthy run */
#define BENCH_PROGRESS_AFTER_S	2.0	/* sweeps shorter than this print no progress */

/* The shared options and what only kcoll-bench has. */
struct kbench_opts {
	struct bench_opts b;
	enum kcoll_dtype dtype;		/* b.dtype and b.op as kcoll numbers them */
	enum kcoll_redop op;
	enum { MEM_SHM, MEM_HOST, MEM_REG } mem;
	const char *socket;
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
	const struct kbench_opts *o;
	struct kcoll_comm *comm;
	int rank;
	void *send, *recv;
};

enum { OPT_MEM = BENCH_OPT_PROG };

static void usage(FILE *f);
static void parse_opt(const struct bench_prog *p, void *ctx, struct bench_opts *o, int c,
		      const char *arg);

static const struct option longopts[] = {
	BENCH_LONGOPTS,
	{ "socket", required_argument, NULL, 's' },
	{ "mem", required_argument, NULL, OPT_MEM },
	{ 0 }
};

static const struct bench_prog prog = {
	.name = "kcoll-bench",
	.usage = usage,
	.with_memcpy = true,
	.shortopts = BENCH_SHORTOPTS "s:",
	.longopts = longopts,
	.parse_opt = parse_opt,
};

static void usage(FILE *f)
{
	fprintf(f,
"usage: %s allreduce|reducescatter|allgather|broadcast|memcpy [options]\n"
"  -N, --nranks N        local ranks (forked processes)          [2]\n"
BENCH_USAGE_SWEEP
"  -d, --datatype T      f32 f64 f16 bf16 i8 u8 i32 u32 i64 u64  [f32]\n"
"  -o, --op OP           sum prod min max avg                    [sum]\n"
"  -r, --root R          broadcast root                          [0]\n"
"      --mem shm|host|reg  kcoll_mem_alloc'ed (zero-copy), malloc'ed (one copy), or\n"
"                        malloc'ed and kcoll_mem_register'ed (zero-copy with kcoll.ko) [shm]\n"
"      --inplace         also measure in place (extra columns)\n"
"      --json            print one JSON document instead of the table\n"
"  -s, --socket PATH     kcolld socket [$KCOLL_SOCKET or " KCOLL_DEFAULT_SOCKET "]\n"
"  -h, --help            this text\n"
"Exit status: 0 success, 1 wrong results or a failed run, 2 bad usage.\n",
		prog.name);
}

/* -N, -d, -o, -r and kcoll-bench's own options. */
static void parse_opt(const struct bench_prog *p, void *ctx, struct bench_opts *o, int c,
		      const char *arg)
{
	struct kbench_opts *ko = ctx;

	switch (c) {
	case 'N': o->nranks = bench_parse_long(p, arg, "-N", 1, BENCH_MAX_RANKS); break;
	case 'd':
		/* kcoll's parser also takes aliases ("float", "bfloat16"...) */
		if (kcoll_dtype_parse(arg, &ko->dtype) ||
		    bench_dtype_parse(kcoll_dtype_name(ko->dtype), &o->dtype))
			bench_usage_error(p, "unknown datatype '%s'", arg);
		break;
	case 'o':
		if (kcoll_redop_parse(arg, &ko->op) || bench_op_parse(kcoll_redop_name(ko->op), &o->op))
			bench_usage_error(p, "unknown reduction op '%s'", arg);
		break;
	case 'r': o->root = bench_parse_long(p, arg, "-r", 0, BENCH_MAX_RANKS - 1); break;
	case 's': ko->socket = arg; break;
	case OPT_MEM:
		if (!strcmp(arg, "host"))
			ko->mem = MEM_HOST;
		else if (!strcmp(arg, "reg"))
			ko->mem = MEM_REG;
		else if (!strcmp(arg, "shm"))
			ko->mem = MEM_SHM;
		else
			bench_usage_error(p, "--mem takes shm, host or reg, not '%s'", arg);
		break;
	}
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/*
 * In place follows kcoll.h (as NCCL): recv holds the whole vector, and this
 * rank's slice of it is the all-gather input or the reduce-scatter output.
 */
static void *rank_slice(const struct bench_rank *b, size_t param)
{
	return bench_rank_slice(&b->o->b, b->recv, b->rank, param);
}

/* ---- one rank ------------------------------------------------------- */

static int __attribute__((format(printf, 3, 4))) rank_fail(int rank, int err, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: rank %d: ", prog.name, rank);
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
	const struct kbench_opts *o = b->o;
	struct kcoll_req *req;
	int r;

	switch (o->b.coll) {
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
		r = kcoll_broadcast(b->comm, b->recv, param, o->dtype, o->b.root, &req);
		break;
	}
	if (r)
		return rank_fail(b->rank, r, "submitting %s of %zu elements",
				 bench_coll_name(o->b.coll), param);
	return wait_req(b, req, bench_coll_name(o->b.coll));
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
static int measure(struct bench_rank *b, bool inplace, const struct bench_counts *n,
		   struct bench_slot *slot)
{
	const struct bench_opts *o = &b->o->b;
	long long wrong = -1;
	double t0;
	int r;

	if (o->check) {
		bench_check_prepare(o, b->rank, b->send, b->recv, inplace, n);
		r = run_coll(b, inplace, n->param);
		if (r)
			return r;
		wrong = bench_check_result(o, b->rank,
					   inplace && o->coll == BENCH_REDUCESCATTER ?
					   rank_slice(b, n->param) : b->recv, n);
	}
	for (int i = 0; i < o->warmup; i++) {
		r = run_coll(b, inplace, n->param);
		if (r)
			return r;
	}
	r = barrier(b);
	if (r)
		return r;
	t0 = now_us();
	for (int i = 0; i < o->iters; i++) {
		r = run_coll(b, inplace, n->param);
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
	fprintf(stderr, "\r%s %s: %d/%d sizes done (%zu bytes)%s", prog.name,
		bench_coll_name(o->coll), done, nrows, bytes, done == nrows ? "\n" : "");
}

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
		bench_row_set(o, row, c, t, w);
	}
	sh->nrows_done = k + 1;
	if (!o->json)
		bench_print_row(o, row);
}

static int rank_main(const struct kbench_opts *o, const kcoll_unique_id_t *id, int rank,
		     struct bench_shared *sh, int nrows)
{
	struct kcoll_connect_opts copts = { .size = sizeof(copts), .socket_path = o->socket };
	struct bench_rank b = { .o = o, .rank = rank };
	size_t elt = bench_dtype_size(o->b.dtype), bytes, buf_bytes;
	struct bench_counts n;
	struct kcoll *k;
	double start = now_us();
	int r;

	r = kcoll_connect(&copts, &k);
	if (r)
		return rank_fail(rank, r, "connecting to kcolld");
	r = kcoll_comm_init_rank(k, id, o->b.nranks, rank, &b.comm);
	if (r) {
		rank_fail(rank, r, "joining a %d-rank communicator", o->b.nranks);
		goto err_disconnect;
	}
	bench_counts(&o->b, o->b.max_bytes, &n);
	/* Both buffers hold the larger side, so in place fits in recv. */
	buf_bytes = n.bytes;
	if (o->mem != MEM_SHM) {
		size_t len = (buf_bytes + 4095) & ~(size_t)4095;

		b.send = aligned_alloc(4096, len);
		b.recv = aligned_alloc(4096, len);
		if (!b.send || !b.recv) {
			r = rank_fail(rank, -ENOMEM, "allocating 2 x %zu bytes", buf_bytes);
			goto err_free;
		}
		if (o->mem == MEM_REG) {
			r = kcoll_mem_register(k, b.send, len);
			if (!r)
				r = kcoll_mem_register(k, b.recv, len);
			if (r) {
				rank_fail(rank, r, "kcoll_mem_register(%zu)%s", len, r == -ENODEV ?
					  ": --mem reg needs kcoll.ko loaded" : "");
				goto err_free;
			}
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
	bench_fill_input(&o->b, b.send, rank, buf_bytes / elt);
	bench_fill_input(&o->b, b.recv, rank, buf_bytes / elt);

	bytes = o->b.min_bytes;
	for (int row = 0; row < nrows; row++, bytes *= o->b.factor) {
		bench_counts(&o->b, bytes, &n);
		for (int ip = 0; ip <= (int)o->b.inplace; ip++) {
			r = measure(&b, ip, &n, &sh->slots[rank]);
			if (r)
				goto err_free;
		}
		/* Every slot is written before rank 0 reads them, and rank 0 has
		 * read them before any rank passes the next size's first barrier. */
		r = barrier(&b);
		if (r)
			goto err_free;
		if (rank == 0) {
			collect_row(&o->b, sh, row, n.bytes, n.param);
			progress(&o->b, start, row + 1, nrows, bytes);
		}
	}
	r = 0;
err_free:
	if (o->mem != MEM_SHM) {
		if (o->mem == MEM_REG) {
			kcoll_mem_deregister(k, b.send);
			kcoll_mem_deregister(k, b.recv);
		}
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
	size_t elt = bench_dtype_size(o->dtype);
	size_t len = (o->max_bytes + 4095) & ~(size_t)4095;
	char *src = aligned_alloc(4096, len), *dst = aligned_alloc(4096, len);
	double start = now_us();
	size_t bytes = o->min_bytes;

	if (!src || !dst) {
		fprintf(stderr, "%s: cannot allocate 2 x %zu bytes\n", prog.name, len);
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

static const char *socket_name(const struct kbench_opts *o)
{
	if (o->socket)
		return o->socket;
	return getenv("KCOLL_SOCKET") ? getenv("KCOLL_SOCKET") : KCOLL_DEFAULT_SOCKET;
}

static void print_header(const struct kbench_opts *o, const struct bench_env *env)
{
	char about[1024];

	if (o->b.coll == BENCH_MEMCPY)
		snprintf(about, sizeof(about), "one process, plain memcpy on %s (no daemon)",
			 env->host);
	else
		snprintf(about, sizeof(about), "libkcoll %s on %s, socket %s", kcoll_version(),
			 env->host, socket_name(o));
	bench_print_header(&o->b, env, about);
}

/* ---- parent --------------------------------------------------------- */

static void parse_args(int argc, char **argv, struct kbench_opts *o)
{
	static const struct bench_half_conv half = {
		.f16_to_f32 = kcoll_f16_to_f32,
		.f32_to_f16 = kcoll_f32_to_f16,
		.bf16_to_f32 = kcoll_bf16_to_f32,
		.f32_to_bf16 = kcoll_f32_to_bf16,
	};

	*o = (struct kbench_opts){ .dtype = KCOLL_F32, .op = KCOLL_SUM };
	bench_opts_init(&o->b, 2);
	o->b.half = &half;
	bench_parse_args(&prog, argc, argv, &o->b, o);
	if (o->b.check && o->b.nranks > BENCH_MAX_CHECK_RANKS)
		bench_usage_error(&prog, "-c 1 supports at most %d ranks (exact check values); use -c 0",
				  BENCH_MAX_CHECK_RANKS);
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
				fprintf(stderr, "%s: rank %d killed by signal %d\n", prog.name, i,
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
	struct kbench_opts o;
	struct bench_env env;
	struct bench_shared *sh;
	kcoll_unique_id_t id;
	struct kcoll *k = NULL;
	pid_t pids[BENCH_MAX_RANKS];
	char host[256] = "unknown";
	long long wrong;
	int nrows, r, rc;

	parse_args(argc, argv, &o);
	gethostname(host, sizeof(host) - 1);
	env = (struct bench_env){ .tool = prog.name, .version = kcoll_version(),
				  .system = o.b.coll == BENCH_MEMCPY ? "memcpy" : "kcoll",
				  .mem = o.mem == MEM_HOST ? "host" : o.mem == MEM_REG ? "reg" : "shm", .host = host };
	nrows = bench_count_rows(&o.b);
	sh = shared_create(nrows, o.b.nranks);
	if (!sh) {
		perror("kcoll-bench: mmap");
		return 1;
	}

	if (o.b.coll != BENCH_MEMCPY) {
		copts.socket_path = o.socket;
		r = kcoll_connect(&copts, &k);
		if (r) {
			fprintf(stderr, "%s: cannot reach kcolld at %s: %s\n", prog.name,
				socket_name(&o), kcoll_strerror(r));
			fprintf(stderr, "%s: is the daemon running? start it with 'kcolld -f -s SOCKET' "
				"and pass -s SOCKET or set KCOLL_SOCKET\n", prog.name);
			return 1;
		}
		r = kcoll_get_unique_id(k, &id);
		if (r) {
			fprintf(stderr, "%s: kcoll_get_unique_id: %s\n", prog.name, kcoll_strerror(r));
			kcoll_disconnect(k);
			return 1;
		}
	}
	if (!o.b.json)
		print_header(&o, &env);
	fflush(stdout);

	if (o.b.coll == BENCH_MEMCPY) {
		rc = memcpy_main(&o.b, sh, nrows) ? 1 : 0;
	} else {
		int started = 0;

		for (; started < o.b.nranks; started++) {
			pids[started] = fork();
			if (pids[started] < 0) {
				perror("kcoll-bench: fork");
				break;
			}
			if (pids[started] == 0)
				_exit(rank_main(&o, &id, started, sh, nrows) ? 1 : 0);
		}
		if (started < o.b.nranks)
			for (int j = 0; j < started; j++)
				kill(pids[j], SIGTERM);
		rc = reap(pids, started) || started < o.b.nranks ? 1 : 0;
		kcoll_disconnect(k);
	}

	wrong = bench_wrong_total(&o.b, sh->rows, sh->nrows_done);
	if (o.b.json)
		bench_print_json(&o.b, &env, sh->rows, sh->nrows_done, rc == 0);
	else
		bench_print_footer(&o.b, sh->rows, sh->nrows_done);
	if (wrong) {
		fprintf(stderr, "%s: %lld wrong elements\n", prog.name, wrong);
		rc = 1;
	}
	if (rc && sh->nrows_done < nrows)
		fprintf(stderr, "%s: stopped after %d of %d sizes\n", prog.name, sh->nrows_done, nrows);
	return rc;
}
