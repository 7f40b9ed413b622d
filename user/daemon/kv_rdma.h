/* SPDX-License-Identifier: MIT */
/*
 * The KV engine's RDMA connection (docs/kv.md "Across hosts over RDMA"):
 * one RC QP, its CQ and completion channel, and one memory region, all in a
 * protection domain of their own. A QP can only reach regions of its own PD,
 * so a peer that connected to one segment (after the owner checked its
 * token) can address that segment and nothing else of this kcolld, whatever
 * rkey it tries.
 */
#ifndef KCOLL_KV_RDMA_H
#define KCOLL_KV_RDMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdma.h"

struct kv_rdma;

/* What the two kcollds swap over the segment's first TCP stream. */
struct kv_rdma_hello {
	struct kcoll_rdma_addr addr;
	uint64_t base;			/* owner: the region's address for RDMA */
	uint32_t rkey;			/* owner: the region's rkey (this connection's PD only) */
	uint32_t reserved;
	char why[192];			/* owner: why not, when it refuses */
};

/*
 * May the KV engine use RDMA (KCOLL_NET_XPORT auto or rdma, a device)? false
 * with the reason in why; *loud is set when the user asked for rdma (the
 * reason is an error, not information).
 */
bool kv_rdma_wanted(char *why, size_t whylen, bool *loud);

/*
 * A PD, QP (INIT) and a region over [base, base + len) on the RoCE v2 GID of
 * the local address of TCP socket fd. remote: the region may be written and
 * read by the peer (the owner's side); else local access only.
 */
int kv_rdma_create(int fd, void *base, size_t len, bool remote, struct kv_rdma **out, char *why,
		   size_t whylen);
/* Replace the region (the initiator's local segment changed). */
int kv_rdma_set_mr(struct kv_rdma *k, void *base, size_t len);
void kv_rdma_hello_fill(struct kv_rdma *k, struct kv_rdma_hello *h);
/* INIT -> RTR -> RTS against the peer's hello; the owner posts receives. */
int kv_rdma_connect(struct kv_rdma *k, const struct kv_rdma_hello *peer, uint32_t nrecv, char *why,
		    size_t whylen);
/* QP to the error state: outstanding work flushes, nothing more lands. */
void kv_rdma_fail(struct kv_rdma *k);
/* kv_rdma_fail, then deregister the region: its rkey is dead on return. */
void kv_rdma_revoke(struct kv_rdma *k);
void kv_rdma_destroy(struct kv_rdma *k);

struct ibv_wc;
/* Post one WRITE (imm: WRITE_WITH_IMM) or READ; signaled, wr_id. */
int kv_rdma_post(struct kv_rdma *k, bool write, uint64_t loff, uint64_t len, uint64_t raddr,
		 uint32_t rkey, const uint32_t *imm, uint64_t wr_id);
int kv_rdma_post_recv(struct kv_rdma *k, uint64_t wr_id);
/* Completions, without sleeping (0: none). */
int kv_rdma_poll(struct kv_rdma *k, struct ibv_wc *wc, int n);
/* Arm the CQ: the channel fd turns readable on the next completion; then
 * poll once more (what came before arming) and sleep on kv_rdma_fd. */
int kv_rdma_arm(struct kv_rdma *k);
int kv_rdma_fd(struct kv_rdma *k);
/* Consume the channel's event (after kv_rdma_fd was readable). */
void kv_rdma_ack_event(struct kv_rdma *k);
const char *kv_rdma_dev(struct kv_rdma *k);
/* A failed completion as a negative errno. */
int kv_rdma_wc_err(const struct ibv_wc *wc);

#endif
