// SPDX-License-Identifier: MIT
/* kcoll-bpf: attach, configure, read and detach the eBPF flow tracker. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>
#include <inttypes.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kcoll_bpf.h"
#include "kcoll_steer.h"

static void usage(FILE *f)
{
	fputs("Usage: kcoll-bpf [--pin DIR] [--netns NAME] COMMAND [ARGS]\n"
	      "Commands:\n"
	      "  attach IFACE[,IFACE...] [--all] [--no-sockops] [--cgroup DIR]\n"
	      "                      load (first time), pin and attach the tc classifiers\n"
	      "                      (--all: count every flow; sockops goes on the cgroup DIR,\n"
	      "                      default: where cgroup v2 is mounted)\n"
	      "  detach              remove classifiers, sockops and every pin\n"
	      "  track PORT[-PORT]   count flows with either port in the range\n"
	      "  track --cgroup DIR  count the TCP/UDP flows of a cgroup v2 (and below)\n"
	      "  track --all | --none  count every flow / only tracked ones\n"
	      "  untrack PORT[-PORT] stop tracking a port range\n"
	      "  link IFACE ADDR|any ID   flows on IFACE (from ADDR) belong to link ID\n"
	      "  peer ADDR HOST      flows to ADDR go to host index HOST\n"
	      "  flows [--json]      one line per flow (payload bytes, packets, retrans, srtt)\n"
	      "  links [--json]      totals per (link, peer host)\n"
	      "  reset               zero every counter (configuration stays)\n"
	      "  steer add [tcp|udp] LOCAL[:PORT] REMOTE[:PORT] via VLOCAL VREMOTE [--recv-only]\n"
	      "                      send this host's side of the flows between LOCAL and REMOTE\n"
	      "                      (PORT 0 or none: any) over the path of VLOCAL/VREMOTE, the\n"
	      "                      sockets keep seeing LOCAL/REMOTE; the peer needs the mirror rule.\n"
	      "                      --recv-only: only restore what arrives that way. Order: both\n"
	      "                      hosts --recv-only first, then both without (see kcoll-bpf(8))\n"
	      "  steer del [tcp|udp] LOCAL[:PORT] REMOTE[:PORT]   remove the rule (first make\n"
	      "                      both hosts --recv-only, then del on both)\n"
	      "  steer list [--json] the rules with packets/bytes steered out and restored in\n"
	      "  steer detach        remove the steering classifiers and their pins\n"
	      "                      (steering pins: the tracker's directory + \"-steer\")\n"
	      "Options:\n"
	      "  --pin DIR           pin directory (default $KCOLL_BPF_PIN, else "
	      KCOLL_BPF_PIN_DEFAULT ")\n"
	      "  --netns NAME        work in network namespace NAME (/run/netns/NAME or a path)\n"
	      "                      while pins stay in this mount namespace\n"
	      "  -h, --help          this help\n"
	      "Needs root. The maps are readable with bpftool too: see kcoll-bpf(8).\n", f);
}

static const char *ip(__u32 a, char *buf)
{
	return inet_ntop(AF_INET, &a, buf, INET_ADDRSTRLEN);
}

static const char *id_str(__u32 id, char *buf, size_t len)
{
	if (id == KCOLL_LINK_NONE)
		return "-";
	snprintf(buf, len, "%u", id);
	return buf;
}

struct walk {
	int json;
	int n;
};

static int print_flow(const struct kcoll_bpf_flow *f, void *arg)
{
	struct walk *w = arg;
	char l[INET_ADDRSTRLEN], r[INET_ADDRSTRLEN], dev[IF_NAMESIZE], li[16], pe[16];
	char ls[32], rs[32];

	if (!if_indextoname(f->ifindex, dev))
		snprintf(dev, sizeof(dev), "#%u", f->ifindex);
	if (w->json) {
		printf("%s\n  {\"proto\": \"%s\", \"laddr\": \"%s\", \"lport\": %u, \"raddr\": \"%s\", "
		       "\"rport\": %u, \"ifindex\": %u, \"ifname\": \"%s\", \"link\": %d, \"peer\": %d, "
		       "\"flags\": %u, \"tx_bytes\": %" PRIu64 ", \"tx_pkts\": %" PRIu64 ", "
		       "\"tx_payload\": %" PRIu64 ", \"rx_bytes\": %" PRIu64 ", \"rx_pkts\": %" PRIu64 ", "
		       "\"rx_payload\": %" PRIu64 ", \"roce_pkts\": %" PRIu64 ", \"retrans\": %" PRIu64 ", "
		       "\"srtt_us\": %u, \"first_seen_ns\": %" PRIu64 ", \"last_seen_ns\": %" PRIu64 "}",
		       w->n ? "," : "", f->proto == 6 ? "tcp" : "udp", ip(f->laddr, l), f->lport,
		       ip(f->raddr, r), f->rport, f->ifindex, dev,
		       f->link_id == KCOLL_LINK_NONE ? -1 : (int)f->link_id,
		       f->peer_host == KCOLL_LINK_NONE ? -1 : (int)f->peer_host, f->flags,
		       (uint64_t)f->tx_bytes, (uint64_t)f->tx_pkts, (uint64_t)f->tx_payload,
		       (uint64_t)f->rx_bytes, (uint64_t)f->rx_pkts, (uint64_t)f->rx_payload,
		       (uint64_t)f->roce_pkts, (uint64_t)f->retrans, f->srtt_us,
		       (uint64_t)f->first_seen_ns, (uint64_t)f->last_seen_ns);
	} else {
		if (!w->n)
			printf("%-4s %-21s %-21s %-8s %4s %4s %14s %10s %14s %10s %7s %8s %s\n", "prot",
			       "local", "remote", "dev", "link", "peer", "tx_payload", "tx_pkts",
			       "rx_payload", "rx_pkts", "retrans", "srtt_us", "roce");
		snprintf(ls, sizeof(ls), "%s:%u", ip(f->laddr, l), f->lport);
		snprintf(rs, sizeof(rs), "%s:%u", ip(f->raddr, r), f->rport);
		printf("%-4s %-21s %-21s %-8s %4s %4s", f->proto == 6 ? "tcp" : "udp", ls, rs, dev,
		       id_str(f->link_id, li, sizeof(li)), id_str(f->peer_host, pe, sizeof(pe)));
		printf(" %14" PRIu64 " %10" PRIu64 " %14" PRIu64 " %10" PRIu64 " %7" PRIu64 " %8u %" PRIu64 "\n",
		       (uint64_t)f->tx_payload, (uint64_t)f->tx_pkts, (uint64_t)f->rx_payload,
		       (uint64_t)f->rx_pkts, (uint64_t)f->retrans, f->srtt_us, (uint64_t)f->roce_pkts);
	}
	w->n++;
	return 0;
}

static int print_link(const struct kcoll_bpf_link *l, void *arg)
{
	struct walk *w = arg;
	char a[16], b[16];

	if (w->json) {
		printf("%s\n  {\"link\": %d, \"peer\": %d, \"tx_bytes\": %" PRIu64 ", \"tx_pkts\": %" PRIu64
		       ", \"rx_bytes\": %" PRIu64 ", \"rx_pkts\": %" PRIu64 ", \"last_seen_ns\": %" PRIu64 "}",
		       w->n ? "," : "", l->link_id == KCOLL_LINK_NONE ? -1 : (int)l->link_id,
		       l->peer_host == KCOLL_LINK_NONE ? -1 : (int)l->peer_host, (uint64_t)l->tx_bytes,
		       (uint64_t)l->tx_pkts, (uint64_t)l->rx_bytes, (uint64_t)l->rx_pkts,
		       (uint64_t)l->last_seen_ns);
	} else {
		if (!w->n)
			printf("%4s %4s %14s %10s %14s %10s\n", "link", "peer", "tx_bytes", "tx_pkts",
			       "rx_bytes", "rx_pkts");
		printf("%4s %4s %14" PRIu64 " %10" PRIu64 " %14" PRIu64 " %10" PRIu64 "\n",
		       id_str(l->link_id, a, sizeof(a)), id_str(l->peer_host, b, sizeof(b)),
		       (uint64_t)l->tx_bytes, (uint64_t)l->tx_pkts, (uint64_t)l->rx_bytes,
		       (uint64_t)l->rx_pkts);
	}
	w->n++;
	return 0;
}

static int parse_u32(const char *s, __u32 max, __u32 *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > max)
		return -EINVAL;
	*out = (__u32)v;
	return 0;
}

static int parse_ports(const char *s, __u16 *lo, __u16 *hi)
{
	char buf[32], *dash;
	__u32 a, b;

	if (snprintf(buf, sizeof(buf), "%s", s) >= (int)sizeof(buf))
		return -EINVAL;
	dash = strchr(buf, '-');
	if (dash)
		*dash++ = '\0';
	if (parse_u32(buf, 65535, &a) || parse_u32(dash ? dash : buf, 65535, &b) || !a || a > b)
		return -EINVAL;
	*lo = (__u16)a;
	*hi = (__u16)b;
	return 0;
}

static int parse_addr(const char *s, __u32 *out)
{
	struct in_addr a;

	if (!strcmp(s, "any")) {
		*out = 0;
		return 0;
	}
	if (inet_pton(AF_INET, s, &a) != 1)
		return -EINVAL;
	*out = a.s_addr;
	return 0;
}

/* Only the network namespace changes: the pins stay in this mount namespace's bpffs. */
static int enter_netns(const char *name)
{
	char path[512];
	int fd;

	snprintf(path, sizeof(path), strchr(name, '/') ? "%s" : "/run/netns/%s", name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWNET)) {
		fprintf(stderr, "kcoll-bpf: --netns %s: %s: %s (ip netns list shows the names)\n", name,
			path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

static int bad(const char *fmt, const char *arg)
{
	fprintf(stderr, "kcoll-bpf: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, " (try kcoll-bpf --help)\n");
	return 2;
}

/* ADDR[:PORT] (port 0 or none: any). */
static int parse_endpoint(const char *s, __u32 *addr, __u16 *port)
{
	char buf[64], *colon;
	__u32 p = 0;

	if (snprintf(buf, sizeof(buf), "%s", s) >= (int)sizeof(buf))
		return -EINVAL;
	colon = strchr(buf, ':');
	if (colon) {
		*colon++ = '\0';
		if (parse_u32(colon, 65535, &p))
			return -EINVAL;
	}
	if (parse_addr(buf, addr) || !*addr)
		return -EINVAL;
	*port = (__u16)p;
	return 0;
}

static int print_rule(const struct kcoll_steer_rule *r, void *arg)
{
	char hl[INET_ADDRSTRLEN], hr[INET_ADDRSTRLEN], vl[INET_ADDRSTRLEN], vr[INET_ADDRSTRLEN];
	char dev[IF_NAMESIZE], hd[IF_NAMESIZE], ls[32], rs[32];
	struct walk *w = arg;

	if (!if_indextoname((unsigned)r->via_ifindex, dev))
		snprintf(dev, sizeof(dev), "#%d", r->via_ifindex);
	if (!r->home_ifindex || !if_indextoname((unsigned)r->home_ifindex, hd))
		snprintf(hd, sizeof(hd), "-");
	ip(r->home_laddr, hl);
	ip(r->home_raddr, hr);
	ip(r->via_laddr, vl);
	ip(r->via_raddr, vr);
	if (w->json) {
		printf("%s\n  {\"proto\": \"%s\", \"laddr\": \"%s\", \"lport\": %u, \"raddr\": \"%s\", "
		       "\"rport\": %u, \"home_ifname\": \"%s\", \"via_laddr\": \"%s\", "
		       "\"via_raddr\": \"%s\", \"via_ifname\": \"%s\", "
		       "\"recv_only\": %s, \"via_dmac\": \"%02x:%02x:%02x:%02x:%02x:%02x\", \"out_pkts\": %" PRIu64
		       ", \"out_bytes\": %" PRIu64 ", \"in_pkts\": %" PRIu64 ", \"in_bytes\": %" PRIu64 "}",
		       w->n ? "," : "", r->proto == 6 ? "tcp" : "udp", hl, r->lport, hr, r->rport, hd,
		       vl, vr, dev, (r->flags & KCOLL_STEER_RECV_ONLY) ? "true" : "false", r->via_dmac[0], r->via_dmac[1], r->via_dmac[2], r->via_dmac[3],
		       r->via_dmac[4], r->via_dmac[5], (uint64_t)r->out_pkts, (uint64_t)r->out_bytes,
		       (uint64_t)r->in_pkts, (uint64_t)r->in_bytes);
	} else {
		if (!w->n)
			printf("%-4s %-21s %-21s %-6s %-15s %-15s %-6s %10s %14s %10s %14s\n", "prot",
			       "local", "remote", "home", "via_local", "via_remote", "via", "out_pkts",
			       "out_bytes", "in_pkts", "in_bytes");
		snprintf(ls, sizeof(ls), "%s:%u", hl, r->lport);
		snprintf(rs, sizeof(rs), "%s:%u", hr, r->rport);
		printf("%-4s %-21s %-21s %-6s %-15s %-15s %-6s %10" PRIu64 " %14" PRIu64 " %10" PRIu64
		       " %14" PRIu64 "%s\n", r->proto == 6 ? "tcp" : "udp", ls, rs, hd, vl, vr, dev,
		       (uint64_t)r->out_pkts, (uint64_t)r->out_bytes, (uint64_t)r->in_pkts,
		       (uint64_t)r->in_bytes, (r->flags & KCOLL_STEER_RECV_ONLY) ? "  recv-only" : "");
	}
	w->n++;
	return 0;
}

/* kcoll-bpf steer ...: argv[i] is the sub-command. */
static int steer_main(const char *pin, int argc, char **argv, int i)
{
	struct kcoll_steer_rule r = { .proto = 6 };
	char dir[512], msg[512] = "", *sub;
	struct walk w = { 0 };
	int err, is_add;

	snprintf(dir, sizeof(dir), "%s-steer", pin ? pin : KCOLL_BPF_PIN_DEFAULT);
	if (i >= argc)
		return bad("steer: give add, del, list or detach%s", "");
	sub = argv[i++];
	if (!strcmp(sub, "list")) {
		for (; i < argc; i++) {
			if (strcmp(argv[i], "--json"))
				return bad("steer list: unexpected '%s'", argv[i]);
			w.json = 1;
		}
		if (w.json)
			printf("{\"rules\": [");
		err = kcoll_steer_foreach(dir, print_rule, &w, msg, sizeof(msg));
		if (w.json)
			printf("%s]}\n", w.n ? "\n" : "");
		/* nothing loaded = no rules: not an error for a reader */
		if (err == -ENOENT)
			err = 0;
	} else if (!strcmp(sub, "detach")) {
		if (i < argc)
			return bad("steer detach: unexpected '%s'", argv[i]);
		err = kcoll_steer_detach(dir, msg, sizeof(msg));
	} else if (!strcmp(sub, "add") || !strcmp(sub, "del")) {
		is_add = sub[0] == 'a';
		if (is_add && argc - i > 0 && !strcmp(argv[argc - 1], "--recv-only")) {
			r.flags |= KCOLL_STEER_RECV_ONLY;
			argc--;
		}
		if (i < argc && (!strcmp(argv[i], "tcp") || !strcmp(argv[i], "udp")))
			r.proto = argv[i++][0] == 't' ? 6 : 17;
		if (argc - i != (is_add ? 5 : 2))
			return bad(is_add ? "steer add: give [tcp|udp] LOCAL[:PORT] REMOTE[:PORT] via "
			       "VLOCAL VREMOTE%s" : "steer del: give [tcp|udp] LOCAL[:PORT] REMOTE[:PORT]%s", "");
		if (parse_endpoint(argv[i], &r.home_laddr, &r.lport))
			return bad("steer: bad LOCAL[:PORT] '%s' (e.g. 10.10.0.1 or 10.10.0.1:5201)", argv[i]);
		if (parse_endpoint(argv[i + 1], &r.home_raddr, &r.rport))
			return bad("steer: bad REMOTE[:PORT] '%s'", argv[i + 1]);
		if (is_add) {
			__u16 p1, p2;

			if (strcmp(argv[i + 2], "via"))
				return bad("steer add: expected 'via' before the via addresses, got '%s'",
					   argv[i + 2]);
			if (parse_endpoint(argv[i + 3], &r.via_laddr, &p1) || p1 ||
			    parse_endpoint(argv[i + 4], &r.via_raddr, &p2) || p2)
				return bad("steer add: via takes two IPv4 addresses without ports%s", "");
			err = kcoll_steer_add(dir, &r, msg, sizeof(msg));
		} else {
			err = kcoll_steer_del(dir, &r, msg, sizeof(msg));
		}
	} else {
		return bad("steer: unknown sub-command '%s' (add, del, list, detach)", sub);
	}
	if (err)
		fprintf(stderr, "kcoll-bpf: steer %s: %s\n", sub, msg[0] ? msg : strerror(-err));
	return err ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct kcoll_bpf_opts o = { .size = sizeof(o) };
	const char *pin = kcoll_knob_str("KCOLL_BPF_PIN"), *cmd, *cg = NULL;
	struct kcoll_bpf *b;
	struct walk w = { 0 };
	int i = 1, err = 0, json = 0;

	if (pin && !*pin)
		pin = NULL;
	while (i < argc && argv[i][0] == '-') {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "--netns") && i + 1 < argc) {
			if (enter_netns(argv[i + 1]))
				return 1;
			i += 2;
		} else if (!strcmp(argv[i], "--pin") && i + 1 < argc) {
			pin = argv[i + 1];
			i += 2;
		} else {
			return bad("unknown option '%s'", argv[i]);
		}
	}
	if (i >= argc) {
		usage(stderr);
		return 2;
	}
	cmd = argv[i++];
	o.pin_dir = pin;
	if (!strcmp(cmd, "steer"))
		return steer_main(pin, argc, argv, i);
	for (int j = i; j < argc; j++)
		if (!strcmp(argv[j], "--json"))
			json = 1;

	if (!strcmp(cmd, "attach")) {
		const char *ifs = NULL;

		for (; i < argc; i++) {
			if (!strcmp(argv[i], "--all"))
				o.flags |= KCOLL_BPF_TRACK_ALL;
			else if (!strcmp(argv[i], "--no-sockops"))
				o.flags |= KCOLL_BPF_NO_SOCKOPS;
			else if (!strcmp(argv[i], "--cgroup") && i + 1 < argc)
				o.cgroup = argv[++i];
			else if (argv[i][0] != '-' && !ifs)
				ifs = argv[i];
			else
				return bad("attach: unexpected '%s'", argv[i]);
		}
		if (!ifs)
			return bad("attach: name the interfaces%s", "");
		err = kcoll_bpf_open(&b, &o);
		if (err)
			goto open_failed;
		err = kcoll_bpf_attach_names(b, ifs);
		if (!err && (o.flags & KCOLL_BPF_TRACK_ALL))
			err = kcoll_bpf_set_track_all(b, 1);
		goto done;
	}
	if (strcmp(cmd, "detach"))
		o.flags |= KCOLL_BPF_OPEN_READ;
	if (!strcmp(cmd, "flows") || !strcmp(cmd, "links") || !strcmp(cmd, "reset") ||
	    !strcmp(cmd, "detach")) {
		if (argc - i > json)
			return bad("%s: unexpected arguments", cmd);
	} else if (!strcmp(cmd, "track") || !strcmp(cmd, "untrack")) {
		if (argc - i != 1 && !(argc - i == 2 && !strcmp(argv[i], "--cgroup")))
			return bad("%s: give PORT[-PORT], --cgroup DIR, --all or --none", cmd);
	} else if (!strcmp(cmd, "link")) {
		if (argc - i != 3)
			return bad("link: give IFACE ADDR|any ID%s", "");
	} else if (!strcmp(cmd, "peer")) {
		if (argc - i != 2)
			return bad("peer: give ADDR HOST (an IPv4 address and a host index)%s", "");
	} else {
		return bad("unknown command '%s'", cmd);
	}
	err = kcoll_bpf_open(&b, &o);
	if (err)
		goto open_failed;

	if (!strcmp(cmd, "detach")) {
		err = kcoll_bpf_detach(b);
	} else if (!strcmp(cmd, "flows")) {
		w.json = json;
		if (json)
			printf("{\"flows\": [");
		err = kcoll_bpf_flows_foreach(b, print_flow, &w);
		if (json)
			printf("%s]}\n", w.n ? "\n" : "");
	} else if (!strcmp(cmd, "links")) {
		w.json = json;
		if (json)
			printf("{\"links\": [");
		err = kcoll_bpf_links_foreach(b, print_link, &w);
		if (json)
			printf("%s]}\n", w.n ? "\n" : "");
	} else if (!strcmp(cmd, "reset")) {
		err = kcoll_bpf_reset(b);
	} else if (!strcmp(cmd, "track") || !strcmp(cmd, "untrack")) {
		__u16 lo, hi;

		if (!strcmp(argv[i], "--cgroup"))
			cg = argv[i + 1];
		if (cg && !strcmp(cmd, "track"))
			err = kcoll_bpf_track_cgroup(b, cg);
		else if (!strcmp(argv[i], "--all") && !strcmp(cmd, "track"))
			err = kcoll_bpf_set_track_all(b, 1);
		else if (!strcmp(argv[i], "--none") && !strcmp(cmd, "track"))
			err = kcoll_bpf_set_track_all(b, 0);
		else if (!parse_ports(argv[i], &lo, &hi))
			err = cmd[0] == 't' ? kcoll_bpf_track_ports(b, lo, hi)
					    : kcoll_bpf_untrack_ports(b, lo, hi);
		else {
			kcoll_bpf_close(b);
			return bad("bad port range '%s' (1-65535, e.g. 40000-40100)", argv[i]);
		}
	} else if (!strcmp(cmd, "link")) {
		__u32 addr, id, idx;

		idx = if_nametoindex(argv[i]);
		if (!idx || parse_addr(argv[i + 1], &addr) || parse_u32(argv[i + 2], 0xfffffffe, &id)) {
			kcoll_bpf_close(b);
			return bad("link: bad interface, address or id in '%s ...'", argv[i]);
		}
		err = kcoll_bpf_set_link(b, idx, addr, id);
	} else {
		__u32 addr, host;

		if (parse_addr(argv[i], &addr) || !addr ||
		    parse_u32(argv[i + 1], 0xfffffffe, &host)) {
			kcoll_bpf_close(b);
			return bad("peer: give ADDR HOST (an IPv4 address and a host index)%s", "");
		}
		err = kcoll_bpf_set_peer(b, addr, host);
	}
done:
	if (err)
		fprintf(stderr, "kcoll-bpf: %s: %s\n", cmd, kcoll_bpf_strerror(b));
	kcoll_bpf_close(b);
	return err ? 1 : 0;

open_failed:
	fprintf(stderr, "kcoll-bpf: %s: %s\n", cmd, kcoll_bpf_open_error());
	return 1;
}
