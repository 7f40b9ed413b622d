// SPDX-License-Identifier: MIT
/*
 * kcolld's Prometheus metrics: counters the data path adds to, the text
 * exposition format 0.0.4, a minimal HTTP/1.x responder and the textfile
 * for node_exporter. metrics.h says who runs what; docs/metrics.md lists
 * every metric.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/c4.h>

#include "config.h"
#include "kcolld.h"
#include "log.h"
#include "metrics.h"

/* ---- what the data path counts ------------------------------------------ */

/* Latency bucket bounds (le, ns): 10 us .. 10 s in 1-2.5-5 steps, enough for
 * a shared-memory barrier and for a multi-GiB all-reduce across hosts. */
static const int64_t lat_le_ns[] = {
	10000, 25000, 50000, 100000, 250000, 500000,
	1000000, 2500000, 5000000, 10000000, 25000000, 50000000,
	100000000, 250000000, 500000000, 1000000000, 2500000000LL, 5000000000LL, 10000000000LL,
};
#define NBUCKETS	(sizeof(lat_le_ns) / sizeof(lat_le_ns[0]))

/* Per-bucket (not cumulative) counts: one add per observation. The renderer
 * sums them, so a scrape's buckets are cumulative and _count equals +Inf
 * whatever completes meanwhile. */
struct hist {
	atomic_ulong b[NBUCKETS + 1];
	atomic_ulong sum_ns;
};

enum { ST_OK, ST_TIMEOUT, ST_ABORTED, ST_INVALID, ST_ERROR, ST_N };
static const char *const st_name[ST_N] = { "ok", "timeout", "aborted", "invalid", "error" };

/* Collectives (opcodes KCOLL_OP_ALLREDUCE..BARRIER; NOP never reaches a comm). */
#define NCOLL	(KCOLL_OP_BARRIER + 1)
static const char *const coll_name[NCOLL] = {
	[KCOLL_OP_ALLREDUCE] = "allreduce", [KCOLL_OP_REDUCE_SCATTER] = "reduce_scatter",
	[KCOLL_OP_ALLGATHER] = "allgather", [KCOLL_OP_BROADCAST] = "broadcast",
	[KCOLL_OP_BARRIER] = "barrier",
};
static const char *const kv_dir[2] = { "read", "write" };

/* The other rooms' state the renderer shows (metrics.h). */
static struct kd_metrics_src src;

static struct {
	atomic_ulong ops[NCOLL][ST_N];
	atomic_ulong bytes[NCOLL];
	struct hist lat[NCOLL];
	atomic_ulong kv_xfers[2][ST_N];
	atomic_ulong kv_bytes[2];
	struct hist kv_lat[2];
	atomic_long kv_segs[2];		/* host, device */
	atomic_ulong kv_dev_bytes;
} hot;

static int status_of(int err)
{
	switch (err) {
	case 0: return ST_OK;
	case -ETIMEDOUT: return ST_TIMEOUT;
	case -ECONNRESET: case -ECONNABORTED: case -ECANCELED: case -EPIPE: case -ESHUTDOWN:
		return ST_ABORTED;
	case -EINVAL: case -EBADMSG: case -EFAULT: case -ENOENT: case -ERANGE: case -EOPNOTSUPP:
		return ST_INVALID;
	}
	return ST_ERROR;
}

