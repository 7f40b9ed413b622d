// SPDX-License-Identifier: MIT
/*
 * Daemon-to-daemon connections and bootstrap; control thread only (but
 * kd_net_abort_peers, which any thread may call).
 *
 * Bootstrap (docs/multihost.md): the unique id names the daemon that issued
 * it, the root. Each daemon a rank joins registers that rank with the root
 * (over a BOOT connection, or directly when it is the root). When every rank
 * is placed the root sends each daemon the TABLE (hosts in order of their
 * lowest rank, where every rank lives); a communicator on one host is then
 * active at once. Otherwise each daemon answers READY, and when all have,
 * the root says GO: every daemon connects one CTRL and nstreams DATA
 * connections to each host after it in the table, and is active once all
 * its connections to every other host are up.
 *
 * Faults: a CTRL connection that breaks without an ABORT first means the
 * peer daemon died: the comm fails naming a rank of that host. An ABORT
 * names the culprit and the first op that fails. An op that hangs longer
 * than the comm's timeout opens a query round: every peer says which of its
 * ranks submitted the op, and the first rank that did not is named.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kcoll/c4.h>
#include <kcoll/kcoll.h>

#include "c4d.h"
#include "config.h"
#include "flow.h"
#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "net.h"
#include "xport.h"

enum pc_role { PC_LISTEN, PC_NEW, PC_BOOT_ROOT, PC_BOOT_MEMBER, PC_CTRL };

struct kd_boot;

struct kd_pconn {
	int fd;
	enum pc_role role;
	pthread_mutex_t send_lock;	/* CTRL: other threads send ABORT too */
	int64_t deadline;		/* NEW: the HELLO must come by then */
	struct kd_boot *boot;		/* BOOT_ROOT */
	struct kd_comm *comm;		/* BOOT_MEMBER, CTRL */
	uint32_t host;			/* CTRL: the peer's host index */
	bool go;			/* BOOT_MEMBER: GO received, EOF is fine */
	bool closing;			/* closed while its event was handled */
	char peer[48];			/* address:port, for messages */
	size_t rxlen;
	uint8_t rx[KD_PMSG_MAX];
	struct kd_pconn *next;
};

struct kd_boot_daemon {
	struct kd_pconn *pc;	/* NULL: this daemon */
	struct kd_p_hostinfo info;
	uint32_t first_rank;
	bool ready;
};

/* Root side: an id this daemon issued, and the ranks registered for it. */
struct kd_boot {
	uint8_t token[KCOLL_ID_TOKEN_BYTES];
	int64_t expires;
	uint32_t nranks, nreg, nd, nready;
	bool tables_sent;
	bool gpu;		/* a rank's process has the CUDA driver: no lanes */
	int16_t *rank_daemon;
	struct kd_boot_daemon d[KD_MAX_HOSTS];
	struct kd_boot *next;
};

#define BOOT_UNUSED_NS		(3600LL * 1000000000)
#define BOOT_MAX		4096
#define HELLO_NS		(5LL * 1000000000)
#define CONNECT_MS		3000
#define QUERY_NS		(500LL * 1000000)

static struct {
	struct kd_pconn listen;
	struct kd_p_hostinfo me;
	uint32_t masks[KCOLL_ID_MAX_ADDRS];	/* netmask of each address */
	struct kd_pconn *conns;		/* NEW, BOOT_*, CTRL */
	struct kd_pconn *current;	/* the one kd_net_event handles */
	struct kd_boot *boots;
	uint32_t nboots;
	_Atomic int algo;
	_Atomic uint32_t lane_bytes;	/* KCOLL_LANE_BYTES, kcollctl set lane_bytes */
	_Atomic uint32_t nstreams;
	atomic_ulong rejected, garbage;
	const struct kd_xport_ops *xport;	/* new communicators' transport */
} net = { .listen.fd = -1 };

static const char *const algo_names[] = { "auto", "ring", "rd", "rabenseifner", "direct" };

const char *kd_algo_name(enum kd_algo a)
{
	return (unsigned)a < sizeof(algo_names) / sizeof(algo_names[0]) ? algo_names[a] : "?";
}

int kd_algo_parse(const char *s, enum kd_algo *a)
{
	for (size_t i = 0; i < sizeof(algo_names) / sizeof(algo_names[0]); i++) {
		if (!strcmp(s, algo_names[i])) {
			*a = i;
			return 0;
		}
	}
	if (!strcmp(s, "recursive_doubling")) {
		*a = KD_ALGO_RD;
		return 0;
	}
	return -EINVAL;
}

enum kd_algo kd_net_algo(void)
{
	return atomic_load(&net.algo);
}

int kd_net_set(const char *key, const char *value, char *err, size_t errlen)
{
	if (!strcmp(key, "algo")) {
		enum kd_algo a;

		if (kd_algo_parse(value, &a)) {
			snprintf(err, errlen, "unknown algorithm '%s' (auto, ring, rd, rabenseifner, direct)", value);
			return -EINVAL;
		}
		atomic_store(&net.algo, a);
		kc_info("algo set to %s", kd_algo_name(a));
		return 0;
	}
	if (!strcmp(key, "streams")) {
		char *end;
		long n = strtol(value, &end, 0);

		if (*end || n < 0 || n > KD_MAX_STREAMS) {
			snprintf(err, errlen, "streams must be 1..%d, or 0: one per shared network",
				 KD_MAX_STREAMS);
			return -EINVAL;
		}
		atomic_store(&net.nstreams, n);
		kc_info("streams per peer set to %ld (communicators formed from now on)", n);
		return 0;
	}
	if (!strcmp(key, "lane_bytes")) {
		char *end;
		long long v = strtoll(value, &end, 0);

		if (*end || end == value || v < 0 || v > KD_LANE_MAX_BYTES) {
			snprintf(err, errlen, "lane_bytes must be 0 (off) .. %u", KD_LANE_MAX_BYTES);
			return -EINVAL;
		}
		atomic_store(&net.lane_bytes, (uint32_t)v);
		kc_info("lane_bytes set to %lld (communicators this daemon's ids form from now on)", v);
		return 0;
	}
	snprintf(err, errlen, "unknown key '%s' (algo, streams, lane_bytes)", key);
	return -ENOENT;
}

/* ---- sockets ------------------------------------------------------------ */

static void addr_str(uint32_t a, uint16_t port, char *buf, size_t len)
{
	struct in_addr in = { .s_addr = a };

	snprintf(buf, len, "%s:%u", inet_ntoa(in), port);
}

static void ep_mod(struct kd_pconn *pc, int op)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP,
				  .data.ptr = (void *)((uintptr_t)pc | 1) };

	epoll_ctl(kd.epfd, op, pc->fd, &ev);
}

static void tune_socket(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Send all of buf on a non-blocking socket, waiting at most ~1 s for room. */
static int send_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	int waited = 0;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n > 0) {
			p += n;
			len -= n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN && waited < 1000) {
			struct pollfd pfd = { .fd = fd, .events = POLLOUT };

			poll(&pfd, 1, 10);
			waited += 10;
			continue;
		}
		return n < 0 ? -errno : -EIO;
	}
	return 0;
}

static int pc_send(struct kd_pconn *pc, void *msg, uint16_t type, size_t len)
{
	struct kd_phdr *h = msg;
	int r;

	h->magic = KD_PEER_MAGIC;
	h->type = type;
	h->flags = 0;
	h->len = len;
	h->reserved = 0;
	pthread_mutex_lock(&pc->send_lock);
	r = pc->fd < 0 ? -ENOTCONN : send_all(pc->fd, msg, len);
	pthread_mutex_unlock(&pc->send_lock);
	return r;
}

static struct kd_pconn *pc_new(int fd, enum pc_role role)
{
	struct kd_pconn *pc = calloc(1, sizeof(*pc));

	if (!pc)
		return NULL;
	pc->fd = fd;
	pc->role = role;
	pthread_mutex_init(&pc->send_lock, NULL);
	pc->next = net.conns;
	net.conns = pc;
	ep_mod(pc, EPOLL_CTL_ADD);
	return pc;
}

/* Close and free (control thread); the connection being handled is freed
 * when its handler returns. */
/*
 * Close a connection to a peer daemon so that what we sent last (an ABORT
 * saying a rank left, the last pieces of an op the peer is still finishing)
 * still arrives: close() on a socket with unread bytes (the peer's periodic
 * C4 reports, say) sends a RST at once, and a RST drops what is still queued
 * and fails the peer's reads. So: FIN after our data, read away what has
 * arrived (bounded: never blocks), then close.
 */
static void close_gracefully(int fd)
{
	char sink[16384];

	shutdown(fd, SHUT_WR);
	for (int i = 0; i < 64 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++)
		;
	close(fd);
}

