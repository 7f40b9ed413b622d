// SPDX-License-Identifier: MIT
/* Loader of the flow steering classifiers; the API is in kcoll_steer.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/neighbour.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/route/neighbour.h>

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

/*
 * What steering asks of the kernel's network configuration goes through
 * rtnetlink (libnl-route): which interface holds an address, an interface's
 * MAC, a neighbour's MAC. One netlink socket per API call, in the caller's
 * netns.
 */
struct rt {
	struct nl_sock *sk;
	struct nl_cache *addrs;	/* this netns's addresses, on first use */
};

/* libnl's error codes as negative errno. */
static int nl_errno(int nlerr)
{
	switch (-nlerr) {
	case NLE_PERM:
		return -EPERM;
	case NLE_NOACCESS:
		return -EACCES;
	case NLE_NOMEM:
		return -ENOMEM;
	case NLE_NODEV:
	case NLE_OBJ_NOTFOUND:
		return -ENODEV;
	default:
		return -EIO;
	}
}

static int rt_open(struct rt *rt, char *msg, size_t len)
{
	int err;

	rt->addrs = NULL;
	rt->sk = nl_socket_alloc();
	if (!rt->sk)
		return say(msg, len, -ENOMEM, "rtnetlink: no memory for a socket");
	err = nl_connect(rt->sk, NETLINK_ROUTE);
	if (err < 0) {
		nl_socket_free(rt->sk);
		rt->sk = NULL;
		return say(msg, len, nl_errno(err), "rtnetlink: %s", nl_geterror(err));
	}
	return 0;
}

static void rt_close(struct rt *rt)
{
	if (rt->addrs)
		nl_cache_free(rt->addrs);
	if (rt->sk)
		nl_socket_free(rt->sk);
}

/* The interface that holds IPv4 address addr here; 0 if none (or unknown). */
static int rt_ifindex(struct rt *rt, __u32 addr)
{
	struct nl_object *o;

	if (!rt->addrs && rtnl_addr_alloc_cache(rt->sk, &rt->addrs) < 0)
		return 0;
	for (o = nl_cache_get_first(rt->addrs); o; o = nl_cache_get_next(o)) {
		struct rtnl_addr *a = (struct rtnl_addr *)o;
		struct nl_addr *l = rtnl_addr_get_local(a);

		if (rtnl_addr_get_family(a) == AF_INET && l && nl_addr_get_len(l) == 4 &&
		    !memcmp(nl_addr_get_binary_addr(l), &addr, 4))
			return rtnl_addr_get_ifindex(a);
	}
	return 0;
}

static int rt_hwaddr(struct rt *rt, int ifindex, __u8 mac[6])
{
	struct rtnl_link *link;
	struct nl_addr *a;
	int err = rtnl_link_get_kernel(rt->sk, ifindex, NULL, &link);

	if (err < 0)
		return nl_errno(err);
	a = rtnl_link_get_addr(link);
	if (a && nl_addr_get_len(a) == 6)
		memcpy(mac, nl_addr_get_binary_addr(a), 6);
	else
		err = -EAFNOSUPPORT;	/* not an Ethernet interface */
	rtnl_link_put(link);
	return err;
}

/* The MAC of addr's neighbour entry on ifindex if it is usable (the kernel's
 * NUD_VALID states); -ENOENT if there is none yet. */
static int rt_neigh(struct rt *rt, __u32 addr, int ifindex, __u8 mac[6])
{
	const int valid = NUD_PERMANENT | NUD_NOARP | NUD_REACHABLE | NUD_PROBE | NUD_STALE |
			  NUD_DELAY;
	struct nl_cache *cache;
	struct nl_addr *dst;
	struct rtnl_neigh *n;
	struct nl_addr *ll;
	int err = rtnl_neigh_alloc_cache(rt->sk, &cache);

	if (err < 0)
		return nl_errno(err);
	dst = nl_addr_build(AF_INET, &addr, 4);
	n = dst ? rtnl_neigh_get(cache, ifindex, dst) : NULL;
	err = -ENOENT;
	if (n) {
		ll = rtnl_neigh_get_lladdr(n);
		if ((rtnl_neigh_get_state(n) & valid) && ll && nl_addr_get_len(ll) == 6) {
			memcpy(mac, nl_addr_get_binary_addr(ll), 6);
			err = 0;
		}
		rtnl_neigh_put(n);
	}
	nl_addr_put(dst);
	nl_cache_free(cache);
	return err;
}