static void hist_add(struct hist *h, int64_t ns)
{
	uint32_t i = 0;

	if (ns < 0)
		ns = 0;
	while (i < NBUCKETS && ns > lat_le_ns[i])
		i++;
	atomic_fetch_add_explicit(&h->b[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum_ns, (unsigned long)ns, memory_order_relaxed);
}

void kd_metrics_op(uint8_t opcode, int err, uint64_t bytes, int64_t ns)
{
	if (opcode < KCOLL_OP_ALLREDUCE || opcode >= NCOLL)
		return;
	atomic_fetch_add_explicit(&hot.ops[opcode][status_of(err)], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&hot.bytes[opcode], bytes, memory_order_relaxed);
	hist_add(&hot.lat[opcode], ns);
}

void kd_metrics_kv(bool write, int err, uint64_t bytes, int64_t ns)
{
	atomic_fetch_add_explicit(&hot.kv_xfers[write][status_of(err)], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&hot.kv_bytes[write], bytes, memory_order_relaxed);
	hist_add(&hot.kv_lat[write], ns);
}

void kd_metrics_kv_seg(bool dev, int delta)
{
	atomic_fetch_add_explicit(&hot.kv_segs[dev], delta, memory_order_relaxed);
}

void kd_metrics_kv_dev(uint64_t bytes)
{
	atomic_fetch_add_explicit(&hot.kv_dev_bytes, bytes, memory_order_relaxed);
}

void kd_metrics_kv_dev_get(uint32_t *segs, uint64_t *bytes)
{
	*segs = (uint32_t)atomic_load_explicit(&hot.kv_segs[1], memory_order_relaxed);
	*bytes = atomic_load_explicit(&hot.kv_dev_bytes, memory_order_relaxed);
}

/* ---- what the control thread counts ------------------------------------- */

/* (peer, link, direction) series; the last two slots take whatever does not
 * fit (peer "_other"), which bounds the label values however many peers. */
#define NLINKS		64
#define NOURLINKS	KCOLL_C4_MAX_LINKS
#define NKINDS		(KCOLL_C4_NONCOMM_SLOW + 1)

struct link_ent {
	char peer[48];
	uint32_t l, dir;
	uint64_t bytes, busy_ns, rate;
};

static const char *const kind_name[NKINDS] = {
	[KCOLL_C4_COMM_HANG] = "comm_hang", [KCOLL_C4_NONCOMM_HANG] = "noncomm_hang",
	[KCOLL_C4_COMM_SLOW] = "comm_slow", [KCOLL_C4_NONCOMM_SLOW] = "straggler",
};

/* HTTP status codes the responder answers with, counted by code. */
static const int codes[] = { 200, 400, 404, 405, 408, 431, 500, 503 };
#define NCODES	(sizeof(codes) / sizeof(codes[0]))

static struct {
	struct link_ent link[NLINKS];
	uint32_t nlink;
	uint64_t c4_raised[NKINDS];
	uint64_t c4_views;
	uint64_t retrans[NOURLINKS];
	char ifname[NOURLINKS][32];	/* our link l's interface, looked up once */
	uint64_t requests[NCODES];
} ctl;

void kd_metrics_c4_raised(uint32_t kind)
{
	if (kind < NKINDS)
		ctl.c4_raised[kind]++;
}

void kd_metrics_c4_view_sent(void)
{
	ctl.c4_views++;
}

static struct link_ent *link_find(const char *peer, uint32_t l, uint32_t dir)
{
	struct link_ent *e;

	for (uint32_t i = 0; i < ctl.nlink; i++) {
		e = &ctl.link[i];
		if (e->l == l && e->dir == dir && !strcmp(e->peer, peer))
			return e;
	}
	if (ctl.nlink < NLINKS - 2) {
		e = &ctl.link[ctl.nlink++];
		snprintf(e->peer, sizeof(e->peer), "%s", peer);
		e->l = l;
		e->dir = dir;
		return e;
	}
	e = &ctl.link[NLINKS - 2 + (dir & 1)];
	snprintf(e->peer, sizeof(e->peer), "_other");
	e->l = UINT32_MAX;
	e->dir = dir & 1;
	return e;
}

void kd_metrics_link(const char *peer, uint32_t l, uint32_t dir, uint64_t bytes, uint64_t busy_ns)
{
	struct link_ent *e = link_find(peer, l, dir);

	e->bytes += bytes;
	e->busy_ns += busy_ns;
}

void kd_metrics_link_rate(const char *peer, uint32_t l, uint32_t dir, uint64_t rate)
{
	for (uint32_t i = 0; !rate && i < ctl.nlink; i++)
		if (ctl.link[i].l == l && ctl.link[i].dir == dir && !strcmp(ctl.link[i].peer, peer))
			ctl.link[i].rate = 0;
	if (rate)
		link_find(peer, l, dir)->rate = rate;	/* idle keys make no series */
}

void kd_metrics_retrans(uint32_t l, uint64_t n)
{
	if (l < NOURLINKS)
		ctl.retrans[l] += n;
}

static const char *our_link(uint32_t l)
{
	if (l >= NOURLINKS)
		return "_other";
	if (!ctl.ifname[l][0])
		src.link_ifname(l, ctl.ifname[l], sizeof(ctl.ifname[l]));
	return ctl.ifname[l];
}

/* ---- the exposition text ------------------------------------------------- */

struct out {
	char *buf;
	size_t cap, len;
	bool full;
};

static void __attribute__((format(printf, 2, 3))) put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (o->full)
		return;
	va_start(ap, fmt);
	n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= o->cap - o->len)
		o->full = true;
	else
		o->len += n;
}

