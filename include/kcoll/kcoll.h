/* SPDX-License-Identifier: MIT */
/*
 * libkcoll: hand collective operations to the local kcolld.
 *
 * Conventions (the whole API keeps them):
 *  - every function that can fail returns 0 or a negative errno; results come
 *    back through out-parameters (never a pointer-or-NULL return);
 *  - kcoll_strerror() turns any such value into a sentence;
 *  - a struct kcoll handle (one connection, one ring) may be used by several
 *    threads: submission and completion are serialized inside.
 *
 * Minimal use:
 *
 *	struct kcoll *k;  struct kcoll_comm *c;  struct kcoll_req *r;
 *	kcoll_connect(NULL, &k);
 *	if (rank == 0) kcoll_get_unique_id(k, &id);   // then share id with the other ranks
 *	kcoll_comm_init_rank(k, &id, nranks, rank, &c);
 *	kcoll_allreduce(c, send, recv, count, KCOLL_F32, KCOLL_SUM, &r);
 *	kcoll_wait(r, -1);
 */
#ifndef KCOLL_KCOLL_H
#define KCOLL_KCOLL_H

#include <stddef.h>
#include <stdint.h>

#include <linux/kcoll.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KCOLL_DEFAULT_SOCKET	"/run/kcoll/kcolld.sock"
#define KCOLL_UNIQUE_ID_BYTES	128

struct kcoll;
struct kcoll_comm;
struct kcoll_req;

/* Opaque, copyable bytes that name one communicator; share them out of band. */
typedef struct {
	uint8_t bytes[KCOLL_UNIQUE_ID_BYTES];
} kcoll_unique_id_t;

struct kcoll_connect_opts {
	uint32_t size;		/* sizeof(struct kcoll_connect_opts) */
	uint32_t flags;		/* none defined: must be 0 */
	const char *socket_path;/* NULL: $KCOLL_SOCKET, else KCOLL_DEFAULT_SOCKET */
	uint32_t sq_entries;	/* 0: default (256); rounded up to a power of two */
	uint32_t reserved;
};

/* Connect to kcolld and map a private ring. opts may be NULL. */
int kcoll_connect(const struct kcoll_connect_opts *opts, struct kcoll **out);
/* Fail any request still pending, drop the ring and the connection. */
void kcoll_disconnect(struct kcoll *k);

/* Version of this libkcoll ("1.0.0") and the ring ABI it speaks. */
const char *kcoll_version(void);

/* A fresh id for a new communicator (random token; carries this host). */
int kcoll_get_unique_id(struct kcoll *k, kcoll_unique_id_t *id);

/* Join communicator id as rank 'rank' of 'nranks'; blocks until every rank
 * has joined or timeout ($KCOLL_TIMEOUT_MS, default 30000) expires. */
int kcoll_comm_init_rank(struct kcoll *k, const kcoll_unique_id_t *id, int nranks, int rank,
			 struct kcoll_comm **out);
/* Leave and free; pending operations on it complete with -ECANCELED. */
int kcoll_comm_destroy(struct kcoll_comm *comm);
int kcoll_comm_rank(const struct kcoll_comm *comm);
int kcoll_comm_size(const struct kcoll_comm *comm);

/*
 * Collectives. All are asynchronous: they queue the operation and return a
 * request in *req to test or wait on. In place follows NCCL: all-reduce
 * sendbuf == recvbuf; reduce-scatter recvbuf == sendbuf + rank * recvcount;
 * all-gather sendbuf == recvbuf + rank * sendcount. Other overlaps: -EINVAL.
 * Buffers from kcoll_mem_alloc() are used by the daemon without any copy;
 * other buffers are moved with one copy. The buffers must stay valid until
 * the request completes.
 * In a process using CUDA, buffers may be device memory (cudaMalloc): each
 * allocation is registered with kcolld once (CUDA IPC); the data must be
 * ready on the device when the call is made. -EOPNOTSUPP: kcolld has no
 * usable GPU (kcollctl gpu says why). kcoll_mem_deregister(k, base) drops an
 * allocation's registration. docs/gpu.md.
 */
int kcoll_allreduce(struct kcoll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
		    enum kcoll_dtype dtype, enum kcoll_redop op, struct kcoll_req **req);
/* recvbuf gets recvcount elements: this rank's slice of the reduced vector. */
int kcoll_reduce_scatter(struct kcoll_comm *comm, const void *sendbuf, void *recvbuf,
			 size_t recvcount, enum kcoll_dtype dtype, enum kcoll_redop op,
			 struct kcoll_req **req);
/* recvbuf gets nranks * sendcount elements, rank r's at r * sendcount. */
int kcoll_allgather(struct kcoll_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
		    enum kcoll_dtype dtype, struct kcoll_req **req);
