// SPDX-License-Identifier: MIT
/* Loader and reader of the eBPF flow tracker; the API is in kcoll_bpf.h. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "kcoll_bpf.h"
#include "flows.skel.h"

#ifndef BPF_FS_MAGIC
#define BPF_FS_MAGIC 0xcafe4a11
#endif
#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

/* Our tc filters: fixed handle and priority so detach finds exactly them. */
#define KCOLL_TC_HANDLE 0xc011
#define KCOLL_TC_PRIO 0xc0

enum { M_FLOWS, M_TCP, M_LINK_CFG, M_PEER_CFG, M_TRACK_PORTS, M_TRACK_CG,
       M_TRACK_FLOWS, M_SETTINGS, M_IFACES, M_NR };
static const char *const map_names[M_NR] = {
	"flows", "tcp", "link_cfg", "peer_cfg", "track_ports", "track_cg",
	"track_flows", "settings", "ifaces",
};
enum { P_INGRESS, P_EGRESS, P_SOCKOPS, P_NR };
static const char *const prog_pins[P_NR] = { "prog_tc_ingress", "prog_tc_egress", "prog_sockops" };
static const char sockops_link_pin[] = "link_sockops";

struct kcoll_bpf {
	char pin_dir[PATH_MAX - 64];
	char cgroup[PATH_MAX];
	__u32 flags;
	int map_fd[M_NR];
	char err[512];
};

static __thread char open_err[512];

static int fail(struct kcoll_bpf *b, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(struct kcoll_bpf *b, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b ? b->err : open_err, sizeof(open_err), fmt, ap);
	va_end(ap);
	return err;
}

const char *kcoll_bpf_strerror(const struct kcoll_bpf *b)
{
	return b && b->err[0] ? b->err : "no error";
}

const char *kcoll_bpf_open_error(void)
{
	return open_err[0] ? open_err : "no error";
}

/*
 * libbpf speaks only for warnings, prefixed so a daemon log says who. The
 * kernel's "Exclusivity flag on" is what creating a clsact qdisc that already
 * exists says: expected on every attach after the first, not a problem.
 */
static int libbpf_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	char line[512];

	if (level != LIBBPF_WARN)
		return 0;
	vsnprintf(line, sizeof(line), fmt, ap);
	if (strstr(line, "Exclusivity flag on"))
		return 0;
	return fprintf(stderr, "kcoll_bpf: %s", line);
}

static void pin_path(const struct kcoll_bpf *b, char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", b->pin_dir, name);
}

static int perm_hint(struct kcoll_bpf *b, int err, const char *what)
{
	if (err == -EPERM || err == -EACCES)
		return fail(b, err, "%s: %s: loading and attaching BPF programs needs root "
			    "(CAP_BPF + CAP_NET_ADMIN + CAP_SYS_ADMIN); run as root or without KCOLL_BPF",
			    what, strerror(-err));
	return fail(b, err, "%s: %s", what, strerror(-err));
}

/*
 * Would a bpffs mounted on /sys/fs/bpf now be seen by other processes? Not in
 * a private mount namespace such as ip netns exec's, which mounts a fresh
 * sysfs on /sys named after the netns (source "sysfs" elsewhere). Where pid
 * 1's namespace is readable, compare with it instead.
 */
static int sys_is_shared(void)
{
	char line[1024], src[256] = "sysfs";
	struct stat a, b;
	FILE *f;

	if (!stat("/proc/self/ns/mnt", &a) && !stat("/proc/1/ns/mnt", &b))
		return a.st_ino == b.st_ino && a.st_dev == b.st_dev;
	f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return 1;
	while (fgets(line, sizeof(line), f)) {
		char mnt[256], *dash = strstr(line, " - sysfs ");

		if (dash && sscanf(line, "%*s %*s %*s %*s %255s", mnt) == 1 && !strcmp(mnt, "/sys"))
			sscanf(dash + 9, "%255s", src);	/* the last mount on /sys wins */
	}
	fclose(f);
	return !strcmp(src, "sysfs") || !strcmp(src, "none");
}

