// SPDX-License-Identifier: MIT
/*
 * kcoll-gpu-bench: the GPU measurements of scripts/gpu-check.sh, each beside
 * its anchor measured in the same run, on device 0 (docs/gpu.md "Running the
 * device check"). It reaches CUDA only through kcoll's loader (gpu/gpu.c) and
 * the kernels table of libkcoll_gpu.so, so it builds wherever kcoll builds;
 * without a usable GPU every command exits 77 with the loader's reason.
 *
 *   reduce     kcoll_gpu_reduce_n (f32/bf16/f16 sum, 2 inputs) against a D2D
 *              cudaMemcpyAsync of the same bytes
 *   allreduce  device-buffer all-reduce through kcolld, -n ranks (processes)
 *              sharing device 0, against the D2D copy bound
 *   staging    all-reduce with rank 0 on device and rank 1 on host (kcolld's
 *              pinned staging) against the same op on host buffers and
 *              cudaMemcpy D2H + H2D of the same bytes
 *   ipc        CUDA IPC between two processes: export, import, read, write
 *   kv         KV blocks into and out of another process's device segment
 *              (device, pageable host) against one cudaMemcpy of the same bytes
 *
 * Timing is host clock around work queued on one stream (or requests waited
 * for one by one), after a warm-up; the repetitions are chosen so that each
 * measurement lasts about --seconds. Bandwidths are in GB/s (1e9 bytes/s).
 * Exit status: 0 done (and checks passed), 1 a check failed, 2 usage,
 * 77 no usable GPU.
 */
#include <errno.h>
#include <getopt.h>
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

#include "kcoll_gpu.h"

#define EXIT_NO_GPU	77
#define MAX_RANKS	8
#define MAX_ROWS	64
#define MiB		(1024.0 * 1024.0)

static const struct kcoll_gpu_kernels *K;
static struct kcoll_gpu *G;
static FILE *json;			/* --json FILE, NULL: none */
static int json_rows;
static double budget = 0.25;		/* seconds per measurement */
static size_t max_bytes = 1ul << 30;
static const char *sock;
static int nranks = 2;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "kcoll-gpu-bench: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/* The kernels table on device 0, or exit 77 with the loader's reason. */
static void dev_init(void)
{
	int rc = kcoll_gpu_process(&G);

	if (!rc)
		rc = kcoll_gpu_kernels(G, &K);
	if (!rc)
		rc = K->set_device(0);
	if (rc) {
		fprintf(stderr, "kcoll-gpu-bench: no usable GPU: %s\n",
			G ? kcoll_gpu_info(G)->why : "out of memory");
		exit(EXIT_NO_GPU);
	}
}

static void *dalloc(size_t n)
{
	void *p = NULL;

	if (K->mem_alloc(&p, n))
		die("cudaMalloc of %zu bytes: %s", n, K->last_error());
	return p;
}

static void *palloc(size_t n)
{
	void *p = NULL;

	if (K->host_alloc(&p, n))
		die("cudaHostAlloc of %zu bytes: %s", n, K->last_error());
	return p;
}

static void check(int rc, const char *what)
{
	if (rc)
		die("%s: %s (%s)", what, strerror(-rc), K ? K->last_error() : "");
}

/* ---- JSON: one object, {"bench": ..., "device": ..., "rows": [...]} ---- */
static void json_begin(const char *bench)
{
	const struct kcoll_gpu_info *in = kcoll_gpu_info(G);

	if (!json)
		return;
	fprintf(json, "{\"bench\": \"%s\", \"device\": \"", bench);
	for (const char *s = in->ndev ? in->dev[0].name : ""; *s; s++)
		fprintf(json, (*s == '"' || *s == '\\') ? "\\%c" : "%c", *s);
	fprintf(json, "\", \"driver_version\": %d, \"runtime_version\": %d, \"rows\": [",
		in->driver_version, in->runtime_version);
}

/* fmt: the members of one row, without braces. */
static void json_row(const char *fmt, ...)
{
	va_list ap;

	if (!json)
		return;
	va_start(ap, fmt);
	fprintf(json, "%s\n  {", json_rows++ ? "," : "");
	vfprintf(json, fmt, ap);
	fputc('}', json);
	va_end(ap);
}

static void json_end(const char *extra)
{
	if (!json)
		return;
	fprintf(json, "\n]%s%s}\n", extra ? ", " : "", extra ? extra : "");
	fflush(json);
}

/* ---- timing ---- */
typedef int (*work_fn)(void *arg);

/* Ranks of one communicator must run the same number of ops: they agree on
 * the slowest first run (set while ranks time collectives). */
