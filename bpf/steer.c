// SPDX-License-Identifier: MIT
/* Loader of the flow steering classifiers; the API is in kcoll_steer.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "kcoll_bpf.h"
#include "kcoll_steer.h"
#include "steer.h"
#include "steer.skel.h"

/* Before the tracker's filters (prio 0xc0): what it counts on the home
 * interface is then what really leaves there. */
#define KCOLL_STEER_TC_HANDLE 0xc012
#define KCOLL_STEER_TC_PRIO 0xb0

enum { M_OUT, M_IN, M_IFS, M_NR };
static const char *const map_names[M_NR] = { "steer_out", "steer_in", "steer_ifs" };
enum { P_OUT, P_IN, P_NR };
static const char *const prog_pins[P_NR] = { "prog_steer_out", "prog_steer_in" };

static int say(char *msg, size_t len, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int say(char *msg, size_t len, int err, const char *fmt, ...)
{
	va_list ap;

	if (msg && len) {
		va_start(ap, fmt);
		vsnprintf(msg, len, fmt, ap);
		va_end(ap);
	}
	return err;
}

static int hint(char *msg, size_t len, int err, const char *what)
{
	if (err == -EPERM || err == -EACCES)
		return say(msg, len, err, "%s: %s: steering needs root (CAP_BPF + CAP_NET_ADMIN)",
			   what, strerror(-err));
	return say(msg, len, err, "%s: %s", what, strerror(-err));
}

static const char *dir_of(const char *pin)
{
	return pin ? pin : KCOLL_STEER_PIN_DEFAULT;
}

static void path(char *buf, size_t n, const char *pin, const char *name)
{
	snprintf(buf, n, "%s/%s", dir_of(pin), name);
}

static void close_fds(int *fd, int n)
{
	for (int i = 0; i < n; i++)
		if (fd[i] >= 0)
			close(fd[i]);
}

/* Open the pinned maps; -ENOENT when nothing is loaded there. */
static int open_maps(const char *pin, int fd[M_NR], char *msg, size_t len)
{
	char p[PATH_MAX];

	for (int i = 0; i < M_NR; i++)
		fd[i] = -1;
	for (int i = 0; i < M_NR; i++) {
		path(p, sizeof(p), pin, map_names[i]);
		fd[i] = bpf_obj_get(p);
		if (fd[i] < 0) {
			int err = -errno;

			close_fds(fd, M_NR);
			if (err == -ENOENT)
				return say(msg, len, err, "no steering loaded in %s (kcoll-bpf steer add "
					   "loads it)", dir_of(pin));
			return hint(msg, len, err, p);
		}
	}
	return 0;
}

/* The pins' directory in a bpffs (mounted on /sys/fs/bpf if need be). */
static int check_bpffs(const char *pin, char *msg, size_t len)
{
	char m[512];
	int err = kcoll_bpffs_ensure(dir_of(pin), KCOLL_STEER_PIN_DEFAULT, m, sizeof(m));

	return err ? say(msg, len, err, "%s", m) : 0;
}

static int load_and_pin(const char *pin, char *msg, size_t len)
{
	LIBBPF_OPTS(bpf_object_open_opts, oo, .pin_root_path = dir_of(pin));
	struct bpf_program *progs[P_NR];
	struct steer_bpf *skel;
	char p[PATH_MAX];
	int err;

	err = check_bpffs(pin, msg, len);
	if (err)
		return err;
	if (mkdir(dir_of(pin), 0700) && errno != EEXIST)
		return hint(msg, len, -errno, dir_of(pin));
	skel = steer_bpf__open_opts(&oo);
	if (!skel)
		return hint(msg, len, -errno, "opening the steering BPF object");
	err = steer_bpf__load(skel);
	if (err) {
		hint(msg, len, err, "loading the steering BPF programs");
		goto err_destroy;
	}
	progs[P_OUT] = skel->progs.kcoll_steer_out;
	progs[P_IN] = skel->progs.kcoll_steer_in;
	for (int i = 0; i < P_NR; i++) {
		path(p, sizeof(p), pin, prog_pins[i]);
		err = bpf_program__pin(progs[i], p);
		if (err) {
			hint(msg, len, err, p);
			goto err_unpin;
		}
	}
	steer_bpf__destroy(skel);
	return 0;

err_unpin:
	for (int i = 0; i < P_NR; i++) {
		path(p, sizeof(p), pin, prog_pins[i]);
		unlink(p);
	}
	bpf_object__unpin_maps(skel->obj, NULL);
	rmdir(dir_of(pin));
err_destroy:
	steer_bpf__destroy(skel);
	return err;
}

/* Put one of our programs on one hook of an interface (once: the map says). */
static int hook_on(const char *pin, int ifs_fd, int ifindex, __u32 bit, char *msg, size_t len)
{
	LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = BPF_TC_INGRESS | BPF_TC_EGRESS);
	LIBBPF_OPTS(bpf_tc_opts, to, .handle = KCOLL_STEER_TC_HANDLE, .priority = KCOLL_STEER_TC_PRIO,
		    .flags = BPF_TC_F_REPLACE);
	__u32 key = (__u32)ifindex, have = 0;
	libbpf_print_fn_t prev;
	char p[PATH_MAX];
	int err, fd;

	if (!bpf_map_lookup_elem(ifs_fd, &key, &have) && (have & bit))
		return 0;
	/* -EEXIST (the clsact qdisc is there already) is fine; keep libbpf quiet about it. */
	prev = libbpf_set_print(NULL);
	err = bpf_tc_hook_create(&hook);
	libbpf_set_print(prev);
	if (err && err != -EEXIST)
		return hint(msg, len, err, "creating the clsact qdisc");
	path(p, sizeof(p), pin, prog_pins[bit == KCOLL_STEER_HOOK_EGRESS ? P_OUT : P_IN]);
	fd = bpf_obj_get(p);
	if (fd < 0)
		return hint(msg, len, -errno, p);
	hook.attach_point = bit == KCOLL_STEER_HOOK_EGRESS ? BPF_TC_EGRESS : BPF_TC_INGRESS;
	to.prog_fd = fd;
	err = bpf_tc_attach(&hook, &to);
	close(fd);
	if (err)
		return hint(msg, len, err, "attaching the steering classifier");
	have |= bit;
	if (bpf_map_update_elem(ifs_fd, &key, &have, BPF_ANY))
		return hint(msg, len, -errno, "steer_ifs map");
	return 0;
}