int kcoll_bpffs_ensure(const char *dir, const char *example, char *msg, size_t len)
{
	char parent[PATH_MAX];
	struct statfs st;
	char *slash;

	msg[0] = '\0';
	snprintf(parent, sizeof(parent), "%s", dir);
	slash = strrchr(parent, '/');
	if (!slash || slash == parent) {
		snprintf(msg, len, "pin directory '%s' must be a subdirectory of a bpf filesystem, e.g. %s",
			 dir, example);
		return -EINVAL;
	}
	*slash = '\0';
	if (statfs(parent, &st)) {
		int err = -errno;

		snprintf(msg, len, "pin directory parent %s: %s (mount bpffs there: mount -t bpf bpf %s)",
			 parent, strerror(-err), parent);
		return err;
	}
	if ((unsigned long)st.f_type == BPF_FS_MAGIC)
		return 0;
	if (strcmp(parent, "/sys/fs/bpf")) {
		snprintf(msg, len, "%s is not a bpf filesystem: mount one there (mount -t bpf bpf %s) or "
			 "pin under /sys/fs/bpf (--pin)", parent, parent);
		return -ENOTSUP;
	}
	if (!sys_is_shared()) {
		snprintf(msg, len, "/sys/fs/bpf is not a bpf filesystem in this mount namespace (ip netns "
			 "exec remounts /sys; a bpffs mounted here would be private to it): run from the "
			 "root namespace (kcoll-bpf --netns NAME), or pin under a bpffs every reader sees "
			 "(--pin / KCOLL_BPF_PIN)");
		return -ENOTSUP;
	}
	if (mount("bpf", parent, "bpf", 0, "mode=0700")) {
		int err = -errno;

		snprintf(msg, len, "/sys/fs/bpf is not a bpf filesystem and mounting one failed: %s (as "
			 "root: mount -t bpf bpf /sys/fs/bpf)", strerror(-err));
		return err;
	}
	return 0;
}

static int ensure_bpffs(struct kcoll_bpf *b)
{
	char msg[512];
	int err = kcoll_bpffs_ensure(b->pin_dir, KCOLL_BPF_PIN_DEFAULT, msg, sizeof(msg));

	return err ? fail(b, err, "%s", msg) : 0;
}

static void close_maps(struct kcoll_bpf *b)
{
	for (int i = 0; i < M_NR; i++) {
		if (b->map_fd[i] >= 0)
			close(b->map_fd[i]);
		b->map_fd[i] = -1;
	}
}

/* Open every pinned map; -ENOENT (with a message) when not attached. */
static int open_pins(struct kcoll_bpf *b)
{
	char p[PATH_MAX];

	for (int i = 0; i < M_NR; i++) {
		if (b->map_fd[i] >= 0)
			continue;
		pin_path(b, p, sizeof(p), map_names[i]);
		b->map_fd[i] = bpf_obj_get(p);
		if (b->map_fd[i] < 0) {
			int err = -errno;

			close_maps(b);
			if (err == -ENOENT)
				return fail(b, err, "flow tracking is not attached (no %s): "
					    "run 'kcoll-bpf attach IFACE' or kcolld with KCOLL_BPF=1", p);
			return perm_hint(b, err, p);
		}
	}
	return 0;
}

