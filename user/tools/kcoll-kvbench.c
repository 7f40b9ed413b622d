// SPDX-License-Identifier: MIT
/*
 * kcoll-kvbench: KV-cache transfer throughput and per-batch latency through
 * kcolld (docs/kv.md, kcoll-kvbench(1)).
 *
 *   local      (default) fork the target process(es) here, then run the
 *              initiator threads; --anchor memcpy measures the same batches
 *              copied by memcpy in one process, in the same run
 *   target     register a segment, write its descriptor to --desc FILE, and
 *              serve until SIGINT/SIGTERM (another host's initiator uses it)
 *   initiator  import the descriptor(s) of --desc FILE[,FILE...] (thread i
 *              uses file i mod n) and measure
 *   tcp-sink, tcp-source
 *              the raw TCP anchor across hosts, no kcolld: the source moves
 *              the same batches (same generator, seeds, segment size) over
 *              KCOLL_KV_STREAMS plain TCP streams straight from its buffer's
 *              blocks into the sink's buffer at the batches' offsets
 *
 * Each initiator thread has its own connection (its own ring thread in
 * kcolld) and keeps --depth batches in flight; a batch is --batch blocks of
 * --block bytes at random disjoint slots of the segments. *
 * This file: main, the options, the target and the initiator (with its
 * memcpy anchor); kvbench_tcp.c: the tcp modes; kvbench_batch.c: the
 * options' defaults and the batches; kvbench.h: what they share.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "bench_common.h"
#include "launch.h"
#include "kvbench.h"

#define MAX_DESCS	16

static kcoll_seg_desc_t descs[MAX_THREADS];	/* local: one per target; --desc: MAX_DESCS */
static int ndescs;

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kcoll-kvbench [options]\n"
		"KV-cache transfers through kcolld: batches of scattered blocks, GB/s and\n"
		"per-batch latency percentiles.\n\n"
		"  -m, --mode MODE        local (fork targets here), target, initiator, or the\n"
		"                         raw TCP anchor tcp-sink / tcp-source (no kcolld) [local]\n"
		"  -A, --addr HOST:PORT[,HOST:PORT...]  tcp-sink: listen there (HOST empty:\n"
		"                         every address); tcp-source: stream i connects to\n"
		"                         address i mod n (kcolld spreads its streams alike)\n"
		"  -D, --desc FILE[,...]  target: write the descriptor; initiator: read them\n"
		"                         (thread i uses file i mod n)\n"
		"  -b, --block LIST       block sizes, K/M suffixes, comma separated [4K,64K,1M,4M]\n"
		"  -B, --batch N          blocks per batch (capped to what the segment holds) [64]\n"
		"  -t, --threads N        initiator threads, one connection each [1]\n"
		"  -d, --duration S       seconds per block size [1]\n"
		"  -o, --op write|read    direction [write]\n"
		"  -p, --pattern P        local: pairwise (a target per thread) or many-to-one [pairwise]\n"
		"  -q, --depth N          batches in flight per thread [2]\n"
		"  -s, --seg-bytes SIZE   segment size on each side [256M]\n"
		"  -M, --mem shm|malloc   buffers: kcoll_mem_alloc (daemon maps them) or malloc [shm]\n"
		"  -a, --anchor memcpy|none  local: memcpy of the same batches beside [memcpy]\n"
		"      --tcp-mem KIND     tcp modes' buffer: anon, memfd (MAP_SHARED, like\n"
		"                         kcoll_mem_alloc's), anon-huge or memfd-huge (2 MiB\n"
		"                         aligned, collapsed into huge pages) [anon]\n"
		"      --json             print JSON instead of the table\n"
		"  -h, --help             this help\n\n"
		"Columns: block, batch, GB/s (all threads), avg/p50/p99/p999 latency of one\n"
		"batch in microseconds; with the anchor, its GB/s and the ratio.\n\n"
		"tcp-source sends the batches an initiator would (write, thread 0's seeds)\n"
		"over KCOLL_KV_STREAMS (default 4) TCP streams to a tcp-sink, each batch's\n"
		"bytes split evenly over the streams, one sendmsg/recvmsg of iovecs per\n"
		"stream and batch, from and into the blocks in place; it prints block,\n"
		"batch, GB/s (bytes the sink confirmed over the time until its answer).\n");
}

