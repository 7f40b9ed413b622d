// SPDX-License-Identifier: MIT
/*
 * Lanes (docs/multihost.md "Lanes"): with one rank on every host and few
 * hosts, the ranks all-reduce small messages themselves over a connection
 * per host pair that the daemons set up. Here: the root's choice of the
 * communicator's lane size, and a peer's lane arriving, a HELLO kind
 * (KD_CONN_LANE) that main.c registers in net.c's table like KV's. The
 * member connects its lanes with the rest of its connections at GO
 * (net_boot.c); the local rank takes its lanes with kd_comm_take_lane
 * (comm.c). Calls net_conn.c.
 */
#include <errno.h>
#include <stdio.h>

#include "kcolld.h"
#include "mh.h"
#include "net.h"
#include "net_int.h"

/*
 * Lanes (docs/multihost.md): with one rank on every host and few hosts, the
 * ranks all-reduce small messages themselves over a connection per host pair
 * that the daemons set up, the root's KCOLL_LANE_BYTES deciding for all.
 */
uint32_t net_lane_bytes(const struct kd_boot *b)
{
	/* Lanes move host memory only, and libkcoll cannot copy device memory
	 * itself: a rank that may pass device buffers keeps the ops on kcolld. */
	if (b->nd < 2 || b->nd != b->nranks || b->nd > KD_LANE_MAX_HOSTS || b->gpu)
		return 0;
	return atomic_load(&kd_net.lane_bytes);
}

/*
 * A peer's lane (net.c's HELLO table): a host before us in the table
 * connects one when the root gave the communicator lanes. Kept for the
 * local rank, which takes it (kd_comm_take_lane); it is one of the
 * connections the communicator waits for.
 */
int kd_net_lane_accept(int fd, const struct kd_p_hello *m, char *why, size_t len)
{
	struct kd_comm *comm = net_comm_find(m->token);
	struct kd_mh *mh = comm ? comm->mh : NULL;

	if (!mh) {
		snprintf(why, len, "no communicator here is forming with that token");
		return -ENOENT;
	}
	if (m->from_host >= mh->self || !mh->lane_bytes ||
	    mh->hosts[m->from_host].info.nonce != m->nonce) {
		snprintf(why, len, "unexpected connection (kind %u, host %u, stream %u)", m->kind,
			 m->from_host, m->stream);
		return -EPROTO;
	}
	if (mh->hosts[m->from_host].lane >= 0) {
		snprintf(why, len, "duplicate lane");
		return -EEXIST;
	}
	mh->hosts[m->from_host].lane = fd;
	mh->conns_up++;
	net_check_up(comm);
	return 0;
}