int kcoll_bpf_open(struct kcoll_bpf **out, const struct kcoll_bpf_opts *opts)
{
	struct kcoll_bpf_opts o = { 0 };
	struct kcoll_bpf *b;
	int err;

	open_err[0] = '\0';
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (opts) {
		if (opts->size < sizeof(__u32) || opts->size > sizeof(o))
			return fail(NULL, -EINVAL, "kcoll_bpf_opts: bad size %u", opts->size);
		memcpy(&o, opts, opts->size);
	}
	if (o.flags & ~(__u32)(KCOLL_BPF_OPEN_READ | KCOLL_BPF_TRACK_ALL | KCOLL_BPF_NO_SOCKOPS))
		return fail(NULL, -EOPNOTSUPP, "kcoll_bpf_opts: unknown flags 0x%x", o.flags);
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	for (int i = 0; i < M_NR; i++)
		b->map_fd[i] = -1;
	b->flags = o.flags;
	if (snprintf(b->pin_dir, sizeof(b->pin_dir), "%s", o.pin_dir ? o.pin_dir : KCOLL_BPF_PIN_DEFAULT)
	    >= (int)sizeof(b->pin_dir) ||
	    snprintf(b->cgroup, sizeof(b->cgroup), "%s", o.cgroup ? o.cgroup : "")
	    >= (int)sizeof(b->cgroup)) {
		free(b);
		return fail(NULL, -ENAMETOOLONG, "pin directory or cgroup path too long");
	}
	while (strlen(b->pin_dir) > 1 && b->pin_dir[strlen(b->pin_dir) - 1] == '/')
		b->pin_dir[strlen(b->pin_dir) - 1] = '\0';
	libbpf_set_print(libbpf_print);

	err = ensure_bpffs(b);
	if (!err && (o.flags & KCOLL_BPF_OPEN_READ))
		err = open_pins(b);
	if (err) {
		memcpy(open_err, b->err, sizeof(open_err));
		kcoll_bpf_close(b);
		return err;
	}
	*out = b;
	return 0;
}

void kcoll_bpf_close(struct kcoll_bpf *b)
{
	if (!b)
		return;
	close_maps(b);
	free(b);
}

static int netns_cookie(__u64 *out)
{
	socklen_t len = sizeof(*out);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int err = 0;

	if (fd < 0)
		return -errno;
	if (getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, out, &len))
		err = -errno;
	close(fd);
	return err;
}

/* Where cgroup v2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid systems). */
static int find_cgroup2(struct kcoll_bpf *b)
{
	char dev[256], dir[PATH_MAX], type[64];
	FILE *f;
	int found = 0;

	if (b->cgroup[0])
		return 0;
	f = fopen("/proc/self/mounts", "re");
	if (!f)
		return fail(b, -errno, "/proc/self/mounts: %s", strerror(errno));
	while (!found && fscanf(f, "%255s %4095s %63s %*[^\n]", dev, dir, type) == 3)
		if (!strcmp(type, "cgroup2")) {
			snprintf(b->cgroup, sizeof(b->cgroup), "%s", dir);
			found = 1;
		}
	fclose(f);
	if (!found)
		return fail(b, -ENOMEDIUM, "no cgroup v2 filesystem is mounted (sockops attaches to one): "
			    "mount -t cgroup2 none /sys/fs/cgroup, or attach with --no-sockops "
			    "(no retransmission / RTT)");
	return 0;
}

/* First attach: load the object (maps pinned by libbpf), pin the programs,
 * attach sockops to the cgroup, record the netns. */
