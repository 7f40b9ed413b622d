/* SPDX-License-Identifier: MIT */
/*
 * What the KV engine's files share (docs/kv.md), private to them:
 *
 *   kv_seg.c    the segment registry, descriptors, imports, the segment
 *               requests of the control socket, a segment's lock, memory
 *               and status
 *   kv_local.c  one batch off the ring: validation, same-host copy rounds
 *   kv_send.c   a batch to another kcolld: cutting it into posts, the
 *               import's queue and its threads, the notify; the bytes go
 *               through the session's transport (kv_xport.h)
 *   kv_serve.c  the owner's side of a peer kcolld's connection
 *   kv_rdma.c   RDMA: the verbs connection, the initiator's transport
 *               (kv_xport_rdma), the owner's session
 *   kv_io.c     the session's wire: streams, the final exchange, and the
 *               initiator's TCP transport (kv_xport_tcp)
 *   kv_notif.c  notification queues
 *
 * The entry points for the rest of kcolld (kd_kv_*) are in kcolld.h and
 * net.h.
 */
#ifndef KCOLLD_KV_INT_H
#define KCOLLD_KV_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "kcolld.h"
#include "kv_notif.h"
#include "kv_rdma.h"
#include "kv_xport.h"

#define KV_ROUND_BYTES		(1u << 20)
#define KV_ROUND_IOVS		512
#define KV_MAX_IMPORTS		1024	/* per client */
#define KV_FRAME_BYTES		(4u << 20)	/* the largest frame an owner takes */
#define KV_FRAME_ENTRIES	4096
#define KV_MAX_STREAMS		8

struct kd_seg {
	uint32_t id;
	uint8_t token[KCOLL_SEG_TOKEN_BYTES];
	struct kd_client *owner;	/* valid while !dead (its close unregisters first) */
	pid_t pid;
	uid_t uid;
	bool granted;
	uid_t grant_uid;
	uint64_t addr, size;
	bool dev;			/* GPU memory: reached through a device region */
	uint32_t nr_notify;
	uint32_t *counters;		/* shared with the owner; then the notif word */
	size_t counters_len;
	struct kv_notifq notifs;	/* ours: messages for the owner (kv_notif.h) */
	pthread_rwlock_t lock;		/* readers: a copy round; writer: unregister */
	atomic_bool dead;
	atomic_int refs;
	struct kv_remote *rm;		/* imported from another kcolld (NULL: ours) */
	void (*rm_free)(struct kv_remote *rm);	/* its teardown (kv_send.c's), at the last put */
	pthread_mutex_t conns_lock;
	struct kv_conn *conns;		/* peers' connections serving this segment */
	struct kd_seg *next;
};

/* A peer kcolld's connection to one of our segments (served by kv_serve). */
struct kv_conn {
	int fd;
	int how;		/* what seg_kill shuts down: SHUT_RD (serving), SHUT_RDWR (sending) */
	struct kd_seg *seg;	/* held by the serving thread; the batch holds it for streams */
	struct kv_conn *next;	/* seg->conns */
};

/* One block of a batch: source and destination offsets in their segments. */
struct kv_piece {
	uint64_t src, dst, len;
};

/* One post of a batch (kv_send.c): n sub-pieces from the first, bytes in all. */
struct kv_frame {
	uint32_t first, n;
	uint64_t bytes;
};

struct kv_side {
	struct kd_seg *seg;
	struct kd_buf buf;	/* whole segment: direct when mapped */
};

struct kv_batch;
struct kv_remote;
struct kv_req;

struct kv_worker {
	struct kv_remote *rm;
	int idx;
};

/* kv_xport_tcp's state of one stream (kv_io.c): the post unanswered and
 * its buffers, kept with the import. */
struct kv_chan {
	struct kv_xfer x;		/* a data post's (final == 0) */
	uint64_t cookie;
	int final;			/* 0 data, 1 NOTIFY, 2 MSG unanswered */
	struct kv_fent *fe;		/* KV_FRAME_ENTRIES: a frame's entries */
	struct iovec *iov;		/* KV_FRAME_ENTRIES + 2: a frame sent from the mapping */
	uint8_t *buf;			/* KV_FRAME_BYTES: frames of unmapped memory */
};

/* An import of another kcolld's segment: a session of the transport xo
 * (kv_xport.h), its TCP streams and their threads (kv_send.c), its RDMA
 * connection (kv_rdma.c). */
struct kv_remote {
	struct kcoll_seg_wire w;
	pthread_mutex_t lock;		/* submitters: set-up, RDMA and the queue's tail */
	int nstreams;
	int fd[KV_MAX_STREAMS];
	const struct kv_xport_ops *xo;	/* the open session's transport (NULL: none yet) */
	/* Batches over TCP, one thread per stream (started by the first batch
	 * that needs them, kept until the import goes). A submitter appends
	 * its batch to the queue and returns; each stream thread takes the
	 * oldest frame no stream took yet whenever its last one was answered
	 * (stream_worker). */
	pthread_mutex_t wlock;
	pthread_cond_t go;		/* a frame to take, or quit */
	pthread_cond_t space;		/* a batch left the queue */
	struct kv_batch *q_head, *q_tail;
	uint32_t nq;
	uint64_t seq;			/* tags' high half: the batch's number */
	int broken;			/* a stream failed: take no frame; reopen once drained */
	pthread_t tid[KV_MAX_STREAMS];
	struct kv_worker wk[KV_MAX_STREAMS];
	bool started[KV_MAX_STREAMS], quit;
	struct kv_chan ch[KV_MAX_STREAMS];	/* kv_xport_tcp's, kept with the import */
	/* RDMA (kv_rdma.h): set up over fd[0] on the first batch whose local
	 * segment is mapped; fd[0] then carries only notify answers.
	 * kv_xport_rdma's state. */
	struct kv_rdma *rd;
	bool rd_off;			/* refused for this import (logged once) */
	uint32_t rd_seg;		/* the local segment the region covers */
	struct kd_buf rd_buf;		/* its mapping, held while registered */
	struct kv_rdma_hello peer;
	uint32_t features;		/* the owner's KV_ACK_F_*, from stream 0's ACK */
};

