// SPDX-License-Identifier: MIT
/* Validation of one untrusted SQE, field by field. Pure: fuzzed directly. */
#include <errno.h>

#include <kcoll/kcoll.h>

#include "kcolld.h"

static int xfer_check(const struct kcoll_sqe *s, const char **why)
{
	const struct kcoll_sqe_xfer *x = &s->xfer;

	for (unsigned int i = 0; i < sizeof(x->reserved) / sizeof(x->reserved[0]); i++) {
		if (x->reserved[i]) {
			*why = "reserved transfer fields not zero";
			return -EINVAL;
		}
	}
	if (s->flags) {
		*why = "flags given to a transfer";
		return -EINVAL;
	}
	if (x->nr_entries > KCOLL_XFER_MAX_ENTRIES) {
		*why = "batch longer than KCOLL_XFER_MAX_ENTRIES";
		return -E2BIG;
	}
	if (x->nr_entries && (!x->entries_addr ||
	    x->entries_addr + (uint64_t)x->nr_entries * sizeof(struct kcoll_xfer_entry) < x->entries_addr)) {
		*why = "NULL or wrapping entry array";
		return -EFAULT;
	}
	if (x->msg_len > KCOLL_NOTIF_MAX_BYTES) {
		*why = "notification longer than KCOLL_NOTIF_MAX_BYTES";
		return -EMSGSIZE;
	}
	if (x->msg_len && (!x->msg_addr || x->msg_addr + x->msg_len < x->msg_addr)) {
		*why = "NULL or wrapping notification";
		return -EFAULT;
	}
	if (!x->msg_len && x->msg_addr) {
		*why = "notification address without a length";
		return -EINVAL;
	}
	return 0;
}

int kd_sqe_check(const struct kcoll_sqe *s, const char **why)
{
	const struct kcoll_sqe_coll *c = &s->coll;
	size_t esz;

	if (s->opcode >= KCOLL_OP_MAX) {
		*why = "unknown opcode";
		return -EINVAL;
	}
	if (s->flags & ~KCOLL_SQE_F_ALL) {
		*why = "unknown flags";
		return -EINVAL;
	}
	if (s->reserved0 || s->reserved1) {
		*why = "reserved header fields not zero";
		return -EINVAL;
	}
	switch (s->opcode) {
	case KCOLL_OP_NOP:
		return 0;
	case KCOLL_OP_XFER_WRITE:
	case KCOLL_OP_XFER_READ:
		return xfer_check(s, why);
	default:
		break;
	}
	if (c->reserved[0] || c->reserved[1] || c->reserved[2]) {
		*why = "reserved collective fields not zero";
		return -EINVAL;
	}
	if (c->dtype >= KCOLL_DTYPE_MAX) {
		*why = "unknown data type";
		return -EINVAL;
	}
	if (c->redop >= KCOLL_REDOP_MAX) {
		*why = "unknown reduction operator";
		return -EINVAL;
	}
	if ((s->opcode == KCOLL_OP_ALLGATHER || s->opcode == KCOLL_OP_BROADCAST ||
	     s->opcode == KCOLL_OP_BARRIER) && c->redop) {
		*why = "reduction operator given to a collective that does not reduce";
		return -EINVAL;
	}
	if (s->opcode != KCOLL_OP_BROADCAST && c->root) {
		*why = "root given to a collective that has none";
		return -EINVAL;
	}
	if (c->send_mem >= KCOLL_MEM_KIND_MAX || c->recv_mem >= KCOLL_MEM_KIND_MAX) {
		*why = "unknown memory kind";
		return -EINVAL;
	}
	if ((c->send_mem != KCOLL_MEM_HOST || c->recv_mem != KCOLL_MEM_HOST) &&
	    kd_gpu_ready(NULL, 0)) {
		*why = "device buffers need a GPU in kcolld (run 'kcollctl gpu')";
		return -EOPNOTSUPP;
	}
	if (s->opcode == KCOLL_OP_BARRIER) {
		if (c->count || c->send_addr || c->recv_addr) {
			*why = "barrier takes no buffers";
			return -EINVAL;
		}
		return 0;
	}
	esz = kcoll_dtype_size(c->dtype);
	if (c->count > KD_MAX_BYTES / esz) {
		*why = "count too large";
		return -EOVERFLOW;
	}
	if (c->count && (!c->recv_addr || !c->send_addr)) {
		*why = "NULL buffer";
		return -EFAULT;
	}
	if ((s->flags & KCOLL_SQE_F_IN_PLACE) && c->send_addr != c->recv_addr) {
		*why = "in-place flag with different send and recv buffers";
		return -EINVAL;
	}
	return 0;
}

static int ranges_overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
	return alen && blen && a < b + blen && b < a + alen;
}

int kd_coll_sizes(const struct kcoll_sqe *s, uint32_t nranks, uint32_t rank,
		  uint64_t *send_bytes, uint64_t *recv_bytes)
{
	const struct kcoll_sqe_coll *c = &s->coll;
	uint64_t n = c->count * kcoll_dtype_size(c->dtype);
	uint64_t sb = n, rb = n;

	if (s->opcode == KCOLL_OP_BARRIER) {
		*send_bytes = *recv_bytes = 0;
		return 0;
	}
	if (s->opcode == KCOLL_OP_BROADCAST && c->root >= nranks)
		return -EINVAL;
	if (n > KD_MAX_BYTES / nranks)
		return -EOVERFLOW;
	if (s->opcode == KCOLL_OP_REDUCE_SCATTER)
		sb = n * nranks;
	else if (s->opcode == KCOLL_OP_ALLGATHER)
		rb = n * nranks;
	if (c->send_addr + sb < c->send_addr || c->recv_addr + rb < c->recv_addr)
		return -EFAULT;
	/* Aliasing: only NCCL's in-place forms, where every element is read
	 * before the same element is written; any other overlap is refused. */
	if (s->opcode != KCOLL_OP_BROADCAST && ranges_overlap(c->send_addr, sb, c->recv_addr, rb)) {
		int ok = 0;

		if (s->opcode == KCOLL_OP_ALLREDUCE)
			ok = c->send_addr == c->recv_addr;
		else if (s->opcode == KCOLL_OP_REDUCE_SCATTER)
			ok = c->recv_addr == c->send_addr + (uint64_t)rank * n;
		else if (s->opcode == KCOLL_OP_ALLGATHER)
			ok = c->send_addr == c->recv_addr + (uint64_t)rank * n;
		if (!ok)
			return -EINVAL;
	}
	*send_bytes = sb;
	*recv_bytes = rb;
	return 0;
}
