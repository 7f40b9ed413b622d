// SPDX-License-Identifier: MIT
/*
 * The verbs layer's public calls (rdma/rdma.h: what the KV-cache engine
 * uses) on a real device: two endpoints in one process, each on the GID of
 * its own address, connected to each other; WRITE_WITH_IMM, plain WRITE and
 * READ between registered buffers, checked byte for byte; the registration
 * cache; bad arguments. Needs an RDMA device (tests/vm/t_rdma.sh runs it on
 * Soft-RoCE); without one it prints SKIP.
 *   rdma_onesided ADDR_A ADDR_B     two local IPv4 addresses with RoCE v2 GIDs
 * TAP.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdma.h"

static int n, failed;

static void ok(int cond, const char *what)
{
	n++;
	printf("%sok %d - %s\n", cond ? "" : "not ", n, what);
	failed |= !cond;
}

/* Wait for one completion of ep (bounded). */
static int wait_one(struct kcoll_rdma_ep *ep, struct ibv_wc *wc)
{
	for (int i = 0; i < 100; i++) {
		int r = kcoll_rdma_poll(ep, wc, 1, 100);

		if (r)
			return r;
	}
	return -ETIMEDOUT;
}

int main(int argc, char **argv)
{
	struct kcoll_rdma_port pa, pb, px;
	struct kcoll_rdma_ep *a = NULL, *b = NULL;
	struct ibv_mr *ma = NULL, *mb = NULL, *m2 = NULL;
	struct ibv_wc wc;
	uint32_t ipa, ipb, ipx, imm = 0x1234567;
	char why[KCOLL_RDMA_WHY];
	size_t len = 1 << 20, before;
	uint8_t *ba, *bb;
	int r;

	if (argc != 3 || inet_pton(AF_INET, argv[1], &ipa) != 1 || inet_pton(AF_INET, argv[2], &ipb) != 1) {
		fprintf(stderr, "usage: rdma_onesided ADDR_A ADDR_B\n");
		return 2;
	}
	if (kcoll_rdma_init()) {
		printf("ok 1 # SKIP %s\n1..1\n", kcoll_rdma_why());
		return 0;
	}
	r = kcoll_rdma_pick_gid(ipa, &pa, why, sizeof(why));
	ok(!r && pa.gid.raw[10] == 0xff && !memcmp(pa.gid.raw + 12, &ipa, 4), "GID picked for address A");
	r = kcoll_rdma_pick_gid(ipb, &pb, why, sizeof(why));
	ok(!r && !memcmp(pb.gid.raw + 12, &ipb, 4) && pb.gid_index != pa.gid_index,
	   "another GID index for address B");
	inet_pton(AF_INET, "192.0.2.77", &ipx);
	r = kcoll_rdma_pick_gid(ipx, &px, why, sizeof(why));
	printf("# %s\n", why);
	ok(r == -EADDRNOTAVAIL && strstr(why, "no RoCE v2 GID carries 192.0.2.77") && strstr(why, "GIDs:"),
	   "an address without a GID: -EADDRNOTAVAIL, the GIDs listed and what to do");

	ok(!kcoll_rdma_ep_create(&pa, 2, NULL, 8, 8, &a) && !kcoll_rdma_ep_create(&pb, 2, NULL, 8, 8, &b),
	   "two endpoints, 2 RC QPs each");
	if (!a || !b)
		goto out;
	ok(kcoll_rdma_ep_create(&pa, 0, NULL, 8, 8, &(struct kcoll_rdma_ep *){ NULL }) == -EINVAL &&
	   kcoll_rdma_ep_create(&pa, KCOLL_RDMA_MAX_QPS + 1, NULL, 8, 8, &(struct kcoll_rdma_ep *){ NULL }) == -EINVAL,
	   "0 or too many QPs: -EINVAL");
	for (uint32_t i = 0; i < 2; i++)
		kcoll_rdma_post_recv(b, i, 100 + i);
	struct kcoll_rdma_addr bad = a->local;

	bad.nqp = 3;
	r = kcoll_rdma_ep_connect(b, &bad, why, sizeof(why));
	ok(r == -EPROTO && strstr(why, "KCOLL_IB_QPS"), "a peer with another QP count is refused, saying why");
	ok(!kcoll_rdma_ep_connect(a, &b->local, why, sizeof(why)) &&
	   !kcoll_rdma_ep_connect(b, &a->local, why, sizeof(why)), "connected (INIT -> RTR -> RTS)");
	ok(kcoll_rdma_ep_qp_state(a, 0) == IBV_QPS_RTS && kcoll_rdma_ep_qp_state(b, 1) == IBV_QPS_RTS &&
	   !strcmp(kcoll_rdma_qp_state_name(kcoll_rdma_ep_qp_state(a, 1)), "RTS"), "QPs in RTS");

	ba = aligned_alloc(4096, len);
	bb = aligned_alloc(4096, len);
	for (size_t i = 0; i < len; i++) {
		ba[i] = (uint8_t)(i * 7 + 3);
		bb[i] = 0;
	}
	before = kcoll_rdma_mr_count();
	ok(!kcoll_rdma_mr_get(pa.dev, ba, len, &ma) && !kcoll_rdma_mr_get(pb.dev, bb, len, &mb) &&
	   kcoll_rdma_mr_count() == before + 2, "two registrations");
	if (!ma || !mb) {
		free(ba);
		free(bb);
		goto out;
	}
	ok(!kcoll_rdma_mr_get(pa.dev, ba + 4096, 8192, &m2) && m2 == ma && kcoll_rdma_mr_count() == before + 2,
	   "a range inside a registration: cache hit, same MR");
	ok(kcoll_rdma_mr_get(pa.dev, ba, 0, &m2) == -EINVAL && kcoll_rdma_mr_get(99, ba, 1, &m2) == -EINVAL,
	   "zero length or unknown device: -EINVAL");

	/* WRITE_WITH_IMM a -> b: b's receive completes with the immediate. */
	r = kcoll_rdma_write(a, 1, ma, ba, len, (uintptr_t)bb, mb->rkey, &imm, 7);
	ok(!r && wait_one(a, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 7, "WRITE_WITH_IMM completes");
	r = wait_one(b, &wc);
	ok(r == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
	   ntohl(wc.imm_data) == imm && wc.wr_id == 101 && !memcmp(ba, bb, len),
	   "the peer sees the immediate on the same QP, and every byte");

	/* Plain WRITE of a slice, then READ it back into another place. */
	memset(ba, 0x5a, 4096);
	r = kcoll_rdma_write(a, 0, ma, ba, 4096, (uintptr_t)bb + 8192, mb->rkey, NULL, 8);
	ok(!r && wait_one(a, &wc) == 1 && wc.status == IBV_WC_SUCCESS && bb[8192] == 0x5a && bb[8192 + 4095] == 0x5a,
	   "plain WRITE lands");
	memset(ba + 65536, 0, 4096);
	r = kcoll_rdma_read(a, 0, ma, ba + 65536, 4096, (uintptr_t)bb + 8192, mb->rkey, 9);
	ok(!r && wait_one(a, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 9 &&
	   !memcmp(ba + 65536, bb + 8192, 4096), "READ brings it back");

	ok(kcoll_rdma_write(a, 2, ma, ba, 1, 0, 0, NULL, 0) == -EINVAL &&
	   kcoll_rdma_read(a, 0, ma, ba, 0, 0, 0, 0) == -EINVAL &&
	   kcoll_rdma_write(a, 0, NULL, ba, 16, 0, 0, NULL, 0) == -EINVAL &&
	   kcoll_rdma_post_recv(a, 9, 0) == -EINVAL, "bad QP index, zero-length read, no MR: -EINVAL");

	/* A bad rkey: the QP goes to the error state, the op says so. */
	r = kcoll_rdma_write(a, 0, ma, ba, 64, (uintptr_t)bb, mb->rkey ^ 0x5500, NULL, 10);
	ok(!r && wait_one(a, &wc) == 1 && wc.status != IBV_WC_SUCCESS &&
	   kcoll_rdma_ep_qp_state(a, 0) == IBV_QPS_ERR, "a write to a bad rkey fails and the QP is in ERR");
	printf("# bad rkey: %s\n", ibv_wc_status_str(wc.status));

	kcoll_rdma_mr_invalidate(ba, len);
	kcoll_rdma_mr_invalidate(bb, len);
	ok(kcoll_rdma_mr_count() == before, "invalidate drops the registrations");
	free(ba);
	free(bb);
out:
	kcoll_rdma_ep_destroy(a);
	kcoll_rdma_ep_destroy(b);
	kcoll_rdma_fini();
	printf("1..%d\n", n);
	return failed;
}
