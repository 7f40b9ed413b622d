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
 *
 * Each initiator thread has its own connection (its own ring thread in
 * kcolld) and keeps --depth batches in flight; a batch is --batch blocks of
 * --block bytes at random disjoint slots of the segments.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
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

#define MAX_BLOCKS	16
#define MAX_THREADS	64
#define MAX_DESCS	16

enum mode { MODE_LOCAL, MODE_TARGET, MODE_INITIATOR };

static struct {
	enum mode mode;
	const char *desc_path;
	size_t blocks[MAX_BLOCKS];
	int nblocks;
	uint32_t batch;
	int threads;
	double duration;
	bool read;
	bool many_to_one;
	int depth;
	size_t seg_bytes;
	bool shm;
	bool anchor;
	bool json;
} opt = {
	.batch = 64, .threads = 1, .duration = 1.0, .depth = 2, .seg_bytes = 256u << 20,
	.shm = true, .anchor = true,
};

static kcoll_seg_desc_t descs[MAX_DESCS];
static int ndescs;

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kcoll-kvbench [options]\n"
		"KV-cache transfers through kcolld: batches of scattered blocks, GB/s and\n"
		"per-batch latency percentiles.\n\n"
		"  -m, --mode MODE        local (fork targets here), target, initiator   [local]\n"
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
		"      --json             print JSON instead of the table\n"
		"  -h, --help             this help\n\n"
		"Columns: block, batch, GB/s (all threads), avg/p50/p99/p999 latency of one\n"
		"batch in microseconds; with the anchor, its GB/s and the ratio.\n");
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
		{ "block", required_argument, NULL, 'b' }, { "batch", required_argument, NULL, 'B' },
		{ "threads", required_argument, NULL, 't' }, { "duration", required_argument, NULL, 'd' },
		{ "op", required_argument, NULL, 'o' }, { "pattern", required_argument, NULL, 'p' },
		{ "depth", required_argument, NULL, 'q' }, { "seg-bytes", required_argument, NULL, 's' },
		{ "mem", required_argument, NULL, 'M' }, { "anchor", required_argument, NULL, 'a' },
		{ "json", no_argument, NULL, 'J' }, { "help", no_argument, NULL, 'h' }, { 0 }
	};
	const char *blocks = "4K,64K,1M,4M";
	char *end;
	int c;

	while ((c = getopt_long(argc, argv, "m:D:b:B:t:d:o:p:q:s:M:a:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm':
			if (!strcmp(optarg, "local")) opt.mode = MODE_LOCAL;
			else if (!strcmp(optarg, "target")) opt.mode = MODE_TARGET;
			else if (!strcmp(optarg, "initiator")) opt.mode = MODE_INITIATOR;
			else die_usage("unknown mode", optarg);
			break;
		case 'D': opt.desc_path = optarg; break;
		case 'b': blocks = optarg; break;
		case 'B':
			opt.batch = strtoul(optarg, &end, 0);
			if (*end || !opt.batch || opt.batch > KCOLL_XFER_MAX_ENTRIES)
				die_usage("batch must be 1..4096, not", optarg);
			break;
		case 't':
			opt.threads = (int)strtol(optarg, &end, 0);
			if (*end || opt.threads < 1 || opt.threads > MAX_THREADS)
				die_usage("threads must be 1..64, not", optarg);
			break;
		case 'd':
			opt.duration = strtod(optarg, &end);
			if (*end || opt.duration <= 0)
				die_usage("bad duration", optarg);
			break;
		case 'o':
			if (strcmp(optarg, "write") && strcmp(optarg, "read"))
				die_usage("op must be write or read, not", optarg);
			opt.read = !strcmp(optarg, "read");
			break;
		case 'p':
			if (strcmp(optarg, "pairwise") && strcmp(optarg, "many-to-one"))
				die_usage("pattern must be pairwise or many-to-one, not", optarg);
			opt.many_to_one = !strcmp(optarg, "many-to-one");
			break;
		case 'q':
			opt.depth = (int)strtol(optarg, &end, 0);
			if (*end || opt.depth < 1 || opt.depth > 64)
				die_usage("depth must be 1..64, not", optarg);
			break;
		case 's':
			if (bench_parse_size(optarg, &opt.seg_bytes) || opt.seg_bytes < 4096)
				die_usage("bad segment size", optarg);
			break;
		case 'M':
			if (strcmp(optarg, "shm") && strcmp(optarg, "malloc"))
				die_usage("mem must be shm or malloc, not", optarg);
			opt.shm = !strcmp(optarg, "shm");
			break;
		case 'a':
			if (strcmp(optarg, "memcpy") && strcmp(optarg, "none"))
				die_usage("anchor must be memcpy or none, not", optarg);
			opt.anchor = !strcmp(optarg, "memcpy");
			break;
		case 'J': opt.json = true; break;
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

			if (opt.nblocks == MAX_BLOCKS || bench_parse_size(tok, &v) || !v ||
			    v > opt.seg_bytes)
				die_usage("bad block size (or larger than --seg-bytes)", tok);
			opt.blocks[opt.nblocks++] = v;
		}
		free(dup);
	}
	if (opt.mode != MODE_LOCAL && !opt.desc_path)
		die_usage("target and initiator modes need --desc", opt.mode == MODE_TARGET ? "target" : "initiator");
	if (opt.mode != MODE_LOCAL)
		opt.anchor = false;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int buf_alloc(struct kcoll *k, size_t n, void **p)
{
	int r = 0;

	if (opt.shm)
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

/* Register a segment and publish its descriptor; then serve until told. */
static int target_run(kcoll_seg_desc_t *out, const char *path, int ready_fd)
{
	struct kcoll *k;
	struct kcoll_seg *seg;
	void *buf;
	int r;

	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	r = kcoll_connect(NULL, &k);
	if (!r)
		r = buf_alloc(k, opt.seg_bytes, &buf);
	if (!r)
		r = kcoll_seg_register(k, buf, opt.seg_bytes, NULL, &seg);
	if (r) {
		fprintf(stderr, "kcoll-kvbench: target: %s\n", kcoll_strerror(r));
		return 1;
	}
	if (out)
		kcoll_seg_export(seg, out);
	if (path) {
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
			opt.seg_bytes, path);
	}
	if (ready_fd >= 0 && write(ready_fd, "r", 1) != 1)
		return 1;
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

/* ---- initiator --------------------------------------------------------------- */

struct worker {
	int idx;
	size_t block;
	uint32_t batch;
	pthread_t tid;
	int err;
	uint64_t batches;
	double t0, t1;
	double *lat;		/* seconds per batch */
	size_t nlat, cap;
	/* connection kept across block sizes */
	struct kcoll *k;
	struct kcoll_seg *ls;
	struct kcoll_rseg *rs;
	void *buf;
};

static uint64_t xrand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* A generator state from a seed: splitmix64's finalizer, so that nearby
 * seeds (one per batch) start far apart; odd, hence never zero. */
static uint64_t seed_state(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return (x ^ (x >> 31)) | 1;
}

/* Distinct batches cycled through, so that the blocks sweep the segments
 * (DRAM, not cache) for the transfer and the memcpy anchor alike. */
static uint32_t nbatches(size_t block, uint32_t batch)
{
	uint64_t n = opt.seg_bytes / ((uint64_t)block * batch);

	return n < 1 ? 1 : n > 64 ? 64 : (uint32_t)n;
}

/* batch random distinct slots of block bytes in a segment of seg bytes */
static void make_entries(struct kcoll_xfer_entry *e, uint32_t n, size_t block, size_t seg,
			 uint64_t seed)
{
	uint64_t slots = seg / block, s = seed_state(seed);
	uint64_t *perm = malloc(slots * sizeof(*perm));

	for (uint64_t i = 0; i < slots; i++)
		perm[i] = i;
	for (uint32_t i = 0; i < n; i++) {	/* partial Fisher-Yates */
		uint64_t j = i + xrand(&s) % (slots - i), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
		e[i].remote_off = perm[i] * block;
	}
	for (uint64_t i = 0; i < slots; i++)
		perm[i] = i;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t j = i + xrand(&s) % (slots - i), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
		e[i].local_off = perm[i] * block;
		e[i].len = block;
	}
	free(perm);
}

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
	uint32_t nb = nbatches(w->block, w->batch), next = 0;
	struct kcoll_xfer_entry *e = malloc((size_t)nb * w->batch * sizeof(*e));
	struct kcoll_req *rq[64];
	double sub[64], end, warm;
	int r = 0, inflight = 0, head = 0;

	if (!e) {
		w->err = -ENOMEM;
		return NULL;
	}
	for (uint32_t i = 0; i < nb; i++)
		make_entries(e + (size_t)i * w->batch, w->batch, w->block, opt.seg_bytes,
			     0x9e3779b97f4a7c15ULL + w->idx * 1000 + i);
	warm = now_s() + (opt.duration > 1 ? 0.2 : opt.duration / 5);
	end = warm + opt.duration;
	w->t0 = 0;
	for (;;) {
		double t = now_s();

		while (!r && inflight < opt.depth && t < end) {
			int slot = (head + inflight) % opt.depth;

			r = (opt.read ? kcoll_xfer_read : kcoll_xfer_write)(w->ls, w->rs,
				e + (size_t)(next++ % nb) * w->batch, w->batch, KCOLL_NOTIFY_NONE, &rq[slot]);
			sub[slot] = now_s();
			if (!r)
				inflight++;
		}
		if (!inflight)
			break;
		r = r ? r : kcoll_wait(rq[head], 60000);
		if (r)
			break;
		t = now_s();
		if (sub[head] >= warm) {
			if (!w->t0)
				w->t0 = sub[head];
			w->t1 = t;
			w->batches++;
			lat_add(w, t - sub[head]);
		}
		head = (head + 1) % opt.depth;
		inflight--;
	}
	while (inflight-- > 0) {	/* after an error: drain */
		kcoll_wait(rq[head], 60000);
		head = (head + 1) % opt.depth;
	}
	w->err = r;
	free(e);
	return NULL;
}