/* buf of root is copied into buf of every other rank. */
int kcoll_broadcast(struct kcoll_comm *comm, void *buf, size_t count, enum kcoll_dtype dtype,
		    int root, struct kcoll_req **req);
int kcoll_barrier(struct kcoll_comm *comm, struct kcoll_req **req);

/* 1 and the request's result in *result if done (the request is then freed),
 * 0 if still pending. */
int kcoll_test(struct kcoll_req *req, int *result);
/* Wait at most timeout_ms (< 0: forever) and free the request. Returns the
 * operation's result, or -ETIMEDOUT (request still pending and still valid),
 * or -ENOTCONN if the daemon went away. */
int kcoll_wait(struct kcoll_req *req, int timeout_ms);
/* kcoll_wait without its one ambiguity (-ETIMEDOUT both for "still pending"
 * and for an operation that failed with ETIMEDOUT): 1 and the result in
 * *result once done (the request is then freed), 0 if timeout_ms (< 0:
 * forever) passed with it still pending (it stays valid), -EINVAL for a
 * bad or freed request. A dead daemon completes it with -ENOTCONN. */
int kcoll_timedwait(struct kcoll_req *req, int timeout_ms, int *result);

/* What a finished request reports (1.6). */
struct kcoll_status {
	int result;		/* the operation's result: 0 or a negative errno */
	int err_rank;		/* after a failure, the rank blamed for it; else -1 */
	uint32_t reserved[2];	/* zeroed */
};
/* kcoll_timedwait that also reports the blamed rank, taken before the
 * request is freed (timeout_ms 0: a test). Returns as kcoll_timedwait. */
int kcoll_wait_status(struct kcoll_req *req, int timeout_ms, struct kcoll_status *status);
/* The rank blamed for a failed request. It reads the request after
 * kcoll_wait/kcoll_test freed it: right only while no other thread submits
 * on the connection in between. Prefer kcoll_wait_status. */
int kcoll_req_err_rank(const struct kcoll_req *req);

/* Shared-memory buffers the daemon maps too: collectives on them are zero-copy. */
int kcoll_mem_alloc(struct kcoll *k, size_t size, void **ptr);
int kcoll_mem_free(struct kcoll *k, void *ptr);

/*
 * Make an ordinary buffer (malloc, stack, mmap) zero-copy for the daemon:
 * with the kernel module loaded its pages are pinned through /dev/kcoll and
 * kcolld maps them. Returns -ENODEV when kcoll.ko is not loaded (the buffer
 * then simply stays on the one-copy path: ignoring the error is fine;
 * kcoll_mem_share below works without the module). The buffer must stay
 * allocated until kcoll_mem_deregister.
 */
int kcoll_mem_register(struct kcoll *k, void *ptr, size_t size);
int kcoll_mem_deregister(struct kcoll *k, void *ptr);

/*
 * Make an ordinary buffer zero-copy without kcoll.ko: the whole pages inside
 * [ptr, ptr + size) (never a page the buffer shares with other objects) are
 * copied into a sealed memfd that is mapped over them at the same address
 * and registered with kcolld like kcoll_mem_alloc memory. *lo and *len get
 * the page-aligned range that is now shared; collectives on buffers inside
 * it are zero-copy, the bytes of the buffer outside it stay on the one-copy
 * path. Nobody may write the range during the call (such a write would be
 * lost). The pages stay MAP_SHARED for good: kcoll_mem_deregister(k, *lo)
 * drops kcolld's mapping and leaves them in place with their data, but a
 * child fork()ed afterwards shares them with its parent. The memory must
 * stay allocated until kcoll_mem_deregister. Errors: -EINVAL (NULL, size 0),
 * -ERANGE (no whole page inside), -EEXIST (overlaps kcoll memory already),
 * -EFAULT (not all mapped), -EACCES (not read-write), -EOPNOTSUPP (not
 * private anonymous memory: a file or shared mapping, huge pages); on any
 * error nothing changed. libkcoll 1.4 (symbol version KCOLL_1.4).
 */
int kcoll_mem_share(struct kcoll *k, void *ptr, size_t size, void **lo, size_t *len);

