/* SPDX-License-Identifier: MIT */
/*
 * kcoll's RDMA verbs layer (rdma/): devices, RoCE v2 GID selection,
 * endpoints (RC queue pairs to one peer), a registration cache and one-sided
 * writes and reads. The daemon's collective transport (xport_rdma.c) is built
 * on it; the KV-cache engine can call the same functions.
 *
 * Every function returns 0 or a negative errno (verbs' positive errno values
 * are negated here). Where a function can fail for a reason the user must act
 * on, it fills 'why' with a sentence that says what to do.
 */
#ifndef KCOLL_RDMA_H
#define KCOLL_RDMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#include "ibv_dl.h"

#define KCOLL_RDMA_MAX_QPS	8
#define KCOLL_RDMA_WHY		512

/* A local port and GID picked for traffic from one IPv4 address. */
struct kcoll_rdma_port {
	int dev;			/* index into the opened devices */
	uint8_t port;
	int gid_index;
	union ibv_gid gid;
	enum ibv_mtu mtu;
};

/* Open the devices (KCOLL_IB_HCA narrows the list). 0, or -ENODEV with the
 * reason in kcoll_rdma_why(). Idempotent; kcoll_rdma_fini closes them. */
int kcoll_rdma_init(void);
void kcoll_rdma_fini(void);
const char *kcoll_rdma_why(void);
int kcoll_rdma_ndevs(void);
const char *kcoll_rdma_dev_name(int dev);
struct ibv_context *kcoll_rdma_ctx(int dev);
struct ibv_pd *kcoll_rdma_pd(int dev);

/*
 * The RoCE v2 GID whose netdev carries local IPv4 address ip (network
 * order), or the one KCOLL_IB_GID_INDEX names. -EADDRNOTAVAIL with a
 * diagnosis (the GIDs that exist and why none fits) in why.
 */
int kcoll_rdma_pick_gid(uint32_t ip, struct kcoll_rdma_port *out, char *why, size_t whylen);
/* The same, ignoring KCOLL_IB_GID_INDEX: always the GID of address ip (the
 * per-QP path choice, kcoll_rdma_ep_set_path). */
int kcoll_rdma_pick_gid_ip(uint32_t ip, struct kcoll_rdma_port *out, char *why, size_t whylen);

/*
 * Read the device's pending async events (non-blocking) and say whether
 * port is usable: -ENETDOWN after IBV_EVENT_PORT_ERR (until PORT_ACTIVE),
 * -EIO after IBV_EVENT_DEVICE_FATAL, with the reason in why. The async fd
 * (kcoll_rdma_async_fd) becomes readable when an event is pending.
 */
int kcoll_rdma_port_check(int dev, uint8_t port, char *why, size_t whylen);
int kcoll_rdma_async_fd(int dev);

/*
 * Device removal ('rdma link delete', driver unload). rdma_rxe (and any
 * driver without disassociate_ucontext) cannot revoke user contexts: the
 * kernel removes the device's uverbs node, then waits until every process
 * has closed it, with no async event. kcoll_rdma_port_check notices the
 * missing node (-ENODEV); endpoints can no longer be created on it; once
 * its last endpoint is destroyed, kcoll_rdma_reap drops the cache's
 * registrations on it and closes it (returns how many it closed), which
 * lets the removal complete. kcoll_rdma_rescan opens devices that appeared
 * since (a re-added link); returns how many.
 */
int kcoll_rdma_reap(void);
/* Whether dev is being removed (its uverbs node is gone). */
bool kcoll_rdma_dev_gone(int dev);
int kcoll_rdma_rescan(void);

/* ---- endpoints: RC QPs to one peer ------------------------------------ */

/* What one side tells the other to connect (sent as is: both sides are
 * the same build; the version field catches mismatches). */
struct kcoll_rdma_addr {
	uint32_t version;
	uint32_t nqp;
	union ibv_gid gid;
	uint32_t qpn[KCOLL_RDMA_MAX_QPS];
	uint32_t psn[KCOLL_RDMA_MAX_QPS];
	uint32_t mtu;			/* enum ibv_mtu */
	uint32_t reserved;
	union ibv_gid qgid[KCOLL_RDMA_MAX_QPS];	/* each QP's own GID (version 2) */
};
#define KCOLL_RDMA_ADDR_VERSION	2

