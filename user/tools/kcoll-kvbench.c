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
 * --block bytes at random disjoint slots of the segments.
 */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "bench_common.h"
#include "config.h"
#include "iov.h"
#include "launch.h"

#define MAX_BLOCKS	16
#define MAX_THREADS	64
#define MAX_DESCS	16

enum mode { MODE_LOCAL, MODE_TARGET, MODE_INITIATOR, MODE_TCP_SINK, MODE_TCP_SOURCE };
/* tcp modes' buffers: anonymous (the default), a memfd MAP_SHARED like
 * kcoll_mem_alloc's; either one 2 MiB aligned with its whole 2 MiB pages
 * collapsed into huge pages (MADV_COLLAPSE) */
enum { TCP_MEM_ANON, TCP_MEM_MEMFD, TCP_MEM_ANON_HUGE, TCP_MEM_MEMFD_HUGE };
static const char *const tcp_mem_names[] = { "anon", "memfd", "anon-huge", "memfd-huge" };
#define TCP_MAX_STREAMS	16

static struct {
	enum mode mode;
	const char *desc_path;
	const char *addr;	/* tcp modes: HOST:PORT */
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
	int tcp_mem;		/* tcp modes: TCP_MEM_* */
	bool anchor;
	bool json;
} opt = {
	.batch = 64, .threads = 1, .duration = 1.0, .depth = 2, .seg_bytes = 256u << 20,
	.shm = true, .anchor = true,
};

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
			if (!strcmp(optarg, "local")) opt.mode = MODE_LOCAL;
			else if (!strcmp(optarg, "target")) opt.mode = MODE_TARGET;
			else if (!strcmp(optarg, "initiator")) opt.mode = MODE_INITIATOR;
			else if (!strcmp(optarg, "tcp-sink")) opt.mode = MODE_TCP_SINK;
			else if (!strcmp(optarg, "tcp-source")) opt.mode = MODE_TCP_SOURCE;
			else die_usage("unknown mode", optarg);
			break;
		case 'D': opt.desc_path = optarg; break;
		case 'A': opt.addr = optarg; break;
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
		case 'T':
			opt.tcp_mem = -1;
			for (int i = 0; i < 4; i++)
				if (!strcmp(optarg, tcp_mem_names[i]))
					opt.tcp_mem = i;
			if (opt.tcp_mem < 0)
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

			if (opt.nblocks == MAX_BLOCKS || bench_parse_size(tok, &v) || !v ||
			    v > opt.seg_bytes)
				die_usage("bad block size (or larger than --seg-bytes)", tok);
			opt.blocks[opt.nblocks++] = v;
		}
		free(dup);
	}
	if ((opt.mode == MODE_TCP_SINK || opt.mode == MODE_TCP_SOURCE) && !opt.addr)
		die_usage("tcp-sink and tcp-source need --addr HOST:PORT, mode",
			  opt.mode == MODE_TCP_SINK ? "tcp-sink" : "tcp-source");
	if ((opt.mode == MODE_TCP_SINK || opt.mode == MODE_TCP_SOURCE) && (opt.read || opt.threads > 1))
		die_usage("tcp modes measure one writer (no --op read, no --threads), mode",
			  opt.mode == MODE_TCP_SINK ? "tcp-sink" : "tcp-source");
	if ((opt.mode == MODE_TARGET || opt.mode == MODE_INITIATOR) && !opt.desc_path)
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
		r = buf_alloc(k, opt.seg_bytes, &buf);
	if (!r)
		r = kcoll_seg_register(k, buf, opt.seg_bytes, NULL, &seg);
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
			opt.seg_bytes, path);
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
	w->t0 = w->t1 = 0;
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
		/* The window opens at the first thread's first completion: the
		 * other threads' first ones fall inside it, its own does not. */
		n -= n > 0;
		bytes = n * batch * block;
		all = malloc((nall ? nall : 1) * sizeof(*all));
		nall = 0;
		for (int i = 0; i < opt.threads; i++)
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

/* ---- the raw TCP anchor (tcp-sink / tcp-source) ---------------------------- */

