/* SPDX-License-Identifier: MIT */
/*
 * kcolld internals. The map (docs/architecture.md has the long form):
 *
 *   main.c    options, socket, the control thread (epoll: accept, control
 *             messages, signals, watchdog); owns client and comm lifetimes
 *   client.c  a client: its ring, its ring thread (SQ consumer), CQ posting,
 *             its shared-memory regions
 *   sqe.c     validation of one untrusted SQE (pure; fuzzed)
 *   comm.c    communicators: rendezvous, per-rank op matching, abort
 *   exec.c    running a matched op: tasks over the worker pool, reductions
 *   mem.c     the data-path ops table: how a rank's buffer is reached (mapped
 *             region in place, or process_vm_readv/writev), regions
 *   tune.c    tunables honoured at run time (environment, /sys/kernel/kcoll)
 *   status.c  `kcollctl status` in text and JSON
 *   metrics.c Prometheus metrics: data-path counters (relaxed atomics), the
 *             text, the KCOLL_METRICS endpoint and textfile (metrics.h)
 *
 * Each file calls only files below it (daemon.c < client.c < comm.c <
 * exec.c < mh.c < net*.c < kv_*.c, c4d*.c); the calls that go up use the ops
 * tables declared here and in c4d.h and net.h, which the upper files
 * install at start-up (docs/architecture.md, "Layers"; measured by
 * scripts/layering.py).
 *
 * Lifetimes are reference counts: a client is held by the client list, each
 * communicator it is a member of and each op it contributed to; a comm by
 * its members and its ops. Lock order: client->lock, then comm->lock, then
 * client->cq_lock; no lock is held while a thread sleeps.
 */
#ifndef KCOLLD_H
#define KCOLLD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <kcoll/proto.h>
#include <kcoll/ring.h>

#include "kdev.h"

#define KD_MAX_RANKS		256
#define KD_MAX_COMMS		1024	/* per client */
#define KD_MAX_BYTES		(1ULL << 40)
#define KD_STAGE_MAX		(16u << 20)

struct kd_comm;
struct kd_kv_client;

/* A client buffer mapped into kcolld: a sealed memfd (kcoll_mem_alloc) or
 * pages the client pinned through /dev/kcoll (kcoll_mem_register). */
struct kd_region {
	uint64_t addr;		/* in the client */
	uint64_t size;
	uint8_t *map;		/* in the daemon */
	bool pinned;		/* kmap: a /dev/kcoll mapping, else a memfd mmap */
	struct kcoll_kdev_map kmap;
	uint64_t khandle;	/* pinned: the client's kcoll.ko handle */
	atomic_int dmabuf_fd;	/* pinned: kd_region_dmabuf's fd, -1 not yet, -2 unavailable */
	bool dev;		/* GPU memory opened by CUDA IPC: map is a device pointer */
	int gpu_dev;		/* kcolld's ordinal of its device */
	void *gpu_base;		/* what cuIpcOpenMemHandle returned (closed on the last put) */
	uint64_t buffer_id;	/* the client's CU_POINTER_ATTRIBUTE_BUFFER_ID */
	atomic_int refs;
	struct kd_region *next;
};

struct kd_member {
	struct kd_comm *comm;
	uint32_t rank;
};

struct kd_client {
	int sock;
	pid_t pid;
	uid_t uid;
	uint32_t id;		/* serial, for logs and status */
	atomic_int refs;
	atomic_bool dead;	/* socket closed: post nothing more */
	atomic_bool stop;	/* ring thread: exit */
	bool hello_done;
	bool thread_started;

	struct kcoll_ring_hdr *ring;
	size_t ring_size;
	struct kcoll_queue sq;	/* consumer view */
	struct kcoll_queue cq;	/* producer view */
	pthread_mutex_t cq_lock;
	atomic_uint inflight;	/* admitted, not yet completed */
	uint32_t sq_behind;	/* ring thread only: SQEs seen ready behind the one dispatched */
	pthread_t ring_thread;