/* The interface that holds an IPv4 address here; 0 if none. */
static int ifindex_of(__u32 addr)
{
	struct ifaddrs *ifa, *i;
	int idx = 0;

	if (getifaddrs(&ifa))
		return 0;
	for (i = ifa; i && !idx; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
		    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == addr)
			idx = (int)if_nametoindex(i->ifa_name);
	freeifaddrs(ifa);
	return idx;
}

static int hwaddr(int ifindex, __u8 mac[6])
{
	struct ifreq ifr = { 0 };
	int s, err = 0;

	if (!if_indextoname((unsigned)ifindex, ifr.ifr_name))
		return -ENODEV;
	s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	if (ioctl(s, SIOCGIFHWADDR, &ifr))
		err = -errno;
	else
		memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
	close(s);
	return err;
}

/* A complete ARP entry for addr on dev in /proc/net/arp (this netns). */
static int arp_lookup(__u32 addr, const char *dev, __u8 mac[6])
{
	char line[256], ip[64], hw[64], d[IF_NAMESIZE + 1];
	unsigned int flags, m[6];
	struct in_addr a;
	FILE *f = fopen("/proc/net/arp", "re");
	int err = -ENOENT;

	if (!f)
		return -errno;
	while (err && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%63s %*s %x %63s %*s %16s", ip, &flags, hw, d) != 4)
			continue;
		if (!(flags & 0x2) || strcmp(d, dev) || inet_pton(AF_INET, ip, &a) != 1 ||
		    a.s_addr != addr)
			continue;
		if (sscanf(hw, "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) != 6)
			continue;
		for (int i = 0; i < 6; i++)
			mac[i] = (__u8)m[i];
		err = 0;
	}
	fclose(f);
	return err;
}

/* The via neighbour's MAC; asks the kernel to resolve it (one UDP datagram
 * to the discard port from the via address) and waits up to 2 s. */
static int neigh_mac(__u32 laddr, __u32 raddr, int ifindex, __u8 mac[6], char *msg, size_t len)
{
	struct sockaddr_in src = { .sin_family = AF_INET, .sin_addr.s_addr = laddr };
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(9),
				   .sin_addr.s_addr = raddr };
	struct timespec ms50 = { 0, 50 * 1000 * 1000 };
	char dev[IF_NAMESIZE], a[INET_ADDRSTRLEN];
	int s;

	if (!if_indextoname((unsigned)ifindex, dev))
		return say(msg, len, -ENODEV, "interface #%d is gone", ifindex);
	if (!arp_lookup(raddr, dev, mac))
		return 0;
	s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s >= 0) {
		if (!bind(s, (struct sockaddr *)&src, sizeof(src)))
			sendto(s, "", 0, MSG_DONTWAIT, (struct sockaddr *)&dst, sizeof(dst));
		close(s);
	}
	for (int i = 0; i < 40; i++) {
		nanosleep(&ms50, NULL);
		if (!arp_lookup(raddr, dev, mac))
			return 0;
	}
	inet_ntop(AF_INET, &raddr, a, sizeof(a));
	return say(msg, len, -EHOSTUNREACH, "no neighbour entry for %s on %s (is it up and on that "
		   "network? ping -I %s %s)", a, dev, dev, a);
}