/* Path control for one QP (the planner's knob): traffic class and the GRH
 * flow label; on RoCE v2 NICs that honor it the flow label picks the UDP
 * source port (docs/rdma.md). 0: the device's choice. */
struct kcoll_rdma_path {
	uint32_t flow_label;		/* 20 bits */
	uint8_t traffic_class;
	/* own_port: this QP leaves through port (its port number and GID; on
	 * the endpoint's device, which owns the CQ), not the endpoint's.
	 * Set it with kcoll_rdma_ep_set_path so that the peer learns the GID. */
	bool own_port;
	struct kcoll_rdma_port port;
};

/*
 * The RoCE v2 UDP source port a QP with this flow label uses on devices that
 * follow the kernel's convention (rdma_rxe since 5.x, most RoCE NICs): the
 * label's low 14 bits XOR its high 6, in the 0xC000 range. Label 0: the
 * device derives one from the two QP numbers (lqpn, rqpn), symmetrically.
 */
uint16_t kcoll_rdma_udp_sport(uint32_t flow_label, uint32_t lqpn, uint32_t rqpn);
/* A flow label that gives UDP source port sport (0xC000..0xFFFF) under that
 * convention: how a planner pins a QP to a port it picked. */
uint32_t kcoll_rdma_flow_label_for_sport(uint16_t sport);

struct kcoll_rdma_ep {
	struct kcoll_rdma_port port;
	struct ibv_cq *cq;
	struct ibv_comp_channel *ch;	/* NULL when the CQ is shared */
	bool own_cq;
	uint32_t nqp;
	struct ibv_qp *qp[KCOLL_RDMA_MAX_QPS];
	struct kcoll_rdma_path path[KCOLL_RDMA_MAX_QPS];
	struct kcoll_rdma_addr local, remote;
	uint32_t send_depth, recv_depth;
};

/*
 * Create nqp RC QPs on port. cq: a CQ to share (its channel is the caller's),
 * or NULL to create one with its own completion channel. The QPs are in INIT;
 * post receives, exchange ep->local, then kcoll_rdma_ep_connect.
 */
int kcoll_rdma_ep_create(const struct kcoll_rdma_port *port, uint32_t nqp, struct ibv_cq *cq,
			 uint32_t send_depth, uint32_t recv_depth, struct kcoll_rdma_ep **out);
/* INIT -> RTR -> RTS against the peer's address. */
int kcoll_rdma_ep_connect(struct kcoll_rdma_ep *ep, const struct kcoll_rdma_addr *remote, char *why,
			  size_t whylen);
/*
 * Give QP i its path before kcoll_rdma_ep_connect (and before ep->local is
 * sent): flow label, traffic class and, with own_port, its own local port
 * and GID (moved there with INIT -> INIT; ep->local.qgid[i] names the GID to
 * the peer). -EINVAL with why when the port is on another device.
 * (Assigning ep->path[i] directly still works for the flow label and
 * traffic class alone.)
 */
int kcoll_rdma_ep_set_path(struct kcoll_rdma_ep *ep, uint32_t i, const struct kcoll_rdma_path *path, char *why,
			   size_t whylen);
/* The local port QP i uses: its own (set_path) or the endpoint's. */
const struct kcoll_rdma_port *kcoll_rdma_ep_qp_port(const struct kcoll_rdma_ep *ep, uint32_t i);
void kcoll_rdma_ep_destroy(struct kcoll_rdma_ep *ep);
/*
 * Move every QP of ep to the error state: the NIC stops retrying what
 * waits for an acknowledgement and flushes the rest as error completions;
 * nothing arrives any more. For an endpoint whose destruction is put off.
 */
void kcoll_rdma_ep_quiesce(struct kcoll_rdma_ep *ep);
/* The state of QP i (IBV_QPS_*), or a negative errno. */
int kcoll_rdma_ep_qp_state(struct kcoll_rdma_ep *ep, uint32_t i);
const char *kcoll_rdma_qp_state_name(int state);