static void pc_close(struct kd_pconn *pc)
{
	if (pc == net.current) {
		pc->closing = true;
		return;
	}
	for (struct kd_pconn **pp = &net.conns; *pp; pp = &(*pp)->next) {
		if (*pp == pc) {
			*pp = pc->next;
			break;
		}
	}
	pthread_mutex_lock(&pc->send_lock);
	if (pc->fd >= 0) {
		epoll_ctl(kd.epfd, EPOLL_CTL_DEL, pc->fd, NULL);
		close_gracefully(pc->fd);
		pc->fd = -1;
	}
	pthread_mutex_unlock(&pc->send_lock);
	pthread_mutex_destroy(&pc->send_lock);
	free(pc);
}

static void reject(struct kd_pconn *pc, const char *why)
{
	struct kd_p_reject m = { 0 };

	snprintf(m.why, sizeof(m.why), "%s", why);
	pc_send(pc, &m, KD_P_REJECT, sizeof(m));
	atomic_fetch_add(&net.rejected, 1);
	kc_warn("peer %s: rejected: %s", pc->peer, why);
	pc_close(pc);
}

/* Blocking connect with a timeout; src 0: any. Returns a non-blocking fd. */
static int tcp_connect(uint32_t src, uint32_t dst, uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = dst };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	struct pollfd pfd = { .fd = fd, .events = POLLOUT };
	int err = 0;
	socklen_t el = sizeof(err);

	if (fd < 0)
		return -errno;
	if (src) {
		struct sockaddr_in me = { .sin_family = AF_INET, .sin_addr.s_addr = src };

		if (bind(fd, (struct sockaddr *)&me, sizeof(me))) {
			err = -errno;
			close(fd);
			return err;
		}
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) && errno != EINPROGRESS) {
		err = -errno;
		close(fd);
		return err;
	}
	if (poll(&pfd, 1, CONNECT_MS) != 1) {
		close(fd);
		return -ETIMEDOUT;
	}
	getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
	if (err) {
		close(fd);
		return -err;
	}
	tune_socket(fd);
	return fd;
}

static void hello_fill(struct kd_p_hello *h, uint32_t kind, const uint8_t *token, uint32_t from,
		       uint32_t stream)
{
	memset(h, 0, sizeof(*h));
	h->version = KD_PEER_VERSION;
	h->kind = kind;
	memcpy(h->token, token, KCOLL_ID_TOKEN_BYTES);
	h->from_host = from;
	h->stream = stream;
	h->nonce = kd.nonce;
}

/* ---- start, ids ---------------------------------------------------------- */

static int parse_listen(const char *spec, struct sockaddr_in *sa)
{
	char host[64];
	const char *colon = strrchr(spec, ':');
	char *end;
	long port = 0;

	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	snprintf(host, sizeof(host), "%.*s", colon ? (int)(colon - spec) : (int)strlen(spec), spec);
	if (colon) {
		port = strtol(colon + 1, &end, 10);
		if (*end || port < 0 || port > 65535)
			return -EINVAL;
	}
	sa->sin_port = htons(port);
	if (!*host || !strcmp(host, "*"))
		sa->sin_addr.s_addr = htonl(INADDR_ANY);
	else if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
		return -EINVAL;
	return 0;
}

/* Advertised addresses: the list given, else every up, non-loopback IPv4
 * address (the interfaces other daemons reach us by), else loopback. */
static void find_addrs(const char *spec)
{
	struct ifaddrs *ifa = NULL, *i;
	uint16_t n = 0;

	getifaddrs(&ifa);
	if (spec && *spec) {
		char buf[256], *save, *tok;

		snprintf(buf, sizeof(buf), "%s", spec);
		for (tok = strtok_r(buf, ",", &save); tok && n < KCOLL_ID_MAX_ADDRS;
		     tok = strtok_r(NULL, ",", &save)) {
			struct in_addr a;

			if (inet_pton(AF_INET, tok, &a) != 1) {
				kc_warn("KCOLL_ADDRS: '%s' is not an IPv4 address; ignored", tok);
				continue;
			}
			net.me.addrs[n] = a.s_addr;
			net.masks[n] = 0xffffffff;
			for (i = ifa; i; i = i->ifa_next)
				if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && i->ifa_netmask &&
				    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == a.s_addr)
					net.masks[n] = ((struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr;
			n++;
		}
	}
	if (!n) {
		/* Sorted by interface name: eth0 before eth1, the same on every host. */
		struct { char name[IFNAMSIZ]; uint32_t a, m; } c[16];
		int nc = 0;

		for (i = ifa; i; i = i->ifa_next) {
			if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET ||
			    !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK) || nc == 16)
				continue;
			snprintf(c[nc].name, IFNAMSIZ, "%s", i->ifa_name);
			c[nc].a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
			c[nc].m = i->ifa_netmask ? ((struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr :
						   0xffffffff;
			nc++;
		}
		for (int x = 0; x < nc; x++)
			for (int y = x + 1; y < nc; y++)
				if (strcmp(c[y].name, c[x].name) < 0) {
					__typeof__(c[0]) t = c[x];

					c[x] = c[y];
					c[y] = t;
				}
		for (int x = 0; x < nc && n < KCOLL_ID_MAX_ADDRS; x++) {
			net.me.addrs[n] = c[x].a;
			net.masks[n++] = c[x].m;
		}
	}
	if (!n) {
		net.me.addrs[n] = htonl(INADDR_LOOPBACK);
		net.masks[n++] = htonl(0xff000000);
	}
	net.me.naddrs = n;
	for (uint16_t k = 0; k < n; k++)
		net.me.prefix[k] = __builtin_popcount(net.masks[k]);
	freeifaddrs(ifa);
}

void (*kd_net_table_hook)(const struct kd_p_hostinfo *hosts, uint32_t nhosts, uint32_t you);

int kd_net_self_addrs(uint16_t *port, uint32_t *addrs, int max)
{
	int n = net.me.naddrs < max ? net.me.naddrs : max;

	*port = net.listen.fd >= 0 ? net.me.port : 0;
	memcpy(addrs, net.me.addrs, n * sizeof(*addrs));
	return n;
}

/* comm.c's way to the network (kcolld.h), defined at the end. */
static const struct kd_comm_net_ops comm_net_ops;

int kd_net_start(const char *listen_spec, const char *addrs_spec, const struct kd_xport_ops *(*pick)(void))
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	int one = 1, fd;
	enum kd_algo a = KD_ALGO_AUTO;
	long long ns = kcoll_knob_ll("KCOLL_NET_STREAMS"), lanes;

	kd_comm_set_net(&comm_net_ops);
	if (kd_algo_parse(kcoll_knob_str("KCOLL_ALGO"), &a))
		kc_warn("KCOLL_ALGO=%s is unknown (auto, ring, rd, rabenseifner, direct); using auto",
			kcoll_knob_str("KCOLL_ALGO"));
	atomic_store(&net.algo, a);
	lanes = kcoll_knob_ll("KCOLL_LANE_BYTES");
	if (lanes > KD_LANE_MAX_BYTES) {	/* as kcollctl set lane_bytes refuses it, but start */
		kc_warn("KCOLL_LANE_BYTES=%lld is over the limit of %u (0 turns lanes off); using %u",
			lanes, KD_LANE_MAX_BYTES, KD_LANE_MAX_BYTES);
		lanes = KD_LANE_MAX_BYTES;
	}
	atomic_store(&net.lane_bytes, lanes <= 0 ? 0 : (uint32_t)lanes);
	atomic_store(&net.nstreams, ns > KD_MAX_STREAMS ? KD_MAX_STREAMS : ns);
	if (getrandom(&kd.nonce, sizeof(kd.nonce), 0) != sizeof(kd.nonce))
		return -EIO;
	if (parse_listen(listen_spec, &sa)) {
		kc_err("listen address '%s' is not ADDR:PORT (IPv4; e.g. 0.0.0.0:7117)", listen_spec);
		return -EINVAL;
	}
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 128)) {
		int e = errno;

		kc_err("cannot listen on %s for other daemons: %s (pick another with --listen "
		       "or KCOLL_LISTEN)", listen_spec, strerror(e));
		close(fd);
		return -e;
	}
	getsockname(fd, (struct sockaddr *)&sa, &sl);
	net.me.port = ntohs(sa.sin_port);
	net.me.nonce = kd.nonce;
	find_addrs(addrs_spec);
	{
		/* "host/first address": containers and namespaces often share a name. */
		char hn[32] = "?";
		struct in_addr in = { .s_addr = net.me.addrs[0] };

		gethostname(hn, sizeof(hn) - 1);
		snprintf(net.me.name, sizeof(net.me.name), "%s/%s", hn, inet_ntoa(in));
	}
	net.listen.fd = fd;
	net.listen.role = PC_LISTEN;
	pthread_mutex_init(&net.listen.send_lock, NULL);
	ep_mod(&net.listen, EPOLL_CTL_ADD);
	{
		char a0[32], a1[32] = "";

		addr_str(net.me.addrs[0], net.me.port, a0, sizeof(a0));
		if (net.me.naddrs > 1)
			addr_str(net.me.addrs[1], net.me.port, a1, sizeof(a1));
		kc_info("peers: listening on port %u, reachable at %s%s%s%s (algo %s, streams per peer: %u, "
			"0 = one per shared network)", net.me.port, a0, net.me.naddrs > 1 ? ", " : "", a1,
			net.me.naddrs > 2 ? ", ..." : "", kd_algo_name(a), atomic_load(&net.nstreams));
	}
	net.xport = pick();	/* picks and logs the transport (and why not RDMA) */
	return 0;
}