	pthread_mutex_t lock;	/* regions and members */
	struct kd_region *regions;
	struct kd_member members[KD_MAX_COMMS];	/* index = comm handle - 1 */
	struct kd_kv_client *kv;	/* KV segments imported (kv_seg.c), NULL until one is */

	atomic_ulong ops;
	atomic_ulong errors;
	struct kd_client *next;
};

enum kd_comm_state { KD_COMM_FORMING, KD_COMM_ACTIVE, KD_COMM_ABORTED };

struct kd_mh;
struct kd_pconn;

struct kd_buf;

/* How the daemon reaches one rank's buffer (mem.c). */
struct kd_mem_ops {
	/* Bytes [off, off+n) readable at *p: in place, or copied into tmp. */
	int (*read)(struct kd_client *c, const struct kd_buf *b, uint64_t off, size_t n,
		    uint8_t *tmp, const uint8_t **p);
	/* Store n bytes at off (a no-op if src already is that place). */
	int (*write)(struct kd_client *c, const struct kd_buf *b, uint64_t off,
		     const uint8_t *src, size_t n);
};

extern const struct kd_mem_ops kd_mem_mapped;
extern const struct kd_mem_ops kd_mem_vm;
extern const struct kd_mem_ops kd_mem_dev;	/* a registered GPU allocation */
extern const struct kd_mem_ops kd_mem_nodev;	/* a device address outside any: -EFAULT */

/* A rank's buffer for one op, resolved once. */
struct kd_buf {
	uint64_t addr;
	uint64_t len;
	uint8_t *direct;	/* daemon pointer when inside a mapped region */
	struct kd_region *rg;	/* held while the op runs */
	const struct kd_mem_ops *ops;
	uint8_t *dptr;		/* kd_mem_dev: device pointer in kcolld (never dereferenced) */
	int gpu_dev;
};

struct kd_contrib {
	struct kd_client *client;	/* held */
	uint64_t user_data;
	uint64_t send, recv;
	uint8_t send_mem, recv_mem;	/* enum kcoll_mem_kind */
	struct kd_buf sbuf, rbuf;
	bool present;
};

struct kd_op {
	struct kd_comm *comm;	/* held */
	uint64_t seq;
	uint8_t opcode, dtype, redop;
	uint64_t count;
	uint32_t root;
	uint32_t arrived;
	int64_t first_ns;
	bool ready;		/* every rank arrived */
	atomic_int err;		/* first error wins */
	atomic_uint err_rank;
	uint32_t cqe_flags;

	/* execution */
	bool on_gpu;		/* every buffer on one GPU: reduce and copy there (exec.c) */
	int gpu_dev;
	size_t esz;
	uint64_t seg_elems;	/* elements per segment (one per rank for RS/AG) */
	uint64_t chunk_elems;
	uint32_t tasks_per_seg;
	uint32_t ntasks;
	atomic_uint next_task;
	atomic_uint tasks_left;
	atomic_uint users;	/* threads inside work_on() */
	struct kd_op *next;	/* comm's pending list, then the pool queue */
	struct kd_contrib c[];	/* [nranks] */
};