/*
 * What plain TCP does with the same batches, no kcolld: the source cuts each
 * batch's bytes (its blocks in order) into nstreams equal parts, stream s
 * sending part s with one sendmsg of iovecs pointing at the blocks in its
 * buffer, followed by an 8-byte mark saying whether another batch follows;
 * the sink's stream s receives part s with one recvmsg of iovecs pointing at
 * the blocks' offsets in its buffer (the mark of the next batch included).
 * Nothing waits at batch boundaries: the best raw TCP can do with these
 * bytes. After the last batch the sink answers the bytes it received; the
 * rate is those bytes over the time from the first send to the last answer.
 */
#define TCP_MAGIC	0x6b767470u	/* "kvtp" */

struct tcp_hello {
	uint32_t magic, stream, nstreams, batch;
	uint64_t block, seg_bytes;
};

struct tcp_mark {
	uint32_t magic, more;
};

static int tcp_nstreams(void)
{
	long long n = kcoll_knob_ll("KCOLL_KV_STREAMS");

	return n < 1 ? 1 : n > TCP_MAX_STREAMS ? TCP_MAX_STREAMS : (int)n;
}

/* Address idx (of the comma-separated --addr list, cycled) as HOST:PORT;
 * an empty HOST listens on every address. */
static int tcp_addr(struct addrinfo **ai, bool passive, int idx)
{
	char list[1024], *host = NULL, *save = NULL, *colon;
	struct addrinfo hint = { .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0 };
	int n = 0, r;

	snprintf(list, sizeof(list), "%s", opt.addr);
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
		n++;
	snprintf(list, sizeof(list), "%s", opt.addr);
	save = NULL;
	host = strtok_r(list, ",", &save);
	for (int i = 0; host && n && i < idx % n; i++)
		host = strtok_r(NULL, ",", &save);
	colon = host ? strrchr(host, ':') : NULL;
	if (!colon || !colon[1]) {
		fprintf(stderr, "kcoll-kvbench: --addr '%s' is not HOST:PORT[,HOST:PORT...]\n",
			opt.addr);
		return -EINVAL;
	}
	*colon = 0;
	r = getaddrinfo(host[0] ? host : NULL, colon + 1, &hint, ai);
	if (r) {
		fprintf(stderr, "kcoll-kvbench: --addr '%s': %s\n", opt.addr, gai_strerror(r));
		return -EINVAL;
	}
	return 0;
}

static int tcp_full(int fd, void *p, size_t n, bool out)
{
	struct iovec v = { p, n };

	return kcoll_io_iovs(fd, &v, 1, out, false);
}

/* Stream s's part of batch e (n blocks of block bytes) as iovecs into buf,
 * source side (local offsets) or sink side (remote offsets); returns the
 * count, bytes in *bytes. */
static size_t tcp_part(const struct kcoll_xfer_entry *e, uint32_t n, size_t block, int s,
		       int ns, uint8_t *buf, bool src, struct iovec *iov, uint64_t *bytes)
{
	uint64_t total = (uint64_t)n * block, lo = total * s / ns, hi = total * (s + 1) / ns;
	size_t k = 0;

	for (uint64_t at = lo; at < hi;) {
		uint32_t i = (uint32_t)(at / block);
		uint64_t in = at - (uint64_t)i * block, len = block - in;

		if (len > hi - at)
			len = hi - at;
		iov[k++] = (struct iovec){ buf + (src ? e[i].local_off : e[i].remote_off) + in, len };
		at += len;
	}
	*bytes = hi - lo;
	return k;
}

struct tcp_conn {
	int fd;
	uint8_t *buf;
};

