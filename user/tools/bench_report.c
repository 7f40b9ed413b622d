/* SPDX-License-Identifier: MIT */
/*
 * kcoll-bench's report: the table (rows as they arrive, with the progress
 * line), the JSON document and the closing lines. The parent of forked or
 * launched ranks prints it from their "host" and "row" lines (bench_jobs.c);
 * under mpirun rank 0 does, straight from its exchanges (bench_rank.c). The
 * table and JSON formats are bench_common's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kcoll-bench.h"
#include "launch.h"

char kb_my_host[KB_NAME_BYTES] = "?";

int kb_report_init(struct report *rep, const struct kbench_opts *o)
{
	int n = o->b.nranks;

	*rep = (struct report){ .o = o, .nrows = bench_count_rows(&o->b), .start_us = launch_now_us() };
	rep->rows = calloc(rep->nrows, sizeof(*rep->rows));
	rep->names = calloc(n, sizeof(*rep->names));
	rep->names_ptr = calloc(n, sizeof(*rep->names_ptr));
	if (!rep->rows || !rep->names || !rep->names_ptr)
		return -ENOMEM;
	rep->env = (struct bench_env){ .tool = KB_PROG, .version = kcoll_version(),
				       .system = o->b.coll == BENCH_MEMCPY ? "memcpy" : "kcoll",
				       .mem = kb_mem_name(o), .host = kb_my_host,
				       .rank_hosts = rep->names_ptr };
	return 0;
}

void kb_report_free(struct report *rep)
{
	free(rep->rows);
	free(rep->names);
	free(rep->names_ptr);
}

void kb_report_host(struct report *rep, int r, const char *name)
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
		fprintf(stderr, "%s: %s %zu bytes done (%d/%d sizes, %.1f s)\n", KB_PROG,
			bench_coll_name(o->coll), bytes, done, rep->nrows, s);
		return;
	}
	if (!isatty(STDERR_FILENO) || (!o->json && isatty(STDOUT_FILENO)))
		return;
	if (!rep->tty_shown && s < KB_PROGRESS_AFTER_S)
		return;
	rep->tty_shown = true;
	fprintf(stderr, "\r%s %s: %d/%d sizes done (%zu bytes)%s", KB_PROG,
		bench_coll_name(o->coll), done, rep->nrows, bytes, done == rep->nrows ? "\n" : "");
}

void kb_report_row(struct report *rep, int k, const struct rank_stat *st)
{
	const struct bench_opts *o = &rep->o->b;
	size_t bytes = kb_row_bytes(o, k);
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

int kb_report_finish(struct report *rep, bool ok)
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
		fprintf(stderr, "%s: %lld wrong elements\n", KB_PROG, wrong);
	if (rep->nrows_done < rep->nrows)
		fprintf(stderr, "%s: stopped after %d of %d sizes\n", KB_PROG, rep->nrows_done,
			rep->nrows);
	return complete && !wrong ? 0 : 1;
}

void kb_print_header(const struct kbench_opts *o, const struct bench_env *env, const char *launch)
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
			 kb_socket_name(o));
	else
		snprintf(about, sizeof(about), "libkcoll %s on %s, socket %s", kcoll_version(),
			 env->host, kb_socket_name(o));
	bench_print_header(&o->b, env, about);
	fflush(stdout);
}