struct kd_comm {
	uint8_t token[KCOLL_ID_TOKEN_BYTES];
	char name[17];		/* hex prefix of the token, for logs */
	uid_t uid;
	uint32_t nranks;
	uint32_t joined;
	enum kd_comm_state state;
	int abort_err;
	uint32_t abort_rank;
	uint32_t abort_flags;
	bool left;		/* aborted because a member left (kcoll_comm_destroy),
				 * not by a failure: status calls it "ended" */
	uint64_t limit_seq;	/* aborted: ops from this one on fail (UINT64_MAX: none) */
	uint32_t nlocal;	/* ranks on this host: an op runs once they all arrived */
	struct kd_mh *mh;	/* multi-host state, NULL while single-host */
	struct kd_pconn *boot;	/* forming: connection to the id's root daemon */
	bool registered;	/* forming: our ranks were registered with the root */
	int64_t deadline_ns;	/* forming: join deadline */
	int64_t timeout_ns;
	atomic_int refs;
	pthread_mutex_t lock;
	struct kd_client **clients;	/* [nranks], held */
	uint32_t *handles;		/* [nranks] comm handle in each client */
	uint32_t *init_seq;		/* [nranks] COMM_INIT request to answer */
	bool *gone;			/* [nranks] left or died */
	uint64_t *next_seq;		/* [nranks] ops submitted */
	uint64_t exec_seq;		/* next op to execute: ops run in order */
	struct kd_op *pending;		/* sorted by seq */
	atomic_ulong ops_done;
	struct kd_comm *next;
};

/* How status and metrics show a communicator: its state, or
 * KD_COMM_SHOWN_ENDED for one aborted by a member leaving (comm->left).
 * Inline here so that status.c and metrics.c need nothing from comm.c,
 * which calls into them (scripts/layering.py keeps the daemon acyclic). */
#define KD_COMM_SHOWN_ENDED	3
#define KD_COMM_NSHOWN		4

static inline unsigned kd_comm_shown(const struct kd_comm *comm)
{
	return comm->state == KD_COMM_ABORTED && comm->left ? KD_COMM_SHOWN_ENDED : (unsigned)comm->state;
}

static inline const char *kd_comm_shown_name(unsigned shown)
{
	static const char *const names[KD_COMM_NSHOWN] = { "forming", "active", "aborted", "ended" };

	return shown < KD_COMM_NSHOWN ? names[shown] : "?";
}

struct kd_stats {
	atomic_ulong ops_ok;
	atomic_ulong ops_failed;
	atomic_ulong bytes;
	atomic_ulong bytes_mapped;	/* moved in place (zero copy) */
	atomic_ulong bytes_copied;	/* moved with process_vm_readv/writev */
	atomic_ulong clients_total;
	atomic_ulong rings_killed;
};

struct kd_daemon {
	const char *socket_path;
	int listen_fd;
	uint64_t nonce;		/* this instance, random: ids name it */
	int epfd;
	int nworkers;
	size_t chunk_bytes;
	size_t net_chunk_bytes;	/* pieces between daemons */
	int64_t spin_ns;
	int64_t timeout_ns;
	int64_t c4_slow_ratio_pct;	/* C4 detector thresholds (tune.c, c4d.c) */
	int64_t c4_hang_ms;
	int64_t c4_straggler_ms;
	int64_t start_ns;
	atomic_bool draining;
	struct kcoll_kdev kdev;	/* /dev/kcoll, fd -1 when the module is absent */
	struct kd_client *clients;
	struct kd_comm *comms;
	uint32_t next_client_id;
	struct kd_stats stats;
};

/* daemon.c: the global state and the monotonic clock every room reads. */
extern struct kd_daemon kd;

int64_t kd_now_ns(void);

/*
 * daemon.c: memory the daemon is about to unmap, free or reallocate. What
 * caches something of such memory (the RDMA registration cache) subscribes
 * at start-up, before any other thread runs; rooms that free memory call
 * kd_unmap_notify and need not know who listens.
 */
typedef void kd_unmap_fn(void *addr, size_t len);
int kd_unmap_subscribe(kd_unmap_fn *fn);	/* 0, or -ENOSPC */
void kd_unmap_notify(void *addr, size_t len);
/* Grow a daemon-owned buffer to at least want bytes (contents kept,
 * unmap notified first); 0 or -ENOMEM (the old buffer stays). */
int kd_grow(uint8_t **p, size_t *have, size_t want);