static void __attribute__((noreturn)) die_usage(const char *what, const char *arg)
{
	fprintf(stderr, "kcoll-kvbench: %s '%s' (see --help)\n", what, arg);
	exit(2);
}

static void parse(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "mode", required_argument, NULL, 'm' }, { "desc", required_argument, NULL, 'D' },
		{ "addr", required_argument, NULL, 'A' },
		{ "block", required_argument, NULL, 'b' }, { "batch", required_argument, NULL, 'B' },
		{ "threads", required_argument, NULL, 't' }, { "duration", required_argument, NULL, 'd' },
		{ "op", required_argument, NULL, 'o' }, { "pattern", required_argument, NULL, 'p' },
		{ "depth", required_argument, NULL, 'q' }, { "seg-bytes", required_argument, NULL, 's' },
		{ "mem", required_argument, NULL, 'M' }, { "anchor", required_argument, NULL, 'a' },
		{ "json", no_argument, NULL, 'J' }, { "help", no_argument, NULL, 'h' },
		{ "tcp-mem", required_argument, NULL, 'T' }, { 0 }
	};
	const char *blocks = "4K,64K,1M,4M";
	char *end;
	int c;

	while ((c = getopt_long(argc, argv, "m:D:A:b:B:t:d:o:p:q:s:M:a:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm':
			if (!strcmp(optarg, "local")) kvb_opt.mode = MODE_LOCAL;
			else if (!strcmp(optarg, "target")) kvb_opt.mode = MODE_TARGET;
			else if (!strcmp(optarg, "initiator")) kvb_opt.mode = MODE_INITIATOR;
			else if (!strcmp(optarg, "tcp-sink")) kvb_opt.mode = MODE_TCP_SINK;
			else if (!strcmp(optarg, "tcp-source")) kvb_opt.mode = MODE_TCP_SOURCE;
			else die_usage("unknown mode", optarg);
			break;
		case 'D': kvb_opt.desc_path = optarg; break;
		case 'A': kvb_opt.addr = optarg; break;
		case 'b': blocks = optarg; break;
		case 'B':
			kvb_opt.batch = strtoul(optarg, &end, 0);
			if (*end || !kvb_opt.batch || kvb_opt.batch > KCOLL_XFER_MAX_ENTRIES)
				die_usage("batch must be 1..4096, not", optarg);
			break;
		case 't':
			kvb_opt.threads = (int)strtol(optarg, &end, 0);
			if (*end || kvb_opt.threads < 1 || kvb_opt.threads > MAX_THREADS)
				die_usage("threads must be 1..64, not", optarg);
			break;
		case 'd':
			kvb_opt.duration = strtod(optarg, &end);
			if (*end || kvb_opt.duration <= 0)
				die_usage("bad duration", optarg);
			break;
		case 'o':
			if (strcmp(optarg, "write") && strcmp(optarg, "read"))
				die_usage("op must be write or read, not", optarg);
			kvb_opt.read = !strcmp(optarg, "read");
			break;
		case 'p':
			if (strcmp(optarg, "pairwise") && strcmp(optarg, "many-to-one"))
				die_usage("pattern must be pairwise or many-to-one, not", optarg);
			kvb_opt.many_to_one = !strcmp(optarg, "many-to-one");
			break;
		case 'q':
			kvb_opt.depth = (int)strtol(optarg, &end, 0);
			if (*end || kvb_opt.depth < 1 || kvb_opt.depth > 64)
				die_usage("depth must be 1..64, not", optarg);
			break;
		case 's':
			if (bench_parse_size(optarg, &kvb_opt.seg_bytes) || kvb_opt.seg_bytes < 4096)
				die_usage("bad segment size", optarg);
			break;
		case 'M':
			if (strcmp(optarg, "shm") && strcmp(optarg, "malloc"))
				die_usage("mem must be shm or malloc, not", optarg);
			kvb_opt.shm = !strcmp(optarg, "shm");
			break;
		case 'a':
			if (strcmp(optarg, "memcpy") && strcmp(optarg, "none"))
				die_usage("anchor must be memcpy or none, not", optarg);
			kvb_opt.anchor = !strcmp(optarg, "memcpy");
			break;
		case 'J': kvb_opt.json = true; break;
		case 'T':
			kvb_opt.tcp_mem = -1;
			for (int i = 0; i < 4; i++)
				if (!strcmp(optarg, kvb_tcp_mem_names[i]))
					kvb_opt.tcp_mem = i;
			if (kvb_opt.tcp_mem < 0)
				die_usage("tcp-mem must be anon, memfd, anon-huge or memfd-huge, not", optarg);
			break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); exit(2);
		}
	}
	if (optind < argc)
		die_usage("unexpected argument", argv[optind]);
	{
		char *dup = strdup(blocks), *save = NULL;

		for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
			size_t v;

			if (kvb_opt.nblocks == MAX_BLOCKS || bench_parse_size(tok, &v) || !v ||
			    v > kvb_opt.seg_bytes)
				die_usage("bad block size (or larger than --seg-bytes)", tok);
			kvb_opt.blocks[kvb_opt.nblocks++] = v;
		}
		free(dup);
	}
	if ((kvb_opt.mode == MODE_TCP_SINK || kvb_opt.mode == MODE_TCP_SOURCE) && !kvb_opt.addr)
		die_usage("tcp-sink and tcp-source need --addr HOST:PORT, mode",
			  kvb_opt.mode == MODE_TCP_SINK ? "tcp-sink" : "tcp-source");
	if ((kvb_opt.mode == MODE_TCP_SINK || kvb_opt.mode == MODE_TCP_SOURCE) && (kvb_opt.read || kvb_opt.threads > 1))
		die_usage("tcp modes measure one writer (no --op read, no --threads), mode",
			  kvb_opt.mode == MODE_TCP_SINK ? "tcp-sink" : "tcp-source");
	if ((kvb_opt.mode == MODE_TARGET || kvb_opt.mode == MODE_INITIATOR) && !kvb_opt.desc_path)
		die_usage("target and initiator modes need --desc", kvb_opt.mode == MODE_TARGET ? "target" : "initiator");
	if (kvb_opt.mode != MODE_LOCAL)
		kvb_opt.anchor = false;
}