static struct kcoll_comm *agree_comm;
static double agree_max(struct kcoll_comm *comm, double v);

/* Seconds per call of fn: a warm-up, one timed call, then enough calls to fill
 * the budget (3..1000). fn queues or waits as it likes; fin makes it done. */
static double time_it(work_fn fn, work_fn fin, void *arg, int *reps_out)
{
	double t0, t1;
	int reps;

	check(fn(arg), "warm-up");
	check(fin(arg), "warm-up sync");
	t0 = now();
	check(fn(arg), "first run");
	check(fin(arg), "first run sync");
	t1 = now() - t0;
	if (agree_comm)
		t1 = agree_max(agree_comm, t1);
	reps = t1 > 0 ? (int)(budget / t1) : 1000;
	reps = reps < 3 ? 3 : reps > 1000 ? 1000 : reps;
	t0 = now();
	for (int i = 0; i < reps; i++)
		check(fn(arg), "timed run");
	check(fin(arg), "timed run sync");
	if (reps_out)
		*reps_out = reps;
	return (now() - t0) / reps;
}

/* ---- reduce: the kernels against a D2D copy ---- */
struct rwork {
	int dtype;
	void *out, *in[2], *stream;
	size_t bytes;
};

static int rw_reduce(void *a)
{
	struct rwork *w = a;
	size_t esz = w->dtype == KCOLL_F32 ? 4 : 2;

	return K->reduce_n(w->dtype, KCOLL_SUM, w->out, (const void *const *)w->in, 2,
			   w->bytes / esz, w->stream);
}

static int rw_copy(void *a)
{
	struct rwork *w = a;

	return K->copy_async(w->out, w->in[0], w->bytes, w->stream);
}

static int rw_sync(void *a)
{
	return K->stream_sync(((struct rwork *)a)->stream);
}

/* Host pattern of 1.0 in dtype; the sum of two is 2.0. */
static void fill_ones(void *h, int dtype, size_t bytes)
{
	if (dtype == KCOLL_F32) {
		for (size_t i = 0; i < bytes / 4; i++)
			((float *)h)[i] = 1.0f;
	} else {
		uint16_t one = dtype == KCOLL_F16 ? 0x3c00 : 0x3f80;

		for (size_t i = 0; i < bytes / 2; i++)
			((uint16_t *)h)[i] = one;
	}
}

static int two_at(const void *h, int dtype, size_t i)
{
	if (dtype == KCOLL_F32)
		return ((const float *)h)[i] == 2.0f;
	return ((const uint16_t *)h)[i] == 0x4000;	/* 2.0 in f16 and in bf16 */
}

static int bench_reduce(void)
{
	static const int dtypes[] = { KCOLL_F32, KCOLL_BF16, KCOLL_F16 };
	static const char *const names[] = { "f32", "bf16", "f16" };
	unsigned long long mem = kcoll_gpu_info(G)->dev[0].mem_bytes;
	size_t top = max_bytes;
	struct rwork w = { 0 };
	void *host;
	int bad = 0;

	while (top > (64u << 20) && 3 * top + (2ull << 30) > mem)
		top /= 2;
	host = malloc(top);
	if (!host)
		die("out of host memory");
	w.in[0] = dalloc(top);
	w.in[1] = dalloc(top);
	w.out = dalloc(top);
	check(K->stream_create(&w.stream), "stream_create");
	json_begin("reduce");
	printf("# kcoll_gpu_reduce_n, 2 inputs, sum, against cudaMemcpyAsync D2D of the same bytes\n"
	       "# bandwidth counts bytes read + written: reduce 3 x size, copy 2 x size\n");
	printf("%-5s %12s %10s %10s %10s %10s %6s\n", "dtype", "size", "reduce_us", "reduce_GB/s",
	       "copy_us", "copy_GB/s", "ratio");
	for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
		w.dtype = dtypes[d];
		fill_ones(host, w.dtype, top);
		check(K->copy(w.in[0], host, top), "fill");
		check(K->copy(w.in[1], host, top), "fill");
		for (size_t s = top < (64u << 20) ? top : 64u << 20; s <= top; s *= 4) {
			double tr, tc, bwr, bwc;
			int reps_r, reps_c, ok = 1;

			w.bytes = s;
			tr = time_it(rw_reduce, rw_sync, &w, &reps_r);
			memset(host, 0, 4096);
			check(K->copy(host, w.out, 4096), "read back");
			for (size_t i = 0; i < 4096 / (w.dtype == KCOLL_F32 ? 4 : 2); i++)
				ok &= two_at(host, w.dtype, i);
			tc = time_it(rw_copy, rw_sync, &w, &reps_c);
			bwr = 3.0 * s / tr / 1e9;
			bwc = 2.0 * s / tc / 1e9;
			bad |= !ok;
			printf("%-5s %12zu %10.1f %10.1f %10.1f %10.1f %6.3f%s\n", names[d], s,
			       tr * 1e6, bwr, tc * 1e6, bwc, bwr / bwc, ok ? "" : "  WRONG RESULT");
			json_row("\"dtype\": \"%s\", \"op\": \"sum\", \"nin\": 2, \"bytes\": %zu, "
				 "\"reduce_us\": %.3f, \"reduce_gbps\": %.3f, \"reduce_reps\": %d, "
				 "\"copy_us\": %.3f, \"copy_gbps\": %.3f, \"copy_reps\": %d, "
				 "\"ratio\": %.4f, \"target\": 0.8, \"result_ok\": %s",
				 names[d], s, tr * 1e6, bwr, reps_r, tc * 1e6, bwc, reps_c, bwr / bwc,
				 ok ? "true" : "false");
		}
	}
	json_end(NULL);
	K->stream_destroy(w.stream);
	K->mem_free(w.out);
	K->mem_free(w.in[1]);
	K->mem_free(w.in[0]);
	free(host);
	return bad;
}

