// SPDX-License-Identifier: MIT
/*
 * kcoll-tcpcap: raw TCP capacity of a cluster, measured the way a ring
 * all-reduce uses the network: every host streams to its ring neighbour while
 * receiving from the other one, all at once, one connection per link.
 *
 *	kcoll-tcpcap ring -r RANK ADDR0,ADDR1,...	one process per host
 *	kcoll-tcpcap server [-B ADDR] [-c COUNT]	one link: the receiving end
 *	kcoll-tcpcap client ADDR			one link: the sending end
 *
 * Every rate is measured by the receiver, from the start of the data to its
 * end (EOF), so bytes still queued in socket buffers or behind a slow qdisc
 * when the sender stops are counted where they arrive. GB/s is 1e9 bytes/s.
 *
 * The ring: rank r listens on ADDR[r], connects to ADDR[r+1] and accepts
 * ADDR[r-1]. A token goes round the ring once the connections are up (all
 * are now connected) and a second one starts the streams (the start skew is
 * one hop per rank). After the data, each rank's figures travel back along
 * the ring, against the data, to rank 0, which prints every link, the
 * aggregate and the ring all-reduce bound they imply.
 *
 * Wire format on each connection (same build on both ends; host byte order):
 * struct tcpcap_hello, then in ring mode the bytes 'T' and 'G', then data
 * until the sender shuts down its side; the receiver answers with records
 * (struct tcpcap_link) on the same connection.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"

#define TCPCAP_MAGIC		0x5043544bu	/* "KTCP" */
#define TCPCAP_VERSION		1
#define TCPCAP_PORT		17650
#define TCPCAP_CHUNK		(1u << 20)	/* one write or read: a ring all-reduce segment */
#define TCPCAP_MAX_RANKS	256
#define TCPCAP_TOKEN_ALL_UP	'T'
#define TCPCAP_TOKEN_GO		'G'

enum tcpcap_mode { TCPCAP_PAIR = 1, TCPCAP_RING = 2 };

struct tcpcap_hello {
	uint32_t magic;
	uint16_t version;
	uint16_t mode;		/* enum tcpcap_mode */
	uint32_t rank;		/* the sender's rank (0 in pair mode) */
	uint32_t nranks;
};

/* One link as its receiver measured it. */
struct tcpcap_link {
	uint32_t to;		/* the receiving rank; the sender is to - 1 */
	uint32_t pad;
	uint64_t bytes;
	uint64_t ns;		/* start of the data to EOF */
};

struct tcpcap_opts {
	const char *bind_addr;
	const char *port;
	double seconds;		/* stream for this long, or ... */
	uint64_t bytes;		/* ... this many bytes (0: use seconds) */
	double connect_timeout;
	int count;		/* server: connections to serve, 0 = forever */
	bool json;
};

static const char *prog = "kcoll-tcpcap";

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kcoll-tcpcap ring -r RANK ADDR0,ADDR1,... [options]\n"
"       kcoll-tcpcap server [-B ADDR] [-c COUNT] [options]\n"
"       kcoll-tcpcap client ADDR [-B SRCADDR] [options]\n"
"Raw TCP capacity: every host streams to its ring neighbour at once (ring),\n"
"or one link (server + client). Rates are measured by the receiver.\n\n"
"  ring      run one per host, rank r listening on ADDR[r]; rank 0 prints\n"
"            every link, the aggregate and the ring all-reduce busbw bound\n"
"  server    receive COUNT streams (0: forever), answer each with its rate\n"
"  client    stream to a server and print the rate the server measured\n\n"
"Options:\n"
"  -r, --rank R              this host's rank in the ring\n"
"  -B, --bind ADDR           server: listen address [any]; client: source\n"
"  -p, --port PORT           TCP port [%d]\n"
"  -t, --time SECONDS        stream for this long [2]\n"
"  -n, --bytes SIZE          stream this many bytes instead (K/M/G suffixes)\n"
"  -c, --count N             server: streams to serve [1]\n"
"  -T, --connect-timeout S   keep trying to connect this long [10]\n"
"      --json                print JSON instead of text\n"
"  -h, --help                this help\n",
		TCPCAP_PORT);
}

