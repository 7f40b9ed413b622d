/* SPDX-License-Identifier: MIT */
/*
 * kcoll-bench: sweep one collective over ranks served by kcolld and print an
 * nccl-tests style table (or one JSON document).
 *
 * Where the ranks run (one mode per process, chosen in parse_args):
 *  - local (default): the parent asks its daemon for a communicator id and
 *    forks -N ranks.
 *  - --hosts H: H * N ranks, rank r on host r / N (block placement), each
 *    started through a launch template: words split on blanks, %h the host
 *    index (--launch, $KCOLL_BENCH_LAUNCH, else
 *    <exe dir>/../../scripts/netns-cluster.sh exec %h). The worker's command
 *    line is appended and the whole exec'd, no shell:
 *        TEMPLATE(h) EXE COLL -b .. -e .. (every bench option) --hosts H -N n
 *                    --worker R --id HEX
 *    Host 0's daemon issues the id, asked through the same template so that
 *    any launcher (ssh as well as the netns cluster) works:
 *        TEMPLATE(0) EXE COLL --print-id            prints "id HEX"
 *  - under mpirun or a PMI launcher (OMPI_COMM_WORLD_RANK/SIZE or
 *    PMI_RANK/SIZE set, no --worker): each process is a rank; rank 0 gets the
 *    id and publishes it in --id-file PATH (PATH.tmp.PID, then rename), the
 *    others poll for it; rank 0 prints the results. MPI is not linked.
 *
 * Every rank connects to its daemon, joins, all-gathers the ranks' host names
 * (uname nodename), and for every size runs: an optional checked pass,
 * warmup, a barrier, timed iterations (each submitted and waited for, so the
 * mean includes the full round trip), then an all-gather of every rank's mean
 * and wrong count, from which rank 0 takes the slowest mean and the total.
 * Every wait is bounded: KCOLL_TIMEOUT_MS (the daemon's hang timeout) plus
 * KB_WAIT_SLACK_MS per operation. `kcoll-bench memcpy` times plain memcpy in
 * one process as a DRAM reference for the same table.
 *
 * Forked and launched ranks report to the parent through their stdout (one
 * pipe per rank), one line per message:
 *   host R NAME                          rank 0: rank R runs on NAME
 *   row K T_OUT T_IN WRONG_OUT WRONG_IN  rank 0: size K, slowest mean (us),
 *                                        wrong elements summed (-1 unchecked)
 *   fail R ERR BLAMED NAME MESSAGE       rank R on NAME failed with errno ERR;
 *                                        BLAMED: the rank kcolld blamed or -1
 *   id HEX                               --print-id
 * The parent prints the table, the JSON and the failures, and when a rank
 * fails or exits non-zero stops the others (SIGTERM to each one's process
 * group, SIGKILL LAUNCH_KILL_GRACE_MS later): launch.c, shared with
 * kcoll-kvbench, starts the children and reads their lines.
 *
 * Options, check values, the table and the JSON document are bench_common's,
 * shared with the MPI and Gloo anchors.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "bench_common.h"
#include "config.h"
#include "launch.h"
#include "reduce.h"

#define KB_MAX_PER_HOST		64	/* -N */
#define KB_MAX_HOSTS		64	/* --hosts */
#define KB_MAX_RANKS		(KB_MAX_PER_HOST * KB_MAX_HOSTS)
#define KB_WAIT_SLACK_MS	30000	/* per op, beyond the daemon's own KCOLL_TIMEOUT_MS */
#define KB_PROGRESS_AFTER_S	2.0	/* sweeps shorter than this print no tty progress */
#define KB_NAME_BYTES		64	/* a host name in the exchange, NUL included */

enum kb_mode { MODE_LOCAL, MODE_HOSTS, MODE_MPI, MODE_WORKER, MODE_PRINT_ID };

/* The shared options and what only kcoll-bench has. */
struct kbench_opts {
	struct bench_opts b;
	enum kcoll_dtype dtype;		/* b.dtype and b.op as kcoll numbers them */
	enum kcoll_redop op;
	enum { MEM_SHM, MEM_HOST, MEM_REG } mem;
	const char *socket;
	enum kb_mode mode;
	int hosts;			/* --hosts, 0 without; b.nranks = max(hosts, 1) x per_host */
	int per_host;			/* -N */
	bool n_given;			/* -N on the command line */
	const char *launch;		/* --launch */
	const char *id_file;		/* --id-file */
	bool progress;			/* --progress */
	int rank;			/* MODE_WORKER (--worker), MODE_MPI (the launcher's) */
	kcoll_unique_id_t id;		/* MODE_WORKER (--id) */
	bool have_id;
	const char *launcher;		/* MODE_MPI: which environment named the rank */
};

/* What each rank contributes per size (all-gathered). */
struct rank_stat {
	double time_us[2];
	int64_t wrong[2];		/* -1: not checked */
};

/* The printing side: the parent of forked or launched ranks, or rank 0 under mpirun. */
struct report {
	const struct kbench_opts *o;
	struct bench_env env;
	struct bench_row *rows;
	int nrows, nrows_done;
	char (*names)[KB_NAME_BYTES];	/* per rank; names_ptr[r] NULL until known */
	const char **names_ptr;
	double start_us;
	bool tty_shown;
};

/* What one rank needs to run the collective. */
struct bench_rank {
	const struct kbench_opts *o;
	struct kcoll *k;
	struct kcoll_comm *comm;
	int rank;
	int wait_ms;
	void *send, *recv;
	char *xbuf;			/* exchanges: KB_NAME_BYTES out, then nranks slots in */
	struct report *rep;		/* rank 0 under mpirun: print here; else NULL */
};

enum {
	OPT_MEM = BENCH_OPT_PROG, OPT_HOSTS, OPT_LAUNCH, OPT_ID_FILE, OPT_PROGRESS,
	OPT_WORKER, OPT_ID, OPT_PRINT_ID,
};

static void usage(FILE *f);
static void parse_opt(const struct bench_prog *p, void *ctx, struct bench_opts *o, int c,
		      const char *arg);

static const struct option longopts[] = {
	BENCH_LONGOPTS,
	{ "socket", required_argument, NULL, 's' },
	{ "mem", required_argument, NULL, OPT_MEM },
	{ "hosts", required_argument, NULL, OPT_HOSTS },
	{ "launch", required_argument, NULL, OPT_LAUNCH },
	{ "id-file", required_argument, NULL, OPT_ID_FILE },
	{ "progress", no_argument, NULL, OPT_PROGRESS },
	/* hidden: what the parent of a --hosts run passes on */
	{ "worker", required_argument, NULL, OPT_WORKER },
	{ "id", required_argument, NULL, OPT_ID },
	{ "print-id", no_argument, NULL, OPT_PRINT_ID },
	{ 0 }
};