static int load_and_pin(struct kcoll_bpf *b)
{
	LIBBPF_OPTS(bpf_object_open_opts, oo, .pin_root_path = b->pin_dir);
	struct kcoll_bpf_settings set = { 0 };
	struct flows_bpf *skel;
	char p[PATH_MAX];
	struct bpf_program *progs[P_NR];
	__u32 zero = 0;
	struct bpf_link *link;
	int err, cg;

	if (mkdir(b->pin_dir, 0700) && errno != EEXIST)
		return perm_hint(b, -errno, b->pin_dir);
	skel = flows_bpf__open_opts(&oo);
	if (!skel)
		return perm_hint(b, -errno, "opening the BPF object");
	err = flows_bpf__load(skel);
	if (err) {
		perm_hint(b, err, "loading the BPF programs");
		goto err_destroy;
	}
	progs[P_INGRESS] = skel->progs.kcoll_ingress;
	progs[P_EGRESS] = skel->progs.kcoll_egress;
	progs[P_SOCKOPS] = skel->progs.kcoll_sockops;
	for (int i = 0; i < P_NR; i++) {
		pin_path(b, p, sizeof(p), prog_pins[i]);
		err = bpf_program__pin(progs[i], p);
		if (err) {
			perm_hint(b, err, p);
			goto err_unpin;
		}
	}

	set.flags = (b->flags & KCOLL_BPF_TRACK_ALL) ? KCOLL_SET_TRACK_ALL : 0;
	err = netns_cookie(&set.netns_cookie);
	if (err) {
		fail(b, err, "reading this network namespace's cookie: %s", strerror(-err));
		goto err_unpin;
	}
	err = bpf_map_update_elem(bpf_map__fd(skel->maps.settings), &zero, &set, BPF_ANY);
	if (err) {
		perm_hint(b, -errno, "settings map");
		goto err_unpin;
	}

	if (!(b->flags & KCOLL_BPF_NO_SOCKOPS)) {
		err = find_cgroup2(b);
		if (err)
			goto err_unpin;
		cg = open(b->cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (cg < 0) {
			err = fail(b, -errno, "cgroup %s: %s (sockops needs a cgroup v2 directory; "
				   "use KCOLL_BPF_NO_SOCKOPS / --no-sockops to go without "
				   "retransmission and RTT)", b->cgroup, strerror(errno));
			goto err_unpin;
		}
		/* A link, pinned: removing the pin detaches it, whoever attached it. */
		link = bpf_program__attach_cgroup(progs[P_SOCKOPS], cg);
		close(cg);
		if (!link) {
			perm_hint(b, err = -errno, "attaching sockops to the cgroup");
			goto err_unpin;
		}
		pin_path(b, p, sizeof(p), sockops_link_pin);
		err = bpf_link__pin(link, p);
		bpf_link__destroy(link);
		if (err) {
			perm_hint(b, err, p);
			goto err_unpin;
		}
	}
	flows_bpf__destroy(skel);	/* programs live on in their pins and attachments */
	return 0;

err_unpin:
	pin_path(b, p, sizeof(p), sockops_link_pin);
	unlink(p);
	for (int i = 0; i < P_NR; i++) {
		pin_path(b, p, sizeof(p), prog_pins[i]);
		unlink(p);
	}
	bpf_object__unpin_maps(skel->obj, NULL);
	rmdir(b->pin_dir);
err_destroy:
	flows_bpf__destroy(skel);
	return err;
}

static int tc_attach_one(struct kcoll_bpf *b, int ifindex, int in_fd, int eg_fd)
{
	LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = BPF_TC_INGRESS | BPF_TC_EGRESS);
	LIBBPF_OPTS(bpf_tc_opts, to, .handle = KCOLL_TC_HANDLE, .priority = KCOLL_TC_PRIO,
		    .flags = BPF_TC_F_REPLACE);
	__u32 one = 1;
	int err;

	err = bpf_tc_hook_create(&hook);	/* the clsact qdisc */
	if (err && err != -EEXIST)
		return perm_hint(b, err, "creating the clsact qdisc");
	hook.attach_point = BPF_TC_INGRESS;
	to.prog_fd = in_fd;
	err = bpf_tc_attach(&hook, &to);
	if (err)
		return perm_hint(b, err, "attaching the tc ingress classifier");
	hook.attach_point = BPF_TC_EGRESS;
	to.prog_fd = eg_fd;
	to.prog_id = 0;
	err = bpf_tc_attach(&hook, &to);
	if (err) {
		LIBBPF_OPTS(bpf_tc_opts, d, .handle = KCOLL_TC_HANDLE, .priority = KCOLL_TC_PRIO);

		hook.attach_point = BPF_TC_INGRESS;
		bpf_tc_detach(&hook, &d);
		return perm_hint(b, err, "attaching the tc egress classifier");
	}
	if (bpf_map_update_elem(b->map_fd[M_IFACES], &ifindex, &one, BPF_ANY))
		return perm_hint(b, -errno, "ifaces map");
	return 0;
}