static void __attribute__((noreturn, format(printf, 1, 2))) usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (try --help)\n");
	exit(2);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= n;
	}
	return 0;
}

/* Exactly len bytes; -EPIPE on an early EOF. */
static int read_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EPIPE;
		p += n;
		len -= n;
	}
	return 0;
}

static int resolve(const char *host, const char *port, bool passive, struct sockaddr_storage *ss,
		   socklen_t *len)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = passive ? AI_PASSIVE : 0 };
	struct addrinfo *ai;
	int r;

	r = getaddrinfo(host, port, &hints, &ai);
	if (r) {
		fprintf(stderr, "%s: %s: %s\n", prog, host ? host : "*", gai_strerror(r));
		return -EINVAL;
	}
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	*len = ai->ai_addrlen;
	freeaddrinfo(ai);
	return 0;
}

static int listen_on(const char *addr, const char *port)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd, one = 1, r;

	r = resolve(addr, port, true, &ss, &len);
	if (r)
		return r;
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, len) || listen(fd, 16)) {
		r = -errno;
		fprintf(stderr, "%s: cannot listen on %s port %s: %s\n", prog, addr ? addr : "*",
			port, strerror(-r));
		close(fd);
		return r;
	}
	return fd;
}

/* Connect, retrying while the peer is not listening yet (it may start later). */
static int connect_to(const char *addr, const char *port, const char *src, double timeout_s)
{
	uint64_t deadline = now_ns() + (uint64_t)(timeout_s * 1e9);
	struct sockaddr_storage ss, from;
	socklen_t len, fromlen = 0;
	int fd, r;

	r = resolve(addr, port, false, &ss, &len);
	if (r)
		return r;
	if (src) {
		r = resolve(src, "0", true, &from, &fromlen);
		if (r)
			return r;
	}
	for (;;) {
		fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (src && bind(fd, (struct sockaddr *)&from, fromlen)) {
			r = -errno;
			fprintf(stderr, "%s: cannot bind to %s: %s\n", prog, src, strerror(-r));
			close(fd);
			return r;
		}
		if (!connect(fd, (struct sockaddr *)&ss, len))
			return fd;
		r = -errno;
		close(fd);
		if (now_ns() > deadline || (r != -ECONNREFUSED && r != -ENETUNREACH &&
					    r != -EHOSTUNREACH && r != -ETIMEDOUT)) {
			fprintf(stderr, "%s: cannot connect to %s port %s: %s\n", prog, addr, port,
				strerror(-r));
			return r;
		}
		usleep(50 * 1000);
	}
}

/* Stream to fd for o->seconds or o->bytes, then end our side. Returns bytes sent. */
static int64_t send_stream(int fd, const struct tcpcap_opts *o, const char *buf)
{
	uint64_t sent = 0, end = now_ns() + (uint64_t)(o->seconds * 1e9);
	int r;

	for (;;) {
		size_t len = TCPCAP_CHUNK;

		if (o->bytes) {
			if (sent >= o->bytes)
				break;
			if (o->bytes - sent < len)
				len = o->bytes - sent;
		} else if (now_ns() >= end) {
			break;
		}
		r = write_all(fd, buf, len);
		if (r)
			return r;
		sent += len;
	}
	if (shutdown(fd, SHUT_WR))
		return -errno;
	return sent;
}

/* Read the data until EOF: bytes and time from the call to the EOF. */
static int recv_stream(int fd, char *buf, struct tcpcap_link *l)
{
	uint64_t t0 = now_ns();

	l->bytes = 0;
	for (;;) {
		ssize_t n = read(fd, buf, TCPCAP_CHUNK);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		l->bytes += n;
	}
	l->ns = now_ns() - t0;
	return 0;
}

static double gbps(const struct tcpcap_link *l)
{
	return l->ns ? (double)l->bytes / l->ns : 0;	/* bytes per ns = GB/s */
}

static int check_hello(const struct tcpcap_hello *h, enum tcpcap_mode mode)
{
	if (h->magic != TCPCAP_MAGIC || h->version != TCPCAP_VERSION) {
		fprintf(stderr, "%s: the peer is not kcoll-tcpcap version %d\n", prog,
			TCPCAP_VERSION);
		return -EPROTO;
	}
	if (h->mode != mode) {
		fprintf(stderr, "%s: the peer runs in %s mode, this end in %s mode\n", prog,
			h->mode == TCPCAP_RING ? "ring" : "client", mode == TCPCAP_RING ? "ring" :
			"server");
		return -EPROTO;
	}
	return 0;
}