static void keys(const struct kcoll_steer_rule *r, struct kcoll_steer_key *out,
		 struct kcoll_steer_key *in)
{
	memset(out, 0, sizeof(*out));
	out->laddr = r->home_laddr;
	out->raddr = r->home_raddr;
	out->lport = r->lport;
	out->rport = r->rport;
	out->proto = r->proto;
	*in = *out;
	in->laddr = r->via_laddr;
	in->raddr = r->via_raddr;
}

static int check_rule(const struct kcoll_steer_rule *r, int need_via, char *msg, size_t len)
{
	if (r->proto != IPPROTO_TCP && r->proto != IPPROTO_UDP)
		return say(msg, len, -EINVAL, "protocol must be tcp or udp");
	if (!r->home_laddr || !r->home_raddr)
		return say(msg, len, -EINVAL, "a rule needs both home addresses (local and remote)");
	if (need_via && (!r->via_laddr || !r->via_raddr))
		return say(msg, len, -EINVAL, "a rule needs both via addresses (local and remote)");
	if (need_via && (r->via_laddr == r->home_laddr || r->via_raddr == r->home_raddr))
		return say(msg, len, -EINVAL, "the via addresses must differ from the home ones");
	return 0;
}

int kcoll_steer_add(const char *pin, const struct kcoll_steer_rule *r, char *msg, size_t len)
{
	struct kcoll_steer_val out = { 0 }, in = { 0 };
	struct kcoll_steer_key ko, ki;
	int fd[M_NR], err, home, via;
	char a[INET_ADDRSTRLEN];

	if (!r)
		return say(msg, len, -EINVAL, "no rule");
	if (r->flags & ~KCOLL_STEER_RECV_ONLY)
		return say(msg, len, -EOPNOTSUPP, "unknown rule flags 0x%x", r->flags);
	err = check_rule(r, 1, msg, len);
	if (err)
		return err;
	home = r->home_ifindex ? r->home_ifindex : ifindex_of(r->home_laddr);
	via = r->via_ifindex ? r->via_ifindex : ifindex_of(r->via_laddr);
	if (!home || !via) {
		inet_ntop(AF_INET, home ? &r->via_laddr : &r->home_laddr, a, sizeof(a));
		return say(msg, len, -EADDRNOTAVAIL, "%s is not an address of this network namespace "
			   "(ip -4 addr lists them; run where the flow's local end is, "
			   "kcoll-bpf --netns NAME)", a);
	}
	if (home == via)
		return say(msg, len, -EINVAL, "home and via addresses are on the same interface: "
			   "nothing to steer");
	err = hwaddr(via, out.smac);
	if (err)
		return hint(msg, len, err, "reading the via interface's MAC");
	err = neigh_mac(r->via_laddr, r->via_raddr, via, out.dmac, msg, len);
	if (err)
		return err;
	out.new_laddr = r->via_laddr;
	out.new_raddr = r->via_raddr;
	out.ifindex = (__u32)via;
	in.new_laddr = r->home_laddr;
	in.new_raddr = r->home_raddr;

	err = open_maps(pin, fd, NULL, 0);
	if (err == -ENOENT) {
		err = load_and_pin(pin, msg, len);
		if (err)
			return err;
		err = open_maps(pin, fd, msg, len);
	} else if (err) {
		err = open_maps(pin, fd, msg, len);
	}
	if (err)
		return err;
	/* Ingress first: the peer may already send on the via path. */
	err = hook_on(pin, fd[M_IFS], via, KCOLL_STEER_HOOK_INGRESS, msg, len);
	if (!err)
		err = hook_on(pin, fd[M_IFS], home, KCOLL_STEER_HOOK_EGRESS, msg, len);
	keys(r, &ko, &ki);
	if (!err && bpf_map_update_elem(fd[M_IN], &ki, &in, BPF_ANY))
		err = hint(msg, len, -errno, "steer_in map");
	if (!err && (r->flags & KCOLL_STEER_RECV_ONLY)) {
		if (bpf_map_delete_elem(fd[M_OUT], &ko) && errno != ENOENT)
			err = hint(msg, len, -errno, "steer_out map");
	} else if (!err && bpf_map_update_elem(fd[M_OUT], &ko, &out, BPF_ANY)) {
		err = hint(msg, len, -errno, "steer_out map");
	}
	close_fds(fd, M_NR);
	return err;
}