/* Interface indexes are per network namespace: stay in the one that attached. */
static int same_netns(struct kcoll_bpf *b)
{
	struct kcoll_bpf_settings set;
	__u32 zero = 0;
	__u64 cookie;

	if (!bpf_map_lookup_elem(b->map_fd[M_SETTINGS], &zero, &set) && !netns_cookie(&cookie) &&
	    set.netns_cookie && set.netns_cookie != cookie)
		return fail(b, -EXDEV, "%s was attached from another network namespace: "
			    "run this there (kcoll-bpf --netns NAME), or use another pin directory",
			    b->pin_dir);
	return 0;
}

int kcoll_bpf_attach(struct kcoll_bpf *b, const int *ifindex, int n)
{
	char p[PATH_MAX];
	int fd[2] = { -1, -1 }, err;

	if (!b || (n && !ifindex) || n < 0)
		return -EINVAL;
	b->err[0] = '\0';
	err = open_pins(b);
	if (err == -ENOENT) {
		b->err[0] = '\0';
		err = load_and_pin(b);
		if (!err)
			err = open_pins(b);
	}
	if (err)
		return err;
	err = same_netns(b);
	if (err)
		return err;
	for (int i = 0; i < P_EGRESS + 1; i++) {
		pin_path(b, p, sizeof(p), prog_pins[i]);
		fd[i] = bpf_obj_get(p);
		if (fd[i] < 0) {
			err = perm_hint(b, -errno, p);
			goto out;
		}
	}
	for (int i = 0; i < n; i++) {
		if (ifindex[i] <= 0) {
			err = fail(b, -EINVAL, "bad interface index %d", ifindex[i]);
			goto out;
		}
		err = tc_attach_one(b, ifindex[i], fd[0], fd[1]);
		if (err)
			goto out;
	}
out:
	for (int i = 0; i < 2; i++)
		if (fd[i] >= 0)
			close(fd[i]);
	return err;
}

int kcoll_bpf_attach_names(struct kcoll_bpf *b, const char *ifnames)
{
	int idx[64], n = 0;
	char buf[1024], *save, *tok;

	if (!b || !ifnames)
		return -EINVAL;
	if (snprintf(buf, sizeof(buf), "%s", ifnames) >= (int)sizeof(buf))
		return fail(b, -ENAMETOOLONG, "interface list too long");
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == (int)(sizeof(idx) / sizeof(idx[0])))
			return fail(b, -E2BIG, "more than %d interfaces", n);
		idx[n] = (int)if_nametoindex(tok);
		if (!idx[n])
			return fail(b, -ENODEV, "no interface '%s' in this network namespace "
				    "(ip link lists them)", tok);
		n++;
	}
	if (!n)
		return fail(b, -EINVAL, "no interface named (give e.g. eth0,eth1)");
	return kcoll_bpf_attach(b, idx, n);
}