static int worker_setup(struct worker *w)
{
	int r = kcoll_connect(NULL, &w->k);

	if (!r)
		r = buf_alloc(w->k, opt.seg_bytes, &w->buf);
	if (!r)
		r = kcoll_seg_register(w->k, w->buf, opt.seg_bytes, NULL, &w->ls);
	if (!r)
		r = kcoll_seg_import(w->k, &descs[w->idx % ndescs], &w->rs);
	if (!r && kcoll_rseg_size(w->rs) < opt.seg_bytes) {
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
	uint32_t nb = nbatches(a->block, a->batch), next = 0;
	struct kcoll_xfer_entry *all = malloc((size_t)nb * a->batch * sizeof(*all)), *e;
	uint8_t *src = malloc(opt.seg_bytes), *dst = malloc(opt.seg_bytes);
	double t0, end;

	if (!all || !src || !dst)
		goto out;
	memset(src, 1, opt.seg_bytes);
	memset(dst, 2, opt.seg_bytes);
	for (uint32_t i = 0; i < nb; i++)
		make_entries(all + (size_t)i * a->batch, a->batch, a->block, opt.seg_bytes,
			     0x9e3779b97f4a7c15ULL + a->idx * 1000 + i);
	t0 = now_s();
	end = t0 + opt.duration;
	do {
		e = all + (size_t)(next++ % nb) * a->batch;
		for (uint32_t i = 0; i < a->batch; i++)
			memcpy(opt.read ? src + e[i].local_off : dst + e[i].remote_off,
			       opt.read ? dst + e[i].remote_off : src + e[i].local_off, e[i].len);
		a->bytes += (uint64_t)a->batch * a->block;
	} while (now_s() < end);
	a->secs = now_s() - t0;
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

	for (int i = 0; i < opt.threads; i++) {
		a[i] = (struct anchor_arg){ .block = block, .batch = batch, .idx = i };
		pthread_create(&tid[i], NULL, anchor_run, &a[i]);
	}
	for (int i = 0; i < opt.threads; i++) {
		pthread_join(tid[i], NULL);
		gb += a[i].bytes / 1e9;
		if (a[i].secs > secs)
			secs = a[i].secs;
	}
	return secs > 0 ? gb / secs : 0;
}

static int measure(struct worker *ws, struct row *rows)
{
	for (int b = 0; b < opt.nblocks; b++) {
		size_t block = opt.blocks[b];
		uint32_t batch = opt.batch;
		double t0 = 1e30, t1 = 0, sum = 0;
		uint64_t n = 0, bytes = 0;
		double *all;
		size_t nall = 0;

		if ((uint64_t)batch * block > opt.seg_bytes)
			batch = (uint32_t)(opt.seg_bytes / block);
		for (int i = 0; i < opt.threads; i++) {
			ws[i].block = block;
			ws[i].batch = batch;
			ws[i].batches = 0;
			ws[i].nlat = 0;
			if (pthread_create(&ws[i].tid, NULL, worker_run, &ws[i]))
				return -EAGAIN;
		}
		for (int i = 0; i < opt.threads; i++)
			pthread_join(ws[i].tid, NULL);
		for (int i = 0; i < opt.threads; i++) {
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
		bytes = n * batch * block;
		all = malloc((nall ? nall : 1) * sizeof(*all));
		nall = 0;
		for (int i = 0; i < opt.threads; i++)
			for (size_t j = 0; j < ws[i].nlat; j++)
				sum += all[nall++] = ws[i].lat[j];
		qsort(all, nall, sizeof(*all), cmp_d);
		rows[b] = (struct row){
			.block = block, .batch = batch, .batches = n,
			.gbps = t1 > t0 ? bytes / (t1 - t0) / 1e9 : 0,
			.avg_us = nall ? sum / nall * 1e6 : 0,
			.p50_us = nall ? all[nall / 2] * 1e6 : 0,
			.p99_us = nall ? all[(size_t)(nall * 0.99)] * 1e6 : 0,
			.p999_us = nall ? all[(size_t)(nall * 0.999)] * 1e6 : 0,
		};
		free(all);
		if (opt.anchor)
			rows[b].anchor_gbps = anchor_gbps(block, batch);
		if (!opt.json) {
			printf("%10zu %6u %9.3f %10.1f %10.1f %10.1f %10.1f", block, batch, rows[b].gbps,
			       rows[b].avg_us, rows[b].p50_us, rows[b].p99_us, rows[b].p999_us);
			if (opt.anchor)
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
	pid_t kids[MAX_THREADS];
	int nkids = 0, r = 0;
	kcoll_seg_desc_t *shared = NULL;
	char host[64] = "";

	parse(argc, argv);
	gethostname(host, sizeof(host) - 1);
	if (opt.mode == MODE_TARGET)
		return target_run(NULL, opt.desc_path, -1);
	if (opt.mode == MODE_INITIATOR) {
		if (read_descs(opt.desc_path))
			return 1;
	} else {
		int p[2];

		ndescs = opt.many_to_one ? 1 : opt.threads;
		shared = mmap(NULL, sizeof(*shared) * ndescs, PROT_READ | PROT_WRITE,
			      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (shared == MAP_FAILED || pipe(p))
			return 1;
		for (int i = 0; i < ndescs; i++) {
			char c;

			kids[nkids] = fork();
			if (kids[nkids] == 0) {
				close(p[0]);
				_exit(target_run(&shared[i], NULL, p[1]));
			}
			nkids++;
			if (read(p[0], &c, 1) != 1) {
				fprintf(stderr, "kcoll-kvbench: a target failed to start\n");
				r = 1;
				goto out;
			}
			descs[i] = shared[i];
		}
		close(p[0]);
		close(p[1]);
	}
	for (int i = 0; i < opt.threads && !r; i++) {
		ws[i].idx = i;
		r = worker_setup(&ws[i]);
		if (r)
			fprintf(stderr, "kcoll-kvbench: thread %d: %s\n", i, kcoll_strerror(r));
	}
	if (r)
		goto out;
	if (!opt.json) {
		printf("# kcoll-kvbench %s: %s, %d thread(s), %s, depth %d, %s buffers, host %s\n",
		       opt.mode == MODE_LOCAL ? "local" : "initiator", opt.read ? "read" : "write",
		       opt.threads, opt.mode == MODE_LOCAL ? (opt.many_to_one ? "many-to-one" : "pairwise") :
		       "to the --desc target(s)", opt.depth, opt.shm ? "kcoll_mem_alloc" : "malloc", host);
		printf("# %8s %6s %9s %10s %10s %10s %10s%s\n", "block", "batch", "GB/s", "avg_us",
		       "p50_us", "p99_us", "p999_us", opt.anchor ? "  memcpy_GB/s  ratio" : "");
	}
	r = measure(ws, rows);
	if (!r && opt.json) {
		printf("{\"tool\":\"kcoll-kvbench\",\"version\":\"%s\",\"host\":\"%s\",\"mode\":\"%s\","
		       "\"op\":\"%s\",\"threads\":%d,\"pattern\":\"%s\",\"depth\":%d,\"mem\":\"%s\","
		       "\"seg_bytes\":%zu,\"rows\":[", kcoll_version(), host,
		       opt.mode == MODE_LOCAL ? "local" : "initiator", opt.read ? "read" : "write",
		       opt.threads, opt.many_to_one ? "many-to-one" : "pairwise", opt.depth,
		       opt.shm ? "shm" : "malloc", opt.seg_bytes);
		for (int b = 0; b < opt.nblocks; b++) {
			printf("%s{\"block\":%zu,\"batch\":%u,\"batches\":%llu,\"GBps\":%.4f,\"avg_us\":%.2f,"
			       "\"p50_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f", b ? "," : "",
			       rows[b].block, rows[b].batch, (unsigned long long)rows[b].batches,
			       rows[b].gbps, rows[b].avg_us, rows[b].p50_us, rows[b].p99_us,
			       rows[b].p999_us);
			if (opt.anchor)
				printf(",\"memcpy_GBps\":%.4f,\"ratio\":%.4f", rows[b].anchor_gbps,
				       rows[b].anchor_gbps > 0 ? rows[b].gbps / rows[b].anchor_gbps : 0);
			printf("}");
		}
		printf("]}\n");
	}
out:
	for (int i = 0; i < opt.threads; i++) {
		if (ws[i].rs)
			kcoll_rseg_close(ws[i].rs);
		if (ws[i].ls)
			kcoll_seg_unregister(ws[i].ls);
		if (ws[i].buf && opt.shm)
			kcoll_mem_free(ws[i].k, ws[i].buf);
		else
			free(ws[i].buf);
		if (ws[i].k)
			kcoll_disconnect(ws[i].k);
		free(ws[i].lat);
	}
	for (int i = 0; i < nkids; i++) {
		kill(kids[i], SIGTERM);
		waitpid(kids[i], NULL, 0);
	}
	return r ? 1 : 0;
}