/* ---- ranks through kcolld ---- */
enum { MODE_DEV, MODE_STAGED, MODE_HOST };
static const char *const mode_names[] = { "device", "staged", "host" };

struct shared {
	kcoll_unique_id_t id;
	int nrows;
	struct {
		int mode;
		size_t bytes;
		double t, copy_t, d2h_t, h2d_t, d2h_page_t, h2d_page_t;
		int reps, ok;
	} row[MAX_ROWS];
	char err[MAX_RANKS][256];
};

static struct shared *sh;

struct awork {
	struct kcoll_comm *comm;
	void *send, *recv;
	size_t count;
	int rc;
};

static int aw_op(void *a)
{
	struct awork *w = a;
	struct kcoll_req *req;
	int r = kcoll_allreduce(w->comm, w->send, w->recv, w->count, KCOLL_F32, KCOLL_SUM, &req);

	return r ? r : kcoll_wait(req, 120000);
}

static int aw_none(void *a)
{
	return 0;
}

/* A host all-reduce of one double: every rank learns the maximum. */
static double agree_max(struct kcoll_comm *comm, double v)
{
	double out = 0;
	struct kcoll_req *req;

	check(kcoll_allreduce(comm, &v, &out, 1, KCOLL_F64, KCOLL_MAX, &req), "agree");
	check(kcoll_wait(req, 120000), "agree wait");
	return out;
}

struct cwork {
	void *dst, *src, *stream;
	size_t bytes;
	int sync;		/* 1: K->copy (synchronous, pageable allowed) */
};

static int cw_copy(void *a)
{
	struct cwork *w = a;

	return w->sync ? K->copy(w->dst, w->src, w->bytes) :
			 K->copy_async(w->dst, w->src, w->bytes, w->stream);
}

static int cw_sync(void *a)
{
	struct cwork *w = a;

	return w->sync ? 0 : K->stream_sync(w->stream);
}

static double copy_time(void *dst, const void *src, size_t bytes, void *stream, int sync)
{
	struct cwork w = { dst, (void *)src, stream, bytes, sync };

	return time_it(cw_copy, cw_sync, &w, NULL);
}