/* Not const: under mpirun only rank 0 prints usage errors (quiet). */
static struct bench_prog prog = {
	.name = "kcoll-bench",
	.usage = usage,
	.with_memcpy = true,
	.shortopts = BENCH_SHORTOPTS "s:",
	.longopts = longopts,
	.parse_opt = parse_opt,
};

/* This process's host name (uname nodename), for messages and the JSON. */
static char my_host[KB_NAME_BYTES] = "?";
/* A rank whose parent prints: failures go to stdout as "fail" lines. */
static bool to_parent;

static void usage(FILE *f)
{
	fprintf(f,
"usage: %s allreduce|reducescatter|allgather|broadcast|memcpy [options]\n"
"  -N, --nranks N        ranks (forked here), or ranks per host with --hosts [2, 1]\n"
BENCH_USAGE_SWEEP
"  -d, --datatype T      f32 f64 f16 bf16 i8 u8 i32 u32 i64 u64  [f32]\n"
"  -o, --op OP           sum prod min max avg                    [sum]\n"
"  -r, --root R          broadcast root                          [0]\n"
"      --mem shm|host|reg  kcoll_mem_alloc'ed (zero-copy), malloc'ed (one copy), or\n"
"                        malloc'ed and kcoll_mem_register'ed (zero-copy with kcoll.ko) [shm]\n"
"      --inplace         also measure in place (extra columns)\n"
"      --json            print one JSON document instead of the table\n"
"      --progress        one line per size on stderr (else only on a tty, after 2 s)\n"
"  -s, --socket PATH     kcolld socket [$KCOLL_SOCKET or " KCOLL_DEFAULT_SOCKET "];\n"
"                        with --hosts every rank uses it (one daemon: for testing)\n"
"  -h, --help            this text\n"
"Across hosts:\n"
"      --hosts H         run H x N ranks, rank r on host r / N, each started by\n"
"      --launch TMPL     TMPL with %%h the host index, split on blanks, the rank's\n"
"                        command line appended, exec'd (no shell)\n"
"                        [$KCOLL_BENCH_LAUNCH or <exe dir>/../../scripts/netns-cluster.sh exec %%h]\n"
"Under mpirun (OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/SIZE set) each process is a rank:\n"
"      --id-file PATH    rank 0 leaves the communicator id there for the others\n"
"                        (on a file system that every rank sees)\n"
"Exit status: 0 success, 1 wrong results or a failed run, 2 bad usage.\n",
		prog.name);
}

static int nranks_of(const struct kbench_opts *ko)
{
	return (ko->hosts ? ko->hosts : 1) * ko->per_host;
}

/* -N, -d, -o, -r and kcoll-bench's own options. */
static void parse_opt(const struct bench_prog *p, void *ctx, struct bench_opts *o, int c,
		      const char *arg)
{
	struct kbench_opts *ko = ctx;

	switch (c) {
	case 'N':
		ko->per_host = bench_parse_long(p, arg, "-N", 1, KB_MAX_PER_HOST);
		ko->n_given = true;
		o->nranks = nranks_of(ko);
		break;
	case OPT_HOSTS:
		ko->hosts = bench_parse_long(p, arg, "--hosts", 1, KB_MAX_HOSTS);
		if (!ko->n_given)
			ko->per_host = 1;
		o->nranks = nranks_of(ko);
		break;
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
	case 'r': o->root = bench_parse_long(p, arg, "-r", 0, KB_MAX_RANKS - 1); break;
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
	case OPT_LAUNCH: ko->launch = arg; break;
	case OPT_ID_FILE: ko->id_file = arg; break;
	case OPT_PROGRESS: ko->progress = true; break;
	case OPT_WORKER:
		ko->mode = MODE_WORKER;
		ko->rank = bench_parse_long(p, arg, "--worker", 0, KB_MAX_RANKS - 1);
		break;
	case OPT_ID:
		if (launch_hex_decode(arg, ko->id.bytes, sizeof(ko->id.bytes)))
			bench_usage_error(p, "--id takes %zu hex digits", 2 * sizeof(ko->id.bytes));
		ko->have_id = true;
		break;
	case OPT_PRINT_ID: ko->mode = MODE_PRINT_ID; break;
	}
}

/* KCOLL_TIMEOUT_MS (libkcoll's and kcolld's hang timeout), capped to fit an int with slack. */
static int timeout_ms(void)
{
	long long t = kcoll_knob_ll("KCOLL_TIMEOUT_MS");

	return t > INT_MAX - KB_WAIT_SLACK_MS ? INT_MAX - KB_WAIT_SLACK_MS : (int)t;
}

static size_t row_bytes(const struct bench_opts *o, int k)
{
	size_t s = o->min_bytes;

	while (k-- > 0)
		s *= o->factor;
	return s;
}

static const char *socket_name(const struct kbench_opts *o)
{
	if (o->socket)
		return o->socket;
	return getenv("KCOLL_SOCKET") ? getenv("KCOLL_SOCKET") : KCOLL_DEFAULT_SOCKET;
}

static const char *mem_name(const struct kbench_opts *o)
{
	return o->mem == MEM_HOST ? "host" : o->mem == MEM_REG ? "reg" : "shm";
}

/* ---- the report (parent, or rank 0 under mpirun) ---------------------- */

static int report_init(struct report *rep, const struct kbench_opts *o)
{
	int n = o->b.nranks;

	*rep = (struct report){ .o = o, .nrows = bench_count_rows(&o->b), .start_us = launch_now_us() };
	rep->rows = calloc(rep->nrows, sizeof(*rep->rows));
	rep->names = calloc(n, sizeof(*rep->names));
	rep->names_ptr = calloc(n, sizeof(*rep->names_ptr));
	if (!rep->rows || !rep->names || !rep->names_ptr)
		return -ENOMEM;
	rep->env = (struct bench_env){ .tool = prog.name, .version = kcoll_version(),
				       .system = o->b.coll == BENCH_MEMCPY ? "memcpy" : "kcoll",
				       .mem = mem_name(o), .host = my_host,
				       .rank_hosts = rep->names_ptr };
	return 0;
}

static void report_free(struct report *rep)
{
	free(rep->rows);
	free(rep->names);
	free(rep->names_ptr);
}