static void boot_free(struct kd_boot *b);

void kd_net_stop(void)
{
	while (net.boots) {
		struct kd_boot *b = net.boots;

		net.boots = b->next;
		boot_free(b);
	}
	net.current = NULL;
	while (net.conns)
		pc_close(net.conns);
	if (net.listen.fd >= 0) {
		epoll_ctl(kd.epfd, EPOLL_CTL_DEL, net.listen.fd, NULL);
		close(net.listen.fd);
		net.listen.fd = -1;
	}
}

/* The members close their BOOT connections when they are done (after a
 * TABLE for one host, GO or REJECT); a member that does not is closed by
 * the watchdog. */
static void boot_free(struct kd_boot *b)
{
	for (uint32_t i = 0; i < b->nd; i++) {
		if (b->d[i].pc) {
			b->d[i].pc->boot = NULL;
			b->d[i].pc->deadline = kd_now_ns() + HELLO_NS;
		}
	}
	free(b->rank_daemon);
	free(b);
}

static void boot_unlink(struct kd_boot *b)
{
	for (struct kd_boot **pp = &net.boots; *pp; pp = &(*pp)->next) {
		if (*pp == b) {
			*pp = b->next;
			net.nboots--;
			break;
		}
	}
}

void kd_net_fill_id(struct kcoll_id *id)
{
	struct kd_boot *b = calloc(1, sizeof(*b));

	memset(id, 0, sizeof(*id));
	id->magic = KCOLL_PROTO_MAGIC;
	id->version = KCOLL_PROTO_VERSION;
	id->daemon_pid = getpid();
	id->root_nonce = kd.nonce;
	id->port = net.me.port;
	id->naddrs = net.me.naddrs;
	memcpy(id->addrs, net.me.addrs, sizeof(id->addrs));
	snprintf(id->host, sizeof(id->host), "%s", net.me.name);
	if (getrandom(id->token, sizeof(id->token), 0) != sizeof(id->token) || !b) {
		id->magic = 0;	/* unusable: kd_comm_join refuses it */
		free(b);
		return;
	}
	/* Remember it: only ids we issued may register here. */
	memcpy(b->token, id->token, sizeof(b->token));
	b->expires = kd_now_ns() + BOOT_UNUSED_NS;
	if (net.nboots >= BOOT_MAX) {
		struct kd_boot **pp = &net.boots, *old;

		while ((*pp)->next)
			pp = &(*pp)->next;
		old = *pp;	/* the oldest */
		*pp = NULL;
		net.nboots--;
		boot_free(old);
	}
	b->next = net.boots;
	net.boots = b;
	net.nboots++;
}

static struct kd_boot *boot_find(const uint8_t *token)
{
	for (struct kd_boot *b = net.boots; b; b = b->next)
		if (!memcmp(b->token, token, KCOLL_ID_TOKEN_BYTES))
			return b;
	return NULL;
}

static struct kd_comm *comm_find(const uint8_t *token)
{
	for (struct kd_comm *c = kd.comms; c; c = c->next)
		if (c->state == KD_COMM_FORMING && !memcmp(c->token, token, KCOLL_ID_TOKEN_BYTES))
			return c;
	return NULL;
}

/* ---- member side ------------------------------------------------------- */

static void member_fail(struct kd_comm *comm, int err, const char *msg)
{
	kd_comm_form_fail(comm, err, msg);
}

static void check_up(struct kd_comm *comm)
{
	struct kd_mh *mh = comm->mh;

	if (comm->state != KD_COMM_FORMING || mh->conns_up < mh->conns_needed)
		return;
	if ((kd_c4 && kd_c4->attach(comm)) || kd_mh_start(mh)) {
		member_fail(comm, -ENOMEM, "cannot start the communicator's network thread");
		return;
	}
	kd_comm_activate(comm);
}

static void boot_ready(struct kd_boot *b, struct kd_pconn *from);

/* The root's table arrived (from a BOOT connection, or from ourselves). */
static void member_table(struct kd_comm *comm, const struct kd_p_table *t, size_t len)
{
	const uint16_t *rank_host = (const uint16_t *)&t->hosts[t->nhosts];
	struct kd_mh *mh;
	uint32_t nlocal = 0;

	if (comm->state != KD_COMM_FORMING || comm->mh) {
		member_fail(comm, -EPROTO, "the root daemon sent a second table");
		return;
	}
	if (t->nranks != comm->nranks || !t->nhosts || t->nhosts > KD_MAX_HOSTS ||
	    t->you >= t->nhosts || !t->nstreams || t->nstreams > KD_MAX_STREAMS ||
	    t->piece < 4096 || t->piece > (64u << 20) ||
	    len < sizeof(*t) + t->nhosts * sizeof(t->hosts[0]) + t->nranks * sizeof(uint16_t)) {
		member_fail(comm, -EPROTO, "the root daemon sent a malformed table");
		return;
	}
	if (t->lane_bytes > KD_LANE_MAX_BYTES) {
		char msg[200];

		snprintf(msg, sizeof(msg), "the root's table gives lanes of %u bytes, over the limit "
			 "%u (KCOLL_LANE_BYTES): run one kcolld version on all hosts",
			 t->lane_bytes, KD_LANE_MAX_BYTES);
		member_fail(comm, -EPROTO, msg);
		return;
	}
	for (uint32_t r = 0; r < t->nranks; r++) {
		if (rank_host[r] >= t->nhosts || (rank_host[r] == t->you) != (comm->clients[r] != NULL)) {
			member_fail(comm, -EPROTO, "the root daemon's table disagrees with the ranks here");
			return;
		}
		nlocal += rank_host[r] == t->you;
	}
	if (t->nhosts == 1) {
		if (comm->boot) {
			pc_close(comm->boot);
			comm->boot = NULL;
		}
		kd_comm_activate(comm);
		return;
	}
	mh = calloc(1, sizeof(*mh));
	if (mh) {
		mh->hosts = calloc(t->nhosts, sizeof(*mh->hosts));
		mh->rank_host = calloc(t->nranks, sizeof(*mh->rank_host));
	}
	if (!mh || !mh->hosts || !mh->rank_host) {
		if (mh) {
			free(mh->hosts);
			free(mh->rank_host);
		}
		free(mh);
		member_fail(comm, -ENOMEM, "out of memory");
		return;
	}
	mh->comm = comm;
	mh->nhosts = t->nhosts;
	mh->self = t->you;
	mh->nstreams = t->nstreams;
	mh->algo = t->algo <= KD_ALGO_DIRECT ? t->algo : KD_ALGO_AUTO;
	mh->lane_bytes = t->lane_bytes;
	mh->net_piece = t->piece;
	mh->xport = net.xport;
	mh->abort_fd = -1;
	mh->running_seq = UINT64_MAX;
	pthread_mutex_init(&mh->plan_lock, NULL);
	mh->conns_needed = (t->nhosts - 1) * (1 + t->nstreams + (t->lane_bytes ? 1 : 0));
	for (uint32_t h = 0; h < t->nhosts; h++) {
		mh->hosts[h].info = t->hosts[h];
		mh->hosts[h].info.name[sizeof(mh->hosts[h].info.name) - 1] = 0;
		if (mh->hosts[h].info.naddrs > KCOLL_ID_MAX_ADDRS)
			mh->hosts[h].info.naddrs = KCOLL_ID_MAX_ADDRS;
		for (char *q = mh->hosts[h].info.name; *q; q++)
			if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20)
				*q = '?';	/* it goes into logs and JSON */
		mh->hosts[h].first_rank = KCOLL_RANK_NONE;
		for (int s = 0; s < KD_MAX_STREAMS; s++)
			mh->hosts[h].data[s] = -1;
		mh->hosts[h].lane = -1;
	}
	if (kd_net_table_hook)
		kd_net_table_hook(t->hosts, t->nhosts, t->you);
	for (uint32_t r = 0; r < t->nranks; r++) {
		struct kd_mh_host *hh = &mh->hosts[rank_host[r]];

		mh->rank_host[r] = rank_host[r];
		if (hh->first_rank == KCOLL_RANK_NONE)
			hh->first_rank = r;
		hh->nranks++;
	}
	pthread_mutex_lock(&comm->lock);
	comm->mh = mh;
	comm->nlocal = nlocal;
	pthread_mutex_unlock(&comm->lock);
	kc_dbg("comm %s: table: %u hosts, we are %u with %u ranks", comm->name, t->nhosts, t->you,
	       nlocal);
	if (comm->boot) {
		struct kd_p_token m = { 0 };

		memcpy(m.token, comm->token, sizeof(m.token));
		if (pc_send(comm->boot, &m, KD_P_READY, sizeof(m)))
			member_fail(comm, -ECONNRESET, "lost the connection to the root daemon");
	}
	/* The root's own READY: boot_send_tables counts it once every table is out. */
}