static int rank_main(int rank, const int *modes, int nmodes, size_t lo, size_t hi)
{
	struct kcoll_connect_opts o = { .size = sizeof(o), .socket_path = sock };
	struct kcoll *k;
	struct kcoll_comm *comm;
	float *hsend, *hrecv, *hcheck;
	void *dsend, *drecv, *stream, *pin = NULL, *dtmp = NULL;
	int r;

	dev_init();
	hsend = malloc(hi);
	hrecv = malloc(hi);
	hcheck = malloc(hi);
	if (!hsend || !hrecv || !hcheck)
		die("out of host memory");
	for (size_t i = 0; i < hi / 4; i++)
		hsend[i] = (float)(rank + 1);
	dsend = dalloc(hi);
	drecv = dalloc(hi);
	check(K->copy(dsend, hsend, hi), "fill");
	check(K->stream_create(&stream), "stream_create");
	if (rank == 0) {
		pin = palloc(hi);
		dtmp = dalloc(hi);
	}
	r = kcoll_connect(&o, &k);
	if (!r)
		r = kcoll_comm_init_rank(k, &sh->id, nranks, rank, &comm);
	if (r) {
		snprintf(sh->err[rank], sizeof(sh->err[rank]), "rank %d: join: %s", rank,
			 kcoll_strerror(r));
		return 1;
	}
	for (int m = 0; m < nmodes; m++) {
		for (size_t s = lo; s <= hi; s *= 4) {
			int dev = modes[m] == MODE_DEV || (modes[m] == MODE_STAGED && rank == 0);
			struct awork w = { comm, dev ? dsend : hsend, dev ? drecv : hrecv, s / 4, 0 };
			float want = nranks * (nranks + 1) / 2.0f;
			double t, tmax;
			int reps, ok = 1, row;
			size_t n = s / 4;

			/* The anchors first, on rank 0 alone (the others wait in agree_max). */
			row = sh->nrows;
			if (rank == 0 && row < MAX_ROWS) {
				sh->row[row].copy_t = copy_time(dtmp, dsend, s, stream, 0);
				if (modes[m] == MODE_STAGED) {
					sh->row[row].d2h_t = copy_time(pin, dsend, s, stream, 0);
					sh->row[row].h2d_t = copy_time(dtmp, pin, s, stream, 0);
					sh->row[row].d2h_page_t = copy_time(hcheck, dsend, s, NULL, 1);
					sh->row[row].h2d_page_t = copy_time(dtmp, hcheck, s, NULL, 1);
				}
			}
			agree_max(comm, 0);
			agree_comm = comm;
			t = time_it(aw_op, aw_none, &w, &reps);
			agree_comm = NULL;
			tmax = agree_max(comm, t);
			if (dev)
				check(K->copy(hcheck, drecv, s), "read back");
			else
				memcpy(hcheck, hrecv, s);
			for (size_t i = 0; i < n; i++)
				ok &= hcheck[i] == want;
			ok = agree_max(comm, ok ? 0 : 1) == 0;
			if (rank == 0 && row < MAX_ROWS) {
				sh->row[row].mode = modes[m];
				sh->row[row].bytes = s;
				sh->row[row].t = tmax;
				sh->row[row].reps = reps;
				sh->row[row].ok = ok;
				sh->nrows = row + 1;
			}
		}
	}
	kcoll_comm_destroy(comm);
	kcoll_disconnect(k);
	return 0;
}

/* Fork the ranks (this process never touches CUDA), wait for them. */
static int run_ranks(const int *modes, int nmodes, size_t lo, size_t hi)
{
	struct kcoll_connect_opts o = { .size = sizeof(o), .socket_path = sock };
	pid_t pid[MAX_RANKS];
	struct kcoll *k;
	int bad = 0, r;

	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	r = kcoll_connect(&o, &k);
	if (!r)
		r = kcoll_get_unique_id(k, &sh->id);
	if (r)
		die("kcolld at %s: %s", sock ? sock : "$KCOLL_SOCKET", kcoll_strerror(r));
	kcoll_disconnect(k);
	for (int i = 0; i < nranks; i++) {
		pid[i] = fork();
		if (pid[i] == 0)
			_exit(rank_main(i, modes, nmodes, lo, hi));
	}
	for (int i = 0; i < nranks; i++) {
		int st;

		if (waitpid(pid[i], &st, 0) != pid[i] || !WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "kcoll-gpu-bench: rank %d failed (status %d)%s%s\n", i,
				WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st),
				sh->err[i][0] ? ": " : "", sh->err[i]);
			if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_NO_GPU)
				exit(EXIT_NO_GPU);
			bad = 1;
		}
	}
	return bad;
}