static void head(struct out *o, const char *name, const char *type, const char *help)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: host names come from peers, so escape what the format
 * reserves (backslash, quote, newline) and drop other control bytes. */
static void put_label(struct out *o, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			put(o, "\\%c", *s);
		else if (*s == '\n')
			put(o, "\\n");
		else if ((unsigned char)*s >= 0x20)
			put(o, "%c", *s);
	}
}

/* One histogram's series; labels: 'key="value"' pairs, without braces. */
static void put_hist(struct out *o, const char *name, const char *labels, const struct hist *h)
{
	unsigned long cum = 0;

	for (uint32_t i = 0; i <= NBUCKETS; i++) {
		cum += atomic_load_explicit(&h->b[i], memory_order_relaxed);
		if (i < NBUCKETS)
			put(o, "%s_bucket{%s,le=\"%g\"} %lu\n", name, labels, lat_le_ns[i] / 1e9, cum);
		else
			put(o, "%s_bucket{%s,le=\"+Inf\"} %lu\n", name, labels, cum);
	}
	put(o, "%s_sum{%s} %.9f\n", name, labels,
	    atomic_load_explicit(&h->sum_ns, memory_order_relaxed) / 1e9);
	put(o, "%s_count{%s} %lu\n", name, labels, cum);
}

static void render_ops(struct out *o)
{
	char labels[64];

	head(o, "kcoll_ops_total", "counter",
	     "Collective operations completed, by collective and outcome (every local rank's part is one op)");
	for (int c = KCOLL_OP_ALLREDUCE; c < NCOLL; c++)
		for (int s = 0; s < ST_N; s++)
			put(o, "kcoll_ops_total{op=\"%s\",status=\"%s\"} %lu\n", coll_name[c], st_name[s],
			    atomic_load_explicit(&hot.ops[c][s], memory_order_relaxed));
	head(o, "kcoll_op_bytes_total", "counter",
	     "Bytes successful collectives delivered into the local ranks' receive buffers");
	for (int c = KCOLL_OP_ALLREDUCE; c < NCOLL; c++)
		put(o, "kcoll_op_bytes_total{op=\"%s\"} %lu\n", coll_name[c],
		    atomic_load_explicit(&hot.bytes[c], memory_order_relaxed));
	head(o, "kcoll_op_duration_seconds", "histogram",
	     "Collective latency: from the first local rank's submission reaching kcolld to completion");
	for (int c = KCOLL_OP_ALLREDUCE; c < NCOLL; c++) {
		snprintf(labels, sizeof(labels), "op=\"%s\"", coll_name[c]);
		put_hist(o, "kcoll_op_duration_seconds", labels, &hot.lat[c]);
	}
	head(o, "kcoll_data_bytes_total", "counter",
	     "Bytes the data path read or wrote in ranks' buffers, by how: mapped (in place) or copied "
	     "(process_vm_readv/writev)");
	put(o, "kcoll_data_bytes_total{path=\"mapped\"} %lu\n", atomic_load(&kd.stats.bytes_mapped));
	put(o, "kcoll_data_bytes_total{path=\"copied\"} %lu\n", atomic_load(&kd.stats.bytes_copied));
}

static void render_kv(struct out *o)
{
	char labels[64];

	head(o, "kcoll_kv_transfers_total", "counter", "KV-cache transfer batches completed, by direction and outcome");
	for (int d = 0; d < 2; d++)
		for (int s = 0; s < ST_N; s++)
			put(o, "kcoll_kv_transfers_total{dir=\"%s\",status=\"%s\"} %lu\n", kv_dir[d], st_name[s],
			    atomic_load_explicit(&hot.kv_xfers[d][s], memory_order_relaxed));
	head(o, "kcoll_kv_bytes_total", "counter", "Bytes KV-cache transfer batches moved, by direction");
	for (int d = 0; d < 2; d++)
		put(o, "kcoll_kv_bytes_total{dir=\"%s\"} %lu\n", kv_dir[d],
		    atomic_load_explicit(&hot.kv_bytes[d], memory_order_relaxed));
	head(o, "kcoll_kv_transfer_duration_seconds", "histogram",
	     "KV-cache batch latency: from kcolld taking the batch off the ring to its completion");
	for (int d = 0; d < 2; d++) {
		snprintf(labels, sizeof(labels), "dir=\"%s\"", kv_dir[d]);
		put_hist(o, "kcoll_kv_transfer_duration_seconds", labels, &hot.kv_lat[d]);
	}
	head(o, "kcoll_kv_segments", "gauge", "KV-cache segments registered here, by memory");
	for (int m = 0; m < 2; m++)
		put(o, "kcoll_kv_segments{memory=\"%s\"} %ld\n", m ? "device" : "host",
		    atomic_load_explicit(&hot.kv_segs[m], memory_order_relaxed));
	head(o, "kcoll_kv_device_bytes_total", "counter",
	     "Bytes kcolld copied to or from KV segments in GPU memory (each byte once)");
	put(o, "kcoll_kv_device_bytes_total %lu\n",
	    atomic_load_explicit(&hot.kv_dev_bytes, memory_order_relaxed));
}