/* sqe.c: 0 or -errno, with *why a short reason for the log. */
int kd_sqe_check(const struct kcoll_sqe *sqe, const char **why);
/* Bytes of a rank's send and recv buffers for a collective of nranks. */
int kd_coll_sizes(const struct kcoll_sqe *sqe, uint32_t nranks, uint32_t rank,
		  uint64_t *send_bytes, uint64_t *recv_bytes);

/* client.c */
/*
 * The rooms above client.c that take part in a client's life (comm.c,
 * exec.c, kv_local.c): main.c registers each table at start-up, before the first
 * client connects; read-only after. client.c dispatches to them without
 * depending on them (docs/architecture.md, "Layers").
 */
struct kd_client_ops {
	const char *name;
	/* Ring thread: an SQE with an opcode in [op_first, op_last] and
	 * kd_sqe_check's verdict on it; malformed ones too, the handler answers
	 * them (a communicator's other ranks must learn of the error). NULL:
	 * it takes no SQEs. */
	uint8_t op_first, op_last;
	void (*submit)(struct kd_client *c, const struct kcoll_sqe *sqe, int err, const char *why);
	/* Control thread, kd_client_close: before the ring thread is stopped
	 * (leave what could keep it waiting), and after it exited. */
	void (*closing)(struct kd_client *c);
	void (*closed)(struct kd_client *c);
	/* A ring thread exits: free what the room keeps per thread. */
	void (*thread_done)(void);
};
int kd_client_register(const struct kd_client_ops *ops);	/* 0, or -ENOSPC */
extern const struct kd_client_ops kd_comm_client_ops;	/* comm.c */
extern const struct kd_client_ops kd_exec_client_ops;	/* exec.c */
extern const struct kd_client_ops kd_kv_client_ops;	/* kv_local.c */

struct kd_client *kd_client_new(int sock);
int kd_client_ring_create(struct kd_client *c, uint32_t sq_entries, int *fd);
int kd_client_start(struct kd_client *c);
void kd_client_get(struct kd_client *c);
void kd_client_put(struct kd_client *c);
/* Shut the client down from any thread: the control thread reaps it. */
void kd_client_kill(struct kd_client *c, const char *why);
/* Control thread: stop the ring thread, leave comms, drop the list's ref. */
void kd_client_close(struct kd_client *c);
void kd_client_post(struct kd_client *c, uint64_t user_data, int res, uint64_t aux,
		    uint32_t err_rank, uint32_t flags);
int kd_region_add(struct kd_client *c, int fd, uint64_t addr, uint64_t size);
int kd_region_add_pinned(struct kd_client *c, uint64_t handle, uint64_t addr, uint64_t size);
/* A pinned region's pages as kcoll.ko's dma-buf: the fd (kept by the region) or -errno. */
int kd_region_dmabuf(struct kd_region *rg);
int kd_region_del(struct kd_client *c, uint64_t addr);
/* mem.c: resolve [addr, addr+len) of c: mapped if inside a region (ref taken). */
void kd_buf_resolve(struct kd_client *c, uint64_t addr, uint64_t len, struct kd_buf *b);
/* The same for a buffer of kind mem (enum kcoll_mem_kind): device addresses
 * resolve only inside the client's device regions, host ones never there. */
void kd_buf_resolve_kind(struct kd_client *c, uint64_t addr, uint64_t len, int mem,
			 struct kd_buf *b);
struct kcoll_msg_mem_reg_dev;
/* MEM_REG_DEV: open the client's GPU allocation; why says what went wrong. */
int kd_region_add_dev(struct kd_client *c, const struct kcoll_msg_mem_reg_dev *m, char *why,
		      size_t len);