int kcoll_bpf_detach(struct kcoll_bpf *b)
{
	char p[PATH_MAX];
	__u32 key, next, *cur = NULL;
	int err, fd, first_err = 0;

	if (!b)
		return -EINVAL;
	b->err[0] = '\0';
	err = open_pins(b);
	if (err && err != -ENOENT)
		return err;
	if (!err && (err = same_netns(b)))
		return err;
	if (!err) {
		while (!bpf_map_get_next_key(b->map_fd[M_IFACES], cur, &next)) {
			LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = (int)next);
			LIBBPF_OPTS(bpf_tc_opts, d, .handle = KCOLL_TC_HANDLE, .priority = KCOLL_TC_PRIO);

			/* -ENOENT / -EINVAL: the interface or filter is gone already. */
			hook.attach_point = BPF_TC_INGRESS;
			err = bpf_tc_detach(&hook, &d);
			if (err && err != -ENOENT && err != -EINVAL && err != -ENODEV && !first_err)
				first_err = perm_hint(b, err, "detaching the tc ingress classifier");
			hook.attach_point = BPF_TC_EGRESS;
			err = bpf_tc_detach(&hook, &d);
			if (err && err != -ENOENT && err != -EINVAL && err != -ENODEV && !first_err)
				first_err = perm_hint(b, err, "detaching the tc egress classifier");
			key = next;
			cur = &key;
		}
	}
	close_maps(b);

	/* The sockops link: detach it explicitly (another fd may hold it), then unpin. */
	pin_path(b, p, sizeof(p), sockops_link_pin);
	fd = bpf_obj_get(p);
	if (fd >= 0) {
		if (bpf_link_detach(fd) && !first_err)
			first_err = perm_hint(b, -errno, "detaching sockops");
		close(fd);
	}
	if (unlink(p) && errno != ENOENT && !first_err)
		first_err = perm_hint(b, -errno, p);
	for (int i = 0; i < M_NR; i++) {
		pin_path(b, p, sizeof(p), map_names[i]);
		if (unlink(p) && errno != ENOENT && !first_err)
			first_err = perm_hint(b, -errno, p);
	}
	for (int i = 0; i < P_NR; i++) {
		pin_path(b, p, sizeof(p), prog_pins[i]);
		if (unlink(p) && errno != ENOENT && !first_err)
			first_err = perm_hint(b, -errno, p);
	}
	if (rmdir(b->pin_dir) && errno != ENOENT && !first_err)
		first_err = fail(b, -errno, "%s: %s (something else is pinned there)", b->pin_dir,
				 strerror(errno));
	return first_err;
}

static int need_pins(struct kcoll_bpf *b)
{
	if (!b)
		return -EINVAL;
	b->err[0] = '\0';
	return open_pins(b);
}

static int set_ports(struct kcoll_bpf *b, __u16 lo, __u16 hi, int on)
{
	struct kcoll_port_range r, want = { .lo = lo, .hi = hi, .in_use = 1 };
	int free_slot = -1, err = need_pins(b);

	if (err)
		return err;
	if (lo > hi || !lo)
		return fail(b, -EINVAL, "bad port range %u-%u (1..65535, low <= high)", lo, hi);
	for (__u32 i = 0; i < KCOLL_TRACK_SLOTS; i++) {
		if (bpf_map_lookup_elem(b->map_fd[M_TRACK_PORTS], &i, &r))
			return perm_hint(b, -errno, "track_ports map");
		if (r.in_use && r.lo == lo && r.hi == hi) {
			if (on)
				return 0;
			memset(&r, 0, sizeof(r));
			if (bpf_map_update_elem(b->map_fd[M_TRACK_PORTS], &i, &r, BPF_ANY))
				return perm_hint(b, -errno, "track_ports map");
			return 0;
		}
		if (!r.in_use && free_slot < 0)
			free_slot = (int)i;
	}
	if (!on)
		return fail(b, -ENOENT, "port range %u-%u is not tracked", lo, hi);
	if (free_slot < 0)
		return fail(b, -ENOSPC, "all %d port-range slots are used: untrack one first",
			    KCOLL_TRACK_SLOTS);
	if (bpf_map_update_elem(b->map_fd[M_TRACK_PORTS], &(__u32){ (__u32)free_slot }, &want, BPF_ANY))
		return perm_hint(b, -errno, "track_ports map");
	return 0;
}

int kcoll_bpf_track_ports(struct kcoll_bpf *b, __u16 lo, __u16 hi)
{
	return set_ports(b, lo, hi, 1);
}

int kcoll_bpf_untrack_ports(struct kcoll_bpf *b, __u16 lo, __u16 hi)
{
	return set_ports(b, lo, hi, 0);
}

int kcoll_bpf_track_cgroup(struct kcoll_bpf *b, const char *cgroup_path)
{
	union {
		struct file_handle fh;
		char space[sizeof(struct file_handle) + sizeof(__u64)];
	} h;
	__u64 id;
	__u32 one = 1;
	int mount_id, err = need_pins(b);

	if (err)
		return err;
	if (!cgroup_path)
		return -EINVAL;
	/* A cgroup v2 id is the kernfs inode number its file handle carries. */
	h.fh.handle_bytes = sizeof(id);
	if (name_to_handle_at(AT_FDCWD, cgroup_path, &h.fh, &mount_id, 0))
		return fail(b, -errno, "cgroup %s: %s (give a cgroup v2 directory, e.g. "
			    "/sys/fs/cgroup/mpi.slice)", cgroup_path, strerror(errno));
	memcpy(&id, h.fh.f_handle, sizeof(id));
	if (bpf_map_update_elem(b->map_fd[M_TRACK_CG], &id, &one, BPF_ANY))
		return perm_hint(b, -errno, "track_cg map");
	return 0;
}

