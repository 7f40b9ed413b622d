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
	__u32 reserved[5];		/* must be zero */
};

#define KCOLL_NOTIFY_NONE	0xffffffffU

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

#endif /* _UAPI_LINUX_KCOLL_H */