/* Device buffers usable in kcolld (a GPU, the kernels): 0, else -EOPNOTSUPP and why. */
int kd_gpu_ready(char *why, size_t len);
struct kcoll_gpu_kernels;
/* The kernels table with dev's context current on this thread. */
int kd_gpu_enter(int dev, const struct kcoll_gpu_kernels **k);
/* kcolld's stream on dev (made on first use, with dev's context current). */
int kd_gpu_stream(int dev, const struct kcoll_gpu_kernels **k, void **stream);
/* Free every device's stream and pinned staging pool (at exit, after the pools). */
void kd_gpu_cleanup(void);
void kd_buf_release(struct kd_buf *b);
void kd_region_put(struct kd_region *rg);
int kd_buf_read(struct kd_client *c, const struct kd_buf *b, uint64_t off, size_t n, uint8_t *tmp,
		const uint8_t **p);
int kd_buf_write(struct kd_client *c, const struct kd_buf *b, uint64_t off, const uint8_t *src,
		 size_t n);
/* n bytes from device buffer src at soff to device buffer dst at doff, both
 * kd_mem_dev (any devices: the driver picks peer access or staging);
 * -EFAULT when either is not. Synchronous. */
int kd_buf_copy_dev(const struct kd_buf *dst, uint64_t doff, const struct kd_buf *src,
		    uint64_t soff, size_t n);

/* comm.c */
/*
 * How comm.c reaches the network and a multi-host communicator's net
 * thread, which sit above it (net.c, mh.c): net.c installs its table first
 * thing in kd_net_start (main.c, before the first client connects; also
 * when it then cannot listen: joins still go through it and say why).
 * NULL before: joins fail with -ENOTCONN and no comm is multi-host.
 */
struct kd_comm_net_ops {
	/* Control thread: a local rank joined comm (FORMING): register it
	 * with the id's root; once every rank is placed, kd_comm_activate. */
	int (*join)(struct kd_comm *comm, const struct kcoll_id *id, uint32_t rank, uint32_t flags,
		    const char **why);
	/* Any thread: tell every peer that comm fails from op from_seq on. */
	void (*abort_peers)(struct kd_comm *comm, int err, uint32_t rank, uint32_t flags,
			    uint64_t from_seq);
	/* Control thread: tear comm's multi-host state down (it is aborted). */
	void (*close)(struct kd_comm *comm);
	/* A ready op of a multi-host comm: its net thread runs it (mh.c). */
	void (*run)(struct kd_op *op);
	/* comm->mh's comm was aborted: its net thread stops waiting (mh.c). */
	void (*wake)(struct kd_mh *mh);
};
void kd_comm_set_net(const struct kd_comm_net_ops *ops);
/* Who runs a ready single-host op: exec.c installs its runner in
 * kd_pool_start (main.c, before the first client connects); the runner
 * calls kd_comm_op_done when the op finished. */
struct kd_comm_exec_ops {
	void (*run)(struct kd_op *op);
};
void kd_comm_set_exec(const struct kd_comm_exec_ops *ops);
/* Tell comm's peers it fails from op from_seq on (through the net ops;
 * nothing while single-host). Any thread. */
void kd_comm_abort_peers(struct kd_comm *comm, int err, uint32_t rank, uint32_t flags,
			 uint64_t from_seq);
/* Control thread: join; 1 = reply deferred until complete, or -errno + why. */
int kd_comm_join(struct kd_client *c, const struct kcoll_msg_comm_init *m, const char **why);
int kd_comm_destroy(struct kd_client *c, uint32_t handle);
int kd_comm_take_lane(struct kd_client *c, uint32_t handle, uint32_t host, int *fd);
/* A member died or left: fail what is pending and refuse what comes. */
void kd_comm_member_gone(struct kd_comm *comm, uint32_t rank, int err);
/* Control thread, periodically: join deadlines and hung ops. */
void kd_comm_watchdog(int64_t now);
void kd_comm_put(struct kd_comm *comm);
/* Forming comm: every rank has a place (net.c); answer the local ranks. */
void kd_comm_activate(struct kd_comm *comm);
/* Forming comm could not be formed: tell the local ranks why. */
void kd_comm_form_fail(struct kd_comm *comm, int err, const char *msg);
/* Fail ops from from_seq on with err naming rank; true if this aborted it
 * now (false: it already was, from an earlier op). KD_ABORT_F_LEFT in flags:
 * the cause is a member that left, not a failure (it reaches no CQE). */