int kcoll_bpf_set_track_all(struct kcoll_bpf *b, int on)
{
	struct kcoll_bpf_settings s;
	__u32 zero = 0;
	int err = need_pins(b);

	if (err)
		return err;
	if (bpf_map_lookup_elem(b->map_fd[M_SETTINGS], &zero, &s))
		return perm_hint(b, -errno, "settings map");
	s.flags = on ? (s.flags | KCOLL_SET_TRACK_ALL) : (s.flags & ~(__u32)KCOLL_SET_TRACK_ALL);
	if (bpf_map_update_elem(b->map_fd[M_SETTINGS], &zero, &s, BPF_ANY))
		return perm_hint(b, -errno, "settings map");
	return 0;
}

int kcoll_bpf_set_link(struct kcoll_bpf *b, __u32 ifindex, __u32 laddr, __u32 link_id)
{
	struct kcoll_link_cfg_key k = { .ifindex = ifindex, .laddr = laddr };
	int err = need_pins(b);

	if (err)
		return err;
	if (!ifindex || link_id == KCOLL_LINK_NONE)
		return fail(b, -EINVAL, "bad link: ifindex %u, id %u", ifindex, link_id);
	if (bpf_map_update_elem(b->map_fd[M_LINK_CFG], &k, &link_id, BPF_ANY))
		return perm_hint(b, -errno, "link_cfg map");
	return 0;
}

int kcoll_bpf_set_peer(struct kcoll_bpf *b, __u32 raddr, __u32 host)
{
	int err = need_pins(b);

	if (err)
		return err;
	if (!raddr || host == KCOLL_LINK_NONE)
		return fail(b, -EINVAL, "bad peer: address 0 or host %u", host);
	if (bpf_map_update_elem(b->map_fd[M_PEER_CFG], &raddr, &host, BPF_ANY))
		return perm_hint(b, -errno, "peer_cfg map");
	return 0;
}

int kcoll_bpf_flows_foreach(struct kcoll_bpf *b, kcoll_bpf_flow_cb cb, void *arg)
{
	struct kcoll_flow_key key, next, *cur = NULL;
	struct kcoll_flow_val v;
	struct kcoll_tcp_val t;
	int err = need_pins(b);

	if (err)
		return err;
	if (!cb)
		return -EINVAL;
	while (!bpf_map_get_next_key(b->map_fd[M_FLOWS], cur, &next)) {
		struct kcoll_bpf_flow f = { 0 };
		struct kcoll_flow_key tk = next;

		key = next;
		cur = &key;
		if (bpf_map_lookup_elem(b->map_fd[M_FLOWS], &key, &v))
			continue;	/* evicted meanwhile */
		f.laddr = key.laddr;
		f.raddr = key.raddr;
		f.lport = key.lport;
		f.rport = key.rport;
		f.proto = key.proto;
		f.ifindex = key.ifindex;
		f.link_id = v.link_id;
		f.peer_host = v.peer_host;
		f.flags = v.flags;
		f.tx_bytes = v.tx_bytes;
		f.tx_pkts = v.tx_pkts;
		f.tx_payload = v.tx_payload;
		f.rx_bytes = v.rx_bytes;
		f.rx_pkts = v.rx_pkts;
		f.rx_payload = v.rx_payload;
		f.roce_pkts = v.roce_pkts;
		f.first_seen_ns = v.first_seen_ns;
		f.last_seen_ns = v.last_seen_ns;
		tk.ifindex = 0;
		if (key.proto == 6 && !bpf_map_lookup_elem(b->map_fd[M_TCP], &tk, &t)) {
			f.retrans = t.retrans;
			f.srtt_us = t.srtt_us;
		}
		err = cb(&f, arg);
		if (err)
			return err;
	}
	return 0;
}