static void report_host(struct report *rep, int r, const char *name)
{
	if (r < 0 || r >= rep->o->b.nranks)
		return;
	snprintf(rep->names[r], KB_NAME_BYTES, "%s", name);
	rep->names_ptr[r] = rep->names[r];
}

static void progress(struct report *rep, size_t bytes)
{
	const struct bench_opts *o = &rep->o->b;
	double s = (launch_now_us() - rep->start_us) / 1e6;
	int done = rep->nrows_done;

	if (rep->o->progress) {
		fprintf(stderr, "%s: %s %zu bytes done (%d/%d sizes, %.1f s)\n", prog.name,
			bench_coll_name(o->coll), bytes, done, rep->nrows, s);
		return;
	}
	if (!isatty(STDERR_FILENO) || (!o->json && isatty(STDOUT_FILENO)))
		return;
	if (!rep->tty_shown && s < KB_PROGRESS_AFTER_S)
		return;
	rep->tty_shown = true;
	fprintf(stderr, "\r%s %s: %d/%d sizes done (%zu bytes)%s", prog.name,
		bench_coll_name(o->coll), done, rep->nrows, bytes, done == rep->nrows ? "\n" : "");
}

/* Size k is done: st holds the slowest mean and the total wrong count. */
static void report_row(struct report *rep, int k, const struct rank_stat *st)
{
	const struct bench_opts *o = &rep->o->b;
	size_t bytes = row_bytes(o, k);
	struct bench_row *row;
	struct bench_counts n;

	if (k != rep->nrows_done || k >= rep->nrows)
		return;		/* out of order: cannot come from rank 0 */
	row = &rep->rows[k];
	bench_counts(o, bytes, &n);
	row->bytes = n.bytes;
	row->count = n.param;
	for (int c = 0; c <= (int)o->inplace; c++)
		bench_row_set(o, row, c, st->time_us[c], st->wrong[c]);
	rep->nrows_done = k + 1;
	if (!o->json)
		bench_print_row(o, row);
	progress(rep, bytes);
}

/* hosts and ranks_per_host from the names: under mpirun nobody told us. */
static void report_topology(struct report *rep)
{
	const struct kbench_opts *o = rep->o;
	int n = o->b.nranks, hosts = 0, per = -1;

	if (o->mode != MODE_MPI) {
		rep->env.hosts = o->hosts ? o->hosts : 1;
		rep->env.ranks_per_host = o->per_host;
		return;
	}
	for (int r = 0; r < n; r++) {
		int same = 0, first = 1;

		if (!rep->names_ptr[r])
			return;		/* unknown: leave the topology out */
		for (int q = 0; q < n; q++) {
			if (!strcmp(rep->names[q], rep->names[r])) {
				same++;
				first &= q >= r;
			}
		}
		hosts += first;
		per = per < 0 || per == same ? same : 0;
	}
	rep->env.hosts = hosts;
	rep->env.ranks_per_host = per;
}

/* The closing lines or the JSON document, and the exit status. */
static int report_finish(struct report *rep, bool ok)
{
	const struct bench_opts *o = &rep->o->b;
	long long wrong = bench_wrong_total(o, rep->rows, rep->nrows_done);
	bool complete = ok && rep->nrows_done == rep->nrows;

	if (o->coll != BENCH_MEMCPY)
		report_topology(rep);
	if (o->json)
		bench_print_json(o, &rep->env, rep->rows, rep->nrows_done, complete);
	else
		bench_print_footer(o, rep->rows, rep->nrows_done);
	fflush(stdout);
	if (wrong)
		fprintf(stderr, "%s: %lld wrong elements\n", prog.name, wrong);
	if (rep->nrows_done < rep->nrows)
		fprintf(stderr, "%s: stopped after %d of %d sizes\n", prog.name, rep->nrows_done,
			rep->nrows);
	return complete && !wrong ? 0 : 1;
}

static void print_header(const struct kbench_opts *o, const struct bench_env *env,
			 const char *launch)
{
	char about[1024];

	if (o->b.coll == BENCH_MEMCPY)
		snprintf(about, sizeof(about), "one process, plain memcpy on %s (no daemon)",
			 env->host);
	else if (o->mode == MODE_HOSTS)
		snprintf(about, sizeof(about), "libkcoll %s, %d hosts x %d ranks (rank r on host "
			 "r / %d), launched by '%s'%s%s", kcoll_version(), o->hosts, o->per_host,
			 o->per_host, launch, o->socket ? ", every rank on socket " : "",
			 o->socket ? o->socket : "");
	else if (o->mode == MODE_MPI)
		snprintf(about, sizeof(about), "libkcoll %s, %d ranks under %s, rank 0 on %s, "
			 "socket %s", kcoll_version(), o->b.nranks, o->launcher, env->host,
			 socket_name(o));
	else
		snprintf(about, sizeof(about), "libkcoll %s on %s, socket %s", kcoll_version(),
			 env->host, socket_name(o));
	bench_print_header(&o->b, env, about);
	fflush(stdout);
}

/* ---- one rank ------------------------------------------------------- */

/* A failure of rank 'rank': a "fail" line for the parent, or a message on stderr. */
static int __attribute__((format(printf, 4, 5)))
say_fail(int rank, int err, int blamed, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (to_parent) {
		for (char *p = msg; *p; p++)
			if (*p == '\n')
				*p = ' ';
		printf("fail %d %d %d %s %s: %s\n", rank, err, blamed, my_host, msg,
		       kcoll_strerror(err));
		fflush(stdout);
	} else {
		fprintf(stderr, "%s: rank %d (%s): %s: %s\n", prog.name, rank, my_host, msg,
			kcoll_strerror(err));
	}
	return err;
}

/*
 * In place follows kcoll.h (as NCCL): recv holds the whole vector, and this
 * rank's slice of it is the all-gather input or the reduce-scatter output.
 */
static void *rank_slice(const struct bench_rank *b, size_t param)
{
	return bench_rank_slice(&b->o->b, b->recv, b->rank, param);
}