static void render_daemon(struct out *o)
{
	uint32_t nclients = 0, inflight = 0, ncomms[KD_COMM_NSHOWN] = { 0 };

	for (struct kd_client *c = kd.clients; c; c = c->next) {
		if (!c->ring)
			continue;	/* control-only connections (kcollctl) */
		nclients++;
		inflight += atomic_load(&c->inflight);
	}
	for (struct kd_comm *m = kd.comms; m; m = m->next)
		ncomms[kd_comm_shown(m)]++;
	head(o, "kcoll_build_info", "gauge", "Always 1; the kcolld version as a label");
	put(o, "kcoll_build_info{version=\"%s\"} 1\n", KCOLL_VERSION);
	head(o, "kcoll_uptime_seconds", "gauge", "Seconds since kcolld started");
	put(o, "kcoll_uptime_seconds %.3f\n", (kd_now_ns() - kd.start_ns) / 1e9);
	head(o, "kcoll_clients", "gauge", "Application clients with a ring now");
	put(o, "kcoll_clients %u\n", nclients);
	head(o, "kcoll_connections_total", "counter",
	     "Control-socket connections accepted (applications and kcollctl)");
	put(o, "kcoll_connections_total %lu\n", atomic_load(&kd.stats.clients_total));
	head(o, "kcoll_rings_killed_total", "counter",
	     "Client rings kcolld shut down because the client broke the ring protocol or stopped reading");
	put(o, "kcoll_rings_killed_total %lu\n", atomic_load(&kd.stats.rings_killed));
	head(o, "kcoll_ops_in_flight", "gauge", "Operations submitted by clients and not completed yet");
	put(o, "kcoll_ops_in_flight %u\n", inflight);
	head(o, "kcoll_communicators", "gauge", "Communicators by state");
	for (int s = 0; s < KD_COMM_NSHOWN; s++)
		put(o, "kcoll_communicators{state=\"%s\"} %u\n", kd_comm_shown_name(s), ncomms[s]);
}

static void render_c4(struct out *o)
{
	uint64_t active[NKINDS] = { 0 };

	src.c4_active_kinds(active, NKINDS);
	head(o, "kcoll_c4_anomalies_total", "counter", "C4 anomalies raised, by kind");
	for (uint32_t k = KCOLL_C4_COMM_HANG; k < NKINDS; k++)
		put(o, "kcoll_c4_anomalies_total{kind=\"%s\"} %lu\n", kind_name[k], (unsigned long)ctl.c4_raised[k]);
	head(o, "kcoll_c4_anomalies_active", "gauge", "C4 anomalies active now, by kind");
	for (uint32_t k = KCOLL_C4_COMM_HANG; k < NKINDS; k++)
		put(o, "kcoll_c4_anomalies_active{kind=\"%s\"} %lu\n", kind_name[k], (unsigned long)active[k]);
	head(o, "kcoll_c4_views_sent_total", "counter",
	     "C4 views (this host's active anomalies and its data path's wait) sent to peer hosts");
	put(o, "kcoll_c4_views_sent_total %lu\n", (unsigned long)ctl.c4_views);
}

static void link_labels(struct out *o, const struct link_ent *e)
{
	put(o, "{peer=\"");
	put_label(o, e->peer);
	put(o, "\",link=\"");
	put_label(o, our_link(e->l));
	put(o, "\",dir=\"%s\"}", e->dir ? "tx" : "rx");
}

