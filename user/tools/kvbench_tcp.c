/* SPDX-License-Identifier: MIT */
/*
 * kcoll-kvbench's raw TCP anchor across hosts, no kcolld: the tcp-sink and
 * tcp-source modes (kcoll-kvbench(1)).
 *
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
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "config.h"
#include "iov.h"
#include "kvbench.h"

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

	snprintf(list, sizeof(list), "%s", kvb_opt.addr);
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
		n++;
	snprintf(list, sizeof(list), "%s", kvb_opt.addr);
	save = NULL;
	host = strtok_r(list, ",", &save);
	for (int i = 0; host && n && i < idx % n; i++)
		host = strtok_r(NULL, ",", &save);
	colon = host ? strrchr(host, ':') : NULL;
	if (!colon || !colon[1]) {
		fprintf(stderr, "kcoll-kvbench: --addr '%s' is not HOST:PORT[,HOST:PORT...]\n",
			kvb_opt.addr);
		return -EINVAL;
	}
	*colon = 0;
	r = getaddrinfo(host[0] ? host : NULL, colon + 1, &hint, ai);
	if (r) {
		fprintf(stderr, "kcoll-kvbench: --addr '%s': %s\n", kvb_opt.addr, gai_strerror(r));
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
	    h.batch > KCOLL_XFER_MAX_ENTRIES || h.seg_bytes != kvb_opt.seg_bytes ||
	    (uint64_t)h.batch * h.block > kvb_opt.seg_bytes) {
		fprintf(stderr, "kcoll-kvbench: tcp-sink: a bad hello (is --seg-bytes the same on "
			"both sides?)\n");
		goto out;
	}
	nb = kvb_nbatches(h.block, h.batch);
	all = malloc((size_t)nb * h.batch * sizeof(*all));
	iov = malloc(((size_t)h.batch + 2) * sizeof(*iov));
	if (!all || !iov)
		goto out;
	for (uint32_t i = 0; i < nb; i++)
		kvb_make_entries(all + (size_t)i * h.batch, h.batch, h.block, kvb_opt.seg_bytes,
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
	bool memfd = kvb_opt.tcp_mem == TCP_MEM_MEMFD || kvb_opt.tcp_mem == TCP_MEM_MEMFD_HUGE;
	bool huge = kvb_opt.tcp_mem == TCP_MEM_ANON_HUGE || kvb_opt.tcp_mem == TCP_MEM_MEMFD_HUGE;
	size_t whole = n & ~(TCP_HUGE - 1);
	uint8_t *raw, *p;
	int fd = -1;

	if (kvb_opt.tcp_mem == TCP_MEM_ANON) {	/* the anchor's default, as it always was */
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
			kvb_tcp_mem_names[kvb_opt.tcp_mem], strerror(errno));
	return p;
fail:
	fprintf(stderr, "kcoll-kvbench: %zu bytes of %s memory: %s\n", n, kvb_tcp_mem_names[kvb_opt.tcp_mem],
		strerror(errno));
	if (fd >= 0)
		close(fd);
	return NULL;
}

static volatile sig_atomic_t stop;

static void on_stop(int sig)
{
	stop = 1;
}