/* ---- registration cache ----------------------------------------------- */

/*
 * A memory region covering [addr, addr + len) on device dev, with local and
 * remote write/read access: reused when a cached region covers the range,
 * registered otherwise. The cache holds the registration until
 * kcoll_rdma_mr_invalidate covers it (call it before unmapping or freeing
 * registered memory: a registration pins the old pages).
 */
int kcoll_rdma_mr_get(int dev, void *addr, size_t len, struct ibv_mr **mr);
/*
 * The same for memory another driver exports as a dma-buf (GPU memory):
 * ibv_reg_dmabuf_mr of dmabuf_fd (offset 0) at iova addr; dmabuf_fd < 0 is
 * kcoll_rdma_mr_get. The caller may close the fd afterwards.
 */
int kcoll_rdma_mr_get_fd(int dev, void *addr, size_t len, int dmabuf_fd, struct ibv_mr **mr);
/*
 * The same for memory the NIC only reads locally (the source of sends): no
 * remote access at all, so no rkey of it lets a peer reach the buffer
 * (kcolld's zero-copy sends from application memory use this).
 */
int kcoll_rdma_mr_get_local(int dev, void *addr, size_t len, struct ibv_mr **mr);
/*
 * Both: local access only, through a dma-buf (kcoll.ko's export of a
 * registration). A device that refuses dma-buf registrations (no
 * reg_user_mr_dmabuf, e.g. rdma_rxe in Linux 6.1) is logged once and not
 * asked again: -EOPNOTSUPP from then on.
 */
int kcoll_rdma_mr_get_local_fd(int dev, void *addr, size_t len, int dmabuf_fd, struct ibv_mr **mr);
/* The device already refused a dma-buf registration: no use exporting one for it. */
bool kcoll_rdma_dmabuf_refused(int dev);
void kcoll_rdma_mr_invalidate(void *addr, size_t len);
/* How many registrations the cache holds (status, tests). */
size_t kcoll_rdma_mr_count(void);

/* ---- one-sided operations (the KV engine's entry points) -------------- */

/*
 * Post an RDMA WRITE (imm == NULL) or WRITE_WITH_IMM of len bytes at laddr
 * (inside mr) to raddr/rkey on QP qpi, signaled with wr_id. The peer learns
 * of a WRITE_WITH_IMM through a receive completion carrying *imm (it must
 * have a receive posted); a plain write is silent there.
 */
int kcoll_rdma_write(struct kcoll_rdma_ep *ep, uint32_t qpi, struct ibv_mr *mr, const void *laddr,
		     size_t len, uint64_t raddr, uint32_t rkey, const uint32_t *imm, uint64_t wr_id);
/*
 * The same with a gather list: nsge (1..2, the QPs' max_send_sge) pieces of
 * local memory, each inside the registration its lkey names, written back to
 * back at raddr. The daemon sends a slot header and application memory in
 * one WRITE_WITH_IMM this way (zero-copy).
 */
int kcoll_rdma_write_sg(struct kcoll_rdma_ep *ep, uint32_t qpi, const struct ibv_sge *sge, int nsge,
			uint64_t raddr, uint32_t rkey, const uint32_t *imm, uint64_t wr_id);
/* Post an RDMA READ of len bytes from raddr/rkey into laddr (inside mr). */
int kcoll_rdma_read(struct kcoll_rdma_ep *ep, uint32_t qpi, struct ibv_mr *mr, void *laddr, size_t len,
		    uint64_t raddr, uint32_t rkey, uint64_t wr_id);
/* Post a receive (for WRITE_WITH_IMM: no buffer needed) on QP qpi. */
int kcoll_rdma_post_recv(struct kcoll_rdma_ep *ep, uint32_t qpi, uint64_t wr_id);
/*
 * Up to n completions of an endpoint with its own CQ, sleeping on the
 * completion channel up to timeout_ms (-1: no limit, 0: do not sleep).
 * Returns how many (0 on timeout) or a negative errno.
 */
int kcoll_rdma_poll(struct kcoll_rdma_ep *ep, struct ibv_wc *wc, int n, int timeout_ms);

#endif /* KCOLL_RDMA_H */
