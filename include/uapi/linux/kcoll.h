/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR MIT) */
/*
 * kcoll ABI shared by the kernel module, kcolld and libkcoll.
 *
 * Everything here is a wire/memory format: fixed-width <linux/types.h> types,
 * explicit padding, pointers carried as __u64. include/kcoll/abi_check.c
 * asserts every size and offset (built for x86_64 and -m32).
 * docs/ring.md is the protocol blueprint for the ring.
 */
#ifndef _UAPI_LINUX_KCOLL_H
#define _UAPI_LINUX_KCOLL_H

#include <linux/types.h>

#define KCOLL_RING_MAGIC	0x4c4f434bU	/* "KCOL" little-endian */
#define KCOLL_ABI_VERSION	1

/* ---------------------------------------------------------------------------
 * Data types and reduction operators
 */
enum kcoll_dtype {
	KCOLL_F32 = 0,
	KCOLL_F64 = 1,
	KCOLL_F16 = 2,
	KCOLL_BF16 = 3,
	KCOLL_I8 = 4,
	KCOLL_U8 = 5,
	KCOLL_I32 = 6,
	KCOLL_U32 = 7,
	KCOLL_I64 = 8,
	KCOLL_U64 = 9,
	KCOLL_DTYPE_MAX
};

enum kcoll_redop {
	KCOLL_SUM = 0,
	KCOLL_PROD = 1,
	KCOLL_MIN = 2,
	KCOLL_MAX = 3,
	KCOLL_AVG = 4,
	KCOLL_REDOP_MAX
};

/* Where a buffer lives. */
enum kcoll_mem_kind {
	KCOLL_MEM_HOST = 0,	/* ordinary or kcoll_mem_alloc'ed host memory */
	KCOLL_MEM_DEVICE = 1,	/* GPU memory registered with the daemon */
	KCOLL_MEM_KIND_MAX
};

/* ---------------------------------------------------------------------------
 * Submission queue entry: 64 bytes, written by the client, untrusted by the
 * daemon (copied out once, then validated field by field).
 */
enum kcoll_opcode {
	KCOLL_OP_NOP = 0,		/* completes at once; ring liveness probe */
	KCOLL_OP_ALLREDUCE = 1,
	KCOLL_OP_REDUCE_SCATTER = 2,	/* count = elements each rank receives */
	KCOLL_OP_ALLGATHER = 3,		/* count = elements each rank sends */
	KCOLL_OP_BROADCAST = 4,
	KCOLL_OP_BARRIER = 5,
	KCOLL_OP_XFER_WRITE = 6,	/* KV-cache batch: local segment -> remote */
	KCOLL_OP_XFER_READ = 7,		/* KV-cache batch: remote segment -> local */
	KCOLL_OP_MAX
};

/* sqe->flags */
#define KCOLL_SQE_F_IN_PLACE	(1U << 0)	/* collectives: send_addr is ignored, recv_addr is both */
#define KCOLL_SQE_F_ALL		(KCOLL_SQE_F_IN_PLACE)

/* Collective arguments (opcodes ALLREDUCE..BARRIER). */
struct kcoll_sqe_coll {
	__aligned_u64 send_addr;
	__aligned_u64 recv_addr;
	__aligned_u64 count;		/* elements, not bytes */
	__u32 comm_id;			/* from the daemon's reply to COMM_INIT */
	__u32 root;			/* broadcast root rank; 0 otherwise */
	__u8 dtype;			/* enum kcoll_dtype */
	__u8 redop;			/* enum kcoll_redop; 0 where unused */
	__u8 send_mem;			/* enum kcoll_mem_kind */
	__u8 recv_mem;			/* enum kcoll_mem_kind */
	__u32 reserved[3];		/* must be zero */
};

/* Point-to-point batch transfer (opcodes XFER_WRITE/XFER_READ). */
struct kcoll_sqe_xfer {
	__aligned_u64 entries_addr;	/* struct kcoll_xfer_entry[nr_entries] in client memory */
	__aligned_u64 remote_seg;	/* handle of an imported segment */
	__u32 nr_entries;
	__u32 local_seg;		/* handle of a registered local segment */
	__u32 notify_id;		/* counter on the remote segment, or KCOLL_NOTIFY_NONE */
	__u32 msg_len;			/* notification bytes at msg_addr, 0: none */
	__aligned_u64 msg_addr;		/* notification for the remote segment's owner */
	__u32 reserved[2];		/* must be zero */
};