/* The via neighbour's MAC; asks the kernel to resolve it (one UDP datagram
 * to the discard port from the via address) and waits up to 2 s. */
static int neigh_mac(struct rt *rt, __u32 laddr, __u32 raddr, int ifindex, __u8 mac[6],
		     char *msg, size_t len)
{
	struct sockaddr_in src = { .sin_family = AF_INET, .sin_addr.s_addr = laddr };
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(9),
				   .sin_addr.s_addr = raddr };
	struct timespec ms50 = { 0, 50 * 1000 * 1000 };
	char dev[IF_NAMESIZE], a[INET_ADDRSTRLEN];
	int s, err;

	if (!if_indextoname((unsigned)ifindex, dev))
		return say(msg, len, -ENODEV, "interface #%d is gone", ifindex);
	err = rt_neigh(rt, raddr, ifindex, mac);
	if (err == -ENOENT) {
		s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (s >= 0) {
			if (!bind(s, (struct sockaddr *)&src, sizeof(src)))
				sendto(s, "", 0, MSG_DONTWAIT, (struct sockaddr *)&dst, sizeof(dst));
			close(s);
		}
		for (int i = 0; i < 40 && err == -ENOENT; i++) {
			nanosleep(&ms50, NULL);
			err = rt_neigh(rt, raddr, ifindex, mac);
		}
	}
	if (err != -ENOENT)
		return err ? hint(msg, len, err, "reading the neighbour table") : 0;
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
	struct rt rt;

	if (!r)
		return say(msg, len, -EINVAL, "no rule");
	if (r->flags & ~KCOLL_STEER_RECV_ONLY)
		return say(msg, len, -EOPNOTSUPP, "unknown rule flags 0x%x", r->flags);
	err = check_rule(r, 1, msg, len);
	if (err)
		return err;
	err = rt_open(&rt, msg, len);
	if (err)
		return err;
	home = r->home_ifindex ? r->home_ifindex : rt_ifindex(&rt, r->home_laddr);
	via = r->via_ifindex ? r->via_ifindex : rt_ifindex(&rt, r->via_laddr);
	if (!home || !via) {
		inet_ntop(AF_INET, home ? &r->via_laddr : &r->home_laddr, a, sizeof(a));
		err = say(msg, len, -EADDRNOTAVAIL, "%s is not an address of this network namespace "
			  "(ip -4 addr lists them; run where the flow's local end is, "
			  "kcoll-bpf --netns NAME)", a);
	} else if (home == via) {
		err = say(msg, len, -EINVAL, "home and via addresses are on the same interface: "
			  "nothing to steer");
	} else {
		err = rt_hwaddr(&rt, via, out.smac);
		if (err)
			hint(msg, len, err, "reading the via interface's MAC");
		else
			err = neigh_mac(&rt, r->via_laddr, r->via_raddr, via, out.dmac, msg, len);
	}
	rt_close(&rt);
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
	struct rt rt;

	if (!cb)
		return say(msg, len, -EINVAL, "no callback");
	err = open_maps(pin, fd, msg, len);
	if (err)
		return err;
	err = rt_open(&rt, msg, len);
	if (err) {
		close_fds(fd, M_NR);
		return err;
	}
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
		r.via_ifindex = rt_ifindex(&rt, k.laddr);
		r.home_ifindex = rt_ifindex(&rt, v.new_laddr);
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
	rt_close(&rt);
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