static int bench_allreduce(void)
{
	static const int modes[] = { MODE_DEV };
	int bad;

	bad = run_ranks(modes, 1, 1u << 20, max_bytes < (256u << 20) ? max_bytes : 256u << 20);
	dev_init();	/* for the JSON header only, after the ranks are done */
	json_begin("allreduce");
	printf("# all-reduce f32 sum, %d processes, device buffers on device 0, through kcolld\n"
	       "# copy bound: the op's device traffic ((3n-1) x size: n reads and a write for the\n"
	       "# reduction, a read and a write per copy to the other n-1) at the D2D copy rate\n",
	       nranks);
	printf("%12s %10s %10s %10s %12s %10s %6s\n", "size", "time_us", "algbw", "busbw",
	       "bound_busbw", "copy_GB/s", "frac");
	for (int i = 0; i < sh->nrows; i++) {
		double s = sh->row[i].bytes, t = sh->row[i].t, tc = sh->row[i].copy_t;
		double f = 2.0 * (nranks - 1) / nranks, alg = s / t / 1e9;
		double tb = (3.0 * nranks - 1) * s / (2.0 * s / tc), bound = s / tb / 1e9 * f;

		bad |= !sh->row[i].ok;
		printf("%12zu %10.1f %10.2f %10.2f %12.2f %10.1f %6.3f%s\n", sh->row[i].bytes,
		       t * 1e6, alg, alg * f, bound, 2.0 * s / tc / 1e9, alg * f / bound,
		       sh->row[i].ok ? "" : "  WRONG RESULT");
		json_row("\"ranks\": %d, \"dtype\": \"f32\", \"op\": \"sum\", \"bytes\": %zu, "
			 "\"time_us\": %.3f, \"reps\": %d, \"algbw_gbps\": %.3f, \"busbw_gbps\": %.3f, "
			 "\"copy_d2d_gbps\": %.3f, \"bound_busbw_gbps\": %.3f, \"fraction_of_bound\": %.4f, "
			 "\"result_ok\": %s",
			 nranks, sh->row[i].bytes, t * 1e6, sh->row[i].reps, alg, alg * f,
			 2.0 * s / tc / 1e9, bound, alg * f / bound, sh->row[i].ok ? "true" : "false");
	}
	json_end(NULL);
	return bad;
}

static int bench_staging(void)
{
	static const int modes[] = { MODE_STAGED, MODE_HOST };
	int bad;

	nranks = 2;
	bad = run_ranks(modes, 2, 1u << 20, max_bytes < (256u << 20) ? max_bytes : 256u << 20);
	dev_init();
	json_begin("staging");
	printf("# all-reduce f32 sum, 2 processes: 'staged' = rank 0 device, rank 1 host (kcolld\n"
	       "# copies rank 0's buffers through pinned host memory); 'host' = both host.\n"
	       "# anchor: cudaMemcpy D2H + H2D of the same bytes, pinned and pageable\n");
	printf("%-6s %12s %10s %10s %14s %14s\n", "mode", "size", "time_us", "algbw",
	       "d2h+h2d_pin", "d2h+h2d_page");
	for (int i = 0; i < sh->nrows; i++) {
		double s = sh->row[i].bytes, t = sh->row[i].t;
		double pin = sh->row[i].d2h_t + sh->row[i].h2d_t;
		double page = sh->row[i].d2h_page_t + sh->row[i].h2d_page_t;
		int staged = sh->row[i].mode == MODE_STAGED;
		char extra[256] = "";

		bad |= !sh->row[i].ok;
		printf("%-6s %12zu %10.1f %10.2f", mode_names[sh->row[i].mode], sh->row[i].bytes,
		       t * 1e6, s / t / 1e9);
		if (staged)
			printf(" %14.2f %14.2f", s / pin / 1e9, s / page / 1e9);
		printf("%s\n", sh->row[i].ok ? "" : "  WRONG RESULT");
		if (staged)
			snprintf(extra, sizeof(extra), ", \"copy_d2h_h2d_pinned_gbps\": %.3f, "
				 "\"copy_d2h_h2d_pageable_gbps\": %.3f, \"fraction_of_pinned_copy\": %.4f",
				 s / pin / 1e9, s / page / 1e9, pin / t);
		json_row("\"mode\": \"%s\", \"ranks\": 2, \"dtype\": \"f32\", \"op\": \"sum\", "
			 "\"bytes\": %zu, \"time_us\": %.3f, \"reps\": %d, \"algbw_gbps\": %.3f, "
			 "\"result_ok\": %s%s",
			 mode_names[sh->row[i].mode], sh->row[i].bytes, t * 1e6, sh->row[i].reps,
			 s / t / 1e9, sh->row[i].ok ? "true" : "false", extra);
	}
	json_end(NULL);
	return bad;
}

/* ---- ipc: export in one process, import in another ---- */
#define IPC_ALLOC	(64u << 20)
#define IPC_OFF		(1u << 20)
#define IPC_LEN		(4u << 20)