/*
 * KV-cache transfers (docs/kv.md, libkcoll(3) "KV-CACHE TRANSFERS").
 *
 * A segment is a buffer of this process registered with kcolld. Its
 * descriptor (opaque bytes: the daemon's address, the segment id and size,
 * an access token) is shared out of band; another process imports it and
 * then moves batches of scattered blocks between one of its own segments
 * and the imported one, one request per batch:
 *
 *	kcoll_seg_register(k, buf, len, &opts, &seg);   kcoll_seg_export(seg, &desc);
 *	// ... desc travels to the peer, which calls:
 *	kcoll_seg_import(k2, &desc, &rseg);
 *	kcoll_xfer_write(myseg, rseg, entries, n, notify_id, &req);  kcoll_wait(req, -1);
 *	// ... and the owner of seg: kcoll_seg_notify_wait(seg, notify_id, 1, -1);
 *
 * Entries within one batch must not overlap at their destination; a batch
 * is validated whole (ranges, the KCOLL_XFER_MAX_ENTRIES limit, overlaps)
 * before any byte moves, so a refused batch writes nothing. The notify
 * counter notify_id of the remote segment (KCOLL_NOTIFY_NONE: none) is
 * incremented once the whole batch has landed (write) or been read (read).
 * Segments inside kcoll_mem_alloc / kcoll_mem_register buffers are reached
 * in place by kcolld; others with process_vm_readv/writev. In a process
 * using CUDA a segment may be device memory (cudaMalloc): its allocation is
 * registered with kcolld as for collectives (CUDA IPC), blocks between two
 * device segments on one host move with the driver's device-to-device
 * copy, others are staged through pinned host memory by the GPU's copy
 * engines (across hosts: over TCP; RDMA is used for host segments only).
 * -EOPNOTSUPP: kcolld has no usable GPU.
 */
struct kcoll_seg;	/* a registered segment of this process */
struct kcoll_rseg;	/* an imported segment */

#define KCOLL_SEG_DESC_BYTES	128

typedef struct {
	uint8_t bytes[KCOLL_SEG_DESC_BYTES];
} kcoll_seg_desc_t;

/* kcoll_seg_opts.flags */
#define KCOLL_SEG_F_GRANT_UID	(1U << 0)	/* grant_uid may import it (besides our uid) */

struct kcoll_seg_opts {
	uint32_t size;		/* sizeof(struct kcoll_seg_opts) */
	uint32_t flags;		/* KCOLL_SEG_F_* */
	uint32_t nr_notify;	/* notify counters, 0..KCOLL_SEG_MAX_NOTIFY */
	uint32_t grant_uid;	/* with KCOLL_SEG_F_GRANT_UID */
};

/* Register [ptr, ptr + len) of this process; opts may be NULL (no
 * counters, our uid only). The memory must stay valid until unregistered. */
int kcoll_seg_register(struct kcoll *k, void *ptr, size_t len, const struct kcoll_seg_opts *opts,
		       struct kcoll_seg **out);
/* End the segment: transfers in flight into or out of it fail with -EIDRM
 * on the initiator's side, and none touches the memory once this returns. */
int kcoll_seg_unregister(struct kcoll_seg *seg);
int kcoll_seg_export(const struct kcoll_seg *seg, kcoll_seg_desc_t *desc);
/* -EACCES wrong token, -EIDRM unregistered (expired descriptor), -ENOENT no
 * such segment, -EPERM another uid without a grant, -ESTALE issued by this
 * kcolld before a restart. Another host's segment is imported without a
 * round trip: its token is checked there on the first transfer. */
int kcoll_seg_import(struct kcoll *k, const kcoll_seg_desc_t *desc, struct kcoll_rseg **out);
int kcoll_rseg_close(struct kcoll_rseg *rseg);
uint64_t kcoll_rseg_size(const struct kcoll_rseg *rseg);

/* One batch as one request (test/wait it with kcoll_test/kcoll_wait). The
 * entry array must stay valid until the request completes. */
int kcoll_xfer_write(struct kcoll_seg *local, struct kcoll_rseg *remote,
		     const struct kcoll_xfer_entry *entries, uint32_t nr_entries, uint32_t notify_id,
		     struct kcoll_req **req);
int kcoll_xfer_read(struct kcoll_seg *local, struct kcoll_rseg *remote,
		    const struct kcoll_xfer_entry *entries, uint32_t nr_entries, uint32_t notify_id,
		    struct kcoll_req **req);

/*
 * Plan a batch the way kcoll.kv does before submitting it (1.3): check
 * every entry (len non-zero: -EINVAL otherwise; inside both segments,
 * without wrap: -ERANGE otherwise; a batch with both faults gets -EINVAL),
 * sort the entries in place by destination (remote_off for a write,
 * local_off for a read), refuse overlapping destinations (-EINVAL), and
 * merge entries contiguous on both sides into one. On 0, e[0..*out_n)
 * holds the plan (*out_n <= n; n == 0 gives 0); on an error the order of
 * e is unspecified and *out_n is 0. No limit on n: split the plan into
 * batches of KCOLL_XFER_MAX_ENTRIES yourself. Touches nothing but e.
 */
int kcoll_xfer_plan(struct kcoll_xfer_entry *e, size_t n, uint64_t local_size,
		    uint64_t remote_size, int write, size_t *out_n);