static int wait_req(struct bench_rank *b, struct kcoll_req *req, const char *what)
{
	int r = kcoll_wait(req, b->wait_ms);

	if (r == -ETIMEDOUT)
		return say_fail(b->rank, r, -1, "%s still pending after %d s", what,
				b->wait_ms / 1000);
	if (r) {
		int blamed = kcoll_req_err_rank(req);

		if (blamed >= 0)
			return say_fail(b->rank, r, blamed, "%s failed (daemon blames rank %d)",
					what, blamed);
		return say_fail(b->rank, r, -1, "%s failed", what);
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
		return say_fail(b->rank, r, -1, "submitting %s of %zu elements",
				bench_coll_name(o->b.coll), param);
	return wait_req(b, req, bench_coll_name(o->b.coll));
}

static int barrier(struct bench_rank *b)
{
	struct kcoll_req *req;
	int r = kcoll_barrier(b->comm, &req);

	if (r)
		return say_fail(b->rank, r, -1, "submitting a barrier");
	return wait_req(b, req, "barrier");
}

/* All-gather len bytes (at most KB_NAME_BYTES) of every rank; rank r's are at *all + r * len. */
static int exchange(struct bench_rank *b, const void *mine, size_t len, const char **all,
		    const char *what)
{
	struct kcoll_req *req;
	int r;

	memcpy(b->xbuf, mine, len);
	r = kcoll_allgather(b->comm, b->xbuf, b->xbuf + KB_NAME_BYTES, len, KCOLL_U8, &req);
	if (r)
		return say_fail(b->rank, r, -1, "submitting the all-gather of %s", what);
	r = wait_req(b, req, what);
	*all = b->xbuf + KB_NAME_BYTES;
	return r;
}

/* One column (out of place or in place) at one size: check, warm up, time. */
static int measure(struct bench_rank *b, bool inplace, const struct bench_counts *n,
		   struct rank_stat *st)
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
	t0 = launch_now_us();
	for (int i = 0; i < o->iters; i++) {
		r = run_coll(b, inplace, n->param);
		if (r)
			return r;
	}
	st->time_us[inplace] = (launch_now_us() - t0) / o->iters;
	st->wrong[inplace] = wrong;
	return 0;
}

/* Rank 0: every rank's host name, to the report or the parent. */
static void emit_hosts(struct bench_rank *b, const char *all)
{
	for (int r = 0; r < b->o->b.nranks; r++) {
		char name[KB_NAME_BYTES];

		memcpy(name, all + (size_t)r * KB_NAME_BYTES, KB_NAME_BYTES);
		name[KB_NAME_BYTES - 1] = '\0';
		if (b->rep)
			report_host(b->rep, r, name);
		else
			printf("host %d %s\n", r, name[0] ? name : "?");
	}
	fflush(stdout);
}

/* Rank 0: size k from every rank's figures (the slowest mean, the wrong total). */
static void emit_row(struct bench_rank *b, int k, const char *all)
{
	struct rank_stat tot = { .wrong = { 0, 0 } };

	for (int r = 0; r < b->o->b.nranks; r++) {
		struct rank_stat s;

		memcpy(&s, all + (size_t)r * sizeof(s), sizeof(s));
		for (int c = 0; c < 2; c++) {
			if (s.time_us[c] > tot.time_us[c])
				tot.time_us[c] = s.time_us[c];
			tot.wrong[c] = s.wrong[c] < 0 || tot.wrong[c] < 0 ? -1 :
				       tot.wrong[c] + s.wrong[c];
		}
	}
	if (b->rep) {
		report_row(b->rep, k, &tot);
		return;
	}
	printf("row %d %.17g %.17g %lld %lld\n", k, tot.time_us[0], tot.time_us[1],
	       (long long)tot.wrong[0], (long long)tot.wrong[1]);
	fflush(stdout);
}

static int alloc_buffers(struct bench_rank *b, size_t bytes)
{
	struct kcoll *k = b->k;
	int r;

	if (b->o->mem == MEM_SHM) {
		r = kcoll_mem_alloc(k, bytes, &b->send);
		if (!r)
			r = kcoll_mem_alloc(k, bytes, &b->recv);
		return r ? say_fail(b->rank, r, -1, "kcoll_mem_alloc(%zu)", bytes) : 0;
	}
	bytes = (bytes + 4095) & ~(size_t)4095;
	b->send = aligned_alloc(4096, bytes);
	b->recv = aligned_alloc(4096, bytes);
	if (!b->send || !b->recv)
		return say_fail(b->rank, -ENOMEM, -1, "allocating 2 x %zu bytes", bytes);
	if (b->o->mem == MEM_REG) {
		r = kcoll_mem_register(k, b->send, bytes);
		if (!r)
			r = kcoll_mem_register(k, b->recv, bytes);
		if (r)
			return say_fail(b->rank, r, -1, "kcoll_mem_register(%zu)%s", bytes,
					r == -ENODEV ? ": --mem reg needs kcoll.ko loaded" : "");
	}
	return 0;
}

static void free_buffers(struct bench_rank *b)
{
	struct kcoll *k = b->k;

	if (b->o->mem == MEM_SHM) {
		if (b->recv)
			kcoll_mem_free(k, b->recv);
		if (b->send)
			kcoll_mem_free(k, b->send);
		return;
	}
	if (b->o->mem == MEM_REG) {
		/* a buffer that was never registered: -EINVAL, harmless */
		if (b->send)
			kcoll_mem_deregister(k, b->send);
		if (b->recv)
			kcoll_mem_deregister(k, b->recv);
	}
	free(b->send);
	free(b->recv);
}

/* One rank, connected as k; rep: rank 0 under mpirun prints there. 0 or a negative errno. */
static int rank_main(const struct kbench_opts *o, struct kcoll *k, const kcoll_unique_id_t *id,
		     int rank, struct report *rep)
{
	struct bench_rank b = { .o = o, .k = k, .rank = rank, .rep = rep,
				.wait_ms = timeout_ms() + KB_WAIT_SLACK_MS };
	int nranks = o->b.nranks, nrows = bench_count_rows(&o->b);
	size_t elt = bench_dtype_size(o->b.dtype);
	char name[KB_NAME_BYTES] = { 0 };
	struct bench_counts n;
	const char *all;
	int r;

	r = kcoll_comm_init_rank(k, id, nranks, rank, &b.comm);
	if (r)
		return say_fail(rank, r, -1, "joining a %d-rank communicator", nranks);
	r = kcoll_mem_alloc(k, (size_t)KB_NAME_BYTES * (nranks + 1), (void **)&b.xbuf);
	if (r) {
		say_fail(rank, r, -1, "kcoll_mem_alloc(%zu)", (size_t)KB_NAME_BYTES * (nranks + 1));
		goto err_destroy;
	}
	snprintf(name, sizeof(name), "%s", my_host);
	r = exchange(&b, name, KB_NAME_BYTES, &all, "host names");
	if (r)
		goto err_free;
	if (rank == 0)
		emit_hosts(&b, all);

	bench_counts(&o->b, o->b.max_bytes, &n);
	/* Both buffers hold the larger side, so in place fits in recv. */
	r = alloc_buffers(&b, n.bytes);
	if (r)
		goto err_free;
	/* Valid, finite inputs even when unchecked: denormals or NaNs would time differently. */
	bench_fill_input(&o->b, b.send, rank, n.bytes / elt);
	bench_fill_input(&o->b, b.recv, rank, n.bytes / elt);

	for (int row = 0; row < nrows; row++) {
		struct rank_stat st = { .wrong = { -1, -1 } };

		bench_counts(&o->b, row_bytes(&o->b, row), &n);
		for (int ip = 0; ip <= (int)o->b.inplace; ip++) {
			r = measure(&b, ip, &n, &st);
			if (r)
				goto err_free;
		}
		r = exchange(&b, &st, sizeof(st), &all, "timings");
		if (r)
			goto err_free;
		if (rank == 0)
			emit_row(&b, row, all);
	}
	r = 0;
err_free:
	free_buffers(&b);
	if (b.xbuf)
		kcoll_mem_free(k, b.xbuf);
err_destroy:
	kcoll_comm_destroy(b.comm);
	return r;
}