static int buf_alloc(struct kcoll *k, size_t n, void **p)
{
	int r = 0;

	if (kvb_opt.shm)
		r = kcoll_mem_alloc(k, n, p);
	else if (!(*p = malloc(n)))
		r = -ENOMEM;
	if (!r)
		memset(*p, 0x42, n);	/* touch every page before timing */
	return r;
}

/* ---- target ---------------------------------------------------------------- */

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	stop = 1;
}

/*
 * Register a segment and publish its descriptor, in the file path or (a
 * target forked by local mode) as "desc HEX" on stdout; then serve until told.
 */
static int target_run(const char *path)
{
	struct kcoll *k;
	struct kcoll_seg *seg;
	void *buf;
	int r;

	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	r = kcoll_connect(NULL, &k);
	if (!r)
		r = buf_alloc(k, kvb_opt.seg_bytes, &buf);
	if (!r)
		r = kcoll_seg_register(k, buf, kvb_opt.seg_bytes, NULL, &seg);
	if (r) {
		fprintf(stderr, "kcoll-kvbench: target: %s\n", kcoll_strerror(r));
		return 1;
	}
	if (!path) {
		char hex[2 * KCOLL_SEG_DESC_BYTES + 1];
		kcoll_seg_desc_t d;

		kcoll_seg_export(seg, &d);
		launch_hex_encode(d.bytes, sizeof(d.bytes), hex);
		printf("desc %s\n", hex);
		if (fflush(stdout))
			return 1;
	} else {
		char tmp[4096];
		kcoll_seg_desc_t d;
		FILE *f;

		kcoll_seg_export(seg, &d);
		snprintf(tmp, sizeof(tmp), "%s.tmp", path);
		f = fopen(tmp, "w");
		if (!f || fwrite(&d, sizeof(d), 1, f) != 1 || fclose(f) || rename(tmp, path)) {
			fprintf(stderr, "kcoll-kvbench: cannot write %s: %s\n", path, strerror(errno));
			return 1;
		}
		fprintf(stderr, "kcoll-kvbench: target: %zu bytes, descriptor in %s; Ctrl-C ends it\n",
			kvb_opt.seg_bytes, path);
	}
	while (!stop)
		pause();
	kcoll_seg_unregister(seg);
	kcoll_disconnect(k);
	return 0;
}

