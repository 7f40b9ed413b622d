/* SPDX-License-Identifier: MIT */
/*
 * kcoll-bench's modes, the processes its ranks run in (kcoll-bench.c picks
 * one): local (fork -N ranks), --hosts (launch a worker per rank through the
 * template, after asking host 0's daemon for the id through it: --print-id),
 * the launched worker itself, and mpirun/PMI (rank 0 passes the id on through
 * --id-file). The parent reads its children's "host", "row" and "fail" lines
 * (launch.c starts and stops them) into the report; each rank runs
 * kb_rank_main (bench_rank.c).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kcoll-bench.h"
#include "launch.h"

/* ---- the children: forked ranks, launched workers, the id helper ------- */

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
		kb_report_row(j->rep, r, &st);
		return;
	} else if (rank == 0 && sscanf(line, "host %d %63s", &r, name) == 2) {
		kb_report_host(j->rep, r, name);
		return;
	} else if (sscanf(line, "fail %d %d %d %63s %n", &r, &err, &blamed, name, &off) == 4 &&
		   off > 0) {
		rank_label(j, rank, name, label, sizeof(label));
		fprintf(stderr, "%s: %s: %s\n", KB_PROG, label, line + off);
		launch_child_failed(l, i);
		return;
	}
	rank_label(j, rank, NULL, label, sizeof(label));
	fprintf(stderr, "%s: %s says: %s\n", KB_PROG, label, line);
}

static const struct launch_ops job_ops = {
	.line = job_line,
	.label = job_label,
};

/* Room for n children: 0, or -1 (said why). */
static int job_init(struct job *j, const struct kbench_opts *o, struct report *rep, int n)
{
	*j = (struct job){ .o = o, .rep = rep, .id_helper = !rep };
	if (launch_init(&j->l, n, KB_PROG, &job_ops, j, 0)) {
		fprintf(stderr, "%s: out of memory\n", KB_PROG);
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

	kb_to_parent = true;
	r = kb_connect_daemon(lr->o, &k);
	if (r)
		return kb_say_fail(lr->rank, r, -1, "connecting to kcolld at %s",
				   kb_socket_name(lr->o));
	r = kb_rank_main(lr->o, k, lr->id, lr->rank, NULL);
	kcoll_disconnect(k);
	return r;
}

int kb_local_main(const struct kbench_opts *o, struct report *rep)
{
	int n = o->b.nranks, started = 0, r;
	struct local_rank *lr = calloc(n, sizeof(*lr));
	kcoll_unique_id_t id;
	struct kcoll *k = NULL;
	struct job j;

	if (!lr) {
		fprintf(stderr, "%s: out of memory\n", KB_PROG);
		return 1;
	}
	if (job_init(&j, o, rep, n))
		goto err_free;
	r = kb_connect_daemon(o, &k);
	if (r) {
		fprintf(stderr, "%s: cannot reach kcolld at %s: %s\n", KB_PROG, kb_socket_name(o),
			kcoll_strerror(r));
		fprintf(stderr, "%s: is the daemon running? start it with 'kcolld -f -s SOCKET' "
			"and pass -s SOCKET or set KCOLL_SOCKET\n", KB_PROG);
		goto err_launch;
	}
	r = kcoll_get_unique_id(k, &id);
	if (r) {
		fprintf(stderr, "%s: kcoll_get_unique_id: %s\n", KB_PROG, kcoll_strerror(r));
		goto err_disconnect;
	}
	if (!o->b.json)
		kb_print_header(o, &rep->env, NULL);
	launch_catch_signals(true);
	for (; started < n; started++) {
		lr[started] = (struct local_rank){ .o = o, .id = &id, .rank = started };
		r = launch_spawn(&j.l, started, NULL, local_rank, &lr[started]);
		if (r) {
			fprintf(stderr, "%s: fork: %s\n", KB_PROG, strerror(-r));
			launch_fail(&j.l);
			break;
		}
	}
	r = launch_run(&j.l);
	kcoll_disconnect(k);
	launch_free(&j.l);
	free(lr);
	r = kb_report_finish(rep, !r && started == n);
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
	launch_argv_add(a, kb_mem_name(o));
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
			KB_PROG, path);
		free(real);
		return NULL;
	}
	if (strpbrk(real, " \t")) {
		fprintf(stderr, "%s: the default launcher's path '%s' has a blank in it: pass "
			"--launch with a path without one\n", KB_PROG, real);
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
		fprintf(stderr, "%s: bad launch template '%s'\n", KB_PROG, tmpl);
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
		fprintf(stderr, "%s: fork: %s\n", KB_PROG, strerror(-r));
		launch_free(&j.l);
		return -1;
	}
	/* Connecting and the id take a few ms; a launcher (ssh) may take seconds. */
	snprintf(late, sizeof(late), "no answer in time (KCOLL_TIMEOUT_MS %d)", kb_timeout_ms());
	j.l.deadline = launch_now_us() + kb_timeout_ms() * 1e3;
	j.l.deadline_msg = late;
	r = launch_run(&j.l);
	launch_free(&j.l);
	if (r || !j.have_id) {
		if (!launch_stop_signal)
			fprintf(stderr, "%s: no communicator id from host 0's daemon through "
				"'%s' (run '%s' by hand to see why)\n", KB_PROG, tmpl, tmpl);
		return -1;
	}
	*id = j.id;
	return 0;
}

