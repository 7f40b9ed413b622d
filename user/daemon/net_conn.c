// SPDX-License-Identifier: MIT
/*
 * The bottom of the network's files (net_int.h): the state they share,
 * sockets and the connections to peer daemons (send with a connection's
 * lock, close so that what we sent last still arrives, reject), the
 * forming communicators (find one by token, fail it, activate it once all
 * its connections are up) and our links (which address a socket leaves
 * from, which networks we share with a host). Calls comm.c and mh.c only.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kcoll/c4.h>

#include "c4d.h"
#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "net.h"
#include "net_int.h"

struct kd_net_state kd_net = { .listen.fd = -1 };

/* ---- sockets ------------------------------------------------------------ */

void net_addr_str(uint32_t a, uint16_t port, char *buf, size_t len)
{
	struct in_addr in = { .s_addr = a };

	snprintf(buf, len, "%s:%u", inet_ntoa(in), port);
}

void net_ep_mod(struct kd_pconn *pc, int op)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP,
				  .data.ptr = (void *)((uintptr_t)pc | 1) };

	epoll_ctl(kd.epfd, op, pc->fd, &ev);
}

void net_tune_socket(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Send all of buf on a non-blocking socket, waiting at most ~1 s for room. */
int net_send_all(int fd, const void *buf, size_t len)
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

int net_pc_send(struct kd_pconn *pc, void *msg, uint16_t type, size_t len)
{
	struct kd_phdr *h = msg;
	int r;

	h->magic = KD_PEER_MAGIC;
	h->type = type;
	h->flags = 0;
	h->len = len;
	h->reserved = 0;
	pthread_mutex_lock(&pc->send_lock);
	r = pc->fd < 0 ? -ENOTCONN : net_send_all(pc->fd, msg, len);
	pthread_mutex_unlock(&pc->send_lock);
	return r;
}

struct kd_pconn *net_pc_new(int fd, enum pc_role role)
{
	struct kd_pconn *pc = calloc(1, sizeof(*pc));

	if (!pc)
		return NULL;
	pc->fd = fd;
	pc->role = role;
	pthread_mutex_init(&pc->send_lock, NULL);
	pc->next = kd_net.conns;
	kd_net.conns = pc;
	net_ep_mod(pc, EPOLL_CTL_ADD);
	return pc;
}

/*
 * Close a connection to a peer daemon so that what we sent last (an ABORT
 * saying a rank left, the last pieces of an op the peer is still finishing)
 * still arrives: close() on a socket with unread bytes (the peer's periodic
 * C4 reports, say) sends a RST at once, and a RST drops what is still queued
 * and fails the peer's reads. So: FIN after our data, read away what has
 * arrived (bounded: never blocks), then close.
 */
void net_close_gracefully(int fd)
{
	char sink[16384];

	shutdown(fd, SHUT_WR);
	for (int i = 0; i < 64 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++)
		;
	close(fd);
}

/* Close and free (control thread); the connection being handled is freed
 * when its handler returns. */
void net_pc_close(struct kd_pconn *pc)
{
	if (pc == kd_net.current) {
		pc->closing = true;
		return;
	}
	for (struct kd_pconn **pp = &kd_net.conns; *pp; pp = &(*pp)->next) {
		if (*pp == pc) {
			*pp = pc->next;
			break;
		}
	}
	pthread_mutex_lock(&pc->send_lock);
	if (pc->fd >= 0) {
		epoll_ctl(kd.epfd, EPOLL_CTL_DEL, pc->fd, NULL);
		net_close_gracefully(pc->fd);
		pc->fd = -1;
	}
	pthread_mutex_unlock(&pc->send_lock);
	pthread_mutex_destroy(&pc->send_lock);
	free(pc);
}

void net_reject(struct kd_pconn *pc, const char *why)
{
	struct kd_p_reject m = { 0 };

	snprintf(m.why, sizeof(m.why), "%s", why);
	net_pc_send(pc, &m, KD_P_REJECT, sizeof(m));
	atomic_fetch_add(&kd_net.rejected, 1);
	kc_warn("peer %s: rejected: %s", pc->peer, why);
	net_pc_close(pc);
}

/* Blocking connect with a timeout; src 0: any. Returns a non-blocking fd. */
int net_tcp_connect(uint32_t src, uint32_t dst, uint16_t port)
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
	net_tune_socket(fd);
	return fd;
}

