// SPDX-License-Identifier: MIT
/*
 * The "net" part of kcollctl status (status.c calls it): this daemon's
 * address and settings, and each multi-host communicator's hosts, C4
 * summary (c4d.c's hooks) and transport (its ops table's render). Reads
 * net_conn.c's state; calls net.c's kd_algo_name.
 */
#include <arpa/inet.h>
#include <stdio.h>

#include "c4d.h"
#include "kcolld.h"
#include "mh.h"
#include "net.h"
#include "net_int.h"
#include "step.h"
#include "xport.h"

static uint32_t c4_summary(struct kd_comm *comm, uint64_t *seen)
{
	*seen = 0;
	return kd_c4 ? kd_c4->summary(comm, seen) : 0;
}

size_t kd_net_render(char *buf, size_t cap, int json)
{
	size_t n = 0;
	char a[32];
	uint64_t seen;
	uint32_t na;

#define PUT(...) do { if (n < cap) n += snprintf(buf + n, cap - n, __VA_ARGS__); } while (0)
	if (json) {
		PUT("\"net\":{\"port\":%u,\"algo\":\"%s\",\"streams\":%u,\"lane_bytes\":%u,\"addrs\":[",
		    kd_net.me.port, kd_algo_name(atomic_load(&kd_net.algo)), atomic_load(&kd_net.nstreams),
		    atomic_load(&kd_net.lane_bytes));
		for (uint32_t i = 0; i < kd_net.me.naddrs; i++) {
			struct in_addr in = { .s_addr = kd_net.me.addrs[i] };

			PUT("%s\"%s\"", i ? "," : "", inet_ntoa(in));
		}
		PUT("],\"rejected\":%lu,\"garbage\":%lu,\"comms\":[", atomic_load(&kd_net.rejected),
		    atomic_load(&kd_net.garbage));
		bool first = true;

		for (struct kd_comm *c = kd.comms; c; c = c->next) {
			struct kd_mh *mh = c->mh;

			if (!mh)
				continue;
			PUT("%s{\"name\":\"%s\",\"hosts\":%u,\"self\":%u,\"algo\":\"%s\",\"streams\":%u,"
			    "\"lane_bytes\":%u,\"bytes_sent\":%lu,"
			    "\"bytes_recv\":%lu,\"peers\":[", first ? "" : ",", c->name, mh->nhosts,
			    mh->self, kd_algo_name(mh->algo), mh->nstreams, mh->lane_bytes,
			    (unsigned long)atomic_load(&mh->bytes_sent),
			    (unsigned long)atomic_load(&mh->bytes_recv));
			first = false;
			for (uint32_t h = 0; h < mh->nhosts; h++)
				PUT("%s{\"host\":%u,\"name\":\"%s\",\"first_rank\":%u,\"ranks\":%u,"
				    "\"dead\":%s}", h ? "," : "", h, mh->hosts[h].info.name,
				    mh->hosts[h].first_rank, mh->hosts[h].nranks,
				    mh->hosts[h].dead ? "true" : "false");
			na = c4_summary(c, &seen);
			PUT("],\"c4_active\":%u,\"c4_seen_by\":[", na);
			for (uint32_t h = 0, k = 0; h < 64; h++)
				if (seen & (1ULL << h))
					PUT("%s%u", k++ ? "," : "", h);
			PUT("],\"xport\":\"%s\"", mh->xport->name);
			if (n + 1 < cap) {
				/* the transport's member, after a comma if it has one */
				size_t xn = kd_step_render(mh, buf + n + 1, cap - n - 1, 1);

				if (xn) {
					buf[n] = ',';
					n += 1 + xn;
				}
			}
			PUT("}");
		}
		PUT("]}");
	} else {
		net_addr_str(kd_net.me.addrs[0], kd_net.me.port, a, sizeof(a));
		PUT("peers: port %u, reachable at %s", kd_net.me.port, a);
		for (uint32_t i = 1; i < kd_net.me.naddrs; i++) {
			struct in_addr in = { .s_addr = kd_net.me.addrs[i] };

			PUT(", %s", inet_ntoa(in));
		}
		PUT("; algo %s, streams per peer %u (0: one per shared network), lanes up to %u B; "
		    "%lu peers rejected\n", kd_algo_name(atomic_load(&kd_net.algo)), atomic_load(&kd_net.nstreams),
		    atomic_load(&kd_net.lane_bytes), atomic_load(&kd_net.rejected));
		for (struct kd_comm *c = kd.comms; c; c = c->next) {
			struct kd_mh *mh = c->mh;

			if (!mh)
				continue;
			PUT("  comm %s: host %u of %u, %s, %u streams, lanes up to %u B, %lu B sent, "
			    "%lu B received\n", c->name, mh->self, mh->nhosts, kd_algo_name(mh->algo),
			    mh->nstreams, mh->lane_bytes, (unsigned long)atomic_load(&mh->bytes_sent),
			    (unsigned long)atomic_load(&mh->bytes_recv));
			na = c4_summary(c, &seen);
			PUT("    C4: %u active anomal%s over its hosts", na, na == 1 ? "y" : "ies");
			for (uint32_t h = 0, k = 0; h < 64; h++)
				if (seen & (1ULL << h))
					PUT("%s%u", k++ ? "," : " (held by host ", h);
			PUT("%s\n", seen ? "; kcollctl anomalies)" : "");
			PUT("    transport %s\n", mh->xport->name);
			if (n < cap)
				n += kd_step_render(mh, buf + n, cap - n, 0);
		}
	}
#undef PUT
	return n < cap ? n : cap;
}
