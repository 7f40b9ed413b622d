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
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <kcoll/kcoll.h>

#include "config.h"
#include "kcoll_bpf.h"
#include "kcoll_steer.h"
#include "kcolld_bpf.h"
#include "log.h"
#include "flow.h"
#include "net.h"

static struct kcoll_bpf *kb;
static int ports_full_logged;

/* kcolld's own ports (ours, the peers'): flows on them are not foreign. */
#define KD_OWN_PORTS 64
static uint16_t own_ports[KD_OWN_PORTS];
static uint32_t n_own_ports;

static void own_port(uint16_t port)
{
	for (uint32_t i = 0; i < n_own_ports; i++)
		if (own_ports[i] == port)
			return;
	if (n_own_ports < KD_OWN_PORTS)
		own_ports[n_own_ports++] = port;
}

static int is_own_port(uint16_t port)
{
	for (uint32_t i = 0; i < n_own_ports; i++)
		if (own_ports[i] == port)
			return 1;
	return 0;
}

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
		if (hosts[h].port) {
			track_port(hosts[h].port);
			own_port(hosts[h].port);
		}
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

/* ---- foreign tracked flows follow the plan (kcoll_steer) ------------------ */

#define KD_FFLOWS 64
#define KD_FFLOW_IDLE_NS (10 * 1000000000LL)	/* forget a flow at home idle this long */
#define KD_STEER_SETTLE_NS (400 * 1000000LL)	/* a receiving half stands this long before
						 * the sending half, or before it is removed */

enum { FF_HOME = 0, FF_RECV = 1, FF_STEERED = 2 };

struct fflow {
	int used;
	struct kcoll_steer_rule r;	/* proto, ports, home pair; via pair while moved */
	uint32_t host, link, via;	/* peer, home link, link it travels on (phase > 0) */
	int phase;			/* FF_* */
	int64_t since;			/* phase entered */
	int64_t seen;			/* last tick its record moved (CLOCK_MONOTONIC of the tick) */
	uint64_t last_bytes;
	char why[96];
};

static struct fflow ff[KD_FFLOWS];
static char steer_pin[512];
static int steer_loaded, steer_err_logged;

struct ffscan {
	int64_t now;
	const struct kd_steer_want *w;
	uint32_t n;
};

static struct fflow *ff_find(const struct kcoll_bpf_flow *f)
{
	struct fflow *freep = NULL;

	for (int i = 0; i < KD_FFLOWS; i++) {
		struct fflow *e = &ff[i];

		if (!e->used) {
			freep = freep ? freep : e;
			continue;
		}
		if (e->r.proto == f->proto && e->r.lport == f->lport && e->r.rport == f->rport &&
		    e->r.home_laddr == f->laddr && e->r.home_raddr == f->raddr)
			return e;
	}
	return freep;
}

/* A record of a moved flow's packets (the via pair): not a flow of its own. */
static int ff_is_via(const struct kcoll_bpf_flow *f)
{
	for (int i = 0; i < KD_FFLOWS; i++)
		if (ff[i].used && ff[i].phase != FF_HOME && ff[i].r.proto == f->proto &&
		    ff[i].r.lport == f->lport && ff[i].r.rport == f->rport &&
		    ff[i].r.via_laddr == f->laddr && ff[i].r.via_raddr == f->raddr)
			return 1;
	return 0;
}

static int ff_scan(const struct kcoll_bpf_flow *f, void *arg)
{
	struct ffscan *sc = arg;
	struct fflow *e;
	uint64_t bytes = f->tx_bytes + f->rx_bytes;
	int known = 0;

	if (f->link_id == KCOLL_LINK_NONE || f->peer_host == KCOLL_LINK_NONE || f->link_id >= KD_STEER_LINKS ||
	    (f->proto != 6 && f->proto != 17) || is_own_port(f->lport) || is_own_port(f->rport) ||
	    f->lport == KCOLL_ROCE_PORT || f->rport == KCOLL_ROCE_PORT || ff_is_via(f))
		return 0;
	for (uint32_t i = 0; i < sc->n; i++)
		known |= sc->w[i].host == f->peer_host;
	if (!known)
		return 0;	/* not a peer of a multi-host communicator */
	e = ff_find(f);
	if (!e)
		return 0;	/* table full: it stays where it is */
	if (!e->used) {
		*e = (struct fflow){ .used = 1, .host = f->peer_host, .link = f->link_id, .via = f->link_id,
				     .seen = sc->now, .last_bytes = bytes };
		e->r.proto = f->proto;
		e->r.lport = f->lport;
		e->r.rport = f->rport;
		e->r.home_laddr = f->laddr;
		e->r.home_raddr = f->raddr;
		snprintf(e->why, sizeof(e->why), "home: link %u is not degraded", f->link_id);
	}
	if (bytes != e->last_bytes) {
		e->last_bytes = bytes;
		e->seen = sc->now;
	}
	return 0;
}

