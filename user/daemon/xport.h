/* SPDX-License-Identifier: MIT */
/*
 * The transport interface: how pieces move between daemons. A transport is
 * a byte mover in the spirit of NCCL's ncclNet_t: it knows hosts, streams
 * and pieces (a struct kd_p_data header plus payload), nothing of ops,
 * communicators, steps, reductions or C4. The one step engine (step.c) runs
 * an inter-host algorithm's steps over it: cursors, chaining, receive-side
 * reduction, cancellation, the watchdog's fields and the C4 observation.
 *
 * Transports: TCP (xport_tcp.c), RDMA (xport_rdma.c: its receive slots
 * are the rx pieces release() returns) and the in-process loopback
 * (xport_loop.c, for tests). xport.c picks one for new communicators;
 * net.c gives it to each as mh->xport.
 *
 * The contract of the narrow interface:
 *   - open() gets what the transport needs (struct kd_xport_env) and returns
 *     its context; every other call gets that context. One thread (the
 *     comm's net thread) calls send, recv, poll, release and wait_fds;
 *     close() comes after that thread stopped.
 *   - Streams are ordered: pieces sent on (host, stream) arrive in that
 *     order on the peer's (self, stream). Different streams are independent.
 *   - open() may lower *piece (the engine sets it to env->piece): the
 *     engine then cuts pieces at most that large. Both ends of a pair must
 *     come to the same size (the same knobs), or their pieces differ.
 *     close() ends the context (the engine closes it after a failed op,
 *     pieces of which may still be in flight); a new open() on the same
 *     streams must work.
 *   - send() queues one piece: the header is copied, the payload (len bytes
 *     at buf) must stay untouched until the piece's KD_XEV_TX event. A
 *     stream holds up to send_depth sends in flight (0 counts as 1): -EBUSY
 *     beyond. The TX events of one stream come in the order of the sends;
 *     a TX event's t0 is when its send was posted (or its first byte
 *     moved), and the engine counts the union of a stream's busy intervals
 *     for C4, so overlapping sends count their shared time once. With
 *     KD_XPORT_F_MEM, mem (NULL: none known) names the buffer buf lies in,
 *     for a zero-copy send; a transport may always copy instead.
 *   - recv() posts the receive of the next piece on (host, stream), of len
 *     bytes payload; one at a time per stream (-EBUSY). A streamed transport
 *     (TCP) receives straight into buf; one with buffers of its own
 *     (loopback, RDMA slots) may hand over its own instead: the KD_XEV_RX
 *     event's data says where the payload is, and when that is not buf the
 *     engine calls release(ev->rx) once it has used it.
 *   - poll() never blocks: it moves what can move and returns how many
 *     events it wrote (at most max) or -errno for the whole transport; it
 *     sets *moved when any byte moved (progress for the watchdog). Per piece
 *     failures are events with err set: -ECONNRESET (the stream broke) or
 *     -EPROTO (what arrived is not the piece posted: ev->hdr is the header
 *     that came, for the engine to say why).
 *   - wait_fds() lists the descriptors to sleep on in poll(2) until poll()
 *     can make progress again; the engine adds its own (the abort eventfd).
 *   - Errors are negative errnos.
 */
#ifndef KCOLLD_XPORT_H
#define KCOLLD_XPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"	/* struct kd_p_data: the piece header */

struct pollfd;

/* 1: run_steps only (the whole mh); 2: no kd_xmem; 3: one send in flight per
 * stream, the legacy run_steps beside; 4: send_depth, open() caps the piece,
 * no legacy entry */
#define KD_XPORT_VERSION	4

/* What open() gets: nothing of the communicator beyond hosts and streams. */
struct kd_xport_env {
	uint32_t nhosts, self, nstreams;
	size_t piece;		/* the largest payload of one piece */
	const int *fds;		/* [host * KD_MAX_STREAMS + stream]: connected byte
				 * streams (-1: none), owned by the caller */
	void *fabric;		/* in-process transports: what the hosts share */
	const char *name;	/* the communicator's, for log lines */
	const char *const *host_names;	/* [nhosts], for log lines (open copies them) */
	int64_t timeout_ns;	/* a connection set up in open() or on first use
				 * gives up after this long */
};

/*
 * Where a send's payload lies, for a transport that sends from registered
 * memory (zero-copy, KD_XPORT_F_MEM): the whole buffer the piece is part of,
 * so that one registration serves all its pieces. Valid while the piece is
 * in flight; the engine's caller keeps the buffer (and the dma-buf) until
 * the op ends and invalidates registrations before it unmaps or reallocates
 * one (kcoll_rdma_mr_invalidate). The transport registers, never maps.
 */