/*
 * Notifications: a short message (1..KCOLL_NOTIF_MAX_BYTES, e.g. a request
 * id) for the owner of the remote segment, delivered once the batch's bytes
 * have landed (write) or been read (read), together with notify_id's counter
 * (KCOLL_NOTIFY_NONE: the message alone). nr_entries 0 sends it with no data.
 * kcolld queues it for the owner, who takes it with kcoll_seg_get_notifs.
 *  - exactly once and in order per sender: a sender is one import (one
 *    kcoll_rseg); its messages reach the owner in the order the requests
 *    were submitted, each at most once, and every request that completed
 *    with 0 delivered its message. A request that failed may or may not have
 *    delivered it (the owner's word got lost with a peer); it is never sent
 *    twice (no retries);
 *  - the owner's queue holds KCOLL_SEG_NOTIF_QUEUE messages per segment (and
 *    kcolld 64 MiB in all): beyond that the request fails with -ENOBUFS, the
 *    message is not queued and the counter not bumped, but the batch's bytes
 *    have landed. Nothing is dropped silently;
 *  - across hosts a batch with a message waits for the import's earlier
 *    batches to finish (that keeps the order); -EOPNOTSUPP: the owner's
 *    kcolld predates notifications (checked before any byte moves).
 * Errors besides those of kcoll_xfer_write: -EMSGSIZE msg_len over the
 * limit, -EFAULT msg not readable, -EINVAL msg_len 0 with a msg.
 */
int kcoll_xfer_write_notif(struct kcoll_seg *local, struct kcoll_rseg *remote,
			   const struct kcoll_xfer_entry *entries, uint32_t nr_entries,
			   uint32_t notify_id, const void *msg, uint32_t msg_len,
			   struct kcoll_req **req);
int kcoll_xfer_read_notif(struct kcoll_seg *local, struct kcoll_rseg *remote,
			  const struct kcoll_xfer_entry *entries, uint32_t nr_entries,
			  uint32_t notify_id, const void *msg, uint32_t msg_len,
			  struct kcoll_req **req);

/* One notification taken by the owner. */
struct kcoll_notif {
	uint32_t size;		/* the caller sets out[0].size = sizeof(struct kcoll_notif) */
	uint32_t flags;		/* none defined: 0 */
	uint64_t sender;	/* the sending import: equal for every message of one sender */
	uint32_t notify_id;	/* the counter bumped with it, or KCOLL_NOTIFY_NONE */
	uint32_t len;		/* bytes of data */
	uint8_t data[KCOLL_NOTIF_MAX_BYTES];
};

/* Take up to max of seg's queued notifications, oldest first, into out
 * (out[0].size must be sizeof(struct kcoll_notif): -EINVAL otherwise; every
 * entry is then filled whole). *nr: how many (0: none queued). Never waits. */
int kcoll_seg_get_notifs(struct kcoll_seg *seg, struct kcoll_notif *out, uint32_t max,
			 uint32_t *nr);
/* Wait until at least one notification is queued for seg, at most
 * timeout_ms (< 0: forever): 0, -ETIMEDOUT or -ENOTCONN. */
int kcoll_seg_notif_wait(struct kcoll_seg *seg, int timeout_ms);
/* Most segments one kcoll_seg_notif_wait_any call waits on. */
#define KCOLL_NOTIF_WAIT_MAX 128
/* Wait until at least one of segs[0..n) has a notification queued, at most
 * timeout_ms (< 0: forever): the index of the first such segment (>= 0),
 * -ETIMEDOUT, -ENOTCONN (a segment's kcolld is gone) or -EINVAL (no
 * segments, more than KCOLL_NOTIF_WAIT_MAX, a NULL one). One system call
 * sleeps on all of them (futex_waitv, Linux 5.16; polled every millisecond
 * on older kernels). The segments may belong to different connections. */
int kcoll_seg_notif_wait_any(struct kcoll_seg *const *segs, uint32_t n, int timeout_ms);

/* Current value of a notify counter of one of our segments. */
int kcoll_seg_notify_get(const struct kcoll_seg *seg, uint32_t id, uint32_t *value);
/* Wait until counter id reaches value (wrap-around safe), at most
 * timeout_ms (< 0: forever): 0, -ETIMEDOUT or -ENOTCONN. */
int kcoll_seg_notify_wait(struct kcoll_seg *seg, uint32_t id, uint32_t value, int timeout_ms);

/* Bytes per element of dtype, 0 if unknown. */
size_t kcoll_dtype_size(enum kcoll_dtype dtype);
const char *kcoll_dtype_name(enum kcoll_dtype dtype);
const char *kcoll_redop_name(enum kcoll_redop op);
/* Parse "f32", "bf16", ... / "sum", "max", ...: 0 or -EINVAL. */
int kcoll_dtype_parse(const char *s, enum kcoll_dtype *out);
int kcoll_redop_parse(const char *s, enum kcoll_redop *out);

/* A sentence for any value returned by this API. */
const char *kcoll_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif /* KCOLL_KCOLL_H */
