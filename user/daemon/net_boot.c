// SPDX-License-Identifier: MIT
/*
 * Bootstrap (docs/multihost.md): the unique id names the daemon that issued
 * it, the root. Each daemon a rank joins registers that rank with the root
 * (over a BOOT connection, or directly when it is the root). When every rank
 * is placed the root sends each daemon the TABLE (hosts in order of their
 * lowest rank, where every rank lives); a communicator on one host is then
 * active at once. Otherwise each daemon answers READY, and when all have,
 * the root says GO: every daemon connects one CTRL and nstreams DATA
 * connections (and a lane, when the table gives lanes) to each host after
 * it in the table, and is active once all its connections to every other
 * host are up.
 *
 * Here: the ids this daemon issued, the member side (table, GO) and the
 * root side (registrations, streams and lanes, tables). net.c reads the
 * BOOT connections and calls in; calls net_conn.c and net_lane.c.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "flow.h"
#include "kcolld.h"
#include "log.h"
#include "mh.h"
#include "net.h"
#include "net_int.h"

void (*kd_net_table_hook)(const struct kd_p_hostinfo *hosts, uint32_t nhosts, uint32_t you);

/* The members close their BOOT connections when they are done (after a
 * TABLE for one host, GO or REJECT); a member that does not is closed by
 * the watchdog. */
void net_boot_free(struct kd_boot *b)
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

void net_boot_unlink(struct kd_boot *b)
{
	for (struct kd_boot **pp = &kd_net.boots; *pp; pp = &(*pp)->next) {
		if (*pp == b) {
			*pp = b->next;
			kd_net.nboots--;
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
	id->port = kd_net.me.port;
	id->naddrs = kd_net.me.naddrs;
	memcpy(id->addrs, kd_net.me.addrs, sizeof(id->addrs));
	snprintf(id->host, sizeof(id->host), "%s", kd_net.me.name);
	if (getrandom(id->token, sizeof(id->token), 0) != sizeof(id->token) || !b) {
		id->magic = 0;	/* unusable: kd_comm_join refuses it */
		free(b);
		return;
	}
	/* Remember it: only ids we issued may register here. */
	memcpy(b->token, id->token, sizeof(b->token));
	b->expires = kd_now_ns() + BOOT_UNUSED_NS;
	if (kd_net.nboots >= BOOT_MAX) {
		struct kd_boot **pp = &kd_net.boots, *old;

		while ((*pp)->next)
			pp = &(*pp)->next;
		old = *pp;	/* the oldest */
		*pp = NULL;
		kd_net.nboots--;
		net_boot_free(old);
	}
	b->next = kd_net.boots;
	kd_net.boots = b;
	kd_net.nboots++;
}

struct kd_boot *net_boot_find(const uint8_t *token)
{
	for (struct kd_boot *b = kd_net.boots; b; b = b->next)
		if (!memcmp(b->token, token, KCOLL_ID_TOKEN_BYTES))
			return b;
	return NULL;
}

/* ---- member side ------------------------------------------------------- */

/* The root's table arrived (from a BOOT connection, or from ourselves). */
void net_member_table(struct kd_comm *comm, const struct kd_p_table *t, size_t len)
{
	const uint16_t *rank_host = (const uint16_t *)&t->hosts[t->nhosts];
	struct kd_mh *mh;
	uint32_t nlocal = 0;

	if (comm->state != KD_COMM_FORMING || comm->mh) {
		net_member_fail(comm, -EPROTO, "the root daemon sent a second table");
		return;
	}
	if (t->nranks != comm->nranks || !t->nhosts || t->nhosts > KD_MAX_HOSTS ||
	    t->you >= t->nhosts || !t->nstreams || t->nstreams > KD_MAX_STREAMS ||
	    t->piece < 4096 || t->piece > (64u << 20) ||
	    len < sizeof(*t) + t->nhosts * sizeof(t->hosts[0]) + t->nranks * sizeof(uint16_t)) {
		net_member_fail(comm, -EPROTO, "the root daemon sent a malformed table");
		return;
	}
	if (t->lane_bytes > KD_LANE_MAX_BYTES) {
		char msg[200];

		snprintf(msg, sizeof(msg), "the root's table gives lanes of %u bytes, over the limit "
			 "%u (KCOLL_LANE_BYTES): run one kcolld version on all hosts",
			 t->lane_bytes, KD_LANE_MAX_BYTES);
		net_member_fail(comm, -EPROTO, msg);
		return;
	}
	for (uint32_t r = 0; r < t->nranks; r++) {
		if (rank_host[r] >= t->nhosts || (rank_host[r] == t->you) != (comm->clients[r] != NULL)) {
			net_member_fail(comm, -EPROTO, "the root daemon's table disagrees with the ranks here");
			return;
		}
		nlocal += rank_host[r] == t->you;
	}
	if (t->nhosts == 1) {
		if (comm->boot) {
			net_pc_close(comm->boot);
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
		net_member_fail(comm, -ENOMEM, "out of memory");
		return;
	}
	mh->comm = comm;
	mh->nhosts = t->nhosts;
	mh->self = t->you;
	mh->nstreams = t->nstreams;
	mh->algo = t->algo <= KD_ALGO_DIRECT ? t->algo : KD_ALGO_AUTO;
	mh->lane_bytes = t->lane_bytes;
	mh->net_piece = t->piece;
	mh->xport = kd_net.xport;
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
		if (net_pc_send(comm->boot, &m, KD_P_READY, sizeof(m)))
			net_member_fail(comm, -ECONNRESET, "lost the connection to the root daemon");
	}
	/* The root's own READY: boot_send_tables counts it once every table is out. */
}

/* Local address for stream s to host h, and the peer's address on the
 * same network (spread the streams across our interfaces). */
static void pick_path(const struct kd_mh_host *h, uint32_t s, uint32_t *src, uint32_t *dst)
{
	for (uint32_t k = 0; k < kd_net.me.naddrs; k++) {
		uint32_t i = (s + k) % kd_net.me.naddrs;

		for (uint32_t j = 0; j < h->info.naddrs && j < KCOLL_ID_MAX_ADDRS; j++) {
			if ((h->info.addrs[j] & kd_net.masks[i]) == (kd_net.me.addrs[i] & kd_net.masks[i])) {
				*src = kd_net.me.addrs[i];
				*dst = h->info.addrs[j];
				return;
			}
		}
	}
	*src = 0;
	*dst = h->info.addrs[s % (h->info.naddrs ? h->info.naddrs : 1)];
}

void net_member_go(struct kd_comm *comm)
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
			net_addr_str(dst, hh->info.port, where, sizeof(where));
			fd = net_tcp_connect(src, dst, hh->info.port);
			net_hello_fill(&hello, lane ? KD_CONN_LANE : ctrl ? KD_CONN_CTRL : KD_CONN_DATA, comm->token,
				   mh->self, s);
			hello.hdr = (struct kd_phdr){ .magic = KD_PEER_MAGIC, .type = KD_P_HELLO,
						      .len = sizeof(hello) };
			if (fd >= 0 && net_send_all(fd, &hello, sizeof(hello))) {
				close(fd);
				fd = -ECONNRESET;
			}
			if (fd < 0) {
				snprintf(msg, sizeof(msg), "cannot connect to host %u (%s) at %s: %s",
					 h, hh->info.name, where, strerror(-fd));
				kc_warn("comm %s: %s", comm->name, msg);
				net_member_fail(comm, fd, msg);
				return;
			}
			if (ctrl) {
				struct kd_pconn *pc = net_pc_new(fd, PC_CTRL);

				if (!pc) {
					close(fd);
					net_member_fail(comm, -ENOMEM, "out of memory");
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
				hh->link[s] = net_link_of_fd(fd);
			}
			mh->conns_up++;
		}
	}
	if (comm->boot) {
		comm->boot->go = true;
		net_pc_close(comm->boot);
		comm->boot = NULL;
	}
	net_check_up(comm);
}