static int bench_ipc(void)
{
	int to_imp[2], to_exp[2], bad = 0, st;
	struct kcoll_gpu_ipc h;
	pid_t exp_pid, imp_pid;
	char msg[512] = "";

	if (pipe(to_imp) || pipe(to_exp))
		die("pipe: %s", strerror(errno));
	exp_pid = fork();
	if (exp_pid == 0) {	/* the exporter: allocation, pattern, handle */
		uint8_t *buf = malloc(IPC_LEN), *d;
		char why[KCOLL_GPU_TEXT];
		int rc, done;

		close(to_imp[0]);
		close(to_exp[1]);
		dev_init();
		d = dalloc(IPC_ALLOC);
		for (size_t i = 0; i < IPC_LEN; i++)
			buf[i] = (uint8_t)(i * 7 + 3);
		check(K->copy(d + IPC_OFF, buf, IPC_LEN), "fill");
		rc = kcoll_gpu_ipc_export(G, d + IPC_OFF, IPC_LEN, &h, why, sizeof(why));
		if (rc)
			fprintf(stderr, "export: %s\n", why);
		if (write(to_imp[1], &h, sizeof(h)) != (ssize_t)sizeof(h) || rc)
			_exit(1);
		if (read(to_exp[0], &done, sizeof(done)) != (ssize_t)sizeof(done) || done)
			_exit(1);
		/* The importer wrote the complement through its mapping. */
		check(K->copy(buf, d + IPC_OFF, IPC_LEN), "read back");
		for (size_t i = 0; i < IPC_LEN; i++)
			if (buf[i] != (uint8_t)~(uint8_t)(i * 7 + 3)) {
				fprintf(stderr, "exporter: byte %zu not written by the importer\n", i);
				_exit(1);
			}
		_exit(0);
	}
	imp_pid = fork();
	if (imp_pid == 0) {	/* the importer: open, read, write, close */
		uint8_t *buf = malloc(IPC_LEN);
		char why[KCOLL_GPU_TEXT];
		void *base, *dptr;
		int rc, done = 1;
		double t0, t1;

		close(to_imp[1]);
		close(to_exp[0]);
		dev_init();
		if (read(to_imp[0], &h, sizeof(h)) != (ssize_t)sizeof(h))
			_exit(1);
		rc = kcoll_gpu_ctx_enter(G, 0, why, sizeof(why));
		t0 = now();
		if (!rc)
			rc = kcoll_gpu_ipc_import(G, &h, exp_pid, IPC_LEN, &base, &dptr, why,
						  sizeof(why));
		t1 = now();
		if (rc) {
			fprintf(stderr, "import: %s\n", why);
		} else {
			check(K->copy(buf, dptr, IPC_LEN), "read through the mapping");
			done = 0;
			for (size_t i = 0; i < IPC_LEN; i++)
				if (buf[i] != (uint8_t)(i * 7 + 3)) {
					fprintf(stderr, "importer: byte %zu differs\n", i);
					done = 1;
					break;
				}
			for (size_t i = 0; i < IPC_LEN; i++)
				buf[i] = ~(uint8_t)(i * 7 + 3);
			check(K->copy(dptr, buf, IPC_LEN), "write through the mapping");
			printf("ipc: import took %.1f us\n", (t1 - t0) * 1e6);
			check(kcoll_gpu_ipc_close(G, base), "ipc close");
		}
		if (write(to_exp[1], &done, sizeof(done)) != (ssize_t)sizeof(done))
			_exit(1);
		_exit(done);
	}
	close(to_imp[0]);
	close(to_imp[1]);
	close(to_exp[0]);
	close(to_exp[1]);
	for (int i = 0; i < 2; i++) {
		pid_t p = i ? imp_pid : exp_pid;

		if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st)) {
			if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_NO_GPU)
				exit(EXIT_NO_GPU);
			snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg), "%s exited %d; ",
				 i ? "importer" : "exporter",
				 WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
			bad = 1;
		}
	}
	printf("%s ipc: %u bytes at offset %u of a %u-byte allocation, read and written by "
	       "another process%s%s\n", bad ? "FAIL" : "ok", IPC_LEN, IPC_OFF, IPC_ALLOC,
	       bad ? ": " : "", msg);
	if (json)
		fprintf(json, "{\"bench\": \"ipc\", \"bytes\": %u, \"offset\": %u, "
			"\"allocation\": %u, \"ok\": %s}\n", IPC_LEN, IPC_OFF, IPC_ALLOC,
			bad ? "false" : "true");
	return bad;
}

/* ---- kv: blocks into and out of a device segment ---- */
#define KV_BLOCKS_MAX	KCOLL_XFER_MAX_ENTRIES

struct kvwork {
	struct kcoll_seg *local;
	struct kcoll_rseg *remote;
	struct kcoll_xfer_entry *e;
	uint32_t n;
	bool write;
};

static int kw_batch(void *a)
{
	struct kvwork *w = a;
	struct kcoll_req *req;
	int r = w->write ? kcoll_xfer_write(w->local, w->remote, w->e, w->n, KCOLL_NOTIFY_NONE, &req) :
			   kcoll_xfer_read(w->local, w->remote, w->e, w->n, KCOLL_NOTIFY_NONE, &req);

	return r ? r : kcoll_wait(req, 120000);
}