int kb_hosts_main(const struct kbench_opts *o, struct report *rep)
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
		fprintf(stderr, "%s: cannot find myself (/proc/self/exe): %s\n", KB_PROG,
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
		kb_print_header(o, &rep->env, tmpl);
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
			fprintf(stderr, "%s: starting rank %d: %s\n", KB_PROG, started, strerror(-r));
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
	r = kb_report_finish(rep, !r && started == n);
	launch_restore_signal();
	return r;
}

/* A launched rank: connect to this host's daemon, run, report to the parent. */
int kb_worker_main(const struct kbench_opts *o)
{
	struct kcoll *k;
	int r;

	kb_to_parent = true;
	r = kb_connect_daemon(o, &k);
	if (r) {
		kb_say_fail(o->rank, r, -1, "cannot reach kcolld at %s", kb_socket_name(o));
		return 1;
	}
	r = kb_rank_main(o, k, &o->id, o->rank, NULL);
	kcoll_disconnect(k);
	return r ? 1 : 0;
}

/* --print-id: this host's daemon's id on stdout, "id HEX". */
int kb_print_id_main(const struct kbench_opts *o)
{
	char hex[2 * KCOLL_UNIQUE_ID_BYTES + 1];
	kcoll_unique_id_t id;
	struct kcoll *k;
	int r = kb_connect_daemon(o, &k);

	if (r) {
		fprintf(stderr, "%s: on %s: cannot reach kcolld at %s: %s\n", KB_PROG, kb_my_host,
			kb_socket_name(o), kcoll_strerror(r));
		return 1;
	}
	r = kcoll_get_unique_id(k, &id);
	kcoll_disconnect(k);
	if (r) {
		fprintf(stderr, "%s: on %s: kcoll_get_unique_id: %s\n", KB_PROG, kb_my_host,
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

int kb_mpi_main(const struct kbench_opts *o, struct report *rep)
{
	int rank = o->rank, r;
	kcoll_unique_id_t id;
	struct kcoll *k;

	r = kb_connect_daemon(o, &k);
	if (r) {
		fprintf(stderr, "%s: rank %d (%s): cannot reach kcolld at %s: %s\n", KB_PROG, rank,
			kb_my_host, kb_socket_name(o), kcoll_strerror(r));
		return 1;
	}
	if (rank == 0) {
		r = kcoll_get_unique_id(k, &id);
		if (r) {
			fprintf(stderr, "%s: rank 0 (%s): kcoll_get_unique_id: %s\n", KB_PROG,
				kb_my_host, kcoll_strerror(r));
			goto err_disconnect;
		}
		r = id_file_write(o->id_file, &id);
		if (r) {
			fprintf(stderr, "%s: rank 0 (%s): writing --id-file %s: %s\n", KB_PROG,
				kb_my_host, o->id_file, strerror(-r));
			goto err_disconnect;
		}
		if (!o->b.json)
			kb_print_header(o, &rep->env, NULL);
	} else {
		r = id_file_read(o->id_file, &id, kb_timeout_ms());
		if (r) {
			fprintf(stderr, "%s: rank %d (%s): no id from rank 0 in %s after %d s (is it "
				"on a file system every rank sees? left over from another run?)\n",
				KB_PROG, rank, kb_my_host, o->id_file, kb_timeout_ms() / 1000);
			goto err_disconnect;
		}
	}
	r = kb_rank_main(o, k, &id, rank, rank == 0 ? rep : NULL);
	if (rank == 0)
		unlink(o->id_file);	/* every rank has joined, or it failed: not needed again */
	kcoll_disconnect(k);
	if (rank == 0)
		return kb_report_finish(rep, !r);
	return r ? 1 : 0;

err_disconnect:
	kcoll_disconnect(k);
	return 1;
}