#define KCOLL_NOTIFY_NONE	0xffffffffU
#define KCOLL_XFER_MAX_ENTRIES	4096		/* nr_entries limit: more is -E2BIG */
#define KCOLL_SEG_MAX_NOTIFY	1024		/* notify counters per segment */
#define KCOLL_NOTIF_MAX_BYTES	512		/* msg_len limit: more is -EMSGSIZE */
#define KCOLL_SEG_NOTIF_QUEUE	256		/* notifications a segment holds untaken */

struct kcoll_xfer_entry {
	__aligned_u64 local_off;
	__aligned_u64 remote_off;
	__aligned_u64 len;
};

struct kcoll_sqe {
	__u8 opcode;			/* enum kcoll_opcode */
	__u8 flags;			/* KCOLL_SQE_F_* */
	__u16 reserved0;		/* must be zero */
	__u32 reserved1;		/* must be zero */
	__aligned_u64 user_data;	/* echoed in the CQE, never interpreted */
	union {
		struct kcoll_sqe_coll coll;
		struct kcoll_sqe_xfer xfer;
	};
};

/* ---------------------------------------------------------------------------
 * Completion queue entry: 32 bytes, written by the daemon.
 */
struct kcoll_cqe {
	__aligned_u64 user_data;
	__s32 res;			/* 0 or negative errno */
	__u32 flags;			/* KCOLL_CQE_F_* */
	__aligned_u64 aux;		/* bytes moved by this rank's op */
	__u32 err_rank;			/* rank blamed for res, or KCOLL_RANK_NONE */
	__u32 reserved;
};

#define KCOLL_RANK_NONE		0xffffffffU
/* cqe->flags: err_rank names a rank that never contributed (vs. one that failed) */
#define KCOLL_CQE_F_MISSING	(1U << 0)

/* ---------------------------------------------------------------------------
 * Ring region: one shared mapping (a sealed memfd from kcolld, or /dev/kcoll
 * mmap at KCOLL_MMAP_OFF_RING). Layout:
 *
 *   [0, hdr_size)                  struct kcoll_ring_hdr
 *   [sq_off, sq_off + 64*sq_entries) struct kcoll_sqe[]
 *   [cq_off, cq_off + 32*cq_entries) struct kcoll_cqe[]
 *
 * Indices are free-running __u32; the reader masks with (entries - 1).
 * Every index lives on its own 64-byte line with exactly one writer.
 */
#define KCOLL_RING_LINE		64

/* sq_flags (daemon-written) */
#define KCOLL_SQ_NEED_WAKEUP	(1U << 0)	/* consumer sleeps: futex-wake sq_tail */
/* cq_flags (client-written) */
#define KCOLL_CQ_NEED_WAKEUP	(1U << 0)	/* client sleeps: futex-wake cq_tail */
/* status (daemon-written) */
#define KCOLL_RING_DEAD		(1U << 0)	/* daemon gave up on this ring */

struct kcoll_ring_hdr {
	/* line 0: identity; daemon writes it once before sharing the ring */
	__u32 magic;
	__u32 abi_version;
	__u32 hdr_size;
	__u32 features;
	__u32 sq_entries;		/* power of two */
	__u32 cq_entries;		/* power of two, >= sq_entries */
	__u32 sqe_size;
	__u32 cqe_size;
	__aligned_u64 sq_off;
	__aligned_u64 cq_off;
	__aligned_u64 ring_size;
	__u32 daemon_pid;
	__u32 reserved0;
	/* line 1: client writes */
	__u32 sq_tail;
	__u32 pad1[15];
	/* line 2: daemon writes */
	__u32 sq_head;
	__u32 sq_flags;
	__u32 status;
	__u32 pad2[13];
	/* line 3: daemon writes */
	__u32 cq_tail;
	__u32 pad3[15];
	/* line 4: client writes */
	__u32 cq_head;
	__u32 cq_flags;
	__u32 pad4[14];
};