static int read_descs(const char *list)
{
	char *dup = strdup(list), *save = NULL;

	for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		FILE *f = NULL;

		if (ndescs == MAX_DESCS)
			break;
		for (int i = 0; i < 300 && !(f = fopen(tok, "r")); i++)
			usleep(100000);	/* the target may still be starting */
		if (!f || fread(&descs[ndescs], sizeof(descs[0]), 1, f) != 1) {
			fprintf(stderr, "kcoll-kvbench: cannot read a descriptor from %s\n", tok);
			free(dup);
			return -ENOENT;
		}
		fclose(f);
		ndescs++;
	}
	free(dup);
	return ndescs ? 0 : -ENOENT;
}

/* Local mode's targets, forked through launch.c: target i's descriptor is descs[i]. */
static bool target_ready[MAX_THREADS];

static void target_line(struct launch *l, int i, char *line)
{
	char hex[2 * KCOLL_SEG_DESC_BYTES + 1];

	if (sscanf(line, "desc %256s", hex) == 1 &&
	    !launch_hex_decode(hex, descs[i].bytes, sizeof(descs[i].bytes))) {
		target_ready[i] = true;
		return;
	}
	fprintf(stderr, "kcoll-kvbench: target %d says: %s\n", i, line);
}

static void target_label(struct launch *l, int i, char *out, size_t len)
{
	snprintf(out, len, "target %d", i);
}

/* One that dies before it is ready has said why on stderr. */
static bool target_exited(struct launch *l, int i, int st)
{
	if (target_ready[i])
		return false;
	fprintf(stderr, "kcoll-kvbench: target %d failed to start (its error is above)\n", i);
	return true;
}

static int target_child(void *arg)
{
	return target_run(NULL);
}

/* Start the targets one by one, each once the one before has its segment. 0 or -1. */
static int targets_start(struct launch *l)
{
	static const struct launch_ops ops = {
		.line = target_line, .label = target_label, .exited = target_exited,
	};

	/* In our process group: a Ctrl-C here ends them as well. */
	if (launch_init(l, ndescs, "kcoll-kvbench", &ops, NULL, LAUNCH_SAME_GROUP)) {
		fprintf(stderr, "kcoll-kvbench: out of memory\n");
		return -1;
	}
	l->noun = "target";
	for (int i = 0; i < ndescs; i++) {
		int r = launch_spawn(l, i, NULL, target_child, NULL);

		if (r) {
			fprintf(stderr, "kcoll-kvbench: target %d failed to start: fork: %s\n", i,
				strerror(-r));
			return -1;
		}
		/* One that dies before it is ready says so and fails the run. */
		while (!target_ready[i] && !l->failed && launch_poll(l))
			;
		if (!target_ready[i])
			return -1;
	}
	return 0;
}

/* ---- initiator --------------------------------------------------------------- */

struct worker {
	int idx;
	size_t block;
	uint32_t batch;
	pthread_t tid;
	int err;
	uint64_t batches;	/* completed from t0 to t1, both counted */
	double t0, t1;		/* t0: the first completion after the warm-up */
	double *lat;		/* seconds per batch */
	size_t nlat, cap;
	/* connection kept across block sizes */
	struct kcoll *k;
	struct kcoll_seg *ls;
	struct kcoll_rseg *rs;
	void *buf;
};

static void lat_add(struct worker *w, double v)
{
	if (w->nlat == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 4096;
		double *p = realloc(w->lat, cap * sizeof(*p));

		if (!p)
			return;
		w->lat = p;
		w->cap = cap;
	}
	w->lat[w->nlat++] = v;
}