/*
 * Another process owns a device segment of S bytes; this one moves all of
 * it in blocks of 64 KiB, 1 MiB and 4 MiB (one batch, blocks in reverse
 * order at the remote side) from its own device segment (device to
 * device), from pageable host memory (host to device) and back into it
 * (device to host). Anchor: one cudaMemcpy of the S bytes in this process,
 * between the same kinds of memory. Then the owner's bytes are checked.
 */
static int bench_kv(void)
{
	static const size_t blocks[] = { 64u << 10, 1u << 20, 4u << 20 };
	static const char *const path_names[] = { "d2d", "h2d", "d2h" };
	struct kcoll_connect_opts o = { .size = sizeof(o), .socket_path = sock };
	size_t S = max_bytes < (64u << 20) ? max_bytes : 64u << 20;
	struct kcoll_seg *dseg, *hseg, *seg;
	struct kcoll_xfer_entry *e;
	struct kcoll_rseg *rs;
	kcoll_seg_desc_t *desc;
	struct kcoll *k;
	uint8_t *h, *back;
	void *d, *anchor_dst;
	int *flag, st, bad = 0;
	size_t last = 0;
	pid_t pid;

	desc = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (desc == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	flag = (int *)(desc + 1);	/* [0] owner: 1 ready, <0 failed; [1] parent done */
	pid = fork();
	if (pid == 0) {	/* the owner: S bytes of device memory */
		dev_init();
		d = dalloc(S);
		check(kcoll_connect(&o, &k), "owner: connect");
		flag[0] = kcoll_seg_register(k, d, S, NULL, &seg);
		if (!flag[0]) {
			kcoll_seg_export(seg, desc);
			__atomic_store_n(&flag[0], 1, __ATOMIC_RELEASE);
		}
		for (int i = 0; i < 30000 && !__atomic_load_n(&flag[1], __ATOMIC_ACQUIRE); i++)
			usleep(10000);	/* at most 300 s: the parent may have died */
		_exit(0);
	}
	/* The owner was forked before this process initialises CUDA. */
	dev_init();
	while (!__atomic_load_n(&flag[0], __ATOMIC_ACQUIRE)) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			exit(WIFEXITED(st) && WEXITSTATUS(st) == EXIT_NO_GPU ? EXIT_NO_GPU : 1);
		usleep(10000);
	}
	if (flag[0] < 0) {
		fprintf(stderr, "kcoll-gpu-bench: kcoll_seg_register(device memory) = %d (%s)\n",
			flag[0], kcoll_strerror(flag[0]));
		__atomic_store_n(&flag[1], 1, __ATOMIC_RELEASE);
		waitpid(pid, &st, 0);
		return 1;
	}
	h = malloc(S);
	back = malloc(S);
	e = calloc(KV_BLOCKS_MAX, sizeof(*e));
	if (!h || !back || !e)
		die("out of memory");
	for (size_t i = 0; i < S; i++)
		h[i] = (uint8_t)(i * 7 + 3);
	d = dalloc(S);
	anchor_dst = dalloc(S);
	check(K->copy(d, h, S), "fill");
	check(kcoll_connect(&o, &k), "connect");
	check(kcoll_seg_register(k, d, S, NULL, &dseg), "device segment");
	check(kcoll_seg_register(k, h, S, NULL, &hseg), "host segment");
	check(kcoll_seg_import(k, desc, &rs), "import");
	json_begin("kv");
	printf("# KV blocks between this process and another's %zu MiB device segment, one batch\n"
	       "# of S/block blocks (reversed at the remote side); anchor: one cudaMemcpy of the\n"
	       "# same bytes in one process, between the same kinds of memory (host: pageable)\n",
	       S >> 20);
	printf("%-4s %10s %7s %10s %10s %12s %8s\n", "path", "block", "blocks", "time_us", "GB/s",
	       "anchor_GB/s", "ratio");
	for (int p = 0; p < 3; p++) {
		double ta = p == 0 ? copy_time(anchor_dst, d, S, NULL, 1) :
			    p == 1 ? copy_time(anchor_dst, h, S, NULL, 1) :
				     copy_time(back, anchor_dst, S, NULL, 1);

		for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); b++) {
			uint32_t n = (uint32_t)(S / blocks[b]);
			struct kvwork w = { p == 0 ? dseg : hseg, rs, e, n, p < 2 };
			int reps;
			double t;

			if (!n || n > KV_BLOCKS_MAX)
				continue;
			for (uint32_t i = 0; i < n; i++)
				e[i] = (struct kcoll_xfer_entry){ (uint64_t)i * blocks[b],
								  (uint64_t)(n - 1 - i) * blocks[b],
								  blocks[b] };
			t = time_it(kw_batch, aw_none, &w, &reps);
			if (p == 1)
				last = blocks[b];
			printf("%-4s %10zu %7u %10.1f %10.2f %12.2f %8.3f\n", path_names[p], blocks[b], n,
			       t * 1e6, n * blocks[b] / t / 1e9, S / ta / 1e9, ta / t);
			json_row("\"path\": \"%s\", \"block_bytes\": %zu, \"blocks\": %u, \"bytes\": %zu, "
				 "\"time_us\": %.3f, \"reps\": %d, \"gbps\": %.3f, \"anchor_gbps\": %.3f, "
				 "\"ratio\": %.4f", path_names[p], blocks[b], n, n * blocks[b], t * 1e6,
				 reps, n * blocks[b] / t / 1e9, S / ta / 1e9, ta / t);
		}
	}
	/* The owner's segment holds the host pattern in blocks of the last h2d
	 * row's size, reversed (d2h read it back into h unchanged): read it
	 * straight and check every byte. */
	{
		uint32_t n = (uint32_t)(S / last);
		struct kvwork w = { hseg, rs, e, n, false };

		for (uint32_t i = 0; i < n; i++)
			e[i] = (struct kcoll_xfer_entry){ (uint64_t)i * last, (uint64_t)i * last, last };
		memset(h, 0, S);
		bad = !n || kw_batch(&w);
		for (uint32_t i = 0; i < n && !bad; i++)
			for (size_t j = 0; j < last && !bad; j++)
				bad = h[(size_t)i * last + j] !=
				      (uint8_t)(((size_t)(n - 1 - i) * last + j) * 7 + 3);
	}
	printf("kv: the owner's device segment read back %s\n", bad ? "WRONG" : "right");
	json_end(bad ? "\"bytes_ok\": false" : "\"bytes_ok\": true");
	__atomic_store_n(&flag[1], 1, __ATOMIC_RELEASE);
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(hseg);
	kcoll_seg_unregister(dseg);
	kcoll_disconnect(k);
	waitpid(pid, &st, 0);
	free(h);
	free(back);
	free(e);
	return bad;
}