/* Per (link, peer) sums of the flows: the classifiers update one record per
 * packet, readers aggregate. */
struct link_sums {
	struct kcoll_bpf_link *v;
	size_t n, cap;
};

static int sum_flow(const struct kcoll_bpf_flow *f, void *arg)
{
	struct link_sums *s = arg;
	struct kcoll_bpf_link *l = NULL;

	for (size_t i = 0; i < s->n && !l; i++)
		if (s->v[i].link_id == f->link_id && s->v[i].peer_host == f->peer_host)
			l = &s->v[i];
	if (!l) {
		if (s->n == s->cap) {
			size_t cap = s->cap ? 2 * s->cap : 16;
			struct kcoll_bpf_link *v = realloc(s->v, cap * sizeof(*v));

			if (!v)
				return -ENOMEM;
			s->v = v;
			s->cap = cap;
		}
		l = &s->v[s->n++];
		memset(l, 0, sizeof(*l));
		l->link_id = f->link_id;
		l->peer_host = f->peer_host;
	}
	l->tx_bytes += f->tx_bytes;
	l->tx_pkts += f->tx_pkts;
	l->rx_bytes += f->rx_bytes;
	l->rx_pkts += f->rx_pkts;
	if (f->last_seen_ns > l->last_seen_ns)
		l->last_seen_ns = f->last_seen_ns;
	return 0;
}

int kcoll_bpf_links_foreach(struct kcoll_bpf *b, kcoll_bpf_link_cb cb, void *arg)
{
	struct link_sums s = { 0 };
	int err;

	if (!cb)
		return -EINVAL;
	err = kcoll_bpf_flows_foreach(b, sum_flow, &s);
	if (err == -ENOMEM)
		fail(b, err, "out of memory summing flows per link");
	for (size_t i = 0; !err && i < s.n; i++)
		err = cb(&s.v[i], arg);
	free(s.v);
	return err;
}

static int add_link(const struct kcoll_bpf_link *l, void *arg)
{
	struct kcoll_bpf_link *sum = arg;

	if (l->link_id != sum->link_id)
		return 0;
	sum->tx_bytes += l->tx_bytes;
	sum->tx_pkts += l->tx_pkts;
	sum->rx_bytes += l->rx_bytes;
	sum->rx_pkts += l->rx_pkts;
	if (l->last_seen_ns > sum->last_seen_ns)
		sum->last_seen_ns = l->last_seen_ns;
	return 0;
}

int kcoll_bpf_link_total(struct kcoll_bpf *b, __u32 link_id, struct kcoll_bpf_link *out)
{
	if (!out)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	out->link_id = link_id;
	out->peer_host = KCOLL_LINK_NONE;
	return kcoll_bpf_links_foreach(b, add_link, out);
}

/* Delete every entry: keys first (a delete during get_next_key restarts the walk). */
static int clear_map(struct kcoll_bpf *b, int fd, size_t key_size)
{
	char key[32], next[32];
	void *cur = NULL;

	for (;;) {
		if (bpf_map_get_next_key(fd, cur, next))
			return errno == ENOENT ? 0 : perm_hint(b, -errno, "clearing a map");
		memcpy(key, next, key_size);
		if (bpf_map_delete_elem(fd, key) && errno != ENOENT)
			return perm_hint(b, -errno, "clearing a map");
		cur = NULL;
	}
}

int kcoll_bpf_reset(struct kcoll_bpf *b)
{
	int err = need_pins(b);

	if (!err)
		err = clear_map(b, b->map_fd[M_FLOWS], sizeof(struct kcoll_flow_key));
	if (!err)
		err = clear_map(b, b->map_fd[M_TCP], sizeof(struct kcoll_flow_key));
	return err;
}