static void *worker_run(void *arg)
{
	struct worker *w = arg;
	uint32_t nb = kvb_nbatches(w->block, w->batch), next = 0;
	struct kcoll_xfer_entry *e = malloc((size_t)nb * w->batch * sizeof(*e));
	struct kcoll_req *rq[64];
	double sub[64], end, warm;
	int r = 0, inflight = 0, head = 0;

	if (!e) {
		w->err = -ENOMEM;
		return NULL;
	}
	for (uint32_t i = 0; i < nb; i++)
		kvb_make_entries(e + (size_t)i * w->batch, w->batch, w->block, kvb_opt.seg_bytes,
				 0x9e3779b97f4a7c15ULL + w->idx * 1000 + i);
	warm = kvb_now_s() + (kvb_opt.duration > 1 ? 0.2 : kvb_opt.duration / 5);
	end = warm + kvb_opt.duration;
	w->t0 = w->t1 = 0;
	for (;;) {
		double t = kvb_now_s();

		while (!r && inflight < kvb_opt.depth && t < end) {
			int slot = (head + inflight) % kvb_opt.depth;

			r = (kvb_opt.read ? kcoll_xfer_read : kcoll_xfer_write)(w->ls, w->rs,
				e + (size_t)(next++ % nb) * w->batch, w->batch, KCOLL_NOTIFY_NONE, &rq[slot]);
			sub[slot] = kvb_now_s();
			if (!r)
				inflight++;
		}
		if (!inflight)
			break;
		r = r ? r : kcoll_wait(rq[head], 60000);
		if (r)
			break;
		t = kvb_now_s();
		/* Throughput counts completions after a completion: from a
		 * submission instead, a batch queued behind one submitted
		 * before the warm-up would pay for that one's bytes too (a
		 * whole batch of time, which is 10% of a run of 4 MiB x 8
		 * batches over rxe). Latency is per batch submitted after it. */
		if (t >= warm) {
			w->t0 = w->t0 ? w->t0 : t;
			w->t1 = t;
			w->batches++;
		}
		if (sub[head] >= warm)
			lat_add(w, t - sub[head]);
		head = (head + 1) % kvb_opt.depth;
		inflight--;
	}
	while (inflight-- > 0) {	/* after an error: drain */
		kcoll_wait(rq[head], 60000);
		head = (head + 1) % kvb_opt.depth;
	}
	w->err = r;
	free(e);
	return NULL;
}

