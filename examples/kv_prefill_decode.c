// SPDX-License-Identifier: MIT
/*
 * Disaggregated prefill/decode with kcoll's KV transfers (docs/kv.md).
 *
 * Two processes, each with a paged KV cache pool laid out as
 *     pool[layer][block][K|V][token][head][dim]   (bf16: 2 bytes)
 * so one page (one block of one layer's K or V) is block_tokens*heads*dim*2
 * bytes. For each request the prefill process "computes" its KV cache into
 * pages it allocates, asks the decode process for pages of its own (over a
 * pipe, as a real system would over its RPC), and moves every page of every
 * layer in one batch (layers x blocks x 2 scattered entries) with a notify
 * counter; the decode process waits on the counter, checks every page and
 * frees them. Both report the per-request transfer time.
 *
 *   kv_prefill_decode [--layers 8] [--heads 8] [--head-dim 128] [--block-tokens 16]
 *                     [--blocks 256] [--requests 16] [--max-tokens 2048] [--seed N]
 *
 * Needs a running kcolld ($KCOLL_SOCKET). Exit status 0 when every page
 * arrived intact.
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

static struct {
	uint32_t layers, heads, head_dim, block_tokens, blocks, requests, max_tokens;
	uint64_t seed;
} o = { 8, 8, 128, 16, 256, 16, 2048, 1 };

#define NOTIFY_SLOTS	8

static size_t page_bytes(void)
{
	return (size_t)o.block_tokens * o.heads * o.head_dim * 2;
}

static size_t pool_bytes(void)
{
	return (size_t)o.layers * o.blocks * 2 * page_bytes();
}

static uint64_t page_off(uint32_t layer, uint32_t block, int v)
{
	return (((uint64_t)layer * o.blocks + block) * 2 + v) * page_bytes();
}

/* What prefill computes for (request, layer, K|V, page of the request). */
static uint16_t kv_value(uint32_t req, uint32_t layer, int v, uint32_t page, size_t i)
{
	return (uint16_t)(req * 7919u + layer * 131u + v * 17u + page * 3u + i);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* A request as the pipe carries it. */
struct msg_req {
	uint32_t id, tokens, npages;
};

static int full_io(int fd, void *p, size_t n, int out)
{
	while (n) {
		ssize_t k = out ? write(fd, p, n) : read(fd, p, n);

		if (k <= 0)
			return -EIO;
		p = (uint8_t *)p + k;
		n -= k;
	}
	return 0;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Pages of a pool handed out at random (a real allocator would do better). */
static void pick_pages(uint32_t *out, uint32_t n, uint64_t *s)
{
	uint32_t *all = malloc(o.blocks * sizeof(*all));

	for (uint32_t i = 0; i < o.blocks; i++)
		all[i] = i;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t j;

		*s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
		j = i + (uint32_t)((*s >> 33) % (o.blocks - i));
		out[i] = all[j];
		all[j] = all[i];
	}
	free(all);
}

static int decode(int rfd, int wfd)
{
	struct kcoll_seg_opts so = { .size = sizeof(so), .nr_notify = NOTIFY_SLOTS };
	struct kcoll *k;
	struct kcoll_seg *seg;
	kcoll_seg_desc_t d;
	uint16_t *pool;
	uint32_t *pages = malloc(o.blocks * sizeof(*pages)), seen[NOTIFY_SLOTS] = { 0 };
	uint64_t s = o.seed * 31 + 7;
	int r, bad = 0;

	r = kcoll_connect(NULL, &k);
	if (!r)
		r = kcoll_mem_alloc(k, pool_bytes(), (void **)&pool);
	if (!r)
		r = kcoll_seg_register(k, pool, pool_bytes(), &so, &seg);
	if (r) {
		fprintf(stderr, "decode: %s\n", kcoll_strerror(r));
		return 1;
	}
	kcoll_seg_export(seg, &d);
	if (full_io(wfd, &d, sizeof(d), 1))
		return 1;
	for (;;) {
		struct msg_req m;
		uint32_t slot;
		double t0, t1;

		if (full_io(rfd, &m, sizeof(m), 0) || m.npages == 0)
			break;
		pick_pages(pages, m.npages, &s);
		t0 = now_us();
		if (full_io(wfd, pages, m.npages * sizeof(*pages), 1))
			return 1;
		slot = m.id % NOTIFY_SLOTS;
		r = kcoll_seg_notify_wait(seg, slot, ++seen[slot], 30000);
		t1 = now_us();
		if (r) {
			fprintf(stderr, "decode: request %u: %s\n", m.id, kcoll_strerror(r));
			return 1;
		}
		for (uint32_t l = 0; l < o.layers; l++)
			for (int v = 0; v < 2; v++)
				for (uint32_t p = 0; p < m.npages; p++) {
					const uint16_t *pg = pool + page_off(l, pages[p], v) / 2;

					for (size_t i = 0; i < page_bytes() / 2; i++)
						if (pg[i] != kv_value(m.id, l, v, p, i)) {
							bad++;
							break;
						}
				}
		printf("decode  request %3u: %5u tokens, KV cache arrived %8.1f us after the pages "
		       "were offered%s\n", m.id, m.tokens, t1 - t0, bad ? " (CORRUPT)" : "");
	}
	kcoll_seg_unregister(seg);
	kcoll_mem_free(k, pool);
	kcoll_disconnect(k);
	free(pages);
	return bad ? 1 : 0;
}

static int prefill(int rfd, int wfd)
{
	struct kcoll *k;
	struct kcoll_seg *seg;
	struct kcoll_rseg *rs;
	kcoll_seg_desc_t d;
	uint16_t *pool;
	uint32_t *mine = malloc(o.blocks * sizeof(*mine)), *theirs = malloc(o.blocks * sizeof(*theirs));
	struct kcoll_xfer_entry *e = malloc((size_t)o.layers * 2 * o.blocks * sizeof(*e));
	double *times = calloc(o.requests, sizeof(*times));
	uint64_t s = o.seed, total = 0;
	int r;

	r = kcoll_connect(NULL, &k);
	if (!r)
		r = kcoll_mem_alloc(k, pool_bytes(), (void **)&pool);
	if (!r)
		r = kcoll_seg_register(k, pool, pool_bytes(), NULL, &seg);
	if (!r)
		r = full_io(rfd, &d, sizeof(d), 0);
	if (!r)
		r = kcoll_seg_import(k, &d, &rs);
	if (r) {
		fprintf(stderr, "prefill: %s\n", kcoll_strerror(r));
		return 1;
	}
	for (uint32_t q = 0; q < o.requests; q++) {
		struct msg_req m = { .id = q };
		struct kcoll_req *rq;
		uint32_t n = 0;
		double t0;

		s = s * 6364136223846793005ULL + 1442695040888963407ULL;
		m.tokens = 1 + (uint32_t)((s >> 33) % o.max_tokens);
		m.npages = (m.tokens + o.block_tokens - 1) / o.block_tokens;
		pick_pages(mine, m.npages, &s);
		/* "prefill": the layers' K and V for this request */
		for (uint32_t l = 0; l < o.layers; l++)
			for (int v = 0; v < 2; v++)
				for (uint32_t p = 0; p < m.npages; p++) {
					uint16_t *pg = pool + page_off(l, mine[p], v) / 2;

					for (size_t i = 0; i < page_bytes() / 2; i++)
						pg[i] = kv_value(q, l, v, p, i);
				}
		if (full_io(wfd, &m, sizeof(m), 1) ||
		    full_io(rfd, theirs, m.npages * sizeof(*theirs), 0))
			return 1;
		for (uint32_t l = 0; l < o.layers; l++)
			for (int v = 0; v < 2; v++)
				for (uint32_t p = 0; p < m.npages; p++)
					e[n++] = (struct kcoll_xfer_entry){ page_off(l, mine[p], v),
						page_off(l, theirs[p], v), page_bytes() };
		t0 = now_us();
		r = kcoll_xfer_write(seg, rs, e, n, q % NOTIFY_SLOTS, &rq);
		if (!r)
			r = kcoll_wait(rq, 30000);
		times[q] = now_us() - t0;
		if (r) {
			fprintf(stderr, "prefill: request %u: %s\n", q, kcoll_strerror(r));
			return 1;
		}
		total += (uint64_t)n * page_bytes();
		printf("prefill request %3u: %5u tokens, %4u pages x %u layers x K,V = %5u entries, "
		       "%7.2f MiB in %8.1f us\n", q, m.tokens, m.npages, o.layers, n,
		       n * page_bytes() / 1048576.0, times[q]);
	}
	{
		struct msg_req end = { 0 };

		full_io(wfd, &end, sizeof(end), 1);
	}
	qsort(times, o.requests, sizeof(*times), cmp_d);
	printf("prefill: %u requests, %.1f MiB, transfer time per request p50 %.1f us, p99 %.1f us, "
	       "max %.1f us\n", o.requests, total / 1048576.0, times[o.requests / 2],
	       times[(size_t)(o.requests * 0.99)], times[o.requests - 1]);
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(seg);
	kcoll_mem_free(k, pool);
	kcoll_disconnect(k);
	free(mine);
	free(theirs);
	free(e);
	free(times);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "layers", required_argument, NULL, 'l' }, { "heads", required_argument, NULL, 'H' },
		{ "head-dim", required_argument, NULL, 'D' }, { "block-tokens", required_argument, NULL, 't' },
		{ "blocks", required_argument, NULL, 'b' }, { "requests", required_argument, NULL, 'r' },
		{ "max-tokens", required_argument, NULL, 'm' }, { "seed", required_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' }, { 0 }
	};
	int to_decode[2], to_prefill[2], c, st, rp;
	pid_t pid;

	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		unsigned long v = optarg ? strtoul(optarg, NULL, 0) : 0;

		switch (c) {
		case 'l': o.layers = v; break;
		case 'H': o.heads = v; break;
		case 'D': o.head_dim = v; break;
		case 't': o.block_tokens = v; break;
		case 'b': o.blocks = v; break;
		case 'r': o.requests = v; break;
		case 'm': o.max_tokens = v; break;
		case 's': o.seed = v; break;
		case 'h':
			printf("Usage: kv_prefill_decode [--layers N] [--heads N] [--head-dim N] "
			       "[--block-tokens N] [--blocks N] [--requests N] [--max-tokens N] [--seed N]\n"
			       "Prefill and decode processes moving a paged KV cache through kcolld.\n");
			return 0;
		default:
			return 2;
		}
	}
	if (!o.layers || !o.heads || !o.head_dim || !o.block_tokens || !o.requests || !o.max_tokens ||
	    (o.max_tokens + o.block_tokens - 1) / o.block_tokens > o.blocks) {
		fprintf(stderr, "kv_prefill_decode: every size must be > 0 and --blocks must hold "
			"--max-tokens / --block-tokens pages\n");
		return 2;
	}
	if ((uint64_t)o.layers * 2 * ((o.max_tokens + o.block_tokens - 1) / o.block_tokens) >
	    KCOLL_XFER_MAX_ENTRIES) {
		fprintf(stderr, "kv_prefill_decode: layers x 2 x pages of the longest request exceeds "
			"KCOLL_XFER_MAX_ENTRIES (%d): lower --max-tokens or raise --block-tokens\n",
			KCOLL_XFER_MAX_ENTRIES);
		return 2;
	}
	if (pipe(to_decode) || pipe(to_prefill))
		return 1;
	setvbuf(stdout, NULL, _IOLBF, 0);
	pid = fork();
	if (pid == 0) {
		close(to_decode[1]);
		close(to_prefill[0]);
		_exit(decode(to_decode[0], to_prefill[1]));
	}
	close(to_decode[0]);
	close(to_prefill[1]);
	rp = prefill(to_prefill[0], to_decode[1]);
	close(to_decode[1]);
	waitpid(pid, &st, 0);
	if (rp || !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "kv_prefill_decode: FAILED (prefill %d, decode status %d)\n", rp, st);
		return 1;
	}
	printf("kv_prefill_decode: every page of every request arrived intact\n");
	return 0;
}