/* Local address for stream s to host h, and the peer's address on the
 * same network (spread the streams across our interfaces). */
static void pick_path(const struct kd_mh_host *h, uint32_t s, uint32_t *src, uint32_t *dst)
{
	for (uint32_t k = 0; k < net.me.naddrs; k++) {
		uint32_t i = (s + k) % net.me.naddrs;

		for (uint32_t j = 0; j < h->info.naddrs && j < KCOLL_ID_MAX_ADDRS; j++) {
			if ((h->info.addrs[j] & net.masks[i]) == (net.me.addrs[i] & net.masks[i])) {
				*src = net.me.addrs[i];
				*dst = h->info.addrs[j];
				return;
			}
		}
	}
	*src = 0;
	*dst = h->info.addrs[s % (h->info.naddrs ? h->info.naddrs : 1)];
}

/* Our link (address index) a connected socket leaves from: by its local
 * address, else by the network it is on. */
static uint8_t link_of_fd(int fd)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	uint32_t n = net.me.naddrs < KCOLL_C4_MAX_LINKS ? net.me.naddrs : KCOLL_C4_MAX_LINKS;

	if (getsockname(fd, (struct sockaddr *)&sa, &sl) || sa.sin_family != AF_INET)
		return 0;
	for (uint32_t i = 0; i < n; i++)
		if (net.me.addrs[i] == sa.sin_addr.s_addr)
			return i;
	for (uint32_t i = 0; i < n; i++)
		if ((sa.sin_addr.s_addr & net.masks[i]) == (net.me.addrs[i] & net.masks[i]))
			return i;
	return 0;
}

uint32_t kd_net_nlinks(void)
{
	uint32_t n = net.me.naddrs < KCOLL_C4_MAX_LINKS ? net.me.naddrs : KCOLL_C4_MAX_LINKS;

	return n ? n : 1;
}

uint32_t kd_net_shared_links(const struct kd_mh *mh, uint32_t h)
{
	uint32_t bits = 0;

	for (uint32_t i = 0; i < kd_net_nlinks() && i < net.me.naddrs; i++)
		for (uint32_t j = 0; j < mh->hosts[h].info.naddrs && j < KCOLL_ID_MAX_ADDRS; j++)
			if ((mh->hosts[h].info.addrs[j] & net.masks[i]) == (net.me.addrs[i] & net.masks[i]))
				bits |= 1u << i;
	return bits ? bits : 1;
}

void kd_net_link_addr(const struct kd_mh *mh, uint32_t h, uint32_t l, char *buf, size_t len)
{
	snprintf(buf, len, "?");
	if (l >= net.me.naddrs)
		return;
	if (h == mh->self) {
		snprintf(buf, len, "%s", inet_ntoa((struct in_addr){ .s_addr = net.me.addrs[l] }));
		return;
	}
	for (uint32_t j = 0; j < mh->hosts[h].info.naddrs && j < KCOLL_ID_MAX_ADDRS; j++)
		if ((mh->hosts[h].info.addrs[j] & net.masks[l]) == (net.me.addrs[l] & net.masks[l]))
			snprintf(buf, len, "%s", inet_ntoa((struct in_addr){ .s_addr = mh->hosts[h].info.addrs[j] }));
}

void kd_net_link_ifname(uint32_t l, char *buf, size_t len)
{
	struct ifaddrs *ifs, *i;

	snprintf(buf, len, "?");
	if (l >= net.me.naddrs || getifaddrs(&ifs))
		return;
	for (i = ifs; i; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
		    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == net.me.addrs[l])
			snprintf(buf, len, "%s", i->ifa_name);
	freeifaddrs(ifs);
}

int kd_net_ctrl_send(struct kd_mh *mh, uint32_t h, void *msg, uint16_t type, size_t len)
{
	return mh->hosts[h].ctrl ? pc_send(mh->hosts[h].ctrl, msg, type, len) : -ENOTCONN;
}

static void member_go(struct kd_comm *comm)
{
	struct kd_mh *mh = comm->mh;

	if (!mh || comm->state != KD_COMM_FORMING)
		return;
	for (uint32_t h = mh->self + 1; h < mh->nhosts; h++) {
		struct kd_mh_host *hh = &mh->hosts[h];

		for (uint32_t s = 0; s <= mh->nstreams + (mh->lane_bytes ? 1 : 0); s++) {
			/* s == nstreams: the control connection; nstreams + 1: the lane */
			bool ctrl = s == mh->nstreams, lane = s > mh->nstreams;
			uint32_t src, dst;
			struct kd_p_hello hello;
			char where[48], msg[200];
			int fd;

			pick_path(hh, ctrl || lane ? 0 : s, &src, &dst);
			addr_str(dst, hh->info.port, where, sizeof(where));
			fd = tcp_connect(src, dst, hh->info.port);
			hello_fill(&hello, lane ? KD_CONN_LANE : ctrl ? KD_CONN_CTRL : KD_CONN_DATA, comm->token,
				   mh->self, s);
			hello.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_HELLO,
						      .len = sizeof(hello) };
			if (fd >= 0 && send_all(fd, &hello, sizeof(hello))) {
				close(fd);
				fd = -ECONNRESET;
			}
			if (fd < 0) {
				snprintf(msg, sizeof(msg), "cannot connect to host %u (%s) at %s: %s",
					 h, hh->info.name, where, strerror(-fd));
				kc_warn("comm %s: %s", comm->name, msg);
				member_fail(comm, fd, msg);
				return;
			}
			if (ctrl) {
				struct kd_pconn *pc = pc_new(fd, PC_CTRL);

				if (!pc) {
					close(fd);
					member_fail(comm, -ENOMEM, "out of memory");
					return;
				}
				pc->comm = comm;
				pc->host = h;
				snprintf(pc->peer, sizeof(pc->peer), "%s", where);
				hh->ctrl = pc;
			} else if (lane) {
				hh->lane = fd;
			} else {
				hh->data[s] = fd;
				hh->link[s] = link_of_fd(fd);
			}
			mh->conns_up++;
		}
	}
	if (comm->boot) {
		comm->boot->go = true;
		pc_close(comm->boot);
		comm->boot = NULL;
	}
	check_up(comm);
}

static void fill_register(struct kd_p_register *m, const struct kd_comm *comm, uint32_t rank)
{
	memset(m, 0, sizeof(*m));
	memcpy(m->token, comm->token, sizeof(m->token));
	m->nranks = comm->nranks;
	m->rank = rank;
	m->me = net.me;
}

static void boot_register(struct kd_boot *b, struct kd_pconn *from, const struct kd_p_register *m);

static int kd_net_join(struct kd_comm *comm, const struct kcoll_id *id, uint32_t rank,
		       uint32_t flags, const char **why)
{
	struct kd_p_register m;

	fill_register(&m, comm, rank);
	m.flags = flags;
	if (id->root_nonce == kd.nonce) {
		struct kd_boot *b = boot_find(id->token);

		if (!b) {
			*why = "this kcolld did not issue that unique id, or it expired: get a new one "
			       "with kcoll_get_unique_id";
			return -ENOENT;
		}
		boot_register(b, NULL, &m);
		return 0;
	}
	if (net.listen.fd < 0) {
		*why = "the id comes from another kcolld, and this one does not talk to other daemons";
		return -EOPNOTSUPP;
	}
	if (!comm->boot) {
		static char msg[200];
		struct kd_p_hello hello;
		int fd = -EHOSTUNREACH;
		char where[48] = "?";

		for (uint32_t i = 0; i < id->naddrs && i < KCOLL_ID_MAX_ADDRS && fd < 0; i++) {
			addr_str(id->addrs[i], id->port, where, sizeof(where));
			fd = tcp_connect(0, id->addrs[i], id->port);
		}
		if (fd < 0) {
			snprintf(msg, sizeof(msg), "cannot reach the root daemon of this id (%.48s at %s): %s",
				 id->host, where, strerror(-fd));
			*why = msg;
			return fd;
		}
		comm->boot = pc_new(fd, PC_BOOT_MEMBER);
		if (!comm->boot) {
			close(fd);
			*why = "out of memory";
			return -ENOMEM;
		}
		comm->boot->comm = comm;
		snprintf(comm->boot->peer, sizeof(comm->boot->peer), "%s", where);
		hello_fill(&hello, KD_CONN_BOOT, comm->token, 0, 0);
		pc_send(comm->boot, &hello, KD_P_HELLO, sizeof(hello));
	}
	comm->registered = true;
	if (pc_send(comm->boot, &m, KD_P_REGISTER, sizeof(m))) {
		*why = "lost the connection to the root daemon";
		return -ECONNRESET;
	}
	return 0;
}