static void render_links(struct out *o)
{
	head(o, "kcoll_link_bytes_total", "counter",
	     "Bytes of large pieces (64 KiB or more) kcolld moved to or from a peer host over one of its links");
	for (uint32_t i = 0; i < NLINKS; i++) {
		if (!ctl.link[i].peer[0])
			continue;
		put(o, "kcoll_link_bytes_total");
		link_labels(o, &ctl.link[i]);
		put(o, " %lu\n", (unsigned long)ctl.link[i].bytes);
	}
	head(o, "kcoll_link_busy_seconds_total", "counter",
	     "Time those pieces took, idle gaps excluded: bytes / busy seconds is the link's rate while in use");
	for (uint32_t i = 0; i < NLINKS; i++) {
		if (!ctl.link[i].peer[0])
			continue;
		put(o, "kcoll_link_busy_seconds_total");
		link_labels(o, &ctl.link[i]);
		put(o, " %.9f\n", ctl.link[i].busy_ns / 1e9);
	}
	head(o, "kcoll_link_rate_bytes_per_second", "gauge",
	     "The C4 detector's latest rate estimate of the link toward the peer (B/s)");
	for (uint32_t i = 0; i < NLINKS; i++) {
		if (!ctl.link[i].peer[0])
			continue;
		put(o, "kcoll_link_rate_bytes_per_second");
		link_labels(o, &ctl.link[i]);
		put(o, " %lu\n", (unsigned long)ctl.link[i].rate);
	}
	if (!src.bpf_on())
		return;	/* flow tracking off (KCOLL_BPF): nothing counts them */
	head(o, "kcoll_bpf_tcp_retransmits_total", "counter",
	     "TCP retransmissions of tracked flows to peer hosts (BPF flow tracker), by our link");
	for (uint32_t l = 0; l < src.nlinks() && l < NOURLINKS; l++) {
		put(o, "kcoll_bpf_tcp_retransmits_total{link=\"");
		put_label(o, our_link(l));
		put(o, "\"} %lu\n", (unsigned long)ctl.retrans[l]);
	}
}

static void render_requests(struct out *o)
{
	head(o, "kcoll_metrics_requests_total", "counter",
	     "HTTP requests the metrics endpoint answered, by status code");
	for (uint32_t i = 0; i < NCODES; i++)
		put(o, "kcoll_metrics_requests_total{code=\"%d\"} %lu\n", codes[i], (unsigned long)ctl.requests[i]);
}

long kd_metrics_render(char *buf, size_t cap)
{
	struct out o = { .buf = buf, .cap = cap };

	if (!cap)
		return -EMSGSIZE;
	render_daemon(&o);
	render_ops(&o);
	render_kv(&o);
	render_c4(&o);
	render_links(&o);
	render_requests(&o);
	return o.full ? -EMSGSIZE : (long)o.len;
}

/* ---- HTTP responder and textfile ------------------------------------------ */

#define MX_CONNS	16		/* concurrent scrapers; more are closed at once */
#define MX_REQ_MAX	8192		/* request line and headers */
#define MX_TIMEOUT_NS	(5 * 1000000000LL)	/* to send a request and take the answer */
#define MX_LINGER_NS	(1 * 1000000000LL)	/* reading what follows an error answer */
#define MX_RENDER_MAX	(4u << 20)

enum mconn_state { MC_FREE, MC_READ, MC_WRITE, MC_LINGER };

struct mconn {
	enum mconn_state state;
	int fd;
	int64_t deadline;
	size_t inlen;
	char in[MX_REQ_MAX];
	char *out;
	size_t outlen, outoff;
};

static struct {
	int epfd, lfd;
	char addr[64];
	struct mconn c[MX_CONNS];
	const char *file;
	int64_t interval_ns, last_file;
	bool file_failed;
} mx = { .epfd = -1, .lfd = -1 };

const char *kd_metrics_addr(void)
{
	return mx.addr;
}

static void count_code(int code)
{
	for (uint32_t i = 0; i < NCODES; i++)
		if (codes[i] == code)
			ctl.requests[i]++;
}

/* The text, rendered into a buffer grown until it fits; NULL on failure. */
static char *render_alloc(size_t *len)
{
	for (size_t cap = 65536; cap <= MX_RENDER_MAX; cap *= 2) {
		char *buf = malloc(cap);
		long n;

		if (!buf)
			return NULL;
		n = kd_metrics_render(buf, cap);
		if (n >= 0) {
			*len = (size_t)n;
			return buf;
		}
		free(buf);
	}
	return NULL;
}