static int worker_setup(struct worker *w)
{
	int r = kcoll_connect(NULL, &w->k);

	if (!r)
		r = buf_alloc(w->k, kvb_opt.seg_bytes, &w->buf);
	if (!r)
		r = kcoll_seg_register(w->k, w->buf, kvb_opt.seg_bytes, NULL, &w->ls);
	if (!r)
		r = kcoll_seg_import(w->k, &descs[w->idx % ndescs], &w->rs);
	if (!r && kcoll_rseg_size(w->rs) < kvb_opt.seg_bytes) {
		fprintf(stderr, "kcoll-kvbench: the target's segment (%llu bytes) is smaller than "
			"--seg-bytes\n", (unsigned long long)kcoll_rseg_size(w->rs));
		r = -ERANGE;
	}
	return r;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

struct row {
	size_t block;
	uint32_t batch;
	double gbps, avg_us, p50_us, p99_us, p999_us;
	uint64_t batches;
	uint64_t bytes;		/* moved by all threads in the measured time */
	double anchor_gbps;
};

/* memcpy of the same batches, threads in parallel, same duration */
struct anchor_arg {
	size_t block;
	uint32_t batch;
	int idx;
	uint64_t bytes;
	double secs;
};

static void *anchor_run(void *arg)
{
	struct anchor_arg *a = arg;
	uint32_t nb = kvb_nbatches(a->block, a->batch), next = 0;
	struct kcoll_xfer_entry *all = malloc((size_t)nb * a->batch * sizeof(*all)), *e;
	uint8_t *src = malloc(kvb_opt.seg_bytes), *dst = malloc(kvb_opt.seg_bytes);
	double t0, end;

	if (!all || !src || !dst)
		goto out;
	memset(src, 1, kvb_opt.seg_bytes);
	memset(dst, 2, kvb_opt.seg_bytes);
	for (uint32_t i = 0; i < nb; i++)
		kvb_make_entries(all + (size_t)i * a->batch, a->batch, a->block, kvb_opt.seg_bytes,
				 0x9e3779b97f4a7c15ULL + a->idx * 1000 + i);
	t0 = kvb_now_s();
	end = t0 + kvb_opt.duration;
	do {
		e = all + (size_t)(next++ % nb) * a->batch;
		for (uint32_t i = 0; i < a->batch; i++)
			memcpy(kvb_opt.read ? src + e[i].local_off : dst + e[i].remote_off,
			       kvb_opt.read ? dst + e[i].remote_off : src + e[i].local_off, e[i].len);
		a->bytes += (uint64_t)a->batch * a->block;
	} while (kvb_now_s() < end);
	a->secs = kvb_now_s() - t0;
out:
	free(all);
	free(src);
	free(dst);
	return NULL;
}

static double anchor_gbps(size_t block, uint32_t batch)
{
	struct anchor_arg a[MAX_THREADS] = { 0 };
	pthread_t tid[MAX_THREADS];
	double gb = 0, secs = 0;

	for (int i = 0; i < kvb_opt.threads; i++) {
		a[i] = (struct anchor_arg){ .block = block, .batch = batch, .idx = i };
		pthread_create(&tid[i], NULL, anchor_run, &a[i]);
	}
	for (int i = 0; i < kvb_opt.threads; i++) {
		pthread_join(tid[i], NULL);
		gb += a[i].bytes / 1e9;
		if (a[i].secs > secs)
			secs = a[i].secs;
	}
	return secs > 0 ? gb / secs : 0;
}

static int measure(struct worker *ws, struct row *rows)
{
	for (int b = 0; b < kvb_opt.nblocks; b++) {
		size_t block = kvb_opt.blocks[b];
		uint32_t batch = kvb_opt.batch;
		double t0 = 1e30, t1 = 0, sum = 0;
		uint64_t n = 0, bytes = 0;
		double *all;
		size_t nall = 0;

		if ((uint64_t)batch * block > kvb_opt.seg_bytes)
			batch = (uint32_t)(kvb_opt.seg_bytes / block);
		for (int i = 0; i < kvb_opt.threads; i++) {
			ws[i].block = block;
			ws[i].batch = batch;
			ws[i].batches = 0;
			ws[i].nlat = 0;
			if (pthread_create(&ws[i].tid, NULL, worker_run, &ws[i]))
				return -EAGAIN;
		}
		for (int i = 0; i < kvb_opt.threads; i++)
			pthread_join(ws[i].tid, NULL);
		for (int i = 0; i < kvb_opt.threads; i++) {
			if (ws[i].err) {
				fprintf(stderr, "kcoll-kvbench: thread %d: %s\n", i, kcoll_strerror(ws[i].err));
				return ws[i].err;
			}
			if (ws[i].batches) {
				t0 = ws[i].t0 < t0 ? ws[i].t0 : t0;
				t1 = ws[i].t1 > t1 ? ws[i].t1 : t1;
			}
			n += ws[i].batches;
			nall += ws[i].nlat;
		}
		/* The window opens at the first thread's first completion: the
		 * other threads' first ones fall inside it, its own does not. */
		n -= n > 0;
		bytes = n * batch * block;
		all = malloc((nall ? nall : 1) * sizeof(*all));
		nall = 0;
		for (int i = 0; i < kvb_opt.threads; i++)
			for (size_t j = 0; j < ws[i].nlat; j++)
				sum += all[nall++] = ws[i].lat[j];
		qsort(all, nall, sizeof(*all), cmp_d);
		rows[b] = (struct row){
			.block = block, .batch = batch, .batches = n, .bytes = bytes,
			.gbps = t1 > t0 ? bytes / (t1 - t0) / 1e9 : 0,
			.avg_us = nall ? sum / nall * 1e6 : 0,
			.p50_us = nall ? all[nall / 2] * 1e6 : 0,
			.p99_us = nall ? all[(size_t)(nall * 0.99)] * 1e6 : 0,
			.p999_us = nall ? all[(size_t)(nall * 0.999)] * 1e6 : 0,
		};
		free(all);
		if (kvb_opt.anchor)
			rows[b].anchor_gbps = anchor_gbps(block, batch);
		if (!kvb_opt.json) {
			printf("%10zu %6u %9.3f %10.1f %10.1f %10.1f %10.1f", block, batch, rows[b].gbps,
			       rows[b].avg_us, rows[b].p50_us, rows[b].p99_us, rows[b].p999_us);
			if (kvb_opt.anchor)
				printf(" %10.3f %6.2f", rows[b].anchor_gbps,
				       rows[b].anchor_gbps > 0 ? rows[b].gbps / rows[b].anchor_gbps : 0);
			printf("\n");
			fflush(stdout);
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct worker ws[MAX_THREADS] = { 0 };
	struct row rows[MAX_BLOCKS];
	struct launch targets = { 0 };
	int r = 0;
	char host[64] = "";

	parse(argc, argv);
	gethostname(host, sizeof(host) - 1);
	if (kvb_opt.mode == MODE_TARGET)
		return target_run(kvb_opt.desc_path);
	if (kvb_opt.mode == MODE_TCP_SINK)
		return kvb_tcp_sink();
	if (kvb_opt.mode == MODE_TCP_SOURCE)
		return kvb_tcp_source();
	if (kvb_opt.mode == MODE_INITIATOR) {
		if (read_descs(kvb_opt.desc_path))
			return 1;
	} else {
		ndescs = kvb_opt.many_to_one ? 1 : kvb_opt.threads;
		if (targets_start(&targets)) {
			r = 1;
			goto out;
		}
	}
	for (int i = 0; i < kvb_opt.threads && !r; i++) {
		ws[i].idx = i;
		r = worker_setup(&ws[i]);
		if (r)
			fprintf(stderr, "kcoll-kvbench: thread %d: %s\n", i, kcoll_strerror(r));
	}
	if (r)
		goto out;
	if (!kvb_opt.json) {
		printf("# kcoll-kvbench %s: %s, %d thread(s), %s, depth %d, %s buffers, host %s\n",
		       kvb_opt.mode == MODE_LOCAL ? "local" : "initiator", kvb_opt.read ? "read" : "write",
		       kvb_opt.threads, kvb_opt.mode == MODE_LOCAL ? (kvb_opt.many_to_one ? "many-to-one" : "pairwise") :
		       "to the --desc target(s)", kvb_opt.depth, kvb_opt.shm ? "kcoll_mem_alloc" : "malloc", host);
		printf("# %8s %6s %9s %10s %10s %10s %10s%s\n", "block", "batch", "GB/s", "avg_us",
		       "p50_us", "p99_us", "p999_us", kvb_opt.anchor ? "  memcpy_GB/s  ratio" : "");
	}
	r = measure(ws, rows);
	if (!r && kvb_opt.json) {
		printf("{\"tool\":\"kcoll-kvbench\",\"version\":\"%s\",\"host\":\"%s\",\"mode\":\"%s\","
		       "\"op\":\"%s\",\"threads\":%d,\"pattern\":\"%s\",\"depth\":%d,\"mem\":\"%s\","
		       "\"seg_bytes\":%zu,\"rows\":[", kcoll_version(), host,
		       kvb_opt.mode == MODE_LOCAL ? "local" : "initiator", kvb_opt.read ? "read" : "write",
		       kvb_opt.threads, kvb_opt.many_to_one ? "many-to-one" : "pairwise", kvb_opt.depth,
		       kvb_opt.shm ? "shm" : "malloc", kvb_opt.seg_bytes);
		for (int b = 0; b < kvb_opt.nblocks; b++) {
			printf("%s{\"block\":%zu,\"batch\":%u,\"batches\":%llu,\"bytes\":%llu,"
			       "\"GBps\":%.4f,\"avg_us\":%.2f,\"p50_us\":%.2f,\"p99_us\":%.2f,"
			       "\"p999_us\":%.2f", b ? "," : "",
			       rows[b].block, rows[b].batch, (unsigned long long)rows[b].batches,
			       (unsigned long long)rows[b].bytes, rows[b].gbps, rows[b].avg_us,
			       rows[b].p50_us, rows[b].p99_us, rows[b].p999_us);
			if (kvb_opt.anchor)
				printf(",\"memcpy_GBps\":%.4f,\"ratio\":%.4f", rows[b].anchor_gbps,
				       rows[b].anchor_gbps > 0 ? rows[b].gbps / rows[b].anchor_gbps : 0);
			printf("}");
		}
		printf("]}\n");
	}
out:
	for (int i = 0; i < kvb_opt.threads; i++) {
		if (ws[i].rs)
			kcoll_rseg_close(ws[i].rs);
		if (ws[i].ls)
			kcoll_seg_unregister(ws[i].ls);
		if (ws[i].buf && kvb_opt.shm)
			kcoll_mem_free(ws[i].k, ws[i].buf);
		else
			free(ws[i].buf);
		if (ws[i].k)
			kcoll_disconnect(ws[i].k);
		free(ws[i].lat);
	}
	if (targets.c) {
		launch_stop(&targets);
		launch_run(&targets);
		launch_free(&targets);
	}
	return r ? 1 : 0;
}
