/* SPDX-License-Identifier: MIT */
/*
 * What the RDMA transport's two files share: xport_rdma.c (the interface:
 * sends, receives, completions, poll) and xport_rdma_conn.c (a pair's
 * connection: endpoint, slots, the setup exchange, teardown).
 */
#ifndef KCOLLD_XPORT_RDMA_INT_H
#define KCOLLD_XPORT_RDMA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdma.h"
#include "wire.h"

#define NSLOT		8		/* slots per stream and direction: sends in flight */
#define IMM_CREDIT	0x80000000u
#define HDR_BYTES	64u		/* slot header + piece header, keeps payloads aligned */
#define SETUP_MAGIC	0x6b637264u	/* "kcrd" */
#define SLOT_MAGIC	0x6b637370u
#define FLUSH_NS	2000000000LL	/* close waits this long for credits to go out */
#define GRAVE_NS	10000000000LL	/* peers not closed clean are destroyed this much later */
#define PORT_CHECK_NS	20000000LL	/* an idle poll looks at the ports this often */

enum { WR_RECV = 1, WR_DATA = 2, WR_CREDIT = 3 };
#define WRID(kind, stream, slot)	((uint64_t)(kind) | ((uint64_t)(stream) << 8) | ((uint64_t)(slot) << 16))
#define IMM(stream, slot)		(((uint32_t)(stream) << 8) | (slot))

/* At the start of every slot; the piece header (struct kd_p_data) follows. */
struct slot_hdr {
	uint32_t magic;
	uint32_t seq;			/* the piece's number on its stream */
};

struct setup_msg {
	uint32_t magic;
	int32_t ok;			/* 1, or 0 and why says why not */
	struct kcoll_rdma_addr addr;
	uint64_t slots;			/* address of the receive slots */
	uint32_t rkey;
	uint32_t slot_bytes;
	uint32_t nstreams;
	uint32_t reserved;
	char why[KCOLL_RDMA_WHY];
};

/* A send, from send() until its TX event. */
struct rtx {
	uint64_t cookie;
	int64_t t0;
	struct kd_p_data hdr;
	const uint8_t *buf;
	size_t len;
	struct ibv_mr *zmr;		/* zero-copy from this registration, else NULL */
	int slot;			/* -1: waits for a credit */
	bool done;			/* its write completed */
};

/* What release() gets: a slot of a stream. */
struct rxh {
	uint32_t host, stream, slot;
};

/* One stream to a peer. */
struct rstream {
	uint32_t sfree;			/* remote slots we hold a credit for */
	struct rtx tx[NSLOT];		/* sends, oldest first (ring) */
	uint32_t txh, txn, txposted;	/* head, count, how many of them are posted */
	uint32_t tx_seq, rx_seq;	/* the next piece's number out, in */
	uint32_t arrived;		/* slots holding a piece not handed over */
	uint32_t held;			/* slots handed over, not released */
	bool rx_on;			/* a receive is posted */
	uint64_t rx_cookie;
	size_t rx_len;
	int64_t rx_t0;
	struct rxh h[NSLOT];
};

enum { P_IDLE, P_SETUP, P_READY, P_UP };

struct rpeer {
	int state;			/* P_*, or < 0: failed with this error */
	char name[48];			/* the host's, for log lines */
	int fd;				/* the pair's first TCP data stream */
	struct kcoll_rdma_ep *ep;
	uint8_t *rbuf, *sbuf;		/* [stream][NSLOT] slots each */
	struct ibv_mr *rmr, *smr;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t rr;			/* next QP, round robin */
	struct setup_msg out, in;	/* the exchange */
	size_t out_done, in_done;
	uint8_t ready_out, ready_in;	/* the closing byte, sent / received */
	int64_t deadline;		/* the exchange gives up then */
	bool armed;			/* its CQ was armed: events to take */
	uint32_t sq_out;		/* writes posted, not completed (all kinds) */
	uint64_t pieces_out, pieces_in, pieces_zc;
	bool eof;			/* its TCP stream closed: it left or died */
	struct rstream *st;		/* [nstreams] */
};

struct rctx {
	const char *name;
	uint32_t nhosts, self, nstreams, nqp;
	size_t piece, slot_bytes, zc_min;
	int64_t timeout_ns;
	int64_t port_checked;
	int kick;			/* eventfd: completions were taken in wait_fds */
	struct ibv_wc backlog[64];	/* ... these, for the next poll() */
	uint32_t backlog_host[64];	/* ... of these peers */
	uint32_t nbacklog;
	struct rpeer *peer;		/* [nhosts] */
};

static inline uint8_t *slot_at(const struct rctx *x, uint8_t *base, uint32_t s, uint32_t k)
{
	return base + ((size_t)s * NSLOT + k) * x->slot_bytes;
}

/* xport_rdma_conn.c */
/* First use of peer h: start the exchange. */
void kd_rdma_peer_start(struct rctx *x, uint32_t h);
/* Advance the exchange with peer h; true when something moved. */
bool kd_rdma_peer_setup(struct rctx *x, uint32_t h);
/* Peer h is lost (err): log why once; its pieces fail in poll(). */
void kd_rdma_peer_fail(struct rctx *x, uint32_t h, int err, const char *why);
/* Its endpoint, slots and registrations. */
void kd_rdma_peer_free(struct rpeer *p);

#endif /* KCOLLD_XPORT_RDMA_INT_H */