static void fill_register(struct kd_p_register *m, const struct kd_comm *comm, uint32_t rank)
{
	memset(m, 0, sizeof(*m));
	memcpy(m->token, comm->token, sizeof(m->token));
	m->nranks = comm->nranks;
	m->rank = rank;
	m->me = kd_net.me;
}

int kd_net_join(struct kd_comm *comm, const struct kcoll_id *id, uint32_t rank,
		uint32_t flags, const char **why)
{
	struct kd_p_register m;

	fill_register(&m, comm, rank);
	m.flags = flags;
	if (id->root_nonce == kd.nonce) {
		struct kd_boot *b = net_boot_find(id->token);

		if (!b) {
			*why = "this kcolld did not issue that unique id, or it expired: get a new one "
			       "with kcoll_get_unique_id";
			return -ENOENT;
		}
		net_boot_register(b, NULL, &m);
		return 0;
	}
	if (kd_net.listen.fd < 0) {
		*why = "the id comes from another kcolld, and this one does not talk to other daemons";
		return -EOPNOTSUPP;
	}
	if (!comm->boot) {
		static char msg[200];
		struct kd_p_hello hello;
		int fd = -EHOSTUNREACH;
		char where[48] = "?";

		for (uint32_t i = 0; i < id->naddrs && i < KCOLL_ID_MAX_ADDRS && fd < 0; i++) {
			net_addr_str(id->addrs[i], id->port, where, sizeof(where));
			fd = net_tcp_connect(0, id->addrs[i], id->port);
		}
		if (fd < 0) {
			snprintf(msg, sizeof(msg), "cannot reach the root daemon of this id (%.48s at %s): %s",
				 id->host, where, strerror(-fd));
			*why = msg;
			return fd;
		}
		comm->boot = net_pc_new(fd, PC_BOOT_MEMBER);
		if (!comm->boot) {
			close(fd);
			*why = "out of memory";
			return -ENOMEM;
		}
		comm->boot->comm = comm;
		snprintf(comm->boot->peer, sizeof(comm->boot->peer), "%s", where);
		net_hello_fill(&hello, KD_CONN_BOOT, comm->token, 0, 0);
		net_pc_send(comm->boot, &hello, KD_P_HELLO, sizeof(hello));
	}
	comm->registered = true;
	if (net_pc_send(comm->boot, &m, KD_P_REGISTER, sizeof(m))) {
		*why = "lost the connection to the root daemon";
		return -ECONNRESET;
	}
	return 0;
}

