// SPDX-License-Identifier: MIT
/*
 * kcolld with KCOLL_BPF=1: attach the flow tracker on the interfaces that
 * carry this daemon's advertised addresses, track its peer port, and give
 * every (interface, address) the link id of that address's index (stream s
 * leaves from address s mod n: link = network). When a communicator's host
 * table arrives, peers' ports are tracked and their addresses mapped to
 * their host index. If anything is missing (no bpffs, no permission, no
 * BPF build), the reason is logged once and the daemon runs without it.
 */
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <kcoll/kcoll.h>

#include "config.h"
#include "kcoll_bpf.h"
#include "kcolld_bpf.h"
#include "log.h"
#include "net.h"

static struct kcoll_bpf *kb;
static int ports_full_logged;

static void track_port(uint16_t port)
{
	int err = kcoll_bpf_track_ports(kb, port, port);

	if (err && !ports_full_logged) {
		kc_warn("flow tracking: cannot track peer port %u: %s", port, kcoll_bpf_strerror(kb));
		ports_full_logged = 1;
	}
}

static void on_table(const struct kd_p_hostinfo *hosts, uint32_t nhosts, uint32_t you)
{
	for (uint32_t h = 0; h < nhosts; h++) {
		if (h == you)
			continue;
		if (hosts[h].port)
			track_port(hosts[h].port);
		for (uint32_t a = 0; a < hosts[h].naddrs && a < KCOLL_ID_MAX_ADDRS; a++)
			if (kcoll_bpf_set_peer(kb, hosts[h].addrs[a], h))
				kc_dbg("flow tracking: peer %u: %s", h, kcoll_bpf_strerror(kb));
	}
}

struct sums {
	struct kd_bpf_sum *v;
	uint32_t n, max;
	uint64_t recent;	/* flows seen after this (CLOCK_MONOTONIC ns) carry a current srtt */
};

static int sum_flow(const struct kcoll_bpf_flow *f, void *arg)
{
	struct sums *s = arg;
	struct kd_bpf_sum *e = NULL;

	if (f->link_id == KCOLL_LINK_NONE || f->peer_host == KCOLL_LINK_NONE)
		return 0;
	for (uint32_t i = 0; i < s->n && !e; i++)
		if (s->v[i].host == f->peer_host && s->v[i].link == f->link_id)
			e = &s->v[i];
	if (!e) {
		if (s->n == s->max)
			return 0;
		e = &s->v[s->n++];
		*e = (struct kd_bpf_sum){ .host = f->peer_host, .link = f->link_id };
	}
	e->tx_payload += f->tx_payload;
	e->rx_payload += f->rx_payload;
	e->retrans += f->retrans;
	e->nflows++;
	if (f->last_seen_ns >= s->recent && f->srtt_us > e->srtt_us)
		e->srtt_us = f->srtt_us;
	return 0;
}

/* kd_bpf_sums_hook: the flows map summed per (peer host, link). */
static int read_sums(struct kd_bpf_sum *out, uint32_t max, uint32_t *n)
{
	struct sums s = { .v = out, .max = max };
	struct timespec ts;
	int err;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	s.recent = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	s.recent = s.recent > 1000000000ull ? s.recent - 1000000000ull : 0;
	err = kb ? kcoll_bpf_flows_foreach(kb, sum_flow, &s) : -ENODEV;
	*n = s.n;
	return err;
}

void kd_bpf_start(void)
{
	struct kcoll_bpf_opts o = { .size = sizeof(o) };
	uint32_t addrs[KCOLL_ID_MAX_ADDRS];
	int idx[KCOLL_ID_MAX_ADDRS], link[KCOLL_ID_MAX_ADDRS], n, nif = 0, err;
	struct ifaddrs *ifa, *i;
	uint16_t port;

	if (kcoll_knob_ll("KCOLL_BPF") != 1)
		return;
	o.pin_dir = kcoll_knob_str("KCOLL_BPF_PIN");
	o.cgroup = kcoll_knob_str("KCOLL_BPF_CGROUP");
	if (o.cgroup && !*o.cgroup)
		o.cgroup = NULL;
	n = kd_net_self_addrs(&port, addrs, KCOLL_ID_MAX_ADDRS);
	if (!port || !n) {
		kc_warn("flow tracking (KCOLL_BPF=1) is off: this kcolld does not listen for peers");
		return;
	}
	if (getifaddrs(&ifa)) {
		kc_warn("flow tracking (KCOLL_BPF=1) is off: getifaddrs: %s", strerror(errno));
		return;
	}
	for (int a = 0; a < n; a++) {
		for (i = ifa; i; i = i->ifa_next) {
			if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET ||
			    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr != addrs[a])
				continue;
			idx[nif] = (int)if_nametoindex(i->ifa_name);
			link[nif] = a;
			if (idx[nif] > 0)
				nif++;
			break;
		}
	}
	freeifaddrs(ifa);
	if (!nif) {
		kc_warn("flow tracking (KCOLL_BPF=1) is off: no interface carries the advertised addresses");
		return;
	}

	err = kcoll_bpf_open(&kb, &o);
	if (err) {
		kc_warn("flow tracking (KCOLL_BPF=1) is off: %s", kcoll_bpf_open_error());
		return;
	}
	err = kcoll_bpf_attach(kb, idx, nif);
	if (err == -ENOMEDIUM) {
		/* A private mount namespace (ip netns exec) may have no cgroup v2. */
		kc_info("flow tracking: no cgroup v2 here, so no TCP retransmission / RTT counts");
		kcoll_bpf_close(kb);
		o.flags |= KCOLL_BPF_NO_SOCKOPS;
		err = kcoll_bpf_open(&kb, &o);
		if (err) {
			kc_warn("flow tracking (KCOLL_BPF=1) is off: %s", kcoll_bpf_open_error());
			kb = NULL;
			return;
		}
		err = kcoll_bpf_attach(kb, idx, nif);
	}
	if (!err)
		err = kcoll_bpf_track_ports(kb, port, port);
	for (int k = 0; !err && k < nif; k++)
		err = kcoll_bpf_set_link(kb, (uint32_t)idx[k], addrs[link[k]], (uint32_t)link[k]);
	if (err) {
		kc_warn("flow tracking (KCOLL_BPF=1) is off: %s", kcoll_bpf_strerror(kb));
		kcoll_bpf_detach(kb);
		kcoll_bpf_close(kb);
		kb = NULL;
		return;
	}
	kd_net_table_hook = on_table;
	kd_bpf_sums_hook = read_sums;
	kc_info("flow tracking: attached on %d interface(s), port %u, maps in %s (kcoll-bpf --pin %s flows)",
		nif, port, o.pin_dir, o.pin_dir);
}

void kd_bpf_stop(void)
{
	if (!kb)
		return;
	kd_net_table_hook = NULL;
	kd_bpf_sums_hook = NULL;
	if (kcoll_bpf_detach(kb))
		kc_warn("flow tracking: detach: %s", kcoll_bpf_strerror(kb));
	kcoll_bpf_close(kb);
	kb = NULL;
}