/* ---- root side ---------------------------------------------------------- */

static void boot_fail(struct kd_boot *b, int err, const char *msg)
{
	struct kd_comm *comm = comm_find(b->token);

	for (uint32_t i = 0; i < b->nd; i++) {
		if (b->d[i].pc) {
			struct kd_p_reject m = { 0 };

			snprintf(m.why, sizeof(m.why), "%s", msg);
			pc_send(b->d[i].pc, &m, KD_P_REJECT, sizeof(m));
		}
	}
	boot_unlink(b);
	boot_free(b);
	if (comm)
		member_fail(comm, err, msg);
}

/* Streams "auto": one per network every host of the comm is on (at least 1). */
static uint32_t shared_networks(const struct kd_boot *b)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < b->d[0].info.naddrs && i < KCOLL_ID_MAX_ADDRS; i++) {
		uint32_t a = b->d[0].info.addrs[i];
		uint8_t len = b->d[0].info.prefix[i];
		uint32_t m = len ? htonl(~0u << (32 - (len > 32 ? 32 : len))) : 0;
		bool all = true;

		for (uint32_t d = 1; d < b->nd && all; d++) {
			bool found = false;

			for (uint32_t j = 0; j < b->d[d].info.naddrs && j < KCOLL_ID_MAX_ADDRS; j++)
				found |= (b->d[d].info.addrs[j] & m) == (a & m);
			all = found;
		}
		n += all;
	}
	return n ? (n > KD_MAX_STREAMS ? KD_MAX_STREAMS : n) : 1;
}

/*
 * Lanes (docs/multihost.md): with one rank on every host and few hosts, the
 * ranks all-reduce small messages themselves over a connection per host pair
 * that the daemons set up, the root's KCOLL_LANE_BYTES deciding for all.
 */
static uint32_t lane_bytes(const struct kd_boot *b)
{
	/* Lanes move host memory only, and libkcoll cannot copy device memory
	 * itself: a rank that may pass device buffers keeps the ops on kcolld. */
	if (b->nd < 2 || b->nd != b->nranks || b->nd > KD_LANE_MAX_HOSTS || b->gpu)
		return 0;
	return atomic_load(&net.lane_bytes);
}

static void boot_send_tables(struct kd_boot *b)
{
	uint32_t order[KD_MAX_HOSTS], host_of[KD_MAX_HOSTS];
	size_t len = sizeof(struct kd_p_table) + b->nd * sizeof(struct kd_p_hostinfo) +
		     b->nranks * sizeof(uint16_t);
	struct kd_p_table *t = calloc(1, len);
	uint16_t *rank_host;

	if (!t) {
		boot_fail(b, -ENOMEM, "the root daemon ran out of memory");
		return;
	}
	/* Hosts in order of their lowest rank. */
	for (uint32_t i = 0; i < b->nd; i++)
		order[i] = i;
	for (uint32_t i = 0; i < b->nd; i++)
		for (uint32_t j = i + 1; j < b->nd; j++)
			if (b->d[order[j]].first_rank < b->d[order[i]].first_rank) {
				uint32_t x = order[i];

				order[i] = order[j];
				order[j] = x;
			}
	for (uint32_t h = 0; h < b->nd; h++) {
		host_of[order[h]] = h;
		t->hosts[h] = b->d[order[h]].info;
	}
	rank_host = (uint16_t *)&t->hosts[b->nd];
	for (uint32_t r = 0; r < b->nranks; r++)
		rank_host[r] = host_of[b->rank_daemon[r]];
	memcpy(t->token, b->token, sizeof(t->token));
	t->nranks = b->nranks;
	t->nhosts = b->nd;
	t->nstreams = atomic_load(&net.nstreams);
	if (!t->nstreams)
		t->nstreams = shared_networks(b);
	t->algo = atomic_load(&net.algo);	/* the root's, for every host alike */
	t->piece = __atomic_load_n(&kd.net_chunk_bytes, __ATOMIC_RELAXED);
	t->lane_bytes = lane_bytes(b);
	kc_info("comm %02x%02x%02x%02x...: all %u ranks registered on %u host(s)", b->token[0],
		b->token[1], b->token[2], b->token[3], b->nranks, b->nd);
	b->tables_sent = true;
	for (uint32_t i = 0; i < b->nd; i++) {
		t->you = host_of[i];
		if (b->d[i].pc) {
			if (pc_send(b->d[i].pc, t, KD_P_TABLE, len)) {
				free(t);
				boot_fail(b, -ECONNRESET, "lost a daemon while forming the communicator");
				return;
			}
		} else {
			struct kd_comm *comm = comm_find(b->token);

			t->hdr.len = len;
			if (comm)
				member_table(comm, t, len);
		}
	}
	free(t);
	if (b->nd == 1) {
		boot_unlink(b);
		boot_free(b);
		return;
	}
	for (uint32_t i = 0; i < b->nd; i++) {
		struct kd_comm *comm = b->d[i].pc ? NULL : comm_find(b->token);

		if (comm && comm->mh) {
			boot_ready(b, NULL);	/* may free b: last use */
			return;
		}
	}
}

static void boot_register(struct kd_boot *b, struct kd_pconn *from, const struct kd_p_register *m)
{
	uint32_t i;

	if (!b->nranks) {
		if (!m->nranks || m->nranks > KD_MAX_RANKS)
			goto bad;
		b->rank_daemon = malloc(m->nranks * sizeof(*b->rank_daemon));
		if (!b->rank_daemon)
			return boot_fail(b, -ENOMEM, "the root daemon ran out of memory");
		for (i = 0; i < m->nranks; i++)
			b->rank_daemon[i] = -1;
		b->nranks = m->nranks;
		b->expires = kd_now_ns() + __atomic_load_n(&kd.timeout_ns, __ATOMIC_RELAXED);
	}
	if (m->nranks != b->nranks || m->rank >= b->nranks || b->rank_daemon[m->rank] >= 0)
		goto bad;
	for (i = 0; i < b->nd; i++)
		if (b->d[i].pc == from && (from || b->d[i].info.nonce == kd.nonce))
			break;
	if (i == b->nd) {
		if (b->nd == KD_MAX_HOSTS)
			return boot_fail(b, -E2BIG, "more than 64 hosts in one communicator");
		b->d[i].pc = from;
		b->d[i].info = m->me;
		b->d[i].first_rank = m->rank;
		b->nd++;
		if (from)
			from->boot = b;
	}
	if (m->rank < b->d[i].first_rank)
		b->d[i].first_rank = m->rank;
	b->rank_daemon[m->rank] = i;
	b->gpu |= m->flags & KCOLL_COMM_F_GPU;
	if (++b->nreg == b->nranks)
		boot_send_tables(b);
	return;
bad:
	{
		char msg[128];

		snprintf(msg, sizeof(msg), "rank %u of %u: nranks differs or the rank registered twice",
			 m->rank, m->nranks);
		boot_fail(b, -EINVAL, msg);
	}
}

static void boot_ready(struct kd_boot *b, struct kd_pconn *from)
{
	for (uint32_t i = 0; i < b->nd; i++) {
		if (b->d[i].pc == from && !b->d[i].ready) {
			b->d[i].ready = true;
			b->nready++;
			break;
		}
	}
	if (b->nready < b->nd)
		return;
	/* Everyone knows the table: connect. */
	boot_unlink(b);
	for (uint32_t i = 0; i < b->nd; i++) {
		if (b->d[i].pc) {
			struct kd_p_token m = { 0 };

			memcpy(m.token, b->token, sizeof(m.token));
			pc_send(b->d[i].pc, &m, KD_P_GO, sizeof(m));
		}
	}
	for (uint32_t i = 0; i < b->nd; i++) {
		if (!b->d[i].pc) {
			struct kd_comm *comm = comm_find(b->token);

			if (comm)
				member_go(comm);
		}
	}
	boot_free(b);	/* closes the BOOT connections: members expect EOF after GO */
}

