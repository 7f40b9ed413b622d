// SPDX-License-Identifier: MIT
/*
 * Daemon-to-daemon: the top of the network's files (net_int.h lists them).
 * Here: the settings (algo, streams, lane_bytes), start and stop, who this
 * daemon is to its peers, the HELLO kind table, and reading every peer
 * connection and dispatching its messages: a NEW connection's HELLO (to a
 * kind in the table, to bootstrap, or to a forming communicator's CTRL or
 * DATA), BOOT messages to net_boot.c, CTRL messages to net_ctrl.c.
 * comm.c reaches the network through the struct kd_comm_net_ops at the end.
 * Control thread only.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "config.h"
#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "net.h"
#include "net_int.h"
#include "xport.h"

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
	return atomic_load(&kd_net.algo);
}

int kd_net_set(const char *key, const char *value, char *err, size_t errlen)
{
	if (!strcmp(key, "algo")) {
		enum kd_algo a;

		if (kd_algo_parse(value, &a)) {
			snprintf(err, errlen, "unknown algorithm '%s' (auto, ring, rd, rabenseifner, direct)", value);
			return -EINVAL;
		}
		atomic_store(&kd_net.algo, a);
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
		atomic_store(&kd_net.nstreams, n);
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
		atomic_store(&kd_net.lane_bytes, (uint32_t)v);
		kc_info("lane_bytes set to %lld (communicators this daemon's ids form from now on)", v);
		return 0;
	}
	snprintf(err, errlen, "unknown key '%s' (algo, streams, lane_bytes)", key);
	return -ENOENT;
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
			kd_net.me.addrs[n] = a.s_addr;
			kd_net.masks[n] = 0xffffffff;
			for (i = ifa; i; i = i->ifa_next)
				if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && i->ifa_netmask &&
				    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == a.s_addr)
					kd_net.masks[n] = ((struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr;
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
			kd_net.me.addrs[n] = c[x].a;
			kd_net.masks[n++] = c[x].m;
		}
	}
	if (!n) {
		kd_net.me.addrs[n] = htonl(INADDR_LOOPBACK);
		kd_net.masks[n++] = htonl(0xff000000);
	}
	kd_net.me.naddrs = n;
	for (uint16_t k = 0; k < n; k++)
		kd_net.me.prefix[k] = __builtin_popcount(kd_net.masks[k]);
	freeifaddrs(ifa);
}

int kd_net_self_addrs(uint16_t *port, uint32_t *addrs, int max)
{
	int n = kd_net.me.naddrs < max ? kd_net.me.naddrs : max;

	*port = kd_net.listen.fd >= 0 ? kd_net.me.port : 0;
	memcpy(addrs, kd_net.me.addrs, n * sizeof(*addrs));
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
	atomic_store(&kd_net.algo, a);
	lanes = kcoll_knob_ll("KCOLL_LANE_BYTES");
	if (lanes > KD_LANE_MAX_BYTES) {	/* as kcollctl set lane_bytes refuses it, but start */
		kc_warn("KCOLL_LANE_BYTES=%lld is over the limit of %u (0 turns lanes off); using %u",
			lanes, KD_LANE_MAX_BYTES, KD_LANE_MAX_BYTES);
		lanes = KD_LANE_MAX_BYTES;
	}
	atomic_store(&kd_net.lane_bytes, lanes <= 0 ? 0 : (uint32_t)lanes);
	atomic_store(&kd_net.nstreams, ns > KD_MAX_STREAMS ? KD_MAX_STREAMS : ns);
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
	kd_net.me.port = ntohs(sa.sin_port);
	kd_net.me.nonce = kd.nonce;
	find_addrs(addrs_spec);
	{
		/* "host/first address": containers and namespaces often share a name. */
		char hn[32] = "?";
		struct in_addr in = { .s_addr = kd_net.me.addrs[0] };

		gethostname(hn, sizeof(hn) - 1);
		snprintf(kd_net.me.name, sizeof(kd_net.me.name), "%s/%s", hn, inet_ntoa(in));
	}
	kd_net.listen.fd = fd;
	kd_net.listen.role = PC_LISTEN;
	pthread_mutex_init(&kd_net.listen.send_lock, NULL);
	net_ep_mod(&kd_net.listen, EPOLL_CTL_ADD);
	{
		char a0[32], a1[32] = "";

		net_addr_str(kd_net.me.addrs[0], kd_net.me.port, a0, sizeof(a0));
		if (kd_net.me.naddrs > 1)
			net_addr_str(kd_net.me.addrs[1], kd_net.me.port, a1, sizeof(a1));
		kc_info("peers: listening on port %u, reachable at %s%s%s%s (algo %s, streams per peer: %u, "
			"0 = one per shared network)", kd_net.me.port, a0, kd_net.me.naddrs > 1 ? ", " : "", a1,
			kd_net.me.naddrs > 2 ? ", ..." : "", kd_algo_name(a), atomic_load(&kd_net.nstreams));
	}
	kd_net.xport = pick();	/* picks and logs the transport (and why not RDMA) */
	return 0;
}