bool kd_comm_abort(struct kd_comm *comm, int err, uint32_t rank, uint32_t flags, uint64_t from_seq);
/* Multi-host: bitmap of local ranks that submitted op seq. */
void kd_comm_submitted(struct kd_comm *comm, uint64_t seq, uint64_t bits[4]);
/* Record err for op unless it already failed (the first error wins). */
void kd_op_fail(struct kd_op *op, int err, uint32_t err_rank, uint32_t flags);
/* The runner (exec.c, mh.c) calls it when an op finished: post CQEs;
 * returns the comm's next op if it may start now (the caller runs it). */
struct kd_op *kd_comm_op_done(struct kd_op *op);

/* exec.c */
int kd_pool_start(int nworkers);
void kd_pool_stop(void);
/* A thread that ran tasks is exiting: free its staging buffer. */
void kd_exec_thread_done(void);
/* The calling thread's staging buffer, at least size bytes (NULL: out of
 * memory); kd_exec_thread_done frees it. For a job's tasks. */
uint8_t *kd_exec_stage(size_t size);

/*
 * A job: ntasks independent tasks that the calling thread runs with the
 * worker pool's help, beside the single-host ops (mh.c's local phases).
 * task() runs on any thread, once per task number; a job records its own
 * errors. kd_exec_job returns when every task has run.
 */
struct kd_job {
	void (*task)(struct kd_job *job, uint32_t t);
	uint32_t ntasks;
	atomic_uint next_task;
	atomic_uint users;	/* threads inside the job's task loop */
	struct kd_job *next;	/* the pool's job queue */
};
void kd_exec_job(struct kd_job *job);
/*
 * The GPU that holds every buffer of op's present ranks, element-aligned (the
 * kernels' rule), with buffers resolved and op->esz set; -1 when any buffer
 * is host memory, on another device or misaligned. Single-host ops then run
 * on the GPU (run_task_gpu), multi-host ops their local phases (mh.c).
 */
int kd_exec_gpu_dev(const struct kd_op *op);

/* tune.c: chunk_bytes and timeout_ms from environment, sysfs, default */
void kd_tunables_init(void);
void kd_tunables_poll(void);
size_t kd_tunables_render(char *buf, size_t cap, int json);
/* kcollctl set chunk_bytes|timeout_ms VALUE (until sysfs changes it again). */
int kd_tunable_set(const char *key, const char *value, char *err, size_t errlen);

/* kv_seg.c, kv_local.c: KV-cache segments and batched transfers (docs/kv.md) */
/* Control thread: a SEG_* message; fills the reply (and an fd to pass). */
int kd_kv_message(struct kd_client *c, const struct kcoll_msg_hdr *h, size_t len, void *reply,
		  size_t *reply_len, int *reply_fd);
/* Ring thread: one XFER SQE and kd_sqe_check's verdict on it. */
void kd_kv_submit(struct kd_client *c, const struct kcoll_sqe *sqe, int err, const char *why);
/* Control thread: the client is closing; its segments end, imports dropped. */
void kd_kv_client_gone(struct kd_client *c);
void kd_kv_thread_done(void);
struct kd_p_hello;
/* kv_serve.c, control thread: a KD_CONN_KV HELLO (net.c's HELLO kind table); takes the
 * connection's fd (answers and serves it, or refuses with its own KD_P_KV_ACK): 0. */
int kd_kv_accept(int fd, const struct kd_p_hello *m, char *why, size_t len);
size_t kd_kv_render(char *buf, size_t cap, int json);

/* status.c */
/* Render status into buf (JSON if json); returns length. */
size_t kd_status_render(char *buf, size_t cap, int json);

#endif /* KCOLLD_H */