static int connect_daemon(const struct kbench_opts *o, struct kcoll **k)
{
	struct kcoll_connect_opts copts = { .size = sizeof(copts), .socket_path = o->socket };

	return kcoll_connect(&copts, k);
}

/* ---- memcpy reference ------------------------------------------------ */

static int memcpy_main(const struct kbench_opts *ko, struct report *rep)
{
	const struct bench_opts *o = &ko->b;
	size_t len = (o->max_bytes + 4095) & ~(size_t)4095;
	char *src = aligned_alloc(4096, len), *dst = aligned_alloc(4096, len);

	if (!o->json)
		print_header(ko, &rep->env, NULL);
	if (!src || !dst) {
		fprintf(stderr, "%s: cannot allocate 2 x %zu bytes\n", prog.name, len);
		free(src);
		free(dst);
		return report_finish(rep, false);
	}
	memset(src, 1, len);
	memset(dst, 2, len);
	for (int row = 0; row < rep->nrows; row++) {
		size_t bytes = row_bytes(o, row);
		struct rank_stat st = { .wrong = { -1, -1 } };
		double t0;

		for (int i = 0; i < o->warmup; i++)
			memcpy(dst, src, bytes);
		t0 = launch_now_us();
		for (int i = 0; i < o->iters; i++) {
			memcpy(dst, src, bytes);
			/* keep the copies: the compiler may not drop or merge them */
			__asm__ volatile("" : : "r"(dst) : "memory");
		}
		st.time_us[0] = st.time_us[1] = (launch_now_us() - t0) / o->iters;
		report_row(rep, row, &st);
	}
	free(src);
	free(dst);
	return report_finish(rep, true);
}

/* ---- children: forked ranks, launched workers, the id helper ------------ */

/* The parent's side of a run (launch.c does the processes). */
struct job {
	const struct kbench_opts *o;
	struct report *rep;		/* NULL for the id helper */
	struct launch l;		/* child i is rank i, or the id helper */
	bool id_helper;
	kcoll_unique_id_t id;		/* the id helper's answer */
	bool have_id;
};

/* "rank 3 (host 1, kc-h1)" or, for local ranks, "rank 3". */
static void rank_label(const struct job *j, int rank, const char *name, char *out, size_t len)
{
	if (rank < 0)
		snprintf(out, len, "the id helper on host 0");
	else if (j->o->mode != MODE_HOSTS)
		snprintf(out, len, "rank %d", rank);
	else if (name)
		snprintf(out, len, "rank %d (host %d, %s)", rank, rank / j->o->per_host, name);
	else
		snprintf(out, len, "rank %d (host %d)", rank, rank / j->o->per_host);
}

/* Child i's rank; -1: the id helper. */
static int job_rank(const struct job *j, int i)
{
	return j->id_helper ? -1 : i;
}

static void job_label(struct launch *l, int i, char *out, size_t len)
{
	struct job *j = l->ctx;
	int rank = job_rank(j, i);

	rank_label(j, rank, j->rep && rank >= 0 ? j->rep->names_ptr[rank] : NULL, out, len);
}

/* One line from child i. */
static void job_line(struct launch *l, int i, char *line)
{
	struct job *j = l->ctx;
	char label[160], name[KB_NAME_BYTES];
	int r, err, blamed, off = 0, rank = job_rank(j, i);
	struct rank_stat st;
	long long w0, w1;

	if (rank < 0) {
		char hex[2 * KCOLL_UNIQUE_ID_BYTES + 1];

		if (sscanf(line, "id %256s", hex) == 1 &&
		    !launch_hex_decode(hex, j->id.bytes, sizeof(j->id.bytes))) {
			j->have_id = true;
			return;
		}
	} else if (rank == 0 && sscanf(line, "row %d %lf %lf %lld %lld", &r, &st.time_us[0],
				       &st.time_us[1], &w0, &w1) == 5) {
		st.wrong[0] = w0;
		st.wrong[1] = w1;
		report_row(j->rep, r, &st);
		return;
	} else if (rank == 0 && sscanf(line, "host %d %63s", &r, name) == 2) {
		report_host(j->rep, r, name);
		return;
	} else if (sscanf(line, "fail %d %d %d %63s %n", &r, &err, &blamed, name, &off) == 4 &&
		   off > 0) {
		rank_label(j, rank, name, label, sizeof(label));
		fprintf(stderr, "%s: %s: %s\n", prog.name, label, line + off);
		launch_child_failed(l, i);
		return;
	}
	rank_label(j, rank, NULL, label, sizeof(label));
	fprintf(stderr, "%s: %s says: %s\n", prog.name, label, line);
}

static const struct launch_ops job_ops = {
	.line = job_line,
	.label = job_label,
};

/* Room for n children: 0, or -1 (said why). */
static int job_init(struct job *j, const struct kbench_opts *o, struct report *rep, int n)
{
	*j = (struct job){ .o = o, .rep = rep, .id_helper = !rep };
	if (launch_init(&j->l, n, prog.name, &job_ops, j, 0)) {
		fprintf(stderr, "%s: out of memory\n", prog.name);
		return -1;
	}
	j->l.noun = "rank";
	return 0;
}

/* ---- local ranks (forked) ------------------------------------------- */

struct local_rank {
	const struct kbench_opts *o;
	const kcoll_unique_id_t *id;
	int rank;
};