struct kd_kv_client {
	struct kd_seg *imports[KV_MAX_IMPORTS];	/* index = handle - 1, held */
	uint64_t sender[KV_MAX_IMPORTS];	/* names the import to its owner's notifs */
};

/* The registry and the counters of status (kv_reg.c). */
struct kv_state {
	pthread_mutex_t lock;
	struct kd_seg *segs;
	uint32_t nsegs;
	uint32_t next_id;
	atomic_ulong xfers_ok, xfers_failed, bytes;
	atomic_ulong rdma_bytes, rdma_sessions;	/* initiator: bytes; owner: sessions */
	atomic_uint next_sender;
	atomic_ulong notifs;			/* notifications queued for our owners */
};

extern struct kv_state kv_state;

/* kv_reg.c: the registry's core, below every other KV file */
void kv_seg_put(struct kd_seg *s);
/* A live segment by id, referenced. */
struct kd_seg *kv_seg_find(uint32_t id);
/* kv_seg.c's seg_kill shuts cn down while it is in s's conns. */
void kv_conn_link(struct kd_seg *s, struct kv_conn *cn);
void kv_conn_unlink(struct kd_seg *s, struct kv_conn *cn);
int kv_token_eq(const uint8_t *a, const uint8_t *b);
int kv_notif_deliver(struct kd_seg *s, uint64_t sender, uint32_t notify_id, const uint8_t *data,
		     uint32_t len);
int kv_lock_sides(struct kv_side *a, struct kv_side *b);
void kv_unlock_sides(struct kv_side *a, struct kv_side *b);
int kv_side_resolve(struct kv_side *s);
/* s's memory for the caller to release: mapped (direct), a device region
 * (dptr), or neither (its owner's pid). */
void kv_seg_buf(struct kd_seg *s, struct kd_buf *b);
/* A process_vm_* call's result: 0, or why it moved less than want. */
int kv_vm_err(ssize_t got, size_t want);
/*
 * Move total bytes between kcolld's memory (liov) and the segment's at the
 * owner's addresses riov, to_seg: liov -> riov. Host memory goes through
 * process_vm_readv/writev; a device segment (s->buf resolved by kv_seg_buf)
 * through the GPU's copies, staged in pinned slabs (mem.c).
 */
int kv_side_vm(const struct kv_side *s, const struct iovec *liov, unsigned long nl,
	       const struct iovec *riov, unsigned long nr, size_t total, bool to_seg);

/* kv_io.c: the session's wire, both ends, for the TCP and RDMA paths (and
 * kv_xport_tcp) */
int kv_io_full(int fd, void *buf, size_t n, bool out);
int kv_io_iovs(int fd, struct iovec *iov, size_t n, bool out);
void kv_sock_timeouts(int fd, int64_t ns);
void kv_remote_close_streams(struct kv_remote *rm);
/* A stream broke: the owner may have said why first (-EIDRM, tag ~0). */
int kv_last_word(int fd, int err);
/* A batch's final frame (NOTIFY, or MSG with a notification) and its answer. */
int kv_final_xchg(int fd, uint32_t id, const struct kv_msgout *m, uint64_t tag, int *ans);
/* The owner's side of a MSG frame whose header rq was read. */
int kv_serve_msg(struct kv_conn *cn, const struct kv_req *rq, bool locked);
/* Open the streams that are not open; the owner's verdict on the token. */
int kv_remote_connect(struct kv_remote *rm);

/* kv_send.c */
int kv_remote_import(const struct kcoll_seg_wire *w, struct kd_seg **out);
void kv_remote_free(struct kv_remote *rm);
/* Cut p[0..n) into sub-pieces (*psp) and posts of xo's size over nchan
 * channels (*pfr, *pnfr); both arrays malloc'ed, freed by the caller.
 * Extern for tests/test_kv_batch.c. */
int kv_batch_cut(const struct kv_xport_ops *xo, int nchan, const struct kv_piece *p, uint32_t n,
		 struct kv_piece **psp, struct kv_frame **pfr, uint32_t *pnfr);
int kv_run_remote(struct kd_client *c, uint64_t user_data, const struct kv_piece *p, uint32_t n,
		  bool write, struct kv_side *local, struct kd_seg *rs, uint32_t notify_id,
		  const struct kv_msgout *msg, int64_t t0, uint64_t *moved);

/* kv_rdma.c (the initiator's side is kv_xport_rdma) */
/* The owner's side of an RDMA session on cn: 0 refused, 1 over. */
int kv_serve_rdma(struct kv_conn *cn, const struct kv_rdma_hello *peer, uint64_t tag);

#endif
