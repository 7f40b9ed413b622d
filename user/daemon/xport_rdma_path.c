// SPDX-License-Identifier: MIT
/*
 * The paths of the RDMA transport's QPs (kd_rdma_path_for): flow labels,
 * UDP source ports and local GIDs from the KCOLL_IB_* path knobs
 * (docs/rdma.md, "Path control"). Apart from xport_rdma.c so that
 * tests/test_rdma_path.c checks the knobs without a device.
 */
#include <arpa/inet.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "xport_rdma.h"

/* Entry i % n of a comma-separated list, in out (empty when the list is). */
static void list_item(const char *list, uint32_t i, char *out, size_t cap)
{
	uint32_t n = 1;
	const char *s = list;

	*out = 0;
	if (!*list)
		return;
	for (const char *q = list; *q; q++)
		n += *q == ',';
	for (i %= n; i; i--)
		s = strchr(s, ',') + 1;
	size_t len = strcspn(s, ",");

	if (len < cap) {
		memcpy(out, s, len);
		out[len] = 0;
	}
}

struct kcoll_rdma_path kd_rdma_path_for(const char *comm, uint32_t host, uint32_t qp)
{
	/*
	 * Default: spread a peer's QPs over distinct flow labels (and so UDP
	 * source ports where the device derives them from the label).
	 * KCOLL_IB_FLOW_LABEL gives the first label, KCOLL_IB_UDP_SPORT the
	 * first UDP source port instead (QP i: +i); KCOLL_IB_QP_ADDRS pins QP i
	 * to the port and GID of local address i (round robin over the list),
	 * else every QP uses the peer's (the GID of the address its data
	 * stream leaves from). A planner may override all of it per host.
	 */
	long long base = kcoll_knob_ll("KCOLL_IB_FLOW_LABEL"), sport = kcoll_knob_ll("KCOLL_IB_UDP_SPORT");
	struct kcoll_rdma_path p = { 0 };
	char a[64], why[KCOLL_RDMA_WHY];
	struct in_addr ip;

	if (sport >= 0xc000 && sport <= 0xffff)
		p.flow_label = kcoll_rdma_flow_label_for_sport((uint16_t)(0xc000 | ((sport + qp) & 0x3fff)));
	else if (base > 0)
		p.flow_label = (uint32_t)((base + qp) & 0xfffff);
	list_item(kcoll_knob_str("KCOLL_IB_QP_ADDRS"), qp, a, sizeof(a));
	if (!*a)
		return p;
	if (inet_pton(AF_INET, a, &ip) != 1)
		kc_warn("comm %s: KCOLL_IB_QP_ADDRS entry '%s' is not an IPv4 address: QP %u to host %u uses "
			"the peer's GID", comm, a, qp, host);
	else if (kcoll_rdma_pick_gid_ip(ip.s_addr, &p.port, why, sizeof(why)))
		kc_warn("comm %s: KCOLL_IB_QP_ADDRS: QP %u to host %u: %s; it uses the peer's GID", comm,
			qp, host, why);
	else
		p.own_port = true;
	return p;
}