#define KCOLL_RING_HDR_SIZE	4096	/* header page; sq_off is at least this */
#define KCOLL_RING_MAX_ENTRIES	4096

/* ===========================================================================
 * BEGIN kcoll.ko device ABI (/dev/kcoll): ioctls, mmap offsets, feature bits.
 * Owned by kmod/; asserted in include/kcoll/abi_check_kmod.c; documented in
 * man/kcoll.4 and docs/sysfs.md.
 *
 * Every ioctl argument begins with __u32 size (the caller's sizeof) and
 * __u32 flags. The kernel accepts any size from the first version's size up
 * to a page: a shorter struct is zero-extended, a longer one must have an
 * all-zero tail (else -E2BIG). A size below the first version's -> -EINVAL;
 * non-zero reserved fields -> -EINVAL; unknown flags -> -EOPNOTSUPP. Output
 * fields are written back for at most the caller's size. The ioctl number's
 * size bits are not checked: the size field governs, so a grown struct keeps
 * working with an older or newer module.
 *
 * Process (file) model: each open of /dev/kcoll is one context holding at
 * most one ring and any number of registered buffers; closing the last
 * reference (fd, fork copy or mapping) frees them.
 */
#include <linux/ioctl.h>

#define KCOLL_DEV_PATH		"/dev/kcoll"
#define KCOLL_KDEV_ABI_VERSION	1

/* Feature bits (KCOLL_IOC_QUERY.features, /sys/kernel/kcoll/features) */
#define KCOLL_FEAT_RING		(1ULL << 0)	/* RING_CREATE + mmap at KCOLL_MMAP_OFF_RING */
#define KCOLL_FEAT_DOORBELL	(1ULL << 1)	/* WAIT / WAKE */
#define KCOLL_FEAT_BUF		(1ULL << 2)	/* BUF_REGISTER / UNREGISTER / IMPORT + mmap */
#define KCOLL_FEAT_GRANT	(1ULL << 3)	/* BUF_GRANT by uid or pid */
#define KCOLL_FEAT_PEERS	(1ULL << 4)	/* PEER_REPORT + /sys/kernel/kcoll/peers */
#define KCOLL_FEAT_DMABUF	(1ULL << 5)	/* BUF_DMABUF: a registration as a dma-buf */

/*
 * mmap offsets. The ring sits at 0 (length <= ring_size). Registered buffer
 * h (h >= 1) sits at KCOLL_MMAP_OFF_BUF(h), one 4 GiB slot per handle, so a
 * registration is at most 4 GiB - 1 page; KCOLL_IOC_BUF_IMPORT returns the
 * offset, use that rather than computing it. Mappings must be MAP_SHARED.
 */
#define KCOLL_MMAP_OFF_RING	0ULL
#define KCOLL_MMAP_BUF_SHIFT	32
#define KCOLL_MMAP_OFF_BUF(h)	((__u64)(h) << KCOLL_MMAP_BUF_SHIFT)

/* Feature and limit query. Only size and flags are input; min size 8. */
struct kcoll_ioc_query {
	__u32 size;
	__u32 flags;			/* none defined: 0 */
	__aligned_u64 features;		/* out: KCOLL_FEAT_* */
	__u32 abi_version;		/* out: KCOLL_KDEV_ABI_VERSION */
	__u32 page_size;		/* out */
	__u32 max_ring_entries;		/* out: sq_entries limit */
	__u32 max_grants;		/* out: grants per buffer */
	__aligned_u64 max_buf_bytes;	/* out: largest single registration */
	__aligned_u64 max_pinned_bytes;	/* out: limit on all pinned memory */
};

/* Create this file's ring (one per file, -EBUSY for a second). */
struct kcoll_ioc_ring_create {
	__u32 size;
	__u32 flags;			/* none defined: 0 */
	__u32 sq_entries;		/* power of two, 1..KCOLL_RING_MAX_ENTRIES */
	__u32 cq_entries;		/* power of two, sq_entries..2*KCOLL_RING_MAX_ENTRIES;
					 * 0: 2 * sq_entries */
	__aligned_u64 ring_size;	/* out: bytes to map */
	__aligned_u64 mmap_offset;	/* out: KCOLL_MMAP_OFF_RING */
};