/* BYTES with an optional K, M or G (binary); 0 when malformed. */
static size_t parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 0);
	int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;

	if (end == s || (shift && end[1]) || (!shift && *end))
		return 0;
	return (size_t)v << shift;
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: kcoll-gpu-bench [options] reduce|allreduce|staging|ipc|kv\n"
		"  -n N         ranks for allreduce (2..%d, default 2)\n"
		"  -s SOCKET    kcolld's socket (default $KCOLL_SOCKET)\n"
		"  -m BYTES[KMG] largest size (default 1 GiB for reduce; 256 MiB cap for ranks)\n"
		"  -t SECONDS   time per measurement (default 0.25)\n"
		"  -j FILE      also write the results as one JSON object to FILE\n"
		"Exit: 0 done, 1 a check failed, 2 usage, 77 no usable GPU.\n", MAX_RANKS);
}

int main(int argc, char **argv)
{
	const char *cmd;
	int c;

	while ((c = getopt(argc, argv, "n:s:m:t:j:h")) != -1) {
		switch (c) {
		case 'n': nranks = atoi(optarg); break;
		case 's': sock = optarg; break;
		case 'm': max_bytes = parse_size(optarg); break;
		case 't': budget = atof(optarg); break;
		case 'j':
			json = fopen(optarg, "w");
			if (!json) {
				fprintf(stderr, "kcoll-gpu-bench: %s: %s\n", optarg, strerror(errno));
				return 2;
			}
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc - 1 || nranks < 2 || nranks > MAX_RANKS || budget <= 0 ||
	    max_bytes < (1u << 20)) {
		usage(stderr);
		return 2;
	}
	cmd = argv[optind];
	setvbuf(stdout, NULL, _IOLBF, 0);
	/* Forking commands must not initialise CUDA before they fork. */
	if (!strcmp(cmd, "allreduce"))
		return bench_allreduce();
	if (!strcmp(cmd, "staging"))
		return bench_staging();
	if (!strcmp(cmd, "ipc"))
		return bench_ipc();
	if (!strcmp(cmd, "kv"))
		return bench_kv();
	if (!strcmp(cmd, "reduce")) {
		dev_init();
		return bench_reduce();
	}
	usage(stderr);
	return 2;
}