/* ---- root side ---------------------------------------------------------- */

void net_boot_fail(struct kd_boot *b, int err, const char *msg)
{
	struct kd_comm *comm = net_comm_find(b->token);

	for (uint32_t i = 0; i < b->nd; i++) {
		if (b->d[i].pc) {
			struct kd_p_reject m = { 0 };

			snprintf(m.why, sizeof(m.why), "%s", msg);
			net_pc_send(b->d[i].pc, &m, KD_P_REJECT, sizeof(m));
		}
	}
	net_boot_unlink(b);
	net_boot_free(b);
	if (comm)
		net_member_fail(comm, err, msg);
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

static void boot_send_tables(struct kd_boot *b)
{
	uint32_t order[KD_MAX_HOSTS], host_of[KD_MAX_HOSTS];
	size_t len = sizeof(struct kd_p_table) + b->nd * sizeof(struct kd_p_hostinfo) +
		     b->nranks * sizeof(uint16_t);
	struct kd_p_table *t = calloc(1, len);
	uint16_t *rank_host;

	if (!t) {
		net_boot_fail(b, -ENOMEM, "the root daemon ran out of memory");
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
	t->nstreams = atomic_load(&kd_net.nstreams);
	if (!t->nstreams)
		t->nstreams = shared_networks(b);
	t->algo = atomic_load(&kd_net.algo);	/* the root's, for every host alike */
	t->piece = __atomic_load_n(&kd.net_chunk_bytes, __ATOMIC_RELAXED);
	t->lane_bytes = net_lane_bytes(b);
	kc_info("comm %02x%02x%02x%02x...: all %u ranks registered on %u host(s)", b->token[0],
		b->token[1], b->token[2], b->token[3], b->nranks, b->nd);
	b->tables_sent = true;
	for (uint32_t i = 0; i < b->nd; i++) {
		t->you = host_of[i];
		if (b->d[i].pc) {
			if (net_pc_send(b->d[i].pc, t, KD_P_TABLE, len)) {
				free(t);
				net_boot_fail(b, -ECONNRESET, "lost a daemon while forming the communicator");
				return;
			}
		} else {
			struct kd_comm *comm = net_comm_find(b->token);

			t->hdr.len = len;
			if (comm)
				net_member_table(comm, t, len);
		}
	}
	free(t);
	if (b->nd == 1) {
		net_boot_unlink(b);
		net_boot_free(b);
		return;
	}
	for (uint32_t i = 0; i < b->nd; i++) {
		struct kd_comm *comm = b->d[i].pc ? NULL : net_comm_find(b->token);

		if (comm && comm->mh) {
			net_boot_ready(b, NULL);	/* may free b: last use */
			return;
		}
	}
}

void net_boot_register(struct kd_boot *b, struct kd_pconn *from, const struct kd_p_register *m)
{
	uint32_t i;

	if (!b->nranks) {
		if (!m->nranks || m->nranks > KD_MAX_RANKS)
			goto bad;
		b->rank_daemon = malloc(m->nranks * sizeof(*b->rank_daemon));
		if (!b->rank_daemon)
			return net_boot_fail(b, -ENOMEM, "the root daemon ran out of memory");
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
			return net_boot_fail(b, -E2BIG, "more than 64 hosts in one communicator");
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
		net_boot_fail(b, -EINVAL, msg);
	}
}

void net_boot_ready(struct kd_boot *b, struct kd_pconn *from)
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
	net_boot_unlink(b);
	for (uint32_t i = 0; i < b->nd; i++) {
		if (b->d[i].pc) {
			struct kd_p_token m = { 0 };

			memcpy(m.token, b->token, sizeof(m.token));
			net_pc_send(b->d[i].pc, &m, KD_P_GO, sizeof(m));
		}
	}
	for (uint32_t i = 0; i < b->nd; i++) {
		if (!b->d[i].pc) {
			struct kd_comm *comm = net_comm_find(b->token);

			if (comm)
				net_member_go(comm);
		}
	}
	net_boot_free(b);	/* closes the BOOT connections: members expect EOF after GO */
}