static int steer_set(struct fflow *e, uint32_t flags, const struct kd_steer_want *w, uint32_t via)
{
	char msg[256];
	int err;

	e->r.flags = flags;
	e->r.via_laddr = w->laddr[via];
	e->r.via_raddr = w->raddr[via];
	e->r.via_ifindex = 0;
	e->r.home_ifindex = 0;
	err = kcoll_steer_add(steer_pin, &e->r, msg, sizeof(msg));
	if (err) {
		if (!steer_err_logged++)
			kc_warn("C4 plan: cannot steer foreign flow %u->%u (host %u) onto link %u: %s",
				e->r.lport, e->r.rport, e->host, via, msg);
		return err;
	}
	steer_loaded = 1;
	return 0;
}

static void steer_home(struct fflow *e)
{
	char msg[256];
	int err = kcoll_steer_del(steer_pin, &e->r, msg, sizeof(msg));

	if (err && err != -ENOENT)
		kc_warn("C4 plan: cannot bring foreign flow %u->%u (host %u) home: %s", e->r.lport,
			e->r.rport, e->host, msg);
}

static void steer_step(struct fflow *e, const struct kd_steer_want *w, int64_t now)
{
	uint32_t bit = 1u << e->link, via = w->via[e->link];
	int mine = !!(w->avoid_mine & bit), theirs = !!(w->avoid_peer & bit);
	int can = via < KD_STEER_LINKS && w->laddr[via] && w->raddr[via];
	int settled = now - e->since >= KD_STEER_SETTLE_NS;

	switch (e->phase) {
	case FF_HOME:
		if ((mine || theirs) && can && now - e->seen < KD_FFLOW_IDLE_NS &&
		    !steer_set(e, KCOLL_STEER_RECV_ONLY, w, via)) {
			e->phase = FF_RECV;
			e->via = via;
			e->since = now;
			kc_info("C4 plan: foreign flow %u->%u (host %u): restoring what arrives on link %u",
				e->r.lport, e->r.rport, e->host, via);
		}
		break;
	case FF_RECV:
		if (mine && theirs && (w->peer_recv & bit) && settled) {
			if (!steer_set(e, 0, w, e->via)) {
				e->phase = FF_STEERED;
				e->since = now;
				kc_info("C4 plan: foreign flow %u->%u (host %u) moved from link %u to link %u "
					"(avoid degraded link)", e->r.lport, e->r.rport, e->host, e->link, e->via);
			}
		} else if (!mine && !theirs && settled) {
			steer_home(e);
			e->phase = FF_HOME;
			e->via = e->link;
			e->since = now;
			kc_info("C4 plan: foreign flow %u->%u (host %u) back on link %u", e->r.lport, e->r.rport,
				e->host, e->link);
		}
		break;
	case FF_STEERED:
		if (!(mine && theirs) && !steer_set(e, KCOLL_STEER_RECV_ONLY, w, e->via)) {
			e->phase = FF_RECV;
			e->since = now;
		}
		break;
	}
	if (e->phase == FF_STEERED)
		snprintf(e->why, sizeof(e->why), "avoid degraded link %u: on link %u", e->link, e->via);
	else if (e->phase == FF_RECV && (mine || theirs))
		snprintf(e->why, sizeof(e->why), "avoid degraded link %u: waiting for host %u to restore on "
			 "link %u", e->link, e->host, e->via);
	else if (e->phase == FF_RECV)
		snprintf(e->why, sizeof(e->why), "link %u healed: coming home", e->link);
	else if ((mine || theirs) && !can)
		snprintf(e->why, sizeof(e->why), "link %u degraded, no other link to this host", e->link);
	else
		snprintf(e->why, sizeof(e->why), "home: link %u is not degraded", e->link);
}