/* ---- control -------------------------------------------------------------- */

static void kd_net_abort_peers(struct kd_comm *comm, int err, uint32_t rank, uint32_t flags,
			       uint64_t from_seq)
{
	struct kd_mh *mh = comm->mh;
	struct kd_p_abort m = { .err = err, .rank = rank, .flags = flags, .from_seq = from_seq };

	if (!mh)
		return;
	for (uint32_t h = 0; h < mh->nhosts; h++)
		if (h != mh->self && mh->hosts[h].ctrl && !mh->hosts[h].dead)
			pc_send(mh->hosts[h].ctrl, &m, KD_P_ABORT, sizeof(m));
}

static const char *host_name(const struct kd_mh *mh, uint32_t h)
{
	return h < mh->nhosts ? mh->hosts[h].info.name : "?";
}

/* A peer daemon is gone (its control connection broke without an ABORT). */
static void host_lost(struct kd_comm *comm, uint32_t h)
{
	struct kd_mh *mh = comm->mh;
	struct kd_mh_host *hh = &mh->hosts[h];
	uint64_t from;

	if (hh->dead)
		return;
	hh->dead = true;
	pthread_mutex_lock(&comm->lock);
	from = comm->exec_seq;
	pthread_mutex_unlock(&comm->lock);
	if (kd_comm_abort(comm, -ECONNRESET, hh->first_rank, 0, from)) {
		kc_warn("comm %s: lost host %u (%s, ranks %u..%u): its kcolld died or the network "
			"failed; failing op %llu and later ones", comm->name, h, hh->info.name,
			hh->first_rank, hh->first_rank + hh->nranks - 1, (unsigned long long)from);
		kd_net_abort_peers(comm, -ECONNRESET, hh->first_rank, 0, from);
	}
}

static void on_ctrl(struct kd_pconn *pc, const struct kd_phdr *h)
{
	struct kd_comm *comm = pc->comm;
	struct kd_mh *mh = comm->mh;
	struct kd_mh_host *hh = &mh->hosts[pc->host];

	switch (h->type) {
	case KD_P_ABORT: {
		const struct kd_p_abort *m = (const void *)h;

		if (h->len < sizeof(*m))
			break;
		int err = m->err < 0 && m->err >= -4095 ? m->err : -EPROTO;
		uint32_t rank = m->rank < comm->nranks ? m->rank : KCOLL_RANK_NONE;

		hh->answered = true;
		if (!kd_comm_abort(comm, err, rank, m->flags & KCOLL_CQE_F_MISSING, m->from_seq))
			;	/* already aborted from an earlier op */
		else if (m->flags & KD_ABORT_F_LEFT)
			kc_dbg("comm %s: rank %d on host %u (%s) left; ops from %llu on fail", comm->name,
			       (int)m->rank, pc->host, hh->info.name, (unsigned long long)m->from_seq);
		else
			kc_info("comm %s: host %u (%s) aborted it from op %llu: %s, rank %d", comm->name,
				pc->host, hh->info.name, (unsigned long long)m->from_seq,
				kcoll_strerror(m->err), (int)m->rank);
		/* It said goodbye: its connections closing is not a death. */
		hh->dead = true;
		return;
	}
	case KD_P_QUERY: {
		const struct kd_p_query *m = (const void *)h;
		struct kd_p_answer a = { 0 };

		if (h->len < sizeof(*m))
			break;
		a.seq = m->seq;
		kd_comm_submitted(comm, m->seq, a.submitted);
		pc_send(pc, &a, KD_P_ANSWER, sizeof(a));
		return;
	}
	case KD_P_C4:
		if (kd_c4)
			kd_c4->on_report(comm, pc->host, h);
		return;
	case KD_P_PLAN:
		if (kd_c4)
			kd_c4->on_plan(comm, pc->host, h);
		return;
	case KD_P_C4_VIEW:
		if (kd_c4)
			kd_c4->on_view(comm, pc->host, h);
		return;
	case KD_P_ANSWER: {
		const struct kd_p_answer *m = (const void *)h;

		if (h->len < sizeof(*m))
			break;
		if (mh->query_deadline && m->seq == mh->query_seq) {
			hh->answered = true;
			memcpy(hh->submitted, m->submitted, sizeof(hh->submitted));
		}
		return;
	}
	}
	/* A newer peer's type is informative by contract (types that change a
	 * peer's duty bump KD_PEER_VERSION): ignore it without alarm. */
	if (h->type > KD_P_C4_VIEW)
		kc_dbg("comm %s: host %u sent control message type %u, newer than this kcolld; ignored",
		       comm->name, pc->host, h->type);
	else
		kc_warn("comm %s: host %u sent an unexpected control message (type %u)", comm->name,
			pc->host, h->type);
}

/* The HELLO kinds that rooms above net.c take (net.h); main.c fills it
 * before kd_net_start, the control thread reads it. */
#define HELLO_KINDS 8
static kd_hello_fn *hello_kinds[HELLO_KINDS];

int kd_net_hello_register(enum kd_conn_kind kind, kd_hello_fn *accept)
{
	if (kind == KD_CONN_BOOT || kind == KD_CONN_CTRL || kind == KD_CONN_DATA ||
	    kind == KD_CONN_LANE)
		return -EINVAL;	/* a communicator's own connections: net.c runs them */
	if ((unsigned int)kind >= HELLO_KINDS)
		return -ERANGE;
	if (hello_kinds[kind])
		return -EEXIST;
	hello_kinds[kind] = accept;
	return 0;
}

/* NEW connection: its HELLO says what it is for. */
static void on_hello(struct kd_pconn *pc, const struct kd_p_hello *m)
{
	struct kd_comm *comm;
	struct kd_mh *mh;
	char msg[160];

	if (m->version != KD_PEER_VERSION) {
		snprintf(msg, sizeof(msg), "peer protocol version %u, this daemon speaks %u: run the same kcoll "
			 "version on every host", m->version, KD_PEER_VERSION);
		return reject(pc, msg);
	}
	if (m->kind < HELLO_KINDS && hello_kinds[m->kind]) {
		/* A room above (kv_serve.c) answers and serves it from its own thread. */
		epoll_ctl(kd.epfd, EPOLL_CTL_DEL, pc->fd, NULL);
		hello_kinds[m->kind](pc->fd, m);
		pc->fd = -1;
		pc_close(pc);
		return;
	}
	if (m->kind == KD_CONN_BOOT) {
		if (!boot_find(m->token))
			return reject(pc, "this daemon did not issue that unique id (wrong token, or expired)");
		pc->role = PC_BOOT_ROOT;
		return;
	}
	comm = comm_find(m->token);
	mh = comm ? comm->mh : NULL;
	if (!mh)
		return reject(pc, "no communicator here is forming with that token");
	if (m->from_host >= mh->self || (m->kind == KD_CONN_DATA && m->stream >= mh->nstreams) ||
	    (m->kind != KD_CONN_DATA && m->kind != KD_CONN_CTRL &&
	     (m->kind != KD_CONN_LANE || !mh->lane_bytes)) ||
	    mh->hosts[m->from_host].info.nonce != m->nonce) {
		snprintf(msg, sizeof(msg), "unexpected connection (kind %u, host %u, stream %u)", m->kind,
			 m->from_host, m->stream);
		return reject(pc, msg);
	}
	if (m->kind == KD_CONN_CTRL) {
		if (mh->hosts[m->from_host].ctrl)
			return reject(pc, "duplicate control connection");
		pc->role = PC_CTRL;
		pc->comm = comm;
		pc->host = m->from_host;
		mh->hosts[m->from_host].ctrl = pc;
	} else if (m->kind == KD_CONN_LANE) {
		if (mh->hosts[m->from_host].lane >= 0)
			return reject(pc, "duplicate lane");
		/* Kept for the local rank, which takes it (kd_comm_take_lane). */
		mh->hosts[m->from_host].lane = pc->fd;
		epoll_ctl(kd.epfd, EPOLL_CTL_DEL, pc->fd, NULL);
		pc->fd = -1;
		pc_close(pc);
	} else {
		if (mh->hosts[m->from_host].data[m->stream] >= 0)
			return reject(pc, "duplicate data connection");
		/* The data stream now belongs to the net thread. */
		mh->hosts[m->from_host].data[m->stream] = pc->fd;
		mh->hosts[m->from_host].link[m->stream] = link_of_fd(pc->fd);
		epoll_ctl(kd.epfd, EPOLL_CTL_DEL, pc->fd, NULL);
		pc->fd = -1;
		pc_close(pc);
	}
	mh->conns_up++;
	check_up(comm);
}