void kd_net_stop(void)
{
	while (kd_net.boots) {
		struct kd_boot *b = kd_net.boots;

		kd_net.boots = b->next;
		net_boot_free(b);
	}
	kd_net.current = NULL;
	while (kd_net.conns)
		net_pc_close(kd_net.conns);
	if (kd_net.listen.fd >= 0) {
		epoll_ctl(kd.epfd, EPOLL_CTL_DEL, kd_net.listen.fd, NULL);
		close(kd_net.listen.fd);
		kd_net.listen.fd = -1;
	}
}

/* This daemon's own address as peers reach it (KV segment descriptors). */
void kd_net_self(struct kd_p_hostinfo *me)
{
	*me = kd_net.me;
	me->nonce = kd.nonce;
}

/* A blocking-mode TCP connection to a peer daemon (KV streams). */
int kd_net_connect(uint32_t addr, uint16_t port)
{
	int fd = net_tcp_connect(0, addr, port);

	if (fd >= 0)
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	return fd;
}

/* ---- HELLO, reading, dispatch ---------------------------------------- */

/* The HELLO kinds that rooms take (net.h: kv_serve.c's, net_lane.c's);
 * main.c fills it before kd_net_start, the control thread reads it. */
#define HELLO_KINDS 8
static kd_hello_fn *hello_kinds[HELLO_KINDS];

int kd_net_hello_register(enum kd_conn_kind kind, kd_hello_fn *accept)
{
	if (kind == KD_CONN_BOOT || kind == KD_CONN_CTRL || kind == KD_CONN_DATA)
		return -EINVAL;	/* bootstrap and a communicator's host table: net.c runs them */
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
		return net_reject(pc, msg);
	}
	if (m->kind < HELLO_KINDS && hello_kinds[m->kind]) {
		/* A room (kv_serve.c, net_lane.c) takes the fd, or says why not. */
		epoll_ctl(kd.epfd, EPOLL_CTL_DEL, pc->fd, NULL);
		if (hello_kinds[m->kind](pc->fd, m, msg, sizeof(msg)))
			return net_reject(pc, msg);
		pc->fd = -1;
		net_pc_close(pc);
		return;
	}
	if (m->kind == KD_CONN_BOOT) {
		if (!net_boot_find(m->token))
			return net_reject(pc, "this daemon did not issue that unique id (wrong token, or expired)");
		pc->role = PC_BOOT_ROOT;
		return;
	}
	comm = net_comm_find(m->token);
	mh = comm ? comm->mh : NULL;
	if (!mh)
		return net_reject(pc, "no communicator here is forming with that token");
	if (m->from_host >= mh->self || (m->kind == KD_CONN_DATA && m->stream >= mh->nstreams) ||
	    (m->kind != KD_CONN_DATA && m->kind != KD_CONN_CTRL) ||
	    mh->hosts[m->from_host].info.nonce != m->nonce) {
		snprintf(msg, sizeof(msg), "unexpected connection (kind %u, host %u, stream %u)", m->kind,
			 m->from_host, m->stream);
		return net_reject(pc, msg);
	}
	if (m->kind == KD_CONN_CTRL) {
		if (mh->hosts[m->from_host].ctrl)
			return net_reject(pc, "duplicate control connection");
		pc->role = PC_CTRL;
		pc->comm = comm;
		pc->host = m->from_host;
		mh->hosts[m->from_host].ctrl = pc;
	} else {
		if (mh->hosts[m->from_host].data[m->stream] >= 0)
			return net_reject(pc, "duplicate data connection");
		/* The data stream now belongs to the net thread. */
		mh->hosts[m->from_host].data[m->stream] = pc->fd;
		mh->hosts[m->from_host].link[m->stream] = net_link_of_fd(pc->fd);
		epoll_ctl(kd.epfd, EPOLL_CTL_DEL, pc->fd, NULL);
		pc->fd = -1;
		net_pc_close(pc);
	}
	mh->conns_up++;
	net_check_up(comm);
}