/* Does the in entry (k, v) restore exactly the home side of rule r? */
static int in_matches(const struct kcoll_steer_key *k, const struct kcoll_steer_val *v,
		      const struct kcoll_steer_key *home)
{
	return k->proto == home->proto && k->lport == home->lport && k->rport == home->rport &&
	       v->new_laddr == home->laddr && v->new_raddr == home->raddr;
}

int kcoll_steer_del(const char *pin, const struct kcoll_steer_rule *r, char *msg, size_t len)
{
	struct kcoll_steer_key ko, ki, k, next, *cur = NULL;
	struct kcoll_steer_val v;
	int fd[M_NR], err, found = 0;

	if (!r)
		return say(msg, len, -EINVAL, "no rule");
	err = check_rule(r, 0, msg, len);
	if (err)
		return err;
	err = open_maps(pin, fd, msg, len);
	if (err)
		return err;
	keys(r, &ko, &ki);
	/* Out first: from then on this host sends on the home path again. */
	if (!bpf_map_delete_elem(fd[M_OUT], &ko))
		found = 1;
	/* The in half is keyed by the via pair: find it by what it restores. */
	while (!bpf_map_get_next_key(fd[M_IN], cur, &next)) {
		k = next;
		cur = &k;
		if (!bpf_map_lookup_elem(fd[M_IN], &k, &v) && in_matches(&k, &v, &ko)) {
			if (bpf_map_delete_elem(fd[M_IN], &k) && errno != ENOENT && !err)
				err = hint(msg, len, -errno, "steer_in map");
			found = 1;
			cur = NULL;	/* the walk restarts after a delete */
		}
	}
	close_fds(fd, M_NR);
	if (!err && !found)
		return say(msg, len, -ENOENT, "no such rule (kcoll-bpf steer list shows them)");
	return err;
}