/* One complete message on a connection; false if pc was closed. */
static bool on_pmsg(struct kd_pconn *pc, const struct kd_phdr *h)
{
	switch (pc->role) {
	case PC_NEW:
		if (h->type != KD_P_HELLO || h->len != sizeof(struct kd_p_hello)) {
			atomic_fetch_add(&net.garbage, 1);
			reject(pc, "expected a HELLO");
			return true;
		}
		on_hello(pc, (const void *)h);
		return true;
	case PC_BOOT_ROOT: {
		struct kd_boot *b = pc->boot;

		if (h->type == KD_P_REGISTER && h->len >= sizeof(struct kd_p_register)) {
			const struct kd_p_register *m = (const void *)h;

			if (!b)
				b = boot_find(m->token);
			if (!b) {
				reject(pc, "this daemon did not issue that unique id (wrong token, or expired)");
				return true;
			}
			if (memcmp(m->token, b->token, sizeof(b->token))) {
				atomic_fetch_add(&net.garbage, 1);
				kc_warn("peer %s: registered for two communicators on one connection; "
					"closing", pc->peer);
				return false;	/* on_eof detaches it from b */
			}
			boot_register(b, pc, m);
			return true;
		}
		if (h->type == KD_P_READY && b && b->tables_sent) {
			boot_ready(b, pc);
			return true;
		}
		break;
	}
	case PC_BOOT_MEMBER: {
		struct kd_comm *comm = pc->comm;

		if (h->type == KD_P_TABLE && h->len >= sizeof(struct kd_p_table)) {
			member_table(comm, (const void *)h, h->len);
			return true;
		}
		if (h->type == KD_P_GO) {
			member_go(comm);
			return true;
		}
		if (h->type == KD_P_REJECT && h->len >= sizeof(struct kd_p_reject)) {
			const struct kd_p_reject *m = (const void *)h;
			char msg[160];

			snprintf(msg, sizeof(msg), "the root daemon refused: %.*s", (int)sizeof(m->why),
				 m->why);
			pc->go = true;	/* its EOF is expected now */
			member_fail(comm, -ECONNREFUSED, msg);
			return false;	/* done with this connection */
		}
		break;
	}
	case PC_CTRL:
		on_ctrl(pc, h);
		return true;
	case PC_LISTEN:
		break;
	}
	atomic_fetch_add(&net.garbage, 1);
	kc_warn("peer %s: unexpected message type %u; closing", pc->peer, h->type);
	return false;
}

static void on_listen(void)
{
	for (;;) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(net.listen.fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
		struct kd_pconn *pc;

		if (fd < 0)
			return;
		tune_socket(fd);
		pc = pc_new(fd, PC_NEW);
		if (!pc) {
			close(fd);
			continue;
		}
		pc->deadline = kd_now_ns() + HELLO_NS;
		addr_str(sa.sin_addr.s_addr, ntohs(sa.sin_port), pc->peer, sizeof(pc->peer));
	}
}

/* Connection closed or broken. */
static void on_eof(struct kd_pconn *pc)
{
	switch (pc->role) {
	case PC_CTRL:
		pthread_mutex_lock(&pc->send_lock);
		if (pc->fd >= 0) {
			epoll_ctl(kd.epfd, EPOLL_CTL_DEL, pc->fd, NULL);
			close(pc->fd);
			pc->fd = -1;
		}
		pthread_mutex_unlock(&pc->send_lock);
		host_lost(pc->comm, pc->host);
		return;	/* freed with the comm */
	case PC_BOOT_MEMBER:
		if (pc->comm->boot == pc)
			pc->comm->boot = NULL;
		break;
	case PC_BOOT_ROOT:
		if (pc->boot) {
			struct kd_boot *b = pc->boot;

			for (uint32_t i = 0; i < b->nd; i++)
				if (b->d[i].pc == pc)
					b->d[i].pc = NULL;
			pc->boot = NULL;
			boot_fail(b, -ECONNRESET, "a member daemon went away while forming the communicator");
		}
		break;
	default:
		break;
	}
	pc_close(pc);
}

static void pc_read(struct kd_pconn *pc)
{
	for (;;) {
		size_t want = pc->role == PC_NEW ? sizeof(struct kd_p_hello) - pc->rxlen :
						   sizeof(pc->rx) - pc->rxlen;
		ssize_t n = recv(pc->fd, pc->rx + pc->rxlen, want, MSG_DONTWAIT);
		size_t off = 0;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			struct kd_comm *comm = pc->role == PC_BOOT_MEMBER ? pc->comm : NULL;
			bool forming = comm && !pc->go && comm->state == KD_COMM_FORMING;

			on_eof(pc);
			if (forming)
				member_fail(comm, -ECONNRESET, "the root daemon closed the connection (did it die?)");
			return;
		}
		pc->rxlen += n;
		while (pc->rxlen - off >= sizeof(struct kd_phdr)) {
			uint64_t msg[KD_PMSG_MAX / 8];
			enum pc_role role = pc->role;
			struct kd_phdr h;

			memcpy(&h, pc->rx + off, sizeof(h));
			if (h.magic != KD_PEER_MAGIC || h.len < sizeof(h) || h.len > KD_PMSG_MAX) {
				atomic_fetch_add(&net.garbage, 1);
				kc_warn("peer %s: garbage on the connection (not a kcoll peer?); closing",
					pc->peer);
				on_eof(pc);
				return;
			}
			if (pc->rxlen - off < h.len)
				break;
			memcpy(msg, pc->rx + off, h.len);	/* aligned, for the handlers */
			off += h.len;
			if (!on_pmsg(pc, (const struct kd_phdr *)msg)) {
				on_eof(pc);
				return;
			}
			/* NEW: the HELLO was all we read; it is handed over or changed role. */
			if (pc->closing || pc->fd < 0)
				return;
			if (role == PC_NEW) {
				pc->rxlen = 0;
				return;
			}
		}
		memmove(pc->rx, pc->rx + off, pc->rxlen - off);
		pc->rxlen -= off;
	}
}

void kd_net_event(struct kd_pconn *pc, uint32_t events)
{
	(void)events;
	if (pc == &net.listen) {
		on_listen();
		return;
	}
	if (pc->fd < 0)
		return;
	net.current = pc;
	pc_read(pc);
	net.current = NULL;
	if (pc->closing)
		pc_close(pc);
}

/* ---- watchdog, teardown, status ------------------------------------------ */

static void query_decide(struct kd_comm *comm)
{
	struct kd_mh *mh = comm->mh;
	uint32_t culprit = KCOLL_RANK_NONE, flags = KCOLL_CQE_F_MISSING;
	char why[160] = "";

	for (uint32_t r = 0; r < comm->nranks && culprit == KCOLL_RANK_NONE; r++) {
		struct kd_mh_host *hh = &mh->hosts[mh->rank_host[r]];

		if (mh->rank_host[r] == mh->self || !hh->answered)
			continue;
		if (!(hh->submitted[r / 64] & (1ULL << (r % 64)))) {
			culprit = r;
			snprintf(why, sizeof(why), "rank %u (host %s) never submitted it", r, hh->info.name);
		}
	}
	for (uint32_t h = 0; h < mh->nhosts && culprit == KCOLL_RANK_NONE; h++) {
		if (h != mh->self && !mh->hosts[h].answered) {
			culprit = mh->hosts[h].first_rank;
			flags = 0;
			snprintf(why, sizeof(why), "host %s (ranks from %u) does not answer", host_name(mh, h),
				 culprit);
		}
	}
	if (culprit == KCOLL_RANK_NONE) {
		uint32_t h = mh->wait_host < mh->nhosts ? mh->wait_host : (mh->self + 1) % mh->nhosts;

		culprit = mh->hosts[h].first_rank;
		flags = 0;
		snprintf(why, sizeof(why), "every rank submitted it, but host %s sent nothing",
			 host_name(mh, h));
	}
	mh->query_deadline = 0;
	if (kd_comm_abort(comm, -ETIMEDOUT, culprit, flags, mh->query_seq)) {
		kc_warn("comm %s: op %llu timed out: %s", comm->name, (unsigned long long)mh->query_seq,
			why);
		kd_net_abort_peers(comm, -ETIMEDOUT, culprit, flags, mh->query_seq);
	}
}