static int local_rank(void *arg)
{
	const struct local_rank *lr = arg;
	struct kcoll *k;
	int r;

	to_parent = true;
	r = connect_daemon(lr->o, &k);
	if (r)
		return say_fail(lr->rank, r, -1, "connecting to kcolld at %s", socket_name(lr->o));
	r = rank_main(lr->o, k, lr->id, lr->rank, NULL);
	kcoll_disconnect(k);
	return r;
}

static int local_main(const struct kbench_opts *o, struct report *rep)
{
	int n = o->b.nranks, started = 0, r;
	struct local_rank *lr = calloc(n, sizeof(*lr));
	kcoll_unique_id_t id;
	struct kcoll *k = NULL;
	struct job j;

	if (!lr) {
		fprintf(stderr, "%s: out of memory\n", prog.name);
		return 1;
	}
	if (job_init(&j, o, rep, n))
		goto err_free;
	r = connect_daemon(o, &k);
	if (r) {
		fprintf(stderr, "%s: cannot reach kcolld at %s: %s\n", prog.name, socket_name(o),
			kcoll_strerror(r));
		fprintf(stderr, "%s: is the daemon running? start it with 'kcolld -f -s SOCKET' "
			"and pass -s SOCKET or set KCOLL_SOCKET\n", prog.name);
		goto err_launch;
	}
	r = kcoll_get_unique_id(k, &id);
	if (r) {
		fprintf(stderr, "%s: kcoll_get_unique_id: %s\n", prog.name, kcoll_strerror(r));
		goto err_disconnect;
	}
	if (!o->b.json)
		print_header(o, &rep->env, NULL);
	launch_catch_signals(true);
	for (; started < n; started++) {
		lr[started] = (struct local_rank){ .o = o, .id = &id, .rank = started };
		r = launch_spawn(&j.l, started, NULL, local_rank, &lr[started]);
		if (r) {
			fprintf(stderr, "%s: fork: %s\n", prog.name, strerror(-r));
			launch_fail(&j.l);
			break;
		}
	}
	r = launch_run(&j.l);
	kcoll_disconnect(k);
	launch_free(&j.l);
	free(lr);
	r = report_finish(rep, !r && started == n);
	launch_restore_signal();
	return r;

err_disconnect:
	kcoll_disconnect(k);
err_launch:
	launch_free(&j.l);
err_free:
	free(lr);
	return 1;
}

/* ---- --hosts: launched workers ---------------------------------------- */

/* Every option a worker needs to run the same sweep, as it parses them. */
static void av_bench(struct launch_argv *a, const struct kbench_opts *o)
{
	const struct bench_opts *b = &o->b;

	launch_argv_add(a, bench_coll_name(b->coll));
	launch_argv_add(a, "-b");
	launch_argv_addf(a, "%zu", b->min_bytes);
	launch_argv_add(a, "-e");
	launch_argv_addf(a, "%zu", b->max_bytes);
	launch_argv_add(a, "-f");
	launch_argv_addf(a, "%lu", b->factor);
	launch_argv_add(a, "-n");
	launch_argv_addf(a, "%d", b->iters);
	launch_argv_add(a, "-w");
	launch_argv_addf(a, "%d", b->warmup);
	launch_argv_add(a, "-c");
	launch_argv_addf(a, "%d", b->check);
	launch_argv_add(a, "-d");
	launch_argv_add(a, kcoll_dtype_name(o->dtype));
	launch_argv_add(a, "-o");
	launch_argv_add(a, kcoll_redop_name(o->op));
	launch_argv_add(a, "-r");
	launch_argv_addf(a, "%d", b->root);
	launch_argv_add(a, "--mem");
	launch_argv_add(a, mem_name(o));
	if (b->inplace)
		launch_argv_add(a, "--inplace");
	launch_argv_add(a, "--hosts");
	launch_argv_addf(a, "%d", o->hosts);
	launch_argv_add(a, "-N");
	launch_argv_addf(a, "%d", o->per_host);
	if (o->socket) {
		launch_argv_add(a, "-s");
		launch_argv_add(a, o->socket);
	}
}

/*
 * The launch template: --launch, $KCOLL_BENCH_LAUNCH, or the netns cluster's
 * exec next to this build (build/bin/../../scripts). NULL with a message if none.
 */
static char *launch_template(const struct kbench_opts *o, const char *self)
{
	const char *t = o->launch ? o->launch : kcoll_knob_str("KCOLL_BENCH_LAUNCH");
	char path[PATH_MAX + 64], *real, *out;

	if (t && *t)
		return strdup(t);
	snprintf(path, sizeof(path), "%s", self);
	*strrchr(path, '/') = '\0';
	strcat(path, "/../../scripts/netns-cluster.sh");
	real = realpath(path, NULL);
	if (!real || access(real, X_OK)) {
		fprintf(stderr, "%s: --hosts needs a way to start a command on each host: pass "
			"--launch TEMPLATE (or set KCOLL_BENCH_LAUNCH), e.g. --launch 'ssh host%%h' or "
			"--launch 'scripts/netns-cluster.sh exec %%h'; the default %s does not exist\n",
			prog.name, path);
		free(real);
		return NULL;
	}
	if (strpbrk(real, " \t")) {
		fprintf(stderr, "%s: the default launcher's path '%s' has a blank in it: pass "
			"--launch with a path without one\n", prog.name, real);
		free(real);
		return NULL;
	}
	if (asprintf(&out, "%s exec %%h", real) < 0)
		out = NULL;
	free(real);
	return out;
}

/* TEMPLATE(0) SELF COLL --print-id: host 0's daemon's id. 0 or -1 (said why). */
static int fetch_id(const struct kbench_opts *o, const char *tmpl, const char *self,
		    kcoll_unique_id_t *id)
{
	struct launch_argv a = { 0 };
	char late[64];
	struct job j;
	int r;

	launch_argv_template(&a, tmpl, 0);
	launch_argv_add(&a, self);
	launch_argv_add(&a, bench_coll_name(o->b.coll));
	launch_argv_add(&a, "--print-id");
	if (o->socket) {
		launch_argv_add(&a, "-s");
		launch_argv_add(&a, o->socket);
	}
	if (a.oom || !a.n) {
		fprintf(stderr, "%s: bad launch template '%s'\n", prog.name, tmpl);
		launch_argv_free(&a);
		return -1;
	}
	if (job_init(&j, o, NULL, 1)) {
		launch_argv_free(&a);
		return -1;
	}
	r = launch_spawn(&j.l, 0, a.v, NULL, NULL);
	launch_argv_free(&a);
	if (r) {
		fprintf(stderr, "%s: fork: %s\n", prog.name, strerror(-r));
		launch_free(&j.l);
		return -1;
	}
	/* Connecting and the id take a few ms; a launcher (ssh) may take seconds. */
	snprintf(late, sizeof(late), "no answer in time (KCOLL_TIMEOUT_MS %d)", timeout_ms());
	j.l.deadline = launch_now_us() + timeout_ms() * 1e3;
	j.l.deadline_msg = late;
	r = launch_run(&j.l);
	launch_free(&j.l);
	if (r || !j.have_id) {
		if (!launch_stop_signal)
			fprintf(stderr, "%s: no communicator id from host 0's daemon through "
				"'%s' (run '%s' by hand to see why)\n", prog.name, tmpl, tmpl);
		return -1;
	}
	*id = j.id;
	return 0;
}