/* ---- one link ------------------------------------------------------------- */

static int run_server(const struct tcpcap_opts *o)
{
	struct tcpcap_hello h;
	struct tcpcap_link l = { 0 };
	char *buf;
	int lfd, fd, r = 0;

	buf = malloc(TCPCAP_CHUNK);
	if (!buf)
		return -ENOMEM;
	lfd = listen_on(o->bind_addr, o->port);
	if (lfd < 0) {
		r = lfd;
		goto err_free;
	}
	for (int served = 0; !o->count || served < o->count; served++) {
		fd = accept(lfd, NULL, NULL);
		if (fd < 0) {
			r = -errno;
			goto err_close_listen;
		}
		r = read_all(fd, &h, sizeof(h));
		if (!r)
			r = check_hello(&h, TCPCAP_PAIR);
		if (!r)
			r = recv_stream(fd, buf, &l);
		if (!r)
			r = write_all(fd, &l, sizeof(l));
		close(fd);
		if (r)
			goto err_close_listen;
		if (o->json)
			printf("{\"tool\": \"%s\", \"mode\": \"server\", \"bytes\": %llu, "
			       "\"seconds\": %.6f, \"GBps\": %.4f}\n", prog,
			       (unsigned long long)l.bytes, l.ns / 1e9, gbps(&l));
		else
			printf("received %llu bytes in %.3f s: %.3f GB/s\n",
			       (unsigned long long)l.bytes, l.ns / 1e9, gbps(&l));
		fflush(stdout);
	}
err_close_listen:
	close(lfd);
err_free:
	free(buf);
	return r;
}

static int run_client(const char *addr, const struct tcpcap_opts *o)
{
	struct tcpcap_hello h = { .magic = TCPCAP_MAGIC, .version = TCPCAP_VERSION,
				  .mode = TCPCAP_PAIR, .nranks = 2 };
	struct tcpcap_link l;
	int64_t sent;
	char *buf;
	int fd, r;

	buf = calloc(1, TCPCAP_CHUNK);
	if (!buf)
		return -ENOMEM;
	fd = connect_to(addr, o->port, o->bind_addr, o->connect_timeout);
	if (fd < 0) {
		r = fd;
		goto err_free;
	}
	r = write_all(fd, &h, sizeof(h));
	if (r)
		goto err_close;
	sent = send_stream(fd, o, buf);
	if (sent < 0) {
		r = (int)sent;
		goto err_close;
	}
	r = read_all(fd, &l, sizeof(l));
	if (r)
		goto err_close;
	if (l.bytes != (uint64_t)sent) {
		fprintf(stderr, "%s: sent %lld bytes, the server got %llu\n", prog, (long long)sent,
			(unsigned long long)l.bytes);
		r = -EIO;
		goto err_close;
	}
	if (o->json)
		printf("{\"tool\": \"%s\", \"mode\": \"pair\", \"to\": \"%s\", \"port\": %s, "
		       "\"bytes\": %llu, \"seconds\": %.6f, \"GBps\": %.4f, \"Gbitps\": %.3f}\n",
		       prog, addr, o->port, (unsigned long long)l.bytes, l.ns / 1e9, gbps(&l),
		       gbps(&l) * 8);
	else
		printf("%s -> %s: %llu bytes in %.3f s: %.3f GB/s (%.2f Gbit/s), measured by the "
		       "receiver\n", o->bind_addr ? o->bind_addr : "this host", addr,
		       (unsigned long long)l.bytes, l.ns / 1e9, gbps(&l), gbps(&l) * 8);
err_close:
	close(fd);
err_free:
	free(buf);
	return r;
}

/* ---- the ring --------------------------------------------------------------- */

struct ring {
	const struct tcpcap_opts *o;
	char **addr;
	int nranks, rank;
	int in, out;			/* from rank - 1, to rank + 1 */
	char *rxbuf;
	struct tcpcap_link rx;		/* the link into this rank */
	int rx_err;
	struct tcpcap_link *links;	/* rank 0: every link, by receiving rank */
};