void kd_net_watchdog(int64_t now)
{
	for (struct kd_pconn *pc = net.conns, *next; pc; pc = next) {
		next = pc->next;
		if (pc->role == PC_NEW && now > pc->deadline) {
			kc_warn("peer %s: no HELLO within 5 s; closing", pc->peer);
			pc_close(pc);
		} else if (pc->role == PC_BOOT_ROOT && !pc->boot && pc->deadline && now > pc->deadline) {
			pc_close(pc);	/* a member that did not close after bootstrap */
		}
	}
	for (struct kd_boot *b = net.boots, *next; b; b = next) {
		next = b->next;
		if (now < b->expires)
			continue;
		if (!b->nreg) {
			boot_unlink(b);
			boot_free(b);
			continue;
		}
		char msg[128];
		int n = snprintf(msg, sizeof(msg), "timed out waiting for ranks:");

		for (uint32_t r = 0; r < b->nranks && n < (int)sizeof(msg) - 12; r++)
			if (b->rank_daemon[r] < 0)
				n += snprintf(msg + n, sizeof(msg) - n, " %u", r);
		kc_warn("comm %02x%02x%02x%02x...: %s", b->token[0], b->token[1], b->token[2],
			b->token[3], msg);
		boot_fail(b, -ETIMEDOUT, msg);
	}
	for (struct kd_comm *comm = kd.comms; comm; comm = comm->next) {
		struct kd_mh *mh = comm->mh;
		uint64_t running;
		bool all = true;

		if (!mh || comm->state != KD_COMM_ACTIVE)
			continue;
		running = atomic_load(&mh->running_seq);
		if (mh->query_deadline) {
			if (running != mh->query_seq) {
				mh->query_deadline = 0;	/* it finished after all */
				continue;
			}
			for (uint32_t h = 0; h < mh->nhosts; h++)
				if (h != mh->self && !mh->hosts[h].dead && !mh->hosts[h].answered)
					all = false;
			if (all || now > mh->query_deadline)
				query_decide(comm);
			continue;
		}
		/* Hung: no byte moved for a whole timeout (a long transfer is not). */
		if (running == UINT64_MAX || now - atomic_load(&mh->last_progress) <= comm->timeout_ns)
			continue;
		/* Hung: ask every peer which of its ranks submitted the op. */
		mh->query_seq = running;
		mh->query_deadline = now + QUERY_NS;
		for (uint32_t h = 0; h < mh->nhosts; h++) {
			struct kd_p_query q = { .seq = running };

			mh->hosts[h].answered = false;
			if (h != mh->self && mh->hosts[h].ctrl && !mh->hosts[h].dead)
				pc_send(mh->hosts[h].ctrl, &q, KD_P_QUERY, sizeof(q));
		}
	}
}

static void kd_net_comm_close(struct kd_comm *comm)
{
	struct kd_mh *mh = comm->mh;

	if (comm->boot) {
		pc_close(comm->boot);
		comm->boot = NULL;
	}
	if (!mh)
		return;
	kd_mh_stop(mh);
	if (mh->xport->close)
		mh->xport->close(mh);
	if (kd_c4)
		kd_c4->detach(mh);
	for (uint32_t h = 0; h < mh->nhosts; h++) {
		if (mh->hosts[h].ctrl)
			pc_close(mh->hosts[h].ctrl);
		for (int s = 0; s < KD_MAX_STREAMS; s++)
			if (mh->hosts[h].data[s] >= 0)
				close_gracefully(mh->hosts[h].data[s]);
		if (mh->hosts[h].lane >= 0)
			close(mh->hosts[h].lane);
	}
	pthread_mutex_lock(&comm->lock);
	comm->mh = NULL;
	pthread_mutex_unlock(&comm->lock);
	free(mh->hosts);
	free(mh->rank_host);
	free(mh);
}

static uint32_t c4_summary(struct kd_comm *comm, uint64_t *seen)
{
	*seen = 0;
	return kd_c4 ? kd_c4->summary(comm, seen) : 0;
}

size_t kd_net_render(char *buf, size_t cap, int json)
{
	size_t n = 0;
	char a[32];
	uint64_t seen;
	uint32_t na;

#define PUT(...) do { if (n < cap) n += snprintf(buf + n, cap - n, __VA_ARGS__); } while (0)
	if (json) {
		PUT("\"net\":{\"port\":%u,\"algo\":\"%s\",\"streams\":%u,\"lane_bytes\":%u,\"addrs\":[",
		    net.me.port, kd_algo_name(atomic_load(&net.algo)), atomic_load(&net.nstreams),
		    atomic_load(&net.lane_bytes));
		for (uint32_t i = 0; i < net.me.naddrs; i++) {
			struct in_addr in = { .s_addr = net.me.addrs[i] };

			PUT("%s\"%s\"", i ? "," : "", inet_ntoa(in));
		}
		PUT("],\"rejected\":%lu,\"garbage\":%lu,\"comms\":[", atomic_load(&net.rejected),
		    atomic_load(&net.garbage));
		bool first = true;

		for (struct kd_comm *c = kd.comms; c; c = c->next) {
			struct kd_mh *mh = c->mh;

			if (!mh)
				continue;
			PUT("%s{\"name\":\"%s\",\"hosts\":%u,\"self\":%u,\"algo\":\"%s\",\"streams\":%u,"
			    "\"lane_bytes\":%u,\"bytes_sent\":%lu,"
			    "\"bytes_recv\":%lu,\"peers\":[", first ? "" : ",", c->name, mh->nhosts,
			    mh->self, kd_algo_name(mh->algo), mh->nstreams, mh->lane_bytes,
			    (unsigned long)atomic_load(&mh->bytes_sent),
			    (unsigned long)atomic_load(&mh->bytes_recv));
			first = false;
			for (uint32_t h = 0; h < mh->nhosts; h++)
				PUT("%s{\"host\":%u,\"name\":\"%s\",\"first_rank\":%u,\"ranks\":%u,"
				    "\"dead\":%s}", h ? "," : "", h, mh->hosts[h].info.name,
				    mh->hosts[h].first_rank, mh->hosts[h].nranks,
				    mh->hosts[h].dead ? "true" : "false");
			na = c4_summary(c, &seen);
			PUT("],\"c4_active\":%u,\"c4_seen_by\":[", na);
			for (uint32_t h = 0, k = 0; h < 64; h++)
				if (seen & (1ULL << h))
					PUT("%s%u", k++ ? "," : "", h);
			PUT("],\"xport\":\"%s\"", mh->xport->name);
			if (mh->xport->render) {
				PUT(",");
				if (n < cap)
					n += mh->xport->render(mh, buf + n, cap - n, 1);
			}
			PUT("}");
		}
		PUT("]}");
	} else {
		addr_str(net.me.addrs[0], net.me.port, a, sizeof(a));
		PUT("peers: port %u, reachable at %s", net.me.port, a);
		for (uint32_t i = 1; i < net.me.naddrs; i++) {
			struct in_addr in = { .s_addr = net.me.addrs[i] };

			PUT(", %s", inet_ntoa(in));
		}
		PUT("; algo %s, streams per peer %u (0: one per shared network), lanes up to %u B; "
		    "%lu peers rejected\n", kd_algo_name(atomic_load(&net.algo)), atomic_load(&net.nstreams),
		    atomic_load(&net.lane_bytes), atomic_load(&net.rejected));
		for (struct kd_comm *c = kd.comms; c; c = c->next) {
			struct kd_mh *mh = c->mh;

			if (!mh)
				continue;
			PUT("  comm %s: host %u of %u, %s, %u streams, lanes up to %u B, %lu B sent, "
			    "%lu B received\n", c->name, mh->self, mh->nhosts, kd_algo_name(mh->algo),
			    mh->nstreams, mh->lane_bytes, (unsigned long)atomic_load(&mh->bytes_sent),
			    (unsigned long)atomic_load(&mh->bytes_recv));
			na = c4_summary(c, &seen);
			PUT("    C4: %u active anomal%s over its hosts", na, na == 1 ? "y" : "ies");
			for (uint32_t h = 0, k = 0; h < 64; h++)
				if (seen & (1ULL << h))
					PUT("%s%u", k++ ? "," : " (held by host ", h);
			PUT("%s\n", seen ? "; kcollctl anomalies)" : "");
			PUT("    transport %s\n", mh->xport->name);
			if (mh->xport->render && n < cap)
				n += mh->xport->render(mh, buf + n, cap - n, 0);
		}
	}
#undef PUT
	return n < cap ? n : cap;
}

/* This daemon's own address as peers reach it (KV segment descriptors). */
void kd_net_self(struct kd_p_hostinfo *me)
{
	*me = net.me;
	me->nonce = kd.nonce;
}

/* A blocking-mode TCP connection to a peer daemon (KV streams). */
int kd_net_connect(uint32_t addr, uint16_t port)
{
	int fd = tcp_connect(0, addr, port);

	if (fd >= 0)
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	return fd;
}

static const struct kd_comm_net_ops comm_net_ops = {
	.join = kd_net_join,
	.abort_peers = kd_net_abort_peers,
	.close = kd_net_comm_close,
	.run = kd_mh_queue,
	.wake = kd_mh_wake,
};