static int hosts_main(const struct kbench_opts *o, struct report *rep)
{
	int n = o->b.nranks, started = 0, r = -1;
	char self[PATH_MAX], hex[2 * KCOLL_UNIQUE_ID_BYTES + 1], *tmpl = NULL;
	kcoll_unique_id_t id;
	ssize_t len;
	struct job j;

	if (job_init(&j, o, rep, n))
		return 1;
	len = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (len <= 0) {
		fprintf(stderr, "%s: cannot find myself (/proc/self/exe): %s\n", prog.name,
			strerror(errno));
		goto out;
	}
	self[len] = '\0';
	tmpl = launch_template(o, self);
	if (!tmpl)
		goto out;
	launch_catch_signals(true);
	if (fetch_id(o, tmpl, self, &id))
		goto out;
	launch_hex_encode(id.bytes, sizeof(id.bytes), hex);
	if (!o->b.json)
		print_header(o, &rep->env, tmpl);
	for (; started < n; started++) {
		struct launch_argv a = { 0 };

		launch_argv_template(&a, tmpl, started / o->per_host);
		launch_argv_add(&a, self);
		av_bench(&a, o);
		launch_argv_add(&a, "--worker");
		launch_argv_addf(&a, "%d", started);
		launch_argv_add(&a, "--id");
		launch_argv_add(&a, hex);
		r = a.oom ? -ENOMEM : launch_spawn(&j.l, started, a.v, NULL, NULL);
		launch_argv_free(&a);
		if (r) {
			fprintf(stderr, "%s: starting rank %d: %s\n", prog.name, started, strerror(-r));
			launch_fail(&j.l);
			break;
		}
	}
	r = launch_run(&j.l);
out:
	free(tmpl);
	launch_free(&j.l);
	if (!started) {
		launch_restore_signal();
		return 1;	/* nothing ran: no table to close */
	}
	r = report_finish(rep, !r && started == n);
	launch_restore_signal();
	return r;
}

/* A launched rank: connect to this host's daemon, run, report to the parent. */
static int worker_main(const struct kbench_opts *o)
{
	struct kcoll *k;
	int r;

	to_parent = true;
	r = connect_daemon(o, &k);
	if (r) {
		say_fail(o->rank, r, -1, "cannot reach kcolld at %s", socket_name(o));
		return 1;
	}
	r = rank_main(o, k, &o->id, o->rank, NULL);
	kcoll_disconnect(k);
	return r ? 1 : 0;
}

/* --print-id: this host's daemon's id on stdout, "id HEX". */
static int print_id_main(const struct kbench_opts *o)
{
	char hex[2 * KCOLL_UNIQUE_ID_BYTES + 1];
	kcoll_unique_id_t id;
	struct kcoll *k;
	int r = connect_daemon(o, &k);

	if (r) {
		fprintf(stderr, "%s: on %s: cannot reach kcolld at %s: %s\n", prog.name, my_host,
			socket_name(o), kcoll_strerror(r));
		return 1;
	}
	r = kcoll_get_unique_id(k, &id);
	kcoll_disconnect(k);
	if (r) {
		fprintf(stderr, "%s: on %s: kcoll_get_unique_id: %s\n", prog.name, my_host,
			kcoll_strerror(r));
		return 1;
	}
	launch_hex_encode(id.bytes, sizeof(id.bytes), hex);
	printf("id %s\n", hex);
	return fflush(stdout) ? 1 : 0;
}

/* ---- under mpirun / PMI ------------------------------------------------ */

/*
 * A name for this job that every rank sees, so that an id file left by an
 * earlier job is not taken for this one's; "-" when the launcher has none.
 */
static void job_key(char *out, size_t len)
{
	const char *ns = getenv("PMIX_NAMESPACE"), *ompi = getenv("OMPI_MCA_ess_base_jobid");
	const char *slurm = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");

	if (ns && *ns)
		snprintf(out, len, "pmix:%s", ns);
	else if (ompi && *ompi)
		snprintf(out, len, "ompi:%s", ompi);
	else if (slurm && *slurm)
		snprintf(out, len, "slurm:%s.%s", slurm, step ? step : "");
	else
		snprintf(out, len, "-");
	for (char *p = out; *p; p++)
		if (*p == ' ' || *p == '\t' || *p == '\n')
			*p = '_';
}

/* Rank 0: write "kcoll-bench-id KEY HEX" to PATH.tmp.PID, then rename it to PATH. */
static int id_file_write(const char *path, const kcoll_unique_id_t *id)
{
	char tmp[PATH_MAX], key[256], hex[2 * KCOLL_UNIQUE_ID_BYTES + 1];
	FILE *f;
	int err = 0;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	job_key(key, sizeof(key));
	launch_hex_encode(id->bytes, sizeof(id->bytes), hex);
	f = fopen(tmp, "w");
	if (!f)
		return -errno;
	if (fprintf(f, "kcoll-bench-id %s %s\n", key, hex) < 0)
		err = -EIO;
	if (fclose(f) && !err)
		err = -errno;
	if (!err && rename(tmp, path))
		err = -errno;
	if (err)
		unlink(tmp);
	return err;
}

/* Other ranks: wait (bounded) for this job's id in path. */
static int id_file_read(const char *path, kcoll_unique_id_t *id, int wait_ms)
{
	char key[256], want[256], hex[2 * KCOLL_UNIQUE_ID_BYTES + 1];
	double until = launch_now_us() + wait_ms * 1e3;

	job_key(want, sizeof(want));
	do {
		FILE *f = fopen(path, "r");

		if (f) {
			int n = fscanf(f, "kcoll-bench-id %255s %256s", key, hex);
			bool ours;

			fclose(f);
			ours = n == 2 && (!strcmp(key, want) || !strcmp(want, "-") || !strcmp(key, "-"));
			if (ours && !launch_hex_decode(hex, id->bytes, sizeof(id->bytes)))
				return 0;
		}
		usleep(20000);
	} while (launch_now_us() < until);
	return -ETIMEDOUT;
}