static void *ring_receiver(void *arg)
{
	struct ring *g = arg;

	g->rx_err = recv_stream(g->in, g->rxbuf, &g->rx);
	return NULL;
}

static int expect_token(int fd, char want)
{
	char c;
	int r = read_all(fd, &c, 1);

	if (!r && c != want)
		r = -EPROTO;
	return r;
}

/* Connect out, accept in, check who is who. */
static int ring_connect(struct ring *g, int lfd)
{
	struct tcpcap_hello h = { .magic = TCPCAP_MAGIC, .version = TCPCAP_VERSION,
				  .mode = TCPCAP_RING, .rank = g->rank, .nranks = g->nranks };
	int next = (g->rank + 1) % g->nranks, prev = (g->rank + g->nranks - 1) % g->nranks;
	int r;

	g->out = connect_to(g->addr[next], g->o->port, NULL, g->o->connect_timeout);
	if (g->out < 0)
		return g->out;
	r = write_all(g->out, &h, sizeof(h));
	if (r)
		return r;
	g->in = accept(lfd, NULL, NULL);
	if (g->in < 0)
		return -errno;
	r = read_all(g->in, &h, sizeof(h));
	if (!r)
		r = check_hello(&h, TCPCAP_RING);
	if (r)
		return r;
	if ((int)h.rank != prev || (int)h.nranks != g->nranks) {
		fprintf(stderr, "%s: rank %d: expected rank %d of %d, got rank %u of %u: same "
			"address list on every host?\n", prog, g->rank, prev, g->nranks, h.rank,
			h.nranks);
		return -EPROTO;
	}
	return 0;
}

/* All connected (one token round), then start (a second one), stream. */
static int ring_stream(struct ring *g, char *txbuf)
{
	char all_up = TCPCAP_TOKEN_ALL_UP, go = TCPCAP_TOKEN_GO;
	pthread_t rx;
	int64_t sent;
	int r;

	if (g->rank == 0) {
		r = write_all(g->out, &all_up, 1);
		if (!r)
			r = expect_token(g->in, all_up);
		if (!r)
			r = write_all(g->out, &go, 1);
		if (!r)
			r = expect_token(g->in, go);
	} else {
		r = expect_token(g->in, all_up);
		if (!r)
			r = write_all(g->out, &all_up, 1);
		if (!r)
			r = expect_token(g->in, go);
		if (!r)
			r = write_all(g->out, &go, 1);
	}
	if (r)
		return r;
	r = -pthread_create(&rx, NULL, ring_receiver, g);
	if (r)
		return r;
	sent = send_stream(g->out, g->o, txbuf);
	pthread_join(rx, NULL);
	if (sent < 0)
		return (int)sent;
	return g->rx_err;
}

/* The links' records flow back to rank 0: read those of later ranks, add ours. */
static int ring_gather(struct ring *g)
{
	int later = g->nranks - 1 - g->rank;
	struct tcpcap_link *l;
	int r = 0;

	l = calloc(g->nranks, sizeof(*l));
	if (!l)
		return -ENOMEM;
	g->rx.to = g->rank;
	l[g->rank] = g->rx;
	if (later > 0)
		r = read_all(g->out, &l[g->rank + 1], later * sizeof(*l));
	if (!r && g->rank > 0)
		r = write_all(g->in, &l[g->rank], (later + 1) * sizeof(*l));
	if (r || g->rank > 0) {
		free(l);
		return r;
	}
	g->links = l;
	return 0;
}

/*
 * The aggregate is every byte over the longest link's time: with -n the fast
 * links finish first and the rest then run with the machine to themselves, so
 * a sum of per-link rates would overstate what the links do at once. The
 * bound is the slowest link: every step of a ring all-reduce moves the same
 * bytes on every link and waits for the last one.
 */
