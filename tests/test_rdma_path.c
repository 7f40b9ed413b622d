// SPDX-License-Identifier: MIT
/*
 * The RDMA transport's pieces that need no device (issue 6): the planner's
 * path knobs (kd_rdma_path_for: KCOLL_IB_FLOW_LABEL, KCOLL_IB_UDP_SPORT,
 * KCOLL_IB_QP_ADDRS), the flow label <-> UDP source port mapping, and the
 * registration cache / device-removal calls when no device is open (the
 * host tier has no RDMA subsystem; tests/vm/t_rdma.sh covers them on rxe).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcoll/tap.h"

#include "kcolld.h"
#include "rdma.h"
#include "xport_rdma.h"

int main(void)
{
	struct kcoll_rdma_path p;
	uint32_t bad = 0;
	int ok;

	/* Every port of the RoCE v2 range has a label that gives it. */
	for (uint32_t s = 0xc000; s <= 0xffff; s++)
		bad += kcoll_rdma_udp_sport(kcoll_rdma_flow_label_for_sport((uint16_t)s), 1, 2) != s;
	tap_ok(!bad, "flow_label_for_sport: all 16384 UDP source ports map back to themselves (%u wrong)", bad);
	/* The kernel's formula: 0xC000 | (low 14 bits ^ high 6 bits). */
	tap_ok(kcoll_rdma_udp_sport(0x12345, 0, 0) == (0xc000 | ((0x12345 & 0x3fff) ^ (0x12345 >> 14))),
	       "a 20-bit label folds its high 6 bits into the port");
	tap_ok(kcoll_rdma_udp_sport(0, 17, 33) == kcoll_rdma_udp_sport(0, 33, 17),
	       "label 0: the port derived from the QP numbers is the same on both sides");

	unsetenv("KCOLL_IB_FLOW_LABEL");
	unsetenv("KCOLL_IB_UDP_SPORT");
	unsetenv("KCOLL_IB_QP_ADDRS");
	p = kd_rdma_path_for("test", 1, 0);
	tap_ok(!p.flow_label && !p.own_port, "no knobs: label 0 (the device picks), the peer's GID");

	setenv("KCOLL_IB_FLOW_LABEL", "4096", 1);
	ok = 1;
	for (uint32_t q = 0; q < 4; q++)
		ok &= kd_rdma_path_for("test", 1, q).flow_label == 4096 + q;
	tap_ok(ok, "KCOLL_IB_FLOW_LABEL=4096: QP i gets 4096 + i");

	setenv("KCOLL_IB_UDP_SPORT", "0xd100", 1);
	ok = 1;
	for (uint32_t q = 0; q < 4; q++) {
		p = kd_rdma_path_for("test", 1, q);
		ok &= kcoll_rdma_udp_sport(p.flow_label, 5, 6) == 0xd100 + q;
	}
	tap_ok(ok, "KCOLL_IB_UDP_SPORT=0xd100 overrides the label: QP i leaves from port 0xd100 + i");
	setenv("KCOLL_IB_UDP_SPORT", "0xffff", 1);
	p = kd_rdma_path_for("test", 1, 1);
	tap_ok(kcoll_rdma_udp_sport(p.flow_label, 5, 6) == 0xc000,
	       "KCOLL_IB_UDP_SPORT=0xffff: QP 1 wraps to 0xc000, inside the range");
	setenv("KCOLL_IB_UDP_SPORT", "80", 1);
	p = kd_rdma_path_for("test", 1, 0);
	tap_ok(p.flow_label == 4096, "KCOLL_IB_UDP_SPORT outside 0xc000..0xffff is ignored (the label rules)");
	unsetenv("KCOLL_IB_UDP_SPORT");
	unsetenv("KCOLL_IB_FLOW_LABEL");

	/* Addresses per QP: without a device none has a GID, and a bad entry is
	 * refused; either way the QP keeps the peer's GID (a warning says why). */
	setenv("KCOLL_IB_QP_ADDRS", "10.31.0.1,not-an-address", 1);
	tap_ok(!kd_rdma_path_for("test", 1, 0).own_port && !kd_rdma_path_for("test", 1, 1).own_port &&
		       !kd_rdma_path_for("test", 1, 3).own_port,
	       "KCOLL_IB_QP_ADDRS with no device, or not an address: the QP keeps the peer's GID");
	unsetenv("KCOLL_IB_QP_ADDRS");

	/* No device open: the cache and device-removal calls are harmless. */
	{
		struct kcoll_rdma_port port;
		struct ibv_mr *mr = NULL;
		char why[KCOLL_RDMA_WHY] = "";
		char buf[64];

		kcoll_rdma_mr_invalidate(buf, sizeof(buf));
		tap_ok(kcoll_rdma_mr_count() == 0, "invalidate of an unregistered range: the cache stays empty");
		tap_ok(kcoll_rdma_mr_get(0, buf, sizeof(buf), &mr) == -EINVAL && !mr,
		       "mr_get on a device that is not open: -EINVAL");
		tap_ok(kcoll_rdma_reap() == 0 && kcoll_rdma_rescan() == 0,
		       "reap and rescan with no device open: nothing closed or opened");
		tap_ok(kcoll_rdma_pick_gid_ip(0x0100007f, &port, why, sizeof(why)) == -EADDRNOTAVAIL && why[0],
		       "pick_gid_ip with no device: -EADDRNOTAVAIL and a reason (%s)", why);
		tap_ok(kcoll_rdma_async_fd(0) == -1, "async_fd of a device that is not open: -1");
	}
	return tap_done();
}