static int mpi_main(const struct kbench_opts *o, struct report *rep)
{
	int rank = o->rank, r;
	kcoll_unique_id_t id;
	struct kcoll *k;

	r = connect_daemon(o, &k);
	if (r) {
		fprintf(stderr, "%s: rank %d (%s): cannot reach kcolld at %s: %s\n", prog.name, rank,
			my_host, socket_name(o), kcoll_strerror(r));
		return 1;
	}
	if (rank == 0) {
		r = kcoll_get_unique_id(k, &id);
		if (r) {
			fprintf(stderr, "%s: rank 0 (%s): kcoll_get_unique_id: %s\n", prog.name,
				my_host, kcoll_strerror(r));
			goto err_disconnect;
		}
		r = id_file_write(o->id_file, &id);
		if (r) {
			fprintf(stderr, "%s: rank 0 (%s): writing --id-file %s: %s\n", prog.name,
				my_host, o->id_file, strerror(-r));
			goto err_disconnect;
		}
		if (!o->b.json)
			print_header(o, &rep->env, NULL);
	} else {
		r = id_file_read(o->id_file, &id, timeout_ms());
		if (r) {
			fprintf(stderr, "%s: rank %d (%s): no id from rank 0 in %s after %d s (is it "
				"on a file system every rank sees? left over from another run?)\n",
				prog.name, rank, my_host, o->id_file, timeout_ms() / 1000);
			goto err_disconnect;
		}
	}
	r = rank_main(o, k, &id, rank, rank == 0 ? rep : NULL);
	if (rank == 0)
		unlink(o->id_file);	/* every rank has joined, or it failed: not needed again */
	kcoll_disconnect(k);
	if (rank == 0)
		return report_finish(rep, !r);
	return r ? 1 : 0;

err_disconnect:
	kcoll_disconnect(k);
	return 1;
}

/* ---- main ----------------------------------------------------------- */

/* Rank and size from mpirun or a PMI launcher: 1, 0 if none, -1 if unusable. */
static int launcher_env(int *rank, int *size, const char **which)
{
	static const char *const vars[][3] = {
		{ "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI)" },
		{ "PMI_RANK", "PMI_SIZE", "a PMI launcher" },
	};

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *r = getenv(vars[i][0]), *s = getenv(vars[i][1]);
		char *end1, *end2;
		long lr, ls;

		if (!r || !s)
			continue;
		lr = strtol(r, &end1, 10);
		ls = strtol(s, &end2, 10);
		*which = vars[i][2];
		if (*end1 || *end2 || end1 == r || end2 == s || ls < 1 || ls > KB_MAX_RANKS ||
		    lr < 0 || lr >= ls)
			return -1;
		*rank = (int)lr;
		*size = (int)ls;
		return 1;
	}
	return 0;
}

static void parse_args(int argc, char **argv, struct kbench_opts *o)
{
	static const struct bench_half_conv half = {
		.f16_to_f32 = kcoll_f16_to_f32,
		.f32_to_f16 = kcoll_f32_to_f16,
		.bf16_to_f32 = kcoll_bf16_to_f32,
		.f32_to_bf16 = kcoll_f32_to_bf16,
	};
	int env_rank = 0, env_size = 0, env;

	*o = (struct kbench_opts){ .dtype = KCOLL_F32, .op = KCOLL_SUM, .per_host = 2 };
	bench_opts_init(&o->b, 2);
	o->b.half = &half;
	env = launcher_env(&env_rank, &env_size, &o->launcher);
	if (env > 0) {
		o->b.nranks = env_size;		/* before -r is checked against it */
		prog.quiet = env_rank != 0;
	}
	bench_parse_args(&prog, argc, argv, &o->b, o);
	if (o->mode == MODE_WORKER) {
		if (!o->hosts || o->rank >= o->b.nranks || !o->have_id)
			bench_usage_error(&prog, "--worker is for the parent of a --hosts run");
		return;
	}
	if (o->mode == MODE_PRINT_ID)
		return;
	if (env < 0)
		bench_usage_error(&prog, "%s set a rank or size that is not a number in range",
				  o->launcher);
	if (env > 0) {
		o->mode = MODE_MPI;
		o->rank = env_rank;
		if (o->n_given || o->hosts)
			bench_usage_error(&prog, "under %s the ranks are its %d processes: no -N or "
					  "--hosts", o->launcher, env_size);
		if (!o->id_file)
			bench_usage_error(&prog, "under %s, rank 0 passes the communicator id on "
					  "through a file: --id-file PATH, on a file system every "
					  "rank sees", o->launcher);
	} else if (o->hosts) {
		o->mode = MODE_HOSTS;
	} else {
		o->mode = MODE_LOCAL;
	}
	if (o->id_file && o->mode != MODE_MPI)
		bench_usage_error(&prog, "--id-file is for runs under mpirun (no OMPI_COMM_WORLD_* "
				  "or PMI_* in the environment)");
	if (o->launch && o->mode != MODE_HOSTS)
		bench_usage_error(&prog, "--launch goes with --hosts");
	if (o->b.coll == BENCH_MEMCPY && o->mode != MODE_LOCAL)
		bench_usage_error(&prog, "memcpy runs in one process: no --hosts, no mpirun");
	if (o->b.check && o->b.nranks > BENCH_MAX_CHECK_RANKS)
		bench_usage_error(&prog, "-c 1 supports at most %d ranks (exact check values); use -c 0",
				  BENCH_MAX_CHECK_RANKS);
}

int main(int argc, char **argv)
{
	struct kbench_opts o;
	struct report rep;
	struct utsname u;
	int rc;

	if (!uname(&u))
		snprintf(my_host, sizeof(my_host), "%.*s", (int)sizeof(my_host) - 1, u.nodename);
	parse_args(argc, argv, &o);
	if (o.mode == MODE_WORKER)
		return worker_main(&o);
	if (o.mode == MODE_PRINT_ID)
		return print_id_main(&o);
	if (report_init(&rep, &o)) {
		fprintf(stderr, "%s: out of memory\n", prog.name);
		report_free(&rep);
		return 1;
	}
	if (o.b.coll == BENCH_MEMCPY)
		rc = memcpy_main(&o, &rep);
	else if (o.mode == MODE_MPI)
		rc = mpi_main(&o, &rep);
	else if (o.mode == MODE_HOSTS)
		rc = hosts_main(&o, &rep);
	else
		rc = local_main(&o, &rep);
	report_free(&rep);
	return rc;
}