static void *tcp_sink_conn(void *arg)
{
	struct tcp_conn *c = arg;
	struct tcp_hello h;
	struct tcp_mark m;
	struct kcoll_xfer_entry *all = NULL;
	struct iovec *iov = NULL;
	uint64_t got = 0;
	uint32_t nb, next = 0;

	if (tcp_full(c->fd, &h, sizeof(h), false) || h.magic != TCP_MAGIC || !h.nstreams ||
	    h.nstreams > TCP_MAX_STREAMS || h.stream >= h.nstreams || !h.block || !h.batch ||
	    h.batch > KCOLL_XFER_MAX_ENTRIES || h.seg_bytes != opt.seg_bytes ||
	    (uint64_t)h.batch * h.block > opt.seg_bytes) {
		fprintf(stderr, "kcoll-kvbench: tcp-sink: a bad hello (is --seg-bytes the same on "
			"both sides?)\n");
		goto out;
	}
	nb = nbatches(h.block, h.batch);
	all = malloc((size_t)nb * h.batch * sizeof(*all));
	iov = malloc(((size_t)h.batch + 2) * sizeof(*iov));
	if (!all || !iov)
		goto out;
	for (uint32_t i = 0; i < nb; i++)
		make_entries(all + (size_t)i * h.batch, h.batch, h.block, opt.seg_bytes,
			     0x9e3779b97f4a7c15ULL + i);
	if (tcp_full(c->fd, &m, sizeof(m), false))
		goto out;
	while (m.magic == TCP_MAGIC && m.more) {
		uint64_t bytes;
		size_t k = tcp_part(all + (size_t)(next++ % nb) * h.batch, h.batch, h.block,
				    (int)h.stream, (int)h.nstreams, c->buf, false, iov, &bytes);

		iov[k++] = (struct iovec){ &m, sizeof(m) };
		if (kcoll_io_iovs(c->fd, iov, k, false, false))
			goto out;
		got += bytes;
	}
	if (m.magic == TCP_MAGIC)
		tcp_full(c->fd, &got, sizeof(got), true);
out:
	close(c->fd);
	free(all);
	free(iov);
	free(c);
	return NULL;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE	25
#endif
#define TCP_HUGE	(2ul << 20)

/* The tcp modes' buffer of n bytes (--tcp-mem), every page touched; NULL on
 * failure (said why). */
static uint8_t *tcp_buf(size_t n)
{
	bool memfd = opt.tcp_mem == TCP_MEM_MEMFD || opt.tcp_mem == TCP_MEM_MEMFD_HUGE;
	bool huge = opt.tcp_mem == TCP_MEM_ANON_HUGE || opt.tcp_mem == TCP_MEM_MEMFD_HUGE;
	size_t whole = n & ~(TCP_HUGE - 1);
	uint8_t *raw, *p;
	int fd = -1;

	if (opt.tcp_mem == TCP_MEM_ANON) {	/* the anchor's default, as it always was */
		p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			goto fail;
		memset(p, 0x42, n);
		return p;
	}
	if (memfd && ((fd = memfd_create("kvbench-tcp", MFD_CLOEXEC)) < 0 || ftruncate(fd, n)))
		goto fail;
	/* 2 MiB aligned (address and file offset alike), the rest given back */
	raw = mmap(NULL, n + TCP_HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (raw == MAP_FAILED)
		goto fail;
	p = (uint8_t *)(((uintptr_t)raw + TCP_HUGE - 1) & ~(uintptr_t)(TCP_HUGE - 1));
	if (mmap(p, n, PROT_READ | PROT_WRITE, MAP_FIXED | (memfd ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS),
		 fd, 0) == MAP_FAILED) {
		int e = errno;

		munmap(raw, n + TCP_HUGE);
		errno = e;
		goto fail;
	}
	if (p > raw)
		munmap(raw, p - raw);
	munmap(p + n, raw + TCP_HUGE - p);
	if (fd >= 0)
		close(fd);
	memset(p, 0x42, n);
	if (huge && whole && madvise(p, whole, MADV_COLLAPSE))
		fprintf(stderr, "kcoll-kvbench: --tcp-mem %s: MADV_COLLAPSE: %s (some pages stay 4 KiB)\n",
			tcp_mem_names[opt.tcp_mem], strerror(errno));
	return p;
fail:
	fprintf(stderr, "kcoll-kvbench: %zu bytes of %s memory: %s\n", n, tcp_mem_names[opt.tcp_mem],
		strerror(errno));
	if (fd >= 0)
		close(fd);
	return NULL;
}

static void on_stop(int sig)
{
	stop = 1;
}

/* Accept streams and receive into one buffer until SIGINT/SIGTERM. */
static int tcp_sink(void)
{
	struct sigaction sa = { .sa_handler = on_stop };	/* no SA_RESTART: accept returns */
	struct addrinfo *ai;
	uint8_t *buf;
	int one = 1, lfd;

	if (tcp_addr(&ai, true, 0))
		return 1;
	lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(lfd, ai->ai_addr, ai->ai_addrlen) || listen(lfd, 64)) {
		fprintf(stderr, "kcoll-kvbench: tcp-sink: cannot listen on %s: %s\n", opt.addr,
			strerror(errno));
		freeaddrinfo(ai);
		return 1;
	}
	freeaddrinfo(ai);
	buf = tcp_buf(opt.seg_bytes);
	if (!buf)
		return 1;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	fprintf(stderr, "kcoll-kvbench: tcp-sink: %zu bytes, listening on %s; Ctrl-C ends it\n",
		opt.seg_bytes, opt.addr);
	while (!stop) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		struct tcp_conn *c;
		pthread_t t;

		if (fd < 0)
			continue;	/* EINTR: stop set, or a transient error */
		c = malloc(sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		*c = (struct tcp_conn){ fd, buf };
		if (pthread_create(&t, NULL, tcp_sink_conn, c)) {
			close(fd);
			free(c);
			continue;
		}
		pthread_detach(t);
	}
	close(lfd);
	return 0;
}

struct tcp_src {
	int fd, s, ns;
	size_t block;
	uint32_t batch;
	uint8_t *buf;
	pthread_barrier_t *bar;
	double t0, t1;
	uint64_t sent, acked;
	int err;
};

static void *tcp_source_stream(void *arg)
{
	struct tcp_src *w = arg;
	uint32_t nb = nbatches(w->block, w->batch), next = 0;
	struct kcoll_xfer_entry *all = malloc((size_t)nb * w->batch * sizeof(*all));
	struct iovec *iov = malloc(((size_t)w->batch + 2) * sizeof(*iov));
	struct tcp_mark more = { TCP_MAGIC, 1 }, end = { TCP_MAGIC, 0 };
	double stop_at;
	int r = all && iov ? 0 : -ENOMEM;

	for (uint32_t i = 0; !r && i < nb; i++)
		make_entries(all + (size_t)i * w->batch, w->batch, w->block, opt.seg_bytes,
			     0x9e3779b97f4a7c15ULL + i);
	pthread_barrier_wait(w->bar);
	w->t0 = now_s();
	stop_at = w->t0 + opt.duration;
	if (!r)
		r = tcp_full(w->fd, &more, sizeof(more), true);
	while (!r) {
		uint64_t bytes;
		size_t k = tcp_part(all + (size_t)(next++ % nb) * w->batch, w->batch, w->block, w->s,
				    w->ns, w->buf, true, iov, &bytes);
		bool last = now_s() >= stop_at;

		iov[k++] = (struct iovec){ last ? &end : &more, sizeof(more) };
		r = kcoll_io_iovs(w->fd, iov, k, true, false);
		if (!r)
			w->sent += bytes;
		if (last)
			break;
	}
	if (!r)
		r = tcp_full(w->fd, &w->acked, sizeof(w->acked), false);
	w->t1 = now_s();
	if (!r && w->acked != w->sent)
		r = -EPROTO;
	w->err = r;
	free(all);
	free(iov);
	return NULL;
}

static int tcp_connect(const struct addrinfo *ai)
{
	for (int i = 0; i < 300; i++) {	/* the sink may still be starting */
		int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (fd < 0)
			return -errno;
		if (!connect(fd, ai->ai_addr, ai->ai_addrlen))
			return fd;
		close(fd);
		usleep(100000);
	}
	fprintf(stderr, "kcoll-kvbench: tcp-source: cannot connect to %s: %s (is a tcp-sink "
		"listening there?)\n", opt.addr, strerror(errno));
	return -ECONNREFUSED;
}

static int tcp_source(void)
{
	int ns = tcp_nstreams();
	struct addrinfo *ai[TCP_MAX_STREAMS] = { 0 };
	uint8_t *buf;
	int r = 0;

	for (int s = 0; s < ns; s++)	/* stream s to address s mod n, as kcolld's streams */
		if (tcp_addr(&ai[s], false, s))
			goto out;
	buf = tcp_buf(opt.seg_bytes);
	if (!buf)
		goto out;
	if (opt.json)
		printf("{\"tool\":\"kcoll-kvbench\",\"version\":\"%s\",\"mode\":\"tcp-source\","
		       "\"op\":\"write\",\"streams\":%d,\"seg_bytes\":%zu,\"mem\":\"%s\",\"rows\":[",
		       kcoll_version(), ns, opt.seg_bytes, tcp_mem_names[opt.tcp_mem]);
	else
		printf("# kcoll-kvbench tcp-source: write, %d TCP streams to %s, no kcolld, %s memory\n"
		       "# %8s %6s %9s %10s\n", ns, opt.addr, tcp_mem_names[opt.tcp_mem], "block", "batch",
		       "GB/s", "MB_moved");
	for (int b = 0; b < opt.nblocks && !r; b++) {
		struct tcp_src w[TCP_MAX_STREAMS];
		pthread_t tid[TCP_MAX_STREAMS];
		pthread_barrier_t bar;
		size_t block = opt.blocks[b];
		uint32_t batch = opt.batch;
		uint64_t bytes = 0;
		double t0 = 1e30, t1 = 0, gbps;

		if ((uint64_t)batch * block > opt.seg_bytes)
			batch = (uint32_t)(opt.seg_bytes / block);
		pthread_barrier_init(&bar, NULL, ns);
		for (int s = 0; s < ns; s++) {
			struct tcp_hello h = { TCP_MAGIC, s, ns, batch, block, opt.seg_bytes };

			w[s] = (struct tcp_src){ .fd = tcp_connect(ai[s]), .s = s, .ns = ns, .block = block,
						 .batch = batch, .buf = buf, .bar = &bar };
			if (w[s].fd < 0 || tcp_full(w[s].fd, &h, sizeof(h), true)) {
				r = w[s].fd < 0 ? w[s].fd : -ECONNRESET;
				for (int j = 0; j <= s; j++)
					if (w[j].fd >= 0)
						close(w[j].fd);
				break;
			}
		}
		if (r) {
			pthread_barrier_destroy(&bar);
			break;
		}
		for (int s = 0; s < ns; s++)
			pthread_create(&tid[s], NULL, tcp_source_stream, &w[s]);
		for (int s = 0; s < ns; s++) {
			pthread_join(tid[s], NULL);
			close(w[s].fd);
			if (w[s].err && !r) {
				r = w[s].err;
				fprintf(stderr, "kcoll-kvbench: tcp-source: stream %d: %s\n", s,
					w[s].err == -EPROTO ? "the sink confirmed fewer bytes than sent" :
					strerror(-w[s].err));
			}
			bytes += w[s].acked;
			t0 = w[s].t0 < t0 ? w[s].t0 : t0;
			t1 = w[s].t1 > t1 ? w[s].t1 : t1;
		}
		pthread_barrier_destroy(&bar);
		if (r)
			break;
		gbps = t1 > t0 ? bytes / (t1 - t0) / 1e9 : 0;
		if (opt.json)
			printf("%s{\"block\":%zu,\"batch\":%u,\"batches\":%llu,\"bytes\":%llu,\"GBps\":%.4f}",
			       b ? "," : "", block, batch,
			       (unsigned long long)(bytes / ((uint64_t)batch * block)),
			       (unsigned long long)bytes, gbps);
		else
			printf("%10zu %6u %9.3f %10.1f\n", block, batch, gbps, bytes / 1e6);
		fflush(stdout);
	}
	if (opt.json && !r)
		printf("]}\n");
	munmap(buf, opt.seg_bytes);
	for (int s = 0; s < ns; s++)
		if (ai[s])
			freeaddrinfo(ai[s]);
	return r ? 1 : 0;
out:
	for (int s = 0; s < ns; s++)
		if (ai[s])
			freeaddrinfo(ai[s]);
	return 1;
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
	if (opt.mode == MODE_TARGET)
		return target_run(opt.desc_path);
	if (opt.mode == MODE_TCP_SINK)
		return tcp_sink();
	if (opt.mode == MODE_TCP_SOURCE)
		return tcp_source();
	if (opt.mode == MODE_INITIATOR) {
		if (read_descs(opt.desc_path))
			return 1;
	} else {
		ndescs = opt.many_to_one ? 1 : opt.threads;
		if (targets_start(&targets)) {
			r = 1;
			goto out;
		}
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
			printf("%s{\"block\":%zu,\"batch\":%u,\"batches\":%llu,\"bytes\":%llu,"
			       "\"GBps\":%.4f,\"avg_us\":%.2f,\"p50_us\":%.2f,\"p99_us\":%.2f,"
			       "\"p999_us\":%.2f", b ? "," : "",
			       rows[b].block, rows[b].batch, (unsigned long long)rows[b].batches,
			       (unsigned long long)rows[b].bytes, rows[b].gbps, rows[b].avg_us,
			       rows[b].p50_us, rows[b].p99_us, rows[b].p999_us);
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
	if (targets.c) {
		launch_stop(&targets);
		launch_run(&targets);
		launch_free(&targets);
	}
	return r ? 1 : 0;
}