static void ring_report(const struct ring *g)
{
	uint64_t bytes = 0, ns = 0;
	double agg, min = 0;
	int n = g->nranks;

	for (int r = 0; r < n; r++) {
		const struct tcpcap_link *l = &g->links[(r + 1) % n];

		bytes += l->bytes;
		ns = l->ns > ns ? l->ns : ns;
		min = r == 0 || gbps(l) < min ? gbps(l) : min;
	}
	agg = ns ? (double)bytes / ns : 0;
	if (g->o->json) {
		printf("{\n  \"tool\": \"%s\", \"mode\": \"ring\", \"hosts\": %d, \"port\": %s, ", prog,
		       n, g->o->port);
		if (g->o->bytes)
			printf("\"bytes_per_link\": %llu,\n", (unsigned long long)g->o->bytes);
		else
			printf("\"seconds\": %.3f,\n", g->o->seconds);
		printf("  \"links\": [");
		for (int r = 0; r < n; r++) {
			const struct tcpcap_link *l = &g->links[(r + 1) % n];

			printf("%s\n    {\"from\": %d, \"to\": %d, \"src\": \"%s\", \"dst\": \"%s\", "
			       "\"bytes\": %llu, \"seconds\": %.6f, \"GBps\": %.4f}", r ? "," : "", r,
			       (r + 1) % n, g->addr[r], g->addr[(r + 1) % n],
			       (unsigned long long)l->bytes, l->ns / 1e9, gbps(l));
		}
		printf("\n  ],\n  \"aggregate_GBps\": %.4f, \"mean_link_GBps\": %.4f, "
		       "\"min_link_GBps\": %.4f,\n  \"ring_allreduce_busbw_bound_GBps\": %.4f\n}\n",
		       agg, agg / n, min, min);
		return;
	}
	printf("# kcoll-tcpcap ring: %d hosts, each streaming to the next at once, %s\n", n,
	       g->o->bytes ? "fixed bytes" : "fixed time");
	printf("# %4s  %-16s  %-16s  %14s  %8s  %8s\n", "host", "from", "to", "bytes", "time(s)",
	       "GB/s");
	for (int r = 0; r < n; r++) {
		const struct tcpcap_link *l = &g->links[(r + 1) % n];

		printf("  %4d  %-16s  %-16s  %14llu  %8.3f  %8.3f\n", r, g->addr[r],
		       g->addr[(r + 1) % n], (unsigned long long)l->bytes, l->ns / 1e9, gbps(l));
	}
	printf("# aggregate %.3f GB/s (all bytes / longest link time), per link mean %.3f min "
	       "%.3f GB/s\n", agg, agg / n, min);
	printf("# ring all-reduce busbw bound = slowest link = %.3f GB/s\n", min);
}

/* Split "a,b,c" in place. */
static int split_addrs(char *list, char ***out)
{
	char **v = calloc(TCPCAP_MAX_RANKS, sizeof(*v));
	char *save = NULL, *tok;
	int n = 0;

	if (!v)
		return -ENOMEM;
	for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == TCPCAP_MAX_RANKS) {
			free(v);
			return -E2BIG;
		}
		v[n++] = tok;
	}
	*out = v;
	return n;
}

static int run_ring(int rank, char *list, const struct tcpcap_opts *o)
{
	struct ring g = { .o = o, .rank = rank, .in = -1, .out = -1 };
	char *txbuf;
	int lfd, r;

	g.nranks = split_addrs(list, &g.addr);
	if (g.nranks < 0)
		return g.nranks;
	if (g.nranks < 2)
		usage_error("a ring needs at least two addresses, comma separated");
	if (rank < 0 || rank >= g.nranks)
		usage_error("-r %d: rank must be in [0, %d)", rank, g.nranks);
	txbuf = calloc(1, TCPCAP_CHUNK);
	g.rxbuf = malloc(TCPCAP_CHUNK);
	if (!txbuf || !g.rxbuf) {
		r = -ENOMEM;
		goto err_free;
	}
	lfd = listen_on(g.addr[rank], o->port);
	if (lfd < 0) {
		r = lfd;
		goto err_free;
	}
	r = ring_connect(&g, lfd);
	close(lfd);
	if (!r)
		r = ring_stream(&g, txbuf);
	if (!r)
		r = ring_gather(&g);
	if (!r && rank == 0)
		ring_report(&g);
	if (r)
		fprintf(stderr, "%s: ring rank %d: %s\n", prog, rank, strerror(-r));
	if (g.in >= 0)
		close(g.in);
	if (g.out >= 0)
		close(g.out);
	free(g.links);
err_free:
	free(txbuf);
	free(g.rxbuf);
	free(g.addr);
	return r;
}