static void steer_plan(struct kd_steer_want *w, uint32_t n, int64_t now)
{
	struct ffscan sc = { .now = now, .w = w, .n = n };

	if (!kb || (n && kcoll_bpf_flows_foreach(kb, ff_scan, &sc)))
		return;
	for (uint32_t i = 0; i < n; i++)
		w[i].recv_ready = 0;
	for (int i = 0; i < KD_FFLOWS; i++) {
		struct fflow *e = &ff[i];
		const struct kd_steer_want *wh = NULL;

		if (!e->used)
			continue;
		for (uint32_t k = 0; k < n && !wh; k++)
			if (w[k].host == e->host)
				wh = &w[k];
		if (!wh) {
			/* its host left (dead, or no communicator steers): home */
			if (e->phase != FF_HOME) {
				steer_home(e);
				kc_info("C4 plan: foreign flow %u->%u (host %u) back on link %u (host gone)",
					e->r.lport, e->r.rport, e->host, e->link);
			}
			e->used = 0;
			continue;
		}
		steer_step(e, wh, now);
		if (e->phase == FF_HOME && now - e->seen >= KD_FFLOW_IDLE_NS)
			e->used = 0;	/* gone quiet at home: forget it */
	}
	/* recv_ready: a link with a foreign flow to that host, each restoring */
	for (uint32_t i = 0; i < n; i++) {
		uint32_t any = 0, home = 0;

		for (int k = 0; k < KD_FFLOWS; k++) {
			if (!ff[k].used || ff[k].host != w[i].host)
				continue;
			any |= 1u << ff[k].link;
			if (ff[k].phase == FF_HOME)
				home |= 1u << ff[k].link;
		}
		w[i].recv_ready = any & ~home;
	}
}

static size_t steer_render(char *buf, size_t cap, int json)
{
	static const char *const phase[] = { "home", "restoring only", "steered" };
	size_t n = 0;
	int first = 1;

#define SPUT(...)                                                              \
	do {                                                                   \
		int w_ = snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__); \
		if (w_ > 0)                                                    \
			n += (size_t)w_;                                       \
	} while (0)
	if (!json)
		SPUT("foreign tracked flows (kcoll_steer, pins %s):\n  %-4s %-28s %-5s %-5s %-5s %-15s %s\n",
		     steer_pin, "PROTO", "FLOW (HOME PAIR)", "HOST", "HOME", "NOW", "STATE", "WHY");
	for (int i = 0; i < KD_FFLOWS; i++) {
		const struct fflow *e = &ff[i];
		char la[16], ra[16], fl[64];

		if (!e->used)
			continue;
		inet_ntop(AF_INET, &e->r.home_laddr, la, sizeof(la));
		inet_ntop(AF_INET, &e->r.home_raddr, ra, sizeof(ra));
		if (json) {
			SPUT("%s{\"proto\":\"%s\",\"laddr\":\"%s\",\"lport\":%u,\"raddr\":\"%s\",\"rport\":%u,"
			     "\"host\":%u,\"home_link\":%u,\"link\":%u,\"state\":\"%s\",\"why\":\"%s\"}",
			     first ? "" : ",", e->r.proto == 6 ? "tcp" : "udp", la, e->r.lport, ra, e->r.rport,
			     e->host, e->link, e->phase == FF_STEERED ? e->via : e->link, phase[e->phase], e->why);
		} else {
			snprintf(fl, sizeof(fl), "%s:%u>%s:%u", la, e->r.lport, ra, e->r.rport);
			SPUT("  %-4s %-28s %-5u %-5u %-5u %-15s %s\n", e->r.proto == 6 ? "tcp" : "udp", fl, e->host,
			     e->link, e->phase == FF_STEERED ? e->via : e->link, phase[e->phase], e->why);
		}
		first = 0;
	}
	if (!json && first)
		SPUT("  none (track them: kcoll-bpf --pin PIN track PORTS)\n");
#undef SPUT
	return n;
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
	own_port(port);
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
	snprintf(steer_pin, sizeof(steer_pin), "%s-steer", o.pin_dir);
	kd_bpf_steer_hook = steer_plan;
	kd_bpf_steer_render = steer_render;
	kc_info("flow tracking: attached on %d interface(s), port %u, maps in %s (kcoll-bpf --pin %s flows)",
		nif, port, o.pin_dir, o.pin_dir);
}

void kd_bpf_stop(void)
{
	if (!kb)
		return;
	kd_net_table_hook = NULL;
	kd_bpf_sums_hook = NULL;
	kd_bpf_steer_hook = NULL;
	kd_bpf_steer_render = NULL;
	if (steer_loaded) {
		char msg[256];

		/* the flows go home at once (the peers' rules stop matching) */
		if (kcoll_steer_detach(steer_pin, msg, sizeof(msg)))
			kc_warn("C4 plan: steering detach: %s", msg);
		steer_loaded = 0;
	}
	if (kcoll_bpf_detach(kb))
		kc_warn("flow tracking: detach: %s", kcoll_bpf_strerror(kb));
	kcoll_bpf_close(kb);
	kb = NULL;
}
