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
 *
 * This file: main, the options and the memcpy reference. bench_jobs.c: the
 * modes (local, --hosts with its worker and id helper, mpirun); bench_rank.c:
 * one rank; bench_report.c: the table and the JSON; kcoll-bench.h: what they
 * share.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include <kcoll/kcoll.h>

#include "bench_common.h"
#include "kcoll-bench.h"
#include "launch.h"
#include "reduce.h"

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
	.name = KB_PROG,
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

/* ---- memcpy reference ------------------------------------------------ */

static int memcpy_main(const struct kbench_opts *ko, struct report *rep)
{
	const struct bench_opts *o = &ko->b;
	size_t len = (o->max_bytes + 4095) & ~(size_t)4095;
	char *src = aligned_alloc(4096, len), *dst = aligned_alloc(4096, len);

	if (!o->json)
		kb_print_header(ko, &rep->env, NULL);
	if (!src || !dst) {
		fprintf(stderr, "%s: cannot allocate 2 x %zu bytes\n", prog.name, len);
		free(src);
		free(dst);
		return kb_report_finish(rep, false);
	}
	memset(src, 1, len);
	memset(dst, 2, len);
	for (int row = 0; row < rep->nrows; row++) {
		size_t bytes = kb_row_bytes(o, row);
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
		kb_report_row(rep, row, &st);
	}
	free(src);
	free(dst);
	return kb_report_finish(rep, true);
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
		snprintf(kb_my_host, sizeof(kb_my_host), "%.*s", (int)sizeof(kb_my_host) - 1,
			 u.nodename);
	parse_args(argc, argv, &o);
	if (o.mode == MODE_WORKER)
		return kb_worker_main(&o);
	if (o.mode == MODE_PRINT_ID)
		return kb_print_id_main(&o);
	if (kb_report_init(&rep, &o)) {
		fprintf(stderr, "%s: out of memory\n", prog.name);
		kb_report_free(&rep);
		return 1;
	}
	if (o.b.coll == BENCH_MEMCPY)
		rc = memcpy_main(&o, &rep);
	else if (o.mode == MODE_MPI)
		rc = kb_mpi_main(&o, &rep);
	else if (o.mode == MODE_HOSTS)
		rc = kb_hosts_main(&o, &rep);
	else
		rc = kb_local_main(&o, &rep);
	kb_report_free(&rep);
	return rc;
}