/* Doorbells: each watches one index of the file's ring header. */
#define KCOLL_DOORBELL_SQ	0	/* sq_tail: the daemon waits for submissions */
#define KCOLL_DOORBELL_CQ	1	/* cq_tail: the client waits for completions */
#define KCOLL_NR_DOORBELLS	2

#define KCOLL_WAIT_FOREVER	0xffffffffU
/* wait flags: any signal ends the wait (-EINTR); by default only a fatal one */
#define KCOLL_WAIT_F_INTERRUPTIBLE	(1U << 0)

/*
 * Sleep while the doorbell's index in the ring header equals value, until a
 * WAKE on that doorbell, the timeout (-ETIMEDOUT) or a signal (-EINTR).
 * Returns 0 at once if the index already differs: no wakeup is lost when the
 * producer publishes the index before ringing.
 */
struct kcoll_ioc_wait {
	__u32 size;
	__u32 flags;			/* KCOLL_WAIT_F_* */
	__u32 doorbell;			/* KCOLL_DOORBELL_* */
	__u32 value;			/* index the caller last saw */
	__u32 timeout_ms;		/* KCOLL_WAIT_FOREVER: no limit; 0: just check */
	__u32 reserved;			/* must be zero */
};

/* Wake every waiter of one doorbell of this file's ring. */
struct kcoll_ioc_wake {
	__u32 size;
	__u32 flags;			/* none defined: 0 */
	__u32 doorbell;			/* KCOLL_DOORBELL_* */
	__u32 reserved;			/* must be zero */
};

/* Registration flags */
#define KCOLL_BUF_F_READONLY	(1U << 0)	/* importers may map it PROT_READ only */

/*
 * Pin [addr, addr + len) of the caller's memory and name it by a handle that
 * other contexts may import (KCOLL_IOC_BUF_IMPORT, then mmap). The pin is
 * charged to the caller's RLIMIT_MEMLOCK. The registration ends with
 * UNREGISTER or when this file is released; its pages stay pinned until the
 * last importer mapping is gone too.
 */
struct kcoll_ioc_buf_register {
	__u32 size;
	__u32 flags;			/* KCOLL_BUF_F_* */
	__aligned_u64 addr;		/* need not be page aligned */
	__aligned_u64 len;		/* bytes, > 0 */
	__aligned_u64 handle;		/* out: >= 1 */
};

/* End a registration made on this file (-ENOENT otherwise). */
struct kcoll_ioc_buf_unregister {
	__u32 size;
	__u32 flags;			/* none defined: 0 */
	__aligned_u64 handle;
};

/* Grant kinds */
#define KCOLL_GRANT_UID		0	/* id is a uid (caller's user namespace) */
#define KCOLL_GRANT_PID		1	/* id is a process id (caller's pid namespace) */
/* grant flags */
#define KCOLL_GRANT_F_REVOKE	(1U << 0)	/* remove the grant; mappings already made stay */

/*
 * Let another uid or process import a buffer registered on this file.
 * Without a grant only processes whose effective uid equals the
 * registrant's may import it.
 */
struct kcoll_ioc_buf_grant {
	__u32 size;
	__u32 flags;			/* KCOLL_GRANT_F_* */
	__aligned_u64 handle;
	__u32 kind;			/* KCOLL_GRANT_UID or KCOLL_GRANT_PID */
	__u32 id;
};

/*
 * Check that the caller may map a registered buffer and tell it where:
 * mmap(NULL, map_len, PROT_READ[|PROT_WRITE], MAP_SHARED, fd, mmap_offset);
 * the buffer then starts page_offset bytes into the mapping. A mapping may
 * also cover a page-aligned part: offset mmap_offset + k * page size.
 * -ENOENT: no such registration; -EACCES: not the owner's uid nor granted.
 */
struct kcoll_ioc_buf_import {
	__u32 size;
	__u32 flags;			/* none defined: 0 */
	__aligned_u64 handle;
	__aligned_u64 mmap_offset;	/* out */
	__aligned_u64 map_len;		/* out: page-rounded length */
	__aligned_u64 len;		/* out: registered length */
	__u32 page_offset;		/* out: buffer start within the first page */
	__u32 buf_flags;		/* out: KCOLL_BUF_F_* it was registered with */
	__u32 owner_pid;		/* out: registrant's pid in the caller's namespace, 0 if gone */
	__u32 reserved;			/* must be zero */
};

