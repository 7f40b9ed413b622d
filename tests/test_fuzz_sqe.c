// SPDX-License-Identifier: MIT
/*
 * Fuzz target for the daemon's ring consumer front end: arbitrary bytes are
 * laid out as a ring (indices + SQE array) and consumed the way kcolld's ring
 * thread does: index check, copy-out, kd_sqe_check, kd_coll_sizes. Invariants
 * that must hold for anything accepted are asserted (abort = finding).
 *
 * Two builds: in `make check` a main() feeds a fixed-seed stream of random
 * and mutated inputs; `make fuzz` builds the same file with clang's libFuzzer
 * (-DKCOLL_LIBFUZZER) for open-ended coverage-guided runs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcoll/kcoll.h>
#include <kcoll/ring.h>

#include "../user/daemon/kcolld.h"

#define NSQE	16

static unsigned long n_accepted, n_refused;

static void check(int cond, const char *what)
{
	if (!cond) {
		fprintf(stderr, "fuzz invariant violated: %s\n", what);
		abort();
	}
}

static void consume_one(const struct kcoll_sqe *sqe, uint32_t nranks, uint32_t rank)
{
	const char *why = NULL;
	uint64_t sb = 0, rb = 0;
	int r = kd_sqe_check(sqe, &why);

	if (r) {
		check(r < 0 && why && *why, "a refusal has an errno and a reason");
		n_refused++;
		return;
	}
	check(sqe->opcode < KCOLL_OP_MAX, "only known opcodes pass");
	if (sqe->opcode == KCOLL_OP_NOP)
		return;
	if (sqe->opcode == KCOLL_OP_XFER_WRITE || sqe->opcode == KCOLL_OP_XFER_READ) {
		check(sqe->xfer.nr_entries <= KCOLL_XFER_MAX_ENTRIES, "batch within the limit");
		check(!sqe->flags && !sqe->xfer.reserved[0] && !sqe->xfer.reserved[1],
		      "transfer flags and reserved fields zero");
		check(sqe->xfer.msg_len <= KCOLL_NOTIF_MAX_BYTES &&
		      !sqe->xfer.msg_len == !sqe->xfer.msg_addr, "notification within the limit");
		check(!sqe->xfer.nr_entries || sqe->xfer.entries_addr, "entry array given");
		n_accepted++;
		return;
	}
	check(sqe->coll.dtype < KCOLL_DTYPE_MAX && sqe->coll.redop < KCOLL_REDOP_MAX, "enums in range");
	check(!sqe->reserved0 && !sqe->reserved1 && !sqe->coll.reserved[0], "reserved fields zero");
	r = kd_coll_sizes(sqe, nranks, rank, &sb, &rb);
	if (r) {
		n_refused++;
		return;
	}
	n_accepted++;
	check(sb <= KD_MAX_BYTES && rb <= KD_MAX_BYTES, "sizes bounded");
	check(sqe->coll.send_addr + sb >= sqe->coll.send_addr, "send range does not wrap");
	check(sqe->coll.recv_addr + rb >= sqe->coll.recv_addr, "recv range does not wrap");
	if (sqe->opcode == KCOLL_OP_ALLREDUCE && sb && sqe->coll.send_addr != sqe->coll.recv_addr)
		check(sqe->coll.send_addr + sb <= sqe->coll.recv_addr ||
		      sqe->coll.recv_addr + rb <= sqe->coll.send_addr, "accepted buffers are disjoint");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct {
		struct kcoll_ring_hdr hdr;
		struct kcoll_sqe sq[NSQE];
	} ring;
	struct kcoll_queue q;
	uint32_t head, nranks, rank;
	int64_t n;

	if (size < 12)
		return 0;
	memcpy(&head, data, 4);
	memcpy(&ring.hdr.sq_tail, data + 4, 4);
	nranks = data[8] % KD_MAX_RANKS + 1;
	rank = data[9] % nranks;
	memset(ring.sq, 0, sizeof(ring.sq));
	memcpy(ring.sq, data + 12, size - 12 < sizeof(ring.sq) ? size - 12 : sizeof(ring.sq));
	ring.hdr.sq_head = head;
	kcoll_queue_init(&q, &ring.hdr.sq_head, &ring.hdr.sq_tail, ring.sq, NSQE, sizeof(struct kcoll_sqe));

	n = kcoll_queue_ready(&q);
	if (n < 0) {
		check((uint32_t)(ring.hdr.sq_tail - head) > NSQE, "only impossible tails are refused");
		return 0;
	}
	check(n <= NSQE, "never more ready than the ring holds");
	for (int64_t i = 0; i < n; i++) {
		struct kcoll_sqe sqe;

		kcoll_queue_copy(&q, i, &sqe);
		consume_one(&sqe, nranks, rank);
	}
	kcoll_queue_release(&q, n);
	return 0;
}

#ifdef KCOLL_LIBFUZZER
/* The libFuzzer build links sqe.c alone, without kcolld's memory layer
 * (user/daemon/mem.c): no GPU, so device buffers are refused, as in a
 * kcolld without one. (make check links the real one.) */
int kd_gpu_ready(char *why, size_t len)
{
	if (why && len)
		snprintf(why, len, "no GPU in the fuzz build");
	return -ENODEV;
}
#else
#include <kcoll/tap.h>

/* Random bytes mostly fail validation early; also mutate a valid SQE one
 * field at a time so the deeper checks see inputs. */
int main(void)
{
	uint8_t buf[12 + NSQE * sizeof(struct kcoll_sqe)];
	unsigned int seed = 12345;
	const int iters = 200000;

	for (int it = 0; it < iters; it++) {
		size_t len = 12 + rand_r(&seed) % (sizeof(buf) - 11);

		for (size_t i = 0; i < len; i++)
			buf[i] = rand_r(&seed);
		if (it & 1) {
			/* A plausible ring: small distance, valid-looking SQEs. */
			uint32_t head = rand_r(&seed), tail = head + rand_r(&seed) % (NSQE + 2);

			memcpy(buf, &head, 4);
			memcpy(buf + 4, &tail, 4);
			for (int e = 0; e < NSQE && 12 + (e + 1) * 64 <= (int)len; e++) {
				struct kcoll_sqe s = { .opcode = 1 + rand_r(&seed) % 5 };

				s.coll.dtype = rand_r(&seed) % 11;
				s.coll.redop = rand_r(&seed) % 6;
				s.coll.count = rand_r(&seed) % 4 ? (uint64_t)(rand_r(&seed) % 100000) :
					       (uint64_t)rand_r(&seed) << 33;
				s.coll.send_addr = (uint64_t)rand_r(&seed) << (rand_r(&seed) % 40);
				s.coll.recv_addr = rand_r(&seed) % 3 ? s.coll.send_addr + rand_r(&seed) % 8192 :
						   s.coll.send_addr;
				/* flip one random byte */
				((uint8_t *)&s)[rand_r(&seed) % sizeof(s)] ^= rand_r(&seed) % 3 ? 0 : 1u << (rand_r(&seed) % 8);
				memcpy(buf + 12 + e * 64, &s, sizeof(s));
			}
		}
		LLVMFuzzerTestOneInput(buf, len);
	}
	/* A broken invariant aborts (the runner reports the crash); here we
	 * check both the accepting and the refusing paths were exercised. */
	tap_ok(n_accepted > 1000 && n_refused > 1000,
	       "%d fuzz inputs, no invariant broken: %lu SQEs accepted, %lu refused",
	       iters, n_accepted, n_refused);
	return tap_done();
}
#endif