/* Accept streams and receive into one buffer until SIGINT/SIGTERM. */
int kvb_tcp_sink(void)
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
		fprintf(stderr, "kcoll-kvbench: tcp-sink: cannot listen on %s: %s\n", kvb_opt.addr,
			strerror(errno));
		freeaddrinfo(ai);
		return 1;
	}
	freeaddrinfo(ai);
	buf = tcp_buf(kvb_opt.seg_bytes);
	if (!buf)
		return 1;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	fprintf(stderr, "kcoll-kvbench: tcp-sink: %zu bytes, listening on %s; Ctrl-C ends it\n",
		kvb_opt.seg_bytes, kvb_opt.addr);
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
	uint32_t nb = kvb_nbatches(w->block, w->batch), next = 0;
	struct kcoll_xfer_entry *all = malloc((size_t)nb * w->batch * sizeof(*all));
	struct iovec *iov = malloc(((size_t)w->batch + 2) * sizeof(*iov));
	struct tcp_mark more = { TCP_MAGIC, 1 }, end = { TCP_MAGIC, 0 };
	double stop_at;
	int r = all && iov ? 0 : -ENOMEM;

	for (uint32_t i = 0; !r && i < nb; i++)
		kvb_make_entries(all + (size_t)i * w->batch, w->batch, w->block, kvb_opt.seg_bytes,
				 0x9e3779b97f4a7c15ULL + i);
	pthread_barrier_wait(w->bar);
	w->t0 = kvb_now_s();
	stop_at = w->t0 + kvb_opt.duration;
	if (!r)
		r = tcp_full(w->fd, &more, sizeof(more), true);
	while (!r) {
		uint64_t bytes;
		size_t k = tcp_part(all + (size_t)(next++ % nb) * w->batch, w->batch, w->block, w->s,
				    w->ns, w->buf, true, iov, &bytes);
		bool last = kvb_now_s() >= stop_at;

		iov[k++] = (struct iovec){ last ? &end : &more, sizeof(more) };
		r = kcoll_io_iovs(w->fd, iov, k, true, false);
		if (!r)
			w->sent += bytes;
		if (last)
			break;
	}
	if (!r)
		r = tcp_full(w->fd, &w->acked, sizeof(w->acked), false);
	w->t1 = kvb_now_s();
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
		"listening there?)\n", kvb_opt.addr, strerror(errno));
	return -ECONNREFUSED;
}

int kvb_tcp_source(void)
{
	int ns = tcp_nstreams();
	struct addrinfo *ai[TCP_MAX_STREAMS] = { 0 };
	uint8_t *buf;
	int r = 0;

	for (int s = 0; s < ns; s++)	/* stream s to address s mod n, as kcolld's streams */
		if (tcp_addr(&ai[s], false, s))
			goto out;
	buf = tcp_buf(kvb_opt.seg_bytes);
	if (!buf)
		goto out;
	if (kvb_opt.json)
		printf("{\"tool\":\"kcoll-kvbench\",\"version\":\"%s\",\"mode\":\"tcp-source\","
		       "\"op\":\"write\",\"streams\":%d,\"seg_bytes\":%zu,\"mem\":\"%s\",\"rows\":[",
		       kcoll_version(), ns, kvb_opt.seg_bytes, kvb_tcp_mem_names[kvb_opt.tcp_mem]);
	else
		printf("# kcoll-kvbench tcp-source: write, %d TCP streams to %s, no kcolld, %s memory\n"
		       "# %8s %6s %9s %10s\n", ns, kvb_opt.addr, kvb_tcp_mem_names[kvb_opt.tcp_mem], "block", "batch",
		       "GB/s", "MB_moved");
	for (int b = 0; b < kvb_opt.nblocks && !r; b++) {
		struct tcp_src w[TCP_MAX_STREAMS];
		pthread_t tid[TCP_MAX_STREAMS];
		pthread_barrier_t bar;
		size_t block = kvb_opt.blocks[b];
		uint32_t batch = kvb_opt.batch;
		uint64_t bytes = 0;
		double t0 = 1e30, t1 = 0, gbps;

		if ((uint64_t)batch * block > kvb_opt.seg_bytes)
			batch = (uint32_t)(kvb_opt.seg_bytes / block);
		pthread_barrier_init(&bar, NULL, ns);
		for (int s = 0; s < ns; s++) {
			struct tcp_hello h = { TCP_MAGIC, s, ns, batch, block, kvb_opt.seg_bytes };

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
		if (kvb_opt.json)
			printf("%s{\"block\":%zu,\"batch\":%u,\"batches\":%llu,\"bytes\":%llu,\"GBps\":%.4f}",
			       b ? "," : "", block, batch,
			       (unsigned long long)(bytes / ((uint64_t)batch * block)),
			       (unsigned long long)bytes, gbps);
		else
			printf("%10zu %6u %9.3f %10.1f\n", block, batch, gbps, bytes / 1e6);
		fflush(stdout);
	}
	if (kvb_opt.json && !r)
		printf("]}\n");
	munmap(buf, kvb_opt.seg_bytes);
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