static void conn_close(struct mconn *c)
{
	epoll_ctl(mx.epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	free(c->out);
	c->out = NULL;
	c->state = MC_FREE;
}

static void conn_watch(struct mconn *c, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = c };

	epoll_ctl(mx.epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Send what is left of the answer; done: shut our side and linger. */
static void conn_flush(struct mconn *c)
{
	while (c->outoff < c->outlen) {
		ssize_t n = send(c->fd, c->out + c->outoff, c->outlen - c->outoff, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			conn_watch(c, EPOLLOUT);
			return;
		}
		if (n <= 0) {
			conn_close(c);
			return;
		}
		c->outoff += (size_t)n;
	}
	/* Closing with unread input would reset the connection and could
	 * destroy the answer in flight: read until the client closes, briefly. */
	shutdown(c->fd, SHUT_WR);
	c->state = MC_LINGER;
	if (c->deadline > kd_now_ns() + MX_LINGER_NS)
		c->deadline = kd_now_ns() + MX_LINGER_NS;
	conn_watch(c, EPOLLIN | EPOLLRDHUP);
}

static void respond(struct mconn *c, int code, const char *reason, const char *extra, const char *body,
		    size_t blen, bool head_only)
{
	const char *ctype = code == 200 ? "text/plain; version=0.0.4; charset=utf-8" :
				      "text/plain; charset=utf-8";
	char hdr[512];
	int h = snprintf(hdr, sizeof(hdr),
			 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n",
			 code, reason, ctype, blen, extra);

	count_code(code);
	free(c->out);
	c->out = malloc((size_t)h + (head_only ? 0 : blen));
	if (!c->out) {
		conn_close(c);
		return;
	}
	memcpy(c->out, hdr, (size_t)h);
	if (!head_only)
		memcpy(c->out + h, body, blen);
	c->outlen = (size_t)h + (head_only ? 0 : blen);
	c->outoff = 0;
	c->state = MC_WRITE;
	conn_flush(c);
}

static void respond_error(struct mconn *c, int code, const char *reason, const char *extra,
			  const char *why)
{
	respond(c, code, reason, extra, why, strlen(why), false);
}

/* "METHOD SP TARGET SP HTTP/1.x": 0, or -EINVAL. */
static int parse_request_line(const char *line, size_t len, char *method, size_t mcap, char *target,
			      size_t tcap)
{
	const char *sp1 = memchr(line, ' ', len), *sp2, *ver;
	size_t mlen, tlen, vlen;

	if (!sp1)
		return -EINVAL;
	sp2 = memchr(sp1 + 1, ' ', len - (size_t)(sp1 + 1 - line));
	if (!sp2)
		return -EINVAL;
	mlen = (size_t)(sp1 - line);
	tlen = (size_t)(sp2 - sp1 - 1);
	ver = sp2 + 1;
	vlen = len - (size_t)(ver - line);
	if (!mlen || mlen >= mcap || !tlen || tlen >= tcap || sp1[1] != '/')
		return -EINVAL;
	if (vlen != 8 || (memcmp(ver, "HTTP/1.0", 8) && memcmp(ver, "HTTP/1.1", 8)))
		return -EINVAL;
	for (size_t i = 0; i < mlen; i++)
		if (line[i] < 'A' || line[i] > 'Z')
			return -EINVAL;
	for (size_t i = 0; i < tlen; i++)
		if ((unsigned char)sp1[1 + i] <= 0x20 || (unsigned char)sp1[1 + i] >= 0x7f)
			return -EINVAL;
	memcpy(method, line, mlen);
	method[mlen] = 0;
	memcpy(target, sp1 + 1, tlen);
	target[tlen] = 0;
	return 0;
}

/* The request so far: answer once its line and headers are in (or once
 * its line alone is bad). */
static void conn_request(struct mconn *c)
{
	char method[16], target[256], *q;
	const char *eol = memchr(c->in, '\n', c->inlen), *end;
	size_t llen;

	if (!eol) {
		if (c->inlen == MX_REQ_MAX)
			respond_error(c, 431, "Request Header Fields Too Large", "", "request line too long\n");
		return;
	}
	llen = (size_t)(eol - c->in);
	if (llen && c->in[llen - 1] == '\r')
		llen--;
	if (parse_request_line(c->in, llen, method, sizeof(method), target, sizeof(target))) {
		respond_error(c, 400, "Bad Request", "", "not an HTTP/1.x request line\n");
		return;
	}
	end = memmem(c->in, c->inlen, "\r\n\r\n", 4);
	if (!end)
		end = memmem(c->in, c->inlen, "\n\n", 2);
	if (!end) {
		if (c->inlen == MX_REQ_MAX)
			respond_error(c, 431, "Request Header Fields Too Large", "", "request headers too large\n");
		return;
	}
	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		respond_error(c, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n", "only GET and HEAD\n");
		return;
	}
	q = strchr(target, '?');
	if (q)
		*q = 0;
	if (strcmp(target, "/metrics")) {
		static const char why[] = "metrics are at /metrics\n";

		respond(c, 404, "Not Found", "", why, sizeof(why) - 1, !strcmp(method, "HEAD"));
		return;
	}
	size_t blen;
	char *body = render_alloc(&blen);

	if (!body) {
		respond_error(c, 500, "Internal Server Error", "", "cannot render the metrics\n");
		return;
	}
	respond(c, 200, "OK", "", body, blen, !strcmp(method, "HEAD"));
	free(body);
}

static void conn_readable(struct mconn *c)
{
	for (;;) {
		char sink[4096];
		bool linger = c->state == MC_LINGER;
		ssize_t n = linger ? recv(c->fd, sink, sizeof(sink), 0) :
				     recv(c->fd, c->in + c->inlen, MX_REQ_MAX - c->inlen, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0) {
			conn_close(c);	/* the client went (or gave up before a full request) */
			return;
		}
		if (linger)
			continue;
		c->inlen += (size_t)n;
		conn_request(c);
		if (c->state != MC_READ)
			return;
	}
}

static void on_accept(void)
{
	for (;;) {
		int fd = accept4(mx.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct mconn *c = NULL;

		if (fd < 0)
			return;
		for (int i = 0; i < MX_CONNS && !c; i++)
			if (mx.c[i].state == MC_FREE)
				c = &mx.c[i];
		if (!c) {
			count_code(503);
			close(fd);	/* too many at once: this scraper tries again later */
			continue;
		}
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = c };

		if (epoll_ctl(mx.epfd, EPOLL_CTL_ADD, fd, &ev)) {
			close(fd);
			continue;
		}
		*c = (struct mconn){ .state = MC_READ, .fd = fd, .deadline = kd_now_ns() + MX_TIMEOUT_NS };
	}
}

void kd_metrics_event(void)
{
	struct epoll_event ev[MX_CONNS + 1];
	int n = epoll_wait(mx.epfd, ev, MX_CONNS + 1, 0);

	for (int i = 0; i < n; i++) {
		struct mconn *c = ev[i].data.ptr;

		if (ev[i].data.ptr == &mx.lfd) {
			on_accept();
			continue;
		}
		if (c->state == MC_FREE)
			continue;	/* closed by an earlier event of this batch */
		if (c->state == MC_WRITE && (ev[i].events & EPOLLOUT))
			conn_flush(c);
		else if (ev[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
			conn_readable(c);
	}
}

/* The textfile: the whole text into PATH.tmp, renamed over PATH, so the
 * collector never reads half of it. */
static void write_file(void)
{
	char tmp[4200];
	size_t len, off = 0;
	char *body;
	int fd, r = 0;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", mx.file) >= sizeof(tmp))
		return;
	body = render_alloc(&len);
	if (!body) {
		r = -ENOMEM;
		goto out;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		r = -errno;
		goto out;
	}
	while (off < len) {
		ssize_t n = write(fd, body + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			break;
		}
		off += (size_t)n;
	}
	if (close(fd) && !r)
		r = -errno;
	if (!r && rename(tmp, mx.file))
		r = -errno;
	if (r)
		unlink(tmp);
out:
	free(body);
	/* Say it once per run of failures, not every interval. */
	if (r && !mx.file_failed)
		kc_warn("metrics: cannot write %s: %s (trying again every interval)", mx.file, strerror(-r));
	else if (!r && mx.file_failed)
		kc_info("metrics: writing %s again", mx.file);
	mx.file_failed = r != 0;
}

void kd_metrics_tick(int64_t now)
{
	for (int i = 0; i < MX_CONNS; i++) {
		struct mconn *c = &mx.c[i];

		if (c->state == MC_FREE || now < c->deadline)
			continue;
		if (c->state == MC_READ) {
			static const char late[] = "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n"
						   "Connection: close\r\n\r\n";

			count_code(408);
			/* Best effort: a client too slow to send is not waited for. */
			if (send(c->fd, late, sizeof(late) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
				kc_dbg("metrics: a scraper sent no request within 5 s");
		}
		conn_close(c);
	}
	if (mx.file && now - mx.last_file >= mx.interval_ns) {
		mx.last_file = now;
		write_file();
	}
}

/* "PORT" (on 127.0.0.1) or "IPV4:PORT". */
static int parse_addr(const char *spec, struct sockaddr_in *sa)
{
	const char *colon = strrchr(spec, ':'), *port = colon ? colon + 1 : spec;
	char host[INET_ADDRSTRLEN];
	unsigned long p;
	char *end;

	*sa = (struct sockaddr_in){ .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (colon) {
		if ((size_t)(colon - spec) >= sizeof(host))
			return -EINVAL;
		memcpy(host, spec, (size_t)(colon - spec));
		host[colon - spec] = 0;
		if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
			return -EINVAL;
	}
	errno = 0;
	p = strtoul(port, &end, 10);
	if (errno || !*port || *end || p > 65535 || *port == '-' || *port == '+')
		return -EINVAL;
	sa->sin_port = htons((uint16_t)p);
	return 0;
}

static int listen_on(const struct sockaddr_in *sa)
{
	struct sockaddr_in got;
	socklen_t glen = sizeof(got);
	char ip[INET_ADDRSTRLEN];
	int fd, one = 1;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) || listen(fd, 64) ||
	    getsockname(fd, (struct sockaddr *)&got, &glen)) {
		int r = -errno;

		close(fd);
		return r;
	}
	inet_ntop(AF_INET, &got.sin_addr, ip, sizeof(ip));
	snprintf(mx.addr, sizeof(mx.addr), "%s:%u", ip, ntohs(got.sin_port));
	return fd;
}

int kd_metrics_start(int epfd, void *tag, const struct kd_metrics_src *from)
{
	const char *spec = kcoll_knob_str("KCOLL_METRICS");
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = tag };
	struct epoll_event lev = { .events = EPOLLIN, .data.ptr = &mx.lfd };
	struct sockaddr_in sa;
	int r;

	src = *from;
	if (kcoll_knob_is_set("KCOLL_METRICS_FILE")) {
		mx.file = kcoll_knob_str("KCOLL_METRICS_FILE");
		mx.interval_ns = kcoll_knob_ll("KCOLL_METRICS_INTERVAL") * 1000000000LL;
		if (mx.interval_ns <= 0) {
			kc_err("KCOLL_METRICS_INTERVAL must be at least 1 (seconds)");
			return -EINVAL;
		}
		mx.last_file = kd_now_ns() - mx.interval_ns;	/* the first one at the first tick */
		kc_info("metrics: writing %s every %lld s", mx.file, (long long)(mx.interval_ns / 1000000000LL));
	}
	if (!kcoll_knob_is_set("KCOLL_METRICS"))
		return 0;
	if (parse_addr(spec, &sa)) {
		kc_err("KCOLL_METRICS=%s: not PORT or IPV4:PORT (e.g. 9464, 127.0.0.1:9464)", spec);
		return -EINVAL;
	}
	mx.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (mx.epfd < 0)
		goto err;
	r = listen_on(&sa);
	if (r < 0) {
		errno = -r;
		goto err_epoll;
	}
	mx.lfd = r;
	if (epoll_ctl(mx.epfd, EPOLL_CTL_ADD, mx.lfd, &lev) || epoll_ctl(epfd, EPOLL_CTL_ADD, mx.epfd, &ev))
		goto err_listen;
	kc_info("metrics: serving http://%s/metrics", mx.addr);
	return 0;

err_listen:
	close(mx.lfd);
	mx.lfd = -1;
err_epoll:
	close(mx.epfd);
	mx.epfd = -1;
err:
	/* Collectives matter more than their metrics: run on, and say so. */
	kc_warn("metrics: cannot serve on %s: %s; the endpoint is off", spec, strerror(errno));
	mx.addr[0] = 0;
	return 0;
}

void kd_metrics_stop(void)
{
	for (int i = 0; i < MX_CONNS; i++)
		if (mx.c[i].state != MC_FREE)
			conn_close(&mx.c[i]);
	if (mx.lfd >= 0)
		close(mx.lfd);
	if (mx.epfd >= 0)
		close(mx.epfd);
	mx.lfd = mx.epfd = -1;
	mx.addr[0] = 0;
	if (mx.file)
		write_file();	/* the final counts */
}
