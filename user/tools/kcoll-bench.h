/* SPDX-License-Identifier: MIT */
/*
 * What kcoll-bench's files share (kcoll-bench.c: main and the options;
 * bench_jobs.c: the ranks' processes in each mode; bench_rank.c: one rank;
 * bench_report.c: the table and the JSON). They call each other in that
 * direction only.
 */
#ifndef KCOLL_BENCH_H
#define KCOLL_BENCH_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <kcoll/kcoll.h>

#include "bench_common.h"
#include "config.h"

#define KB_PROG			"kcoll-bench"	/* the prefix of every message */
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

/* This process's host name (uname nodename), for messages and the JSON. */
extern char kb_my_host[KB_NAME_BYTES];
/* A rank whose parent prints: failures go to stdout as "fail" lines. */
extern bool kb_to_parent;

/* KCOLL_TIMEOUT_MS (libkcoll's and kcolld's hang timeout), capped to fit an int with slack. */
static inline int kb_timeout_ms(void)
{
	long long t = kcoll_knob_ll("KCOLL_TIMEOUT_MS");

	return t > INT_MAX - KB_WAIT_SLACK_MS ? INT_MAX - KB_WAIT_SLACK_MS : (int)t;
}

static inline size_t kb_row_bytes(const struct bench_opts *o, int k)
{
	size_t s = o->min_bytes;

	while (k-- > 0)
		s *= o->factor;
	return s;
}

static inline const char *kb_socket_name(const struct kbench_opts *o)
{
	if (o->socket)
		return o->socket;
	return getenv("KCOLL_SOCKET") ? getenv("KCOLL_SOCKET") : KCOLL_DEFAULT_SOCKET;
}

static inline const char *kb_mem_name(const struct kbench_opts *o)
{
	return o->mem == MEM_HOST ? "host" : o->mem == MEM_REG ? "reg" : "shm";
}

/* bench_jobs.c: one mode each; the exit status. */
int kb_local_main(const struct kbench_opts *o, struct report *rep);
int kb_hosts_main(const struct kbench_opts *o, struct report *rep);
int kb_worker_main(const struct kbench_opts *o);
int kb_print_id_main(const struct kbench_opts *o);
int kb_mpi_main(const struct kbench_opts *o, struct report *rep);

/* bench_rank.c */
int kb_connect_daemon(const struct kbench_opts *o, struct kcoll **k);
/* One rank, connected as k; rep: rank 0 under mpirun prints there. 0 or a negative errno. */
int kb_rank_main(const struct kbench_opts *o, struct kcoll *k, const kcoll_unique_id_t *id,
		 int rank, struct report *rep);
/* A failure of rank 'rank': a "fail" line for the parent, or a message on stderr. */
int __attribute__((format(printf, 4, 5)))
kb_say_fail(int rank, int err, int blamed, const char *fmt, ...);

/* bench_report.c: the report (the parent, or rank 0 under mpirun). */
int kb_report_init(struct report *rep, const struct kbench_opts *o);
void kb_report_free(struct report *rep);
/* Rank r runs on host name. */
void kb_report_host(struct report *rep, int r, const char *name);
/* Size k is done: st holds the slowest mean and the total wrong count. */
void kb_report_row(struct report *rep, int k, const struct rank_stat *st);
/* The closing lines or the JSON document, and the exit status. */
int kb_report_finish(struct report *rep, bool ok);
/* The table's head; launch: the --hosts template (else NULL). */
void kb_print_header(const struct kbench_opts *o, const struct bench_env *env, const char *launch);

#endif /* KCOLL_BENCH_H */