int kcoll_steer_foreach(const char *pin, kcoll_steer_cb cb, void *arg, char *msg, size_t len)
{
	struct kcoll_steer_key k, next, *cur = NULL, ko;
	struct kcoll_steer_val v, vo;
	struct kcoll_steer_rule r;
	int fd[M_NR], err;

	if (!cb)
		return say(msg, len, -EINVAL, "no callback");
	err = open_maps(pin, fd, msg, len);
	if (err)
		return err;
	/* Every rule has its in half; the out half is missing when RECV_ONLY. */
	while (!err && !bpf_map_get_next_key(fd[M_IN], cur, &next)) {
		k = next;
		cur = &k;
		if (bpf_map_lookup_elem(fd[M_IN], &k, &v))
			continue;	/* deleted meanwhile */
		memset(&r, 0, sizeof(r));
		r.proto = k.proto;
		r.lport = k.lport;
		r.rport = k.rport;
		r.home_laddr = v.new_laddr;
		r.home_raddr = v.new_raddr;
		r.via_laddr = k.laddr;
		r.via_raddr = k.raddr;
		r.via_ifindex = ifindex_of(k.laddr);
		r.home_ifindex = ifindex_of(v.new_laddr);
		r.in_pkts = v.pkts;
		r.in_bytes = v.bytes;
		ko = k;
		ko.laddr = v.new_laddr;
		ko.raddr = v.new_raddr;
		if (!bpf_map_lookup_elem(fd[M_OUT], &ko, &vo)) {
			memcpy(r.via_dmac, vo.dmac, 6);
			r.out_pkts = vo.pkts;
			r.out_bytes = vo.bytes;
		} else {
			r.flags |= KCOLL_STEER_RECV_ONLY;
		}
		err = cb(&r, arg);
	}
	close_fds(fd, M_NR);
	return err;
}

int kcoll_steer_detach(const char *pin, char *msg, size_t len)
{
	__u32 key, next, *cur = NULL, bits;
	int fd[M_NR], err, first = 0;
	char p[PATH_MAX];

	err = open_maps(pin, fd, NULL, 0);
	if (err && err != -ENOENT)
		return open_maps(pin, fd, msg, len);
	while (!err && !bpf_map_get_next_key(fd[M_IFS], cur, &next)) {
		LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = (int)next);
		LIBBPF_OPTS(bpf_tc_opts, d, .handle = KCOLL_STEER_TC_HANDLE,
			    .priority = KCOLL_STEER_TC_PRIO);
		int e;

		key = next;
		cur = &key;
		if (bpf_map_lookup_elem(fd[M_IFS], &key, &bits))
			continue;
		for (int h = 0; h < 2; h++) {
			__u32 bit = h ? KCOLL_STEER_HOOK_INGRESS : KCOLL_STEER_HOOK_EGRESS;

			if (!(bits & bit))
				continue;
			hook.attach_point = h ? BPF_TC_INGRESS : BPF_TC_EGRESS;
			e = bpf_tc_detach(&hook, &d);
			/* gone already: the interface, its qdisc or the filter */
			if (e && e != -ENOENT && e != -EINVAL && e != -ENODEV && !first)
				first = hint(msg, len, e, "detaching a steering classifier");
		}
	}
	if (!err)
		close_fds(fd, M_NR);
	for (int i = 0; i < M_NR; i++) {
		path(p, sizeof(p), pin, map_names[i]);
		if (unlink(p) && errno != ENOENT && !first)
			first = hint(msg, len, -errno, p);
	}
	for (int i = 0; i < P_NR; i++) {
		path(p, sizeof(p), pin, prog_pins[i]);
		if (unlink(p) && errno != ENOENT && !first)
			first = hint(msg, len, -errno, p);
	}
	if (rmdir(dir_of(pin)) && errno != ENOENT && !first)
		first = say(msg, len, -errno, "%s: %s (something else is pinned there)", dir_of(pin),
			    strerror(errno));
	return first;
}