/* One complete message on a connection; false if pc was closed. */
static bool on_pmsg(struct kd_pconn *pc, const struct kd_phdr *h)
{
	switch (pc->role) {
	case PC_NEW:
		if (h->type != KD_P_HELLO || h->len != sizeof(struct kd_p_hello)) {
			atomic_fetch_add(&kd_net.garbage, 1);
			net_reject(pc, "expected a HELLO");
			return true;
		}
		on_hello(pc, (const void *)h);
		return true;
	case PC_BOOT_ROOT: {
		struct kd_boot *b = pc->boot;

		if (h->type == KD_P_REGISTER && h->len >= sizeof(struct kd_p_register)) {
			const struct kd_p_register *m = (const void *)h;

			if (!b)
				b = net_boot_find(m->token);
			if (!b) {
				net_reject(pc, "this daemon did not issue that unique id (wrong token, or expired)");
				return true;
			}
			if (memcmp(m->token, b->token, sizeof(b->token))) {
				atomic_fetch_add(&kd_net.garbage, 1);
				kc_warn("peer %s: registered for two communicators on one connection; "
					"closing", pc->peer);
				return false;	/* on_eof detaches it from b */
			}
			net_boot_register(b, pc, m);
			return true;
		}
		if (h->type == KD_P_READY && b && b->tables_sent) {
			net_boot_ready(b, pc);
			return true;
		}
		break;
	}
	case PC_BOOT_MEMBER: {
		struct kd_comm *comm = pc->comm;

		if (h->type == KD_P_TABLE && h->len >= sizeof(struct kd_p_table)) {
			net_member_table(comm, (const void *)h, h->len);
			return true;
		}
		if (h->type == KD_P_GO) {
			net_member_go(comm);
			return true;
		}
		if (h->type == KD_P_REJECT && h->len >= sizeof(struct kd_p_reject)) {
			const struct kd_p_reject *m = (const void *)h;
			char msg[160];

			snprintf(msg, sizeof(msg), "the root daemon refused: %.*s", (int)sizeof(m->why),
				 m->why);
			pc->go = true;	/* its EOF is expected now */
			net_member_fail(comm, -ECONNREFUSED, msg);
			return false;	/* done with this connection */
		}
		break;
	}
	case PC_CTRL:
		net_on_ctrl(pc, h);
		return true;
	case PC_LISTEN:
		break;
	}
	atomic_fetch_add(&kd_net.garbage, 1);
	kc_warn("peer %s: unexpected message type %u; closing", pc->peer, h->type);
	return false;
}

static void on_listen(void)
{
	for (;;) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(kd_net.listen.fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
		struct kd_pconn *pc;

		if (fd < 0)
			return;
		net_tune_socket(fd);
		pc = net_pc_new(fd, PC_NEW);
		if (!pc) {
			close(fd);
			continue;
		}
		pc->deadline = kd_now_ns() + HELLO_NS;
		net_addr_str(sa.sin_addr.s_addr, ntohs(sa.sin_port), pc->peer, sizeof(pc->peer));
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
		net_host_lost(pc->comm, pc->host);
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
			net_boot_fail(b, -ECONNRESET, "a member daemon went away while forming the communicator");
		}
		break;
	default:
		break;
	}
	net_pc_close(pc);
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
				net_member_fail(comm, -ECONNRESET, "the root daemon closed the connection (did it die?)");
			return;
		}
		pc->rxlen += n;
		while (pc->rxlen - off >= sizeof(struct kd_phdr)) {
			uint64_t msg[KD_PMSG_MAX / 8];
			enum pc_role role = pc->role;
			struct kd_phdr h;

			memcpy(&h, pc->rx + off, sizeof(h));
			if (h.magic != KD_PEER_MAGIC || h.len < sizeof(h) || h.len > KD_PMSG_MAX) {
				atomic_fetch_add(&kd_net.garbage, 1);
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
	if (pc == &kd_net.listen) {
		on_listen();
		return;
	}
	if (pc->fd < 0)
		return;
	kd_net.current = pc;
	pc_read(pc);
	kd_net.current = NULL;
	if (pc->closing)
		net_pc_close(pc);
}

static const struct kd_comm_net_ops comm_net_ops = {
	.join = kd_net_join,
	.abort_peers = kd_net_abort_peers,
	.close = kd_net_comm_close,
	.run = kd_mh_queue,
	.wake = kd_mh_wake,
};
