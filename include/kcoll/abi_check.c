// SPDX-License-Identifier: MIT
/*
 * Compile-time proof of the ring ABI: every size and offset that the kernel
 * module, kcolld and libkcoll share. Built for the native ABI and with -m32
 * (make builds both); a layout change fails the build, not a user.
 */
#include <stddef.h>
#include <linux/kcoll.h>

#define ABI_SIZE(type, n)	_Static_assert(sizeof(type) == (n), #type " size")
#define ABI_OFF(type, f, n)	_Static_assert(offsetof(type, f) == (n), #type "." #f " offset")

ABI_SIZE(struct kcoll_sqe, 64);
ABI_OFF(struct kcoll_sqe, opcode, 0);
ABI_OFF(struct kcoll_sqe, flags, 1);
ABI_OFF(struct kcoll_sqe, reserved0, 2);
ABI_OFF(struct kcoll_sqe, reserved1, 4);
ABI_OFF(struct kcoll_sqe, user_data, 8);
ABI_OFF(struct kcoll_sqe, coll, 16);
ABI_OFF(struct kcoll_sqe, xfer, 16);

ABI_SIZE(struct kcoll_sqe_coll, 48);
ABI_OFF(struct kcoll_sqe_coll, send_addr, 0);
ABI_OFF(struct kcoll_sqe_coll, recv_addr, 8);
ABI_OFF(struct kcoll_sqe_coll, count, 16);
ABI_OFF(struct kcoll_sqe_coll, comm_id, 24);
ABI_OFF(struct kcoll_sqe_coll, root, 28);
ABI_OFF(struct kcoll_sqe_coll, dtype, 32);
ABI_OFF(struct kcoll_sqe_coll, redop, 33);
ABI_OFF(struct kcoll_sqe_coll, send_mem, 34);
ABI_OFF(struct kcoll_sqe_coll, recv_mem, 35);
ABI_OFF(struct kcoll_sqe_coll, reserved, 36);

ABI_SIZE(struct kcoll_sqe_xfer, 48);
ABI_OFF(struct kcoll_sqe_xfer, entries_addr, 0);
ABI_OFF(struct kcoll_sqe_xfer, remote_seg, 8);
ABI_OFF(struct kcoll_sqe_xfer, nr_entries, 16);
ABI_OFF(struct kcoll_sqe_xfer, local_seg, 20);
ABI_OFF(struct kcoll_sqe_xfer, notify_id, 24);
ABI_OFF(struct kcoll_sqe_xfer, msg_len, 28);
ABI_OFF(struct kcoll_sqe_xfer, msg_addr, 32);
ABI_OFF(struct kcoll_sqe_xfer, reserved, 40);

ABI_SIZE(struct kcoll_xfer_entry, 24);
ABI_OFF(struct kcoll_xfer_entry, local_off, 0);
ABI_OFF(struct kcoll_xfer_entry, remote_off, 8);
ABI_OFF(struct kcoll_xfer_entry, len, 16);

ABI_SIZE(struct kcoll_cqe, 32);
ABI_OFF(struct kcoll_cqe, user_data, 0);
ABI_OFF(struct kcoll_cqe, res, 8);
ABI_OFF(struct kcoll_cqe, flags, 12);
ABI_OFF(struct kcoll_cqe, aux, 16);
ABI_OFF(struct kcoll_cqe, err_rank, 24);
ABI_OFF(struct kcoll_cqe, reserved, 28);

/* Header: identity line, then one 64-byte line per single-writer index. */
ABI_SIZE(struct kcoll_ring_hdr, 5 * KCOLL_RING_LINE);
ABI_OFF(struct kcoll_ring_hdr, magic, 0);
ABI_OFF(struct kcoll_ring_hdr, abi_version, 4);
ABI_OFF(struct kcoll_ring_hdr, hdr_size, 8);
ABI_OFF(struct kcoll_ring_hdr, features, 12);
ABI_OFF(struct kcoll_ring_hdr, sq_entries, 16);
ABI_OFF(struct kcoll_ring_hdr, cq_entries, 20);
ABI_OFF(struct kcoll_ring_hdr, sqe_size, 24);
ABI_OFF(struct kcoll_ring_hdr, cqe_size, 28);
ABI_OFF(struct kcoll_ring_hdr, sq_off, 32);
ABI_OFF(struct kcoll_ring_hdr, cq_off, 40);
ABI_OFF(struct kcoll_ring_hdr, ring_size, 48);
ABI_OFF(struct kcoll_ring_hdr, daemon_pid, 56);
ABI_OFF(struct kcoll_ring_hdr, sq_tail, 1 * KCOLL_RING_LINE);
ABI_OFF(struct kcoll_ring_hdr, sq_head, 2 * KCOLL_RING_LINE);
ABI_OFF(struct kcoll_ring_hdr, sq_flags, 2 * KCOLL_RING_LINE + 4);
ABI_OFF(struct kcoll_ring_hdr, status, 2 * KCOLL_RING_LINE + 8);
ABI_OFF(struct kcoll_ring_hdr, cq_tail, 3 * KCOLL_RING_LINE);
ABI_OFF(struct kcoll_ring_hdr, cq_head, 4 * KCOLL_RING_LINE);
ABI_OFF(struct kcoll_ring_hdr, cq_flags, 4 * KCOLL_RING_LINE + 4);
_Static_assert(sizeof(struct kcoll_ring_hdr) <= KCOLL_RING_HDR_SIZE, "header fits its page");
_Static_assert(KCOLL_DTYPE_MAX == 10 && KCOLL_REDOP_MAX == 5 && KCOLL_OP_MAX == 8, "enum ranges");
_Static_assert(KCOLL_XFER_MAX_ENTRIES == 4096 && KCOLL_SEG_MAX_NOTIFY == 1024 &&
	       KCOLL_NOTIFY_NONE == 0xffffffffU, "KV transfer limits are ABI");