/* ---- main ----------------------------------------------------------------------- */

enum { OPT_JSON = 256 };

static const struct option longopts[] = {
	{ "rank", required_argument, NULL, 'r' },
	{ "bind", required_argument, NULL, 'B' },
	{ "port", required_argument, NULL, 'p' },
	{ "time", required_argument, NULL, 't' },
	{ "bytes", required_argument, NULL, 'n' },
	{ "count", required_argument, NULL, 'c' },
	{ "connect-timeout", required_argument, NULL, 'T' },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "help", no_argument, NULL, 'h' },
	{ 0 }
};

static double parse_seconds(const char *s, const char *what)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v > 0) || v > 86400)
		usage_error("%s must be a number of seconds in (0, 86400], not '%s'", what, s);
	return v;
}

static void on_alarm(int sig)
{
	static const char msg[] = "kcoll-tcpcap: timed out (a peer is missing or stuck)\n";

	(void)sig;
	if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0)
		_exit(3);
	_exit(3);
}

int main(int argc, char **argv)
{
	struct tcpcap_opts o = { .port = NULL, .seconds = 2, .connect_timeout = 10, .count = 1 };
	char portbuf[16], *end;
	const char *mode;
	long rank = -1, v;
	int c, r;

	while ((c = getopt_long(argc, argv, ":r:B:p:t:n:c:T:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'r':
			errno = 0;
			rank = strtol(optarg, &end, 10);
			if (errno || end == optarg || *end || rank < 0 || rank >= TCPCAP_MAX_RANKS)
				usage_error("-r needs a rank in [0, %d)", TCPCAP_MAX_RANKS);
			break;
		case 'B': o.bind_addr = optarg; break;
		case 'p':
			errno = 0;
			v = strtol(optarg, &end, 10);
			if (errno || end == optarg || *end || v < 1 || v > 65535)
				usage_error("-p needs a port in [1, 65535]");
			o.port = optarg;
			break;
		case 't': o.seconds = parse_seconds(optarg, "-t"); break;
		case 'n': {
			size_t n;

			if (bench_parse_size(optarg, &n) || !n)
				usage_error("bad size for -n: '%s'", optarg);
			o.bytes = n;
			break;
		}
		case 'c':
			errno = 0;
			v = strtol(optarg, &end, 10);
			if (errno || end == optarg || *end || v < 0 || v > 1000000)
				usage_error("-c needs a count in [0, 1000000]");
			o.count = (int)v;
			break;
		case 'T': o.connect_timeout = parse_seconds(optarg, "-T"); break;
		case OPT_JSON: o.json = true; break;
		case 'h': usage(stdout); return 0;
		case ':': usage_error("option '%s' needs a value", argv[optind - 1]);
		default: usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (!o.port) {
		snprintf(portbuf, sizeof(portbuf), "%d", TCPCAP_PORT);
		o.port = portbuf;
	}
	if (optind >= argc)
		usage_error("which mode: ring, server or client?");
	mode = argv[optind++];
	/* a peer that never comes must not hang a test or a benchmark script */
	signal(SIGPIPE, SIG_IGN);
	if (strcmp(mode, "server")) {
		signal(SIGALRM, on_alarm);
		alarm((unsigned)(o.connect_timeout + (o.bytes ? 600 : o.seconds) + 30));
	}
	if (!strcmp(mode, "server")) {
		if (optind != argc)
			usage_error("server takes no address (use -B to choose one)");
		r = run_server(&o);
	} else if (!strcmp(mode, "client")) {
		if (optind != argc - 1)
			usage_error("client needs one address");
		r = run_client(argv[optind], &o);
	} else if (!strcmp(mode, "ring")) {
		if (optind != argc - 1)
			usage_error("ring needs one comma separated address list");
		if (rank < 0)
			usage_error("ring needs -r RANK");
		r = run_ring((int)rank, argv[optind], &o);
	} else {
		usage_error("unknown mode '%s'", mode);
	}
	if (r && strcmp(mode, "ring"))
		fprintf(stderr, "%s: %s failed: %s\n", prog, mode, strerror(-r));
	return r ? 1 : 0;
}