void net_hello_fill(struct kd_p_hello *h, uint32_t kind, const uint8_t *token, uint32_t from,
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

/* ---- forming communicators ------------------------------------------ */

/* The communicator forming here with that token, or NULL. */
struct kd_comm *net_comm_find(const uint8_t *token)
{
	for (struct kd_comm *c = kd.comms; c; c = c->next)
		if (c->state == KD_COMM_FORMING && !memcmp(c->token, token, KCOLL_ID_TOKEN_BYTES))
			return c;
	return NULL;
}

void net_member_fail(struct kd_comm *comm, int err, const char *msg)
{
	kd_comm_form_fail(comm, err, msg);
}

/* Once every connection to every other host is up (CTRL, DATA, lanes):
 * attach C4, start the net thread, activate. */
void net_check_up(struct kd_comm *comm)
{
	struct kd_mh *mh = comm->mh;

	if (comm->state != KD_COMM_FORMING || mh->conns_up < mh->conns_needed)
		return;
	if ((kd_c4 && kd_c4->attach(comm)) || kd_mh_start(mh)) {
		net_member_fail(comm, -ENOMEM, "cannot start the communicator's network thread");
		return;
	}
	kd_comm_activate(comm);
}

/* ---- links ------------------------------------------------------------ */

/* Our link (address index) a connected socket leaves from: by its local
 * address, else by the network it is on. */
uint8_t net_link_of_fd(int fd)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	uint32_t n = kd_net.me.naddrs < KCOLL_C4_MAX_LINKS ? kd_net.me.naddrs : KCOLL_C4_MAX_LINKS;

	if (getsockname(fd, (struct sockaddr *)&sa, &sl) || sa.sin_family != AF_INET)
		return 0;
	for (uint32_t i = 0; i < n; i++)
		if (kd_net.me.addrs[i] == sa.sin_addr.s_addr)
			return i;
	for (uint32_t i = 0; i < n; i++)
		if ((sa.sin_addr.s_addr & kd_net.masks[i]) == (kd_net.me.addrs[i] & kd_net.masks[i]))
			return i;
	return 0;
}

uint32_t kd_net_nlinks(void)
{
	uint32_t n = kd_net.me.naddrs < KCOLL_C4_MAX_LINKS ? kd_net.me.naddrs : KCOLL_C4_MAX_LINKS;

	return n ? n : 1;
}

uint32_t kd_net_shared_links(const struct kd_mh *mh, uint32_t h)
{
	uint32_t bits = 0;

	for (uint32_t i = 0; i < kd_net_nlinks() && i < kd_net.me.naddrs; i++)
		for (uint32_t j = 0; j < mh->hosts[h].info.naddrs && j < KCOLL_ID_MAX_ADDRS; j++)
			if ((mh->hosts[h].info.addrs[j] & kd_net.masks[i]) == (kd_net.me.addrs[i] & kd_net.masks[i]))
				bits |= 1u << i;
	return bits ? bits : 1;
}

void kd_net_link_addr(const struct kd_mh *mh, uint32_t h, uint32_t l, char *buf, size_t len)
{
	snprintf(buf, len, "?");
	if (l >= kd_net.me.naddrs)
		return;
	if (h == mh->self) {
		snprintf(buf, len, "%s", inet_ntoa((struct in_addr){ .s_addr = kd_net.me.addrs[l] }));
		return;
	}
	for (uint32_t j = 0; j < mh->hosts[h].info.naddrs && j < KCOLL_ID_MAX_ADDRS; j++)
		if ((mh->hosts[h].info.addrs[j] & kd_net.masks[l]) == (kd_net.me.addrs[l] & kd_net.masks[l]))
			snprintf(buf, len, "%s", inet_ntoa((struct in_addr){ .s_addr = mh->hosts[h].info.addrs[j] }));
}

void kd_net_link_ifname(uint32_t l, char *buf, size_t len)
{
	struct ifaddrs *ifs, *i;

	snprintf(buf, len, "?");
	if (l >= kd_net.me.naddrs || getifaddrs(&ifs))
		return;
	for (i = ifs; i; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
		    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == kd_net.me.addrs[l])
			snprintf(buf, len, "%s", i->ifa_name);
	freeifaddrs(ifs);
}

int kd_net_ctrl_send(struct kd_mh *mh, uint32_t h, void *msg, uint16_t type, size_t len)
{
	return mh->hosts[h].ctrl ? net_pc_send(mh->hosts[h].ctrl, msg, type, len) : -ENOTCONN;
}
