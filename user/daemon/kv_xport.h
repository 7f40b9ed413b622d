/* SPDX-License-Identifier: MIT */
/*
 * The one-sided interface of a KV session (docs/kv.md "Across hosts"): what
 * the batch logic of kv_send.c asks of a transport that moves an import's
 * bytes. Two implementations, picked when the session opens:
 *
 *   kv_xport_rdma  kv_rdma.c: WRITE / READ per piece and a WRITE_WITH_IMM
 *                  notify on one RC QP, set up over the import's stream 0
 *   kv_xport_tcp   kv_io.c: KV_REQ / KV_RESP frames (kv_wire.h) on the
 *                  import's KCOLL_KV_STREAMS streams
 *
 * The batch logic (kv_send.c) owns everything above the bytes: validating
 * and cutting a batch into posts (at most max_pieces pieces, frame_min ..
 * frame_max bytes), ordering, the per-import queue and its threads, the
 * notify once every post completed, errors and completions to the client.
 * A transport knows nothing of batches, clients or counters.
 *
 * Contract, for every op (all return 0 or a negative errno):
 * - A session is struct kv_remote (an import); a channel ch is one of its
 *   0 .. nchan(rm) - 1, used by one thread at a time. The caller holds
 *   rm->lock around open/close and around batches on the ring thread.
 * - open makes the session ready for a batch from local (held, its
 *   mapping resolved): 0 ready, 1 this transport cannot carry it (the next
 *   one is asked; nothing is left half set up), < 0 the session broke.
 *   close drops the session's connections (mid-exchange state unknown);
 *   the next open starts afresh.
 * - write / read start moving x (local offsets are x->p's src for a write,
 *   dst for a read; remote the other); write_notify starts the batch's
 *   final step: bump notify_id on the owner's side, or deliver m (which
 *   bumps it too unless KCOLL_NOTIFY_NONE). At most depth posts unanswered
 *   per channel. cookie comes back in the post's event.
 * - poll returns up to n events (0 is allowed after a short sleep: the
 *   caller checks its deadline, the local segment and the client), or the
 *   channel's error: the channel is then broken and the session must be
 *   closed before reuse. An event's status is the post's own outcome (a
 *   failed WRITE, the owner's verdict on a notification); data posts that
 *   fail break the channel too.
 * - begin / end bracket a batch run on the ring thread (batches on the
 *   queue threads have none): end gets the batch's error and bytes moved,
 *   stops what is still posted and returns the error to report.
 * - why translates a broken channel's error into the reason the client
 *   sees (the local segment unregistered: -EIDRM; the owner's last word).
 *
 * The owner's side has no such interface, on purpose (looked at for issue
 * 22): what would sit behind it is already transport-neutral or is not
 * one job done two ways.
 * - Every session starts on a TCP stream, whatever moves its bytes later:
 *   accepting a peer (kd_kv_accept: token check, KV_ACK, serving thread)
 *   and tearing down (kv_serve's unlink, close, put) are the same code for
 *   both transports already.
 * - The two owner sides do different work. TCP's serves frames: the owner
 *   moves every byte (range checks, receive in place, copies, read
 *   answers). RDMA's moves none: it registers the segment, holds its lock
 *   for the session, counts WRITE_WITH_IMM notifies, revokes the rkey on
 *   seg_kill. A shared "serve" op would have one thing in common, its
 *   signature; all it would replace is kv_serve's one KV_OP_RDMA branch.
 * - The RDMA session is asked for in-band on a stream kv_serve serves, and
 *   nests in it: refused, the same stream goes on with frames; during it,
 *   MSG frames still come on the stream. Peers behind a table would need
 *   their own handshake, a protocol change for nothing kcolld needs.
 * A new transport adds its kv_xport_ops, one KV_OP_* case in kv_serve and
 * its owner session, as RDMA did. Worth revisiting when an owner side has
 * to accept peers without a TCP stream (say RDMA CM).
 */
#ifndef KCOLLD_KV_XPORT_H
#define KCOLLD_KV_XPORT_H

#include <stdbool.h>
#include <stdint.h>

struct kv_msgout;
struct kv_piece;
struct kv_remote;
struct kv_side;

/* One post: n pieces of a batch, src/dst in the batch's direction. */
struct kv_xfer {
	struct kv_side *local;		/* held by the batch */
	const struct kv_piece *p;
	uint32_t n;
	uint64_t bytes;
	bool write;
};

struct kv_xev {
	uint64_t cookie;
	int status;
};

struct kv_xport_ops {
	const char *name;
	uint32_t depth;			/* posts unanswered per channel */
	uint32_t max_pieces;		/* per post */
	uint64_t frame_min, frame_max;	/* a post's bytes: a batch's share, clamped */
	bool queued;			/* batches may run on per-channel threads, several in flight */
	int (*nchan)(const struct kv_remote *rm);
	int (*open)(struct kv_remote *rm, struct kv_side *local);
	void (*close)(struct kv_remote *rm);
	int (*begin)(struct kv_remote *rm, struct kv_side *local);
	int (*end)(struct kv_remote *rm, struct kv_side *local, int err, uint64_t moved);
	int (*write)(struct kv_remote *rm, int ch, const struct kv_xfer *x, uint64_t cookie);
	int (*read)(struct kv_remote *rm, int ch, const struct kv_xfer *x, uint64_t cookie);
	int (*write_notify)(struct kv_remote *rm, int ch, uint32_t notify_id,
			    const struct kv_msgout *m, uint64_t cookie);
	int (*poll)(struct kv_remote *rm, int ch, struct kv_xev *ev, int n);
	int (*why)(struct kv_remote *rm, int ch, struct kv_side *local, int err);
};

extern const struct kv_xport_ops kv_xport_tcp;	/* kv_io.c */
extern const struct kv_xport_ops kv_xport_rdma;	/* kv_rdma.c */

#endif
