/* SPDX-License-Identifier: MIT */
/*
 * The network, daemon-to-daemon: the TCP listener, connections between
 * daemons, bootstrap (root and member side), lanes and control messages
 * (abort, query), on the control thread (docs/multihost.md has the long
 * form). Its files, net.c, net_conn.c, net_lane.c, net_boot.c, net_ctrl.c
 * and net_status.c, share net_int.h, which says who does what. The peer
 * protocol is wire.h, a multi-host communicator mh.h, its transports
 * xport.h, the C4 hooks c4d.h, flow observation flow.h.
 *
 * The network sits above comm.c and mh.c: it forms communicators, starts
 * their net threads and aborts them on peers' word. comm.c reaches it back
 * through the struct kd_comm_net_ops that kd_net_start installs (kcolld.h);
 * rooms take connections of their own kinds through the HELLO kind table
 * below (kv_serve.c's KV connections, net_lane.c's lanes).
 */
#ifndef KCOLLD_NET_H
#define KCOLLD_NET_H

#include <stddef.h>
#include <stdint.h>

#include <kcoll/proto.h>

#include "wire.h"

struct kd_comm;
struct kd_mh;
struct kd_pconn;
struct kd_xport_ops;

/* net.c (control thread). pick: the transport for new communicators
 * (main.c passes xport.c's kd_xport_default; called once here, at start). */
int kd_net_start(const char *listen_spec, const char *addrs_spec,
		 const struct kd_xport_ops *(*pick)(void));
/* Who this daemon is to its peers (after kd_net_start): listen port (0 when
 * not listening) and up to max advertised addresses; returns how many. */
int kd_net_self_addrs(uint16_t *port, uint32_t *addrs, int max);
void kd_net_stop(void);
void kd_net_event(struct kd_pconn *pc, uint32_t events);
void kd_net_fill_id(struct kcoll_id *id);
/* This daemon's address and instance nonce, for KV segment descriptors. */
void kd_net_self(struct kd_p_hostinfo *me);
/* TCP connection to addr:port (network-order address), blocking mode; fd or -errno. */
int kd_net_connect(uint32_t addr, uint16_t port);
/* Control thread, periodically: bootstrap deadlines, query rounds. */
void kd_net_watchdog(int64_t now);
size_t kd_net_render(char *buf, size_t cap, int json);
const char *kd_algo_name(enum kd_algo a);
int kd_algo_parse(const char *s, enum kd_algo *a);
enum kd_algo kd_net_algo(void);
/* kcollctl set KEY VALUE for the keys net.c owns (algo, streams, lane_bytes). */
int kd_net_set(const char *key, const char *value, char *err, size_t errlen);

/* Host h's address on the network of our link l ("?" if none); our
 * interface name of link l. */
void kd_net_link_addr(const struct kd_mh *mh, uint32_t h, uint32_t l, char *buf, size_t len);
void kd_net_link_ifname(uint32_t l, char *buf, size_t len);
uint32_t kd_net_nlinks(void);
/* Links (bitmap of our network indices) host h is on too. */
uint32_t kd_net_shared_links(const struct kd_mh *mh, uint32_t h);
int kd_net_ctrl_send(struct kd_mh *mh, uint32_t h, void *msg, uint16_t type, size_t len);

/*
 * The HELLO kind table: who takes a connection whose HELLO names a kind
 * that net.c does not run itself (KD_CONN_KV: kv_serve.c, KD_CONN_LANE:
 * net_lane.c); bootstrap, CTRL and DATA are net.c's. Registered at start-up
 * by main.c, before kd_net_start, read-only after. accept, on the control
 * thread, returns 0 when it took the fd (it answers and serves it, or
 * keeps or closes it); else -errno with why (at most len bytes): net.c
 * rejects the connection, saying why, and closes it.
 */
typedef int kd_hello_fn(int fd, const struct kd_p_hello *m, char *why, size_t len);
int kd_net_hello_register(enum kd_conn_kind kind, kd_hello_fn *accept);	/* 0 or -errno */
/* net_lane.c: KD_CONN_LANE's accept */
int kd_net_lane_accept(int fd, const struct kd_p_hello *m, char *why, size_t len);

#endif /* KCOLLD_NET_H */