struct kd_xmem {
	const uint8_t *lo;	/* the buffer: [lo, lo + len) holds the payload */
	size_t len;
	int dmabuf_fd;		/* >= 0: pages only this dma-buf reaches (a kcoll.ko
				 * region; its iova is lo), else -1 */
};

/* kd_xport_ops.flags */
#define KD_XPORT_F_MEM		1u	/* send() wants a kd_xmem where the engine has one */

enum kd_xev_kind { KD_XEV_TX = 1, KD_XEV_RX = 2 };

/* One completion from poll(). */
struct kd_xev {
	uint32_t kind;		/* enum kd_xev_kind */
	int err;		/* 0, or -errno: this piece failed */
	uint32_t host, stream;
	uint64_t cookie;	/* as given to send() / recv() */
	int64_t t0;		/* kd_now_ns() when the piece's first byte moved */
	const struct kd_p_data *hdr;	/* rx: the header that came (valid until
					 * the next poll() or release) */
	const uint8_t *data;	/* rx: the payload: recv()'s buf, or the transport's */
	void *rx;		/* rx: non-NULL: release() it when done with data */
};

struct kd_xport_ops {
	uint32_t size;		/* sizeof(struct kd_xport_ops) it was built with */
	uint32_t version;	/* KD_XPORT_VERSION */
	const char *name;
	/* Once, when xport.c considers it: 0 if usable (it logs what it runs
	 * on), else -errno with why filled in. NULL: always usable. */
	int (*init)(char *why, size_t cap);

	/* The narrow interface (see the contract above). */
	int (*open)(const struct kd_xport_env *env, void **ctx, size_t *piece);
	uint32_t flags;		/* KD_XPORT_F_* */
	uint32_t send_depth;	/* sends in flight per stream (0: 1) */
	int (*send)(void *ctx, uint32_t host, uint32_t stream, const struct kd_p_data *hdr,
		    const void *buf, size_t len, const struct kd_xmem *mem, uint64_t cookie);
	int (*recv)(void *ctx, uint32_t host, uint32_t stream, void *buf, size_t len, uint64_t cookie);
	int (*poll)(void *ctx, struct kd_xev *ev, uint32_t max, bool *moved);
	void (*release)(void *ctx, void *rx);	/* NULL: never hands over its own */
	uint32_t (*wait_fds)(void *ctx, struct pollfd *pfd, uint32_t cap);
	/* kcollctl status: the transport's own state (json: one "key":value
	 * member); NULL: nothing to show. Returns bytes written. */
	size_t (*render)(void *ctx, char *buf, size_t cap, int json);
	void (*close)(void *ctx);

};

extern const struct kd_xport_ops kd_xport_tcp;	/* xport_tcp.c */
extern const struct kd_xport_ops kd_xport_rdma;	/* xport_rdma.c */
extern const struct kd_xport_ops kd_xport_loop;	/* xport_loop.c (tests): send_depth 1 */
extern const struct kd_xport_ops kd_xport_loop_deep;	/* ... send_depth KD_LOOP_DEPTH */

/* xport_loop.c: the hosts of one in-process "network" (env->fabric of
 * kd_xport_loop). NULL when out of memory. */
struct kd_loop_fabric;
struct kd_loop_fabric *kd_loop_fabric_new(uint32_t nhosts, uint32_t nstreams);
void kd_loop_fabric_free(struct kd_loop_fabric *f);
/* Pieces sent and not yet received, over all queues. */
uint32_t kd_loop_fabric_pending(struct kd_loop_fabric *f);
/* Tests: corrupt the n-th piece sent from now on (counting from 1) once:
 * payload: flip a byte of it; else bump its header's step. */
void kd_loop_fabric_corrupt(struct kd_loop_fabric *f, uint32_t nth, bool payload);
/* Tests: once, a transport bug the engine must catch: report the TX events
 * of a stream's first two sends in flight swapped, or one TX event twice. */
enum kd_loop_fault { KD_LOOP_TX_SWAP = 1, KD_LOOP_TX_DUP = 2 };
void kd_loop_fabric_fault(struct kd_loop_fabric *f, enum kd_loop_fault fault);
#define KD_LOOP_DEPTH	4

/* xport.c: the transport new communicators use (KCOLL_NET_XPORT; auto: the
 * best whose init succeeds, RDMA before TCP, logging why once). */
const struct kd_xport_ops *kd_xport_default(void);
/* xport.c: that choice and why, as logged ("tcp (rdma not used: ...)");
 * "" before kd_xport_default() first ran. For kcollctl status. */
const char *kd_xport_choice(void);

#endif /* KCOLLD_XPORT_H */