/*
 * Export a registered buffer's pinned pages as a dma-buf, so a device (an
 * RDMA NIC through ibv_reg_dmabuf_mr) reads and writes the registrant's
 * memory directly. Same permission check as KCOLL_IOC_BUF_IMPORT. The new fd
 * (close-on-exec) covers the page-rounded range; the buffer starts
 * page_offset bytes into it. mmap(MAP_SHARED) of the fd shows the bytes.
 * The dma-buf holds the registration: its pages stay pinned until the fd,
 * its mappings and every device attachment are gone, even after the
 * registration ended or its owner died. A KCOLL_BUF_F_READONLY registration
 * gives an O_RDONLY dma-buf that devices may only read (DMA_TO_DEVICE).
 * -ENOENT: no such registration; -EACCES: not the owner's uid nor granted.
 */
struct kcoll_ioc_buf_dmabuf {
	__u32 size;
	__u32 flags;			/* none defined: 0 */
	__aligned_u64 handle;
	__aligned_u64 dmabuf_size;	/* out: page-rounded length */
	__aligned_u64 len;		/* out: registered length */
	__s32 fd;			/* out: the dma-buf */
	__u32 page_offset;		/* out: buffer start within the first page */
};

/* Link health kcolld reports (CAP_NET_ADMIN); shown in /sys/kernel/kcoll/peers. */
enum kcoll_peer_state {
	KCOLL_PEER_UNKNOWN = 0,		/* forget the peer */
	KCOLL_PEER_OK = 1,
	KCOLL_PEER_SLOW = 2,		/* beyond slow_ratio_pct of its usual speed */
	KCOLL_PEER_HUNG = 3,		/* no progress for hang_ms */
	KCOLL_PEER_DOWN = 4,		/* connection lost */
	KCOLL_PEER_STATE_MAX
};

#define KCOLL_MAX_PEERS		64

struct kcoll_ioc_peer_report {
	__u32 size;
	__u32 flags;			/* none defined: 0 */
	__u32 peer;			/* < KCOLL_MAX_PEERS: rank or host index */
	__u32 state;			/* enum kcoll_peer_state */
	__u32 latency_us;		/* last measured latency, 0 if unknown */
	__u32 bw_mbps;			/* last measured bandwidth in MB/s, 0 if unknown */
};

#define KCOLL_IOC_MAGIC		'k'
#define KCOLL_IOC_QUERY		_IOWR(KCOLL_IOC_MAGIC, 0x40, struct kcoll_ioc_query)
#define KCOLL_IOC_RING_CREATE	_IOWR(KCOLL_IOC_MAGIC, 0x41, struct kcoll_ioc_ring_create)
#define KCOLL_IOC_WAIT		_IOWR(KCOLL_IOC_MAGIC, 0x42, struct kcoll_ioc_wait)
#define KCOLL_IOC_WAKE		_IOWR(KCOLL_IOC_MAGIC, 0x43, struct kcoll_ioc_wake)
#define KCOLL_IOC_BUF_REGISTER	_IOWR(KCOLL_IOC_MAGIC, 0x44, struct kcoll_ioc_buf_register)
#define KCOLL_IOC_BUF_UNREGISTER _IOWR(KCOLL_IOC_MAGIC, 0x45, struct kcoll_ioc_buf_unregister)
#define KCOLL_IOC_BUF_GRANT	_IOWR(KCOLL_IOC_MAGIC, 0x46, struct kcoll_ioc_buf_grant)
#define KCOLL_IOC_BUF_IMPORT	_IOWR(KCOLL_IOC_MAGIC, 0x47, struct kcoll_ioc_buf_import)
#define KCOLL_IOC_PEER_REPORT	_IOWR(KCOLL_IOC_MAGIC, 0x48, struct kcoll_ioc_peer_report)
#define KCOLL_IOC_BUF_DMABUF	_IOWR(KCOLL_IOC_MAGIC, 0x49, struct kcoll_ioc_buf_dmabuf)

/* END kcoll.ko device ABI
 * ===========================================================================
 */

#endif /* _UAPI_LINUX_KCOLL_H */
