/* SPDX-License-Identifier: MIT */
/*
 * What the network's files share, private to them (net.h is their API for
 * the rest of kcolld). Each calls only the files above it in this list, as
 * scripts/layering.py checks (docs/architecture.md, "Layers"):
 *
 *   net_conn.c    the state, sockets, peer connections (send, close,
 *                 reject), our links, the forming communicators and "all
 *                 of a communicator's connections are up"
 *   net_lane.c    lanes: the root's choice, a peer's lane arriving (a HELLO
 *                 kind net.c's table dispatches, main.c registers it)
 *   net_boot.c    bootstrap: the ids this daemon issued, the member side
 *                 (table, GO: connect) and the root side (registrations,
 *                 tables)
 *   net_ctrl.c    control messages, a lost host, the watchdog (bootstrap
 *                 deadlines, query rounds), a communicator's teardown
 *   net.c         settings, start and stop, the HELLO kind table, reading
 *                 and dispatching every connection's messages, comm.c's
 *                 net ops
 *   net_status.c  the "net" part of kcollctl status
 *
 * All of it runs on the control thread, but kd_net_abort_peers and
 * net_pc_send (a connection's send_lock), which any thread may call.
 */
#ifndef KCOLLD_NET_INT_H
#define KCOLLD_NET_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcoll/proto.h>

#include "wire.h"

struct kd_comm;
struct kd_xport_ops;

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

struct kd_net_state {
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
};

/* net_conn.c */
extern struct kd_net_state kd_net;
void net_addr_str(uint32_t a, uint16_t port, char *buf, size_t len);
void net_ep_mod(struct kd_pconn *pc, int op);
void net_tune_socket(int fd);
int net_send_all(int fd, const void *buf, size_t len);
int net_pc_send(struct kd_pconn *pc, void *msg, uint16_t type, size_t len);
struct kd_pconn *net_pc_new(int fd, enum pc_role role);
void net_close_gracefully(int fd);
void net_pc_close(struct kd_pconn *pc);
void net_reject(struct kd_pconn *pc, const char *why);
int net_tcp_connect(uint32_t src, uint32_t dst, uint16_t port);
void net_hello_fill(struct kd_p_hello *h, uint32_t kind, const uint8_t *token, uint32_t from,
		    uint32_t stream);
struct kd_comm *net_comm_find(const uint8_t *token);
void net_member_fail(struct kd_comm *comm, int err, const char *msg);
void net_check_up(struct kd_comm *comm);
uint8_t net_link_of_fd(int fd);

/* net_lane.c */
uint32_t net_lane_bytes(const struct kd_boot *b);

/* net_boot.c */
void net_boot_free(struct kd_boot *b);
void net_boot_unlink(struct kd_boot *b);
struct kd_boot *net_boot_find(const uint8_t *token);
void net_member_table(struct kd_comm *comm, const struct kd_p_table *t, size_t len);
void net_member_go(struct kd_comm *comm);
int kd_net_join(struct kd_comm *comm, const struct kcoll_id *id, uint32_t rank,
		uint32_t flags, const char **why);
void net_boot_fail(struct kd_boot *b, int err, const char *msg);
void net_boot_register(struct kd_boot *b, struct kd_pconn *from, const struct kd_p_register *m);
void net_boot_ready(struct kd_boot *b, struct kd_pconn *from);

/* net_ctrl.c */
void kd_net_abort_peers(struct kd_comm *comm, int err, uint32_t rank, uint32_t flags,
			uint64_t from_seq);
void net_host_lost(struct kd_comm *comm, uint32_t h);
void net_on_ctrl(struct kd_pconn *pc, const struct kd_phdr *h);
void kd_net_comm_close(struct kd_comm *comm);

#endif /* KCOLLD_NET_INT_H */
