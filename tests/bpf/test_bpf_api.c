// SPDX-License-Identifier: MIT
/*
 * libkcoll_bpf's contract, one rule at a time: option validation, the
 * tracking filter's limits, link/peer config checks, the reader's walk and
 * its early stop, detach, and what a missing tracker returns. Runs in a
 * network namespace of its own (unshare) on lo, pins in a private
 * directory. Root only for the parts that load programs (SKIP otherwise).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kcoll/tap.h>

#include "kcoll_bpf.h"

static int count_flows(const struct kcoll_bpf_flow *f, void *arg)
{
	int *n = arg;

	(*n)++;
	return 0;
}

static int stop_at_first(const struct kcoll_bpf_flow *f, void *arg)
{
	(*(int *)arg)++;
	return 7;
}

static int udp_to(uint16_t port, int count)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	char buf[100] = { 0 };
	int fd = socket(AF_INET, SOCK_DGRAM, 0);

	if (fd < 0)
		return -errno;
	for (int i = 0; i < count; i++)
		if (sendto(fd, buf, sizeof(buf), 0, (struct sockaddr *)&sa, sizeof(sa)) != sizeof(buf)) {
			close(fd);
			return -errno;
		}
	close(fd);
	return 0;
}

int main(void)
{
	struct kcoll_bpf_opts o = { .size = sizeof(o) };
	struct kcoll_bpf *b = NULL;
	struct kcoll_bpf_link total;
	char pin[64];
	int err, n, lo, bad_if = 0;

	/* Option validation: no privilege needed. */
	o.size = 2;
	tap_ok(kcoll_bpf_open(&b, &o) == -EINVAL && !b, "opts.size too small: -EINVAL");
	o.size = sizeof(o) + 8;
	tap_ok(kcoll_bpf_open(&b, &o) == -EINVAL, "opts.size larger than known: -EINVAL");
	o.size = sizeof(o);
	o.flags = 0x80;
	err = kcoll_bpf_open(&b, &o);
	tap_ok(err == -EOPNOTSUPP, "unknown flag: -EOPNOTSUPP (%s)", kcoll_bpf_open_error());
	o.flags = 0;
	o.pin_dir = "kcoll";
	tap_ok(kcoll_bpf_open(&b, &o) == -EINVAL, "pin directory without a parent: -EINVAL");
	o.pin_dir = "/tmp/kcoll-bpf-api";
	err = kcoll_bpf_open(&b, &o);
	tap_ok(err == -ENOTSUP, "pin directory not on bpffs: -ENOTSUP (%s)", kcoll_bpf_open_error());
	o.pin_dir = "/nonexistent-kcoll/x";
	err = kcoll_bpf_open(&b, &o);
	tap_ok(err == -ENOENT, "pin directory's parent missing: -ENOENT (%s)", kcoll_bpf_open_error());
	tap_ok(kcoll_bpf_open(NULL, &o) == -EINVAL, "NULL out: -EINVAL");

	if (geteuid() != 0) {
		tap_skip("the rest loads BPF programs: needs root");
		return tap_done();
	}
	if (unshare(CLONE_NEWNET)) {
		tap_skip("cannot create a network namespace: %s", strerror(errno));
		return tap_done();
	}
	lo = (int)if_nametoindex("lo");
	{
		int s = socket(AF_INET, SOCK_DGRAM, 0);
		struct ifreq ifr = { 0 };

		strcpy(ifr.ifr_name, "lo");
		if (s >= 0 && !ioctl(s, SIOCGIFFLAGS, &ifr)) {
			ifr.ifr_flags |= IFF_UP;
			ioctl(s, SIOCSIFFLAGS, &ifr);
		}
		if (s >= 0)
			close(s);
	}
	snprintf(pin, sizeof(pin), "/sys/fs/bpf/kcoll-api-%d", (int)getpid());
	o.pin_dir = pin;
	o.flags = KCOLL_BPF_OPEN_READ;
	err = kcoll_bpf_open(&b, &o);
	tap_ok(err == -ENOENT && strstr(kcoll_bpf_open_error(), "not attached"),
	       "reader before attach: -ENOENT, 'not attached'");
	o.flags = KCOLL_BPF_NO_SOCKOPS;
	err = kcoll_bpf_open(&b, &o);
	if (!tap_ok(!err, "open %s: %d", pin, err))
		return tap_done();
	tap_ok(kcoll_bpf_track_ports(b, 100, 200) == -ENOENT, "tracking before attach: -ENOENT");
	tap_ok(kcoll_bpf_attach(b, &bad_if, 1) == -EINVAL, "attach ifindex 0: -EINVAL");
	err = kcoll_bpf_attach_names(b, "kcoll-nope0");
	tap_ok(err == -ENODEV, "attach unknown name: -ENODEV (%s)", kcoll_bpf_strerror(b));
	tap_ok(kcoll_bpf_attach_names(b, ",") == -EINVAL, "attach empty list: -EINVAL");
	err = kcoll_bpf_attach(b, &lo, 1);
	if (!tap_ok(!err, "attach on lo: %d (%s)", err, err ? kcoll_bpf_strerror(b) : "ok"))
		goto out;
	tap_ok(kcoll_bpf_attach(b, &lo, 1) == 0, "attach on lo again: replaces, 0");

	tap_ok(kcoll_bpf_track_ports(b, 200, 100) == -EINVAL, "port range low > high: -EINVAL");
	tap_ok(kcoll_bpf_track_ports(b, 0, 10) == -EINVAL, "port 0: -EINVAL");
	tap_ok(kcoll_bpf_untrack_ports(b, 1, 2) == -ENOENT, "untrack what is not tracked: -ENOENT");
	err = 0;
	for (int i = 0; i < KCOLL_TRACK_SLOTS && !err; i++)
		err = kcoll_bpf_track_ports(b, (uint16_t)(30000 + i), (uint16_t)(30000 + i));
	tap_ok(!err, "%d port ranges fit", KCOLL_TRACK_SLOTS);
	tap_ok(kcoll_bpf_track_ports(b, 30000, 30000) == 0, "tracking a range twice: 0, no new slot");
	err = kcoll_bpf_track_ports(b, 40000, 40000);
	tap_ok(err == -ENOSPC, "one range more: -ENOSPC (%s)", kcoll_bpf_strerror(b));
	tap_ok(kcoll_bpf_untrack_ports(b, 30015, 30015) == 0 &&
	       kcoll_bpf_track_ports(b, 40000, 40000) == 0, "untrack frees a slot for another");
	tap_ok(kcoll_bpf_set_link(b, 0, 0, 1) == -EINVAL, "link on ifindex 0: -EINVAL");
	tap_ok(kcoll_bpf_set_link(b, (uint32_t)lo, 0, KCOLL_LINK_NONE) == -EINVAL, "link id NONE: -EINVAL");
	tap_ok(kcoll_bpf_set_peer(b, 0, 1) == -EINVAL, "peer address 0: -EINVAL");
	tap_ok(kcoll_bpf_set_peer(b, htonl(INADDR_LOOPBACK), KCOLL_LINK_NONE) == -EINVAL,
	       "peer host NONE: -EINVAL");
	tap_ok(kcoll_bpf_track_cgroup(b, "/nonexistent/cgroup") == -ENOENT, "unknown cgroup: -ENOENT");
	tap_ok(kcoll_bpf_set_link(b, (uint32_t)lo, 0, 5) == 0 &&
	       kcoll_bpf_set_peer(b, htonl(INADDR_LOOPBACK), 2) == 0, "link lo = 5, peer 127.0.0.1 = 2");

	tap_ok(udp_to(39999, 10) == 0, "10 datagrams to untracked port 39999");
	n = 0;
	err = kcoll_bpf_flows_foreach(b, count_flows, &n);
	tap_ok(!err && n == 0, "no flow counted (%d)", n);
	tap_ok(udp_to(40000, 10) == 0, "10 datagrams to tracked port 40000");
	n = 0;
	/* On lo a datagram leaves (egress) and arrives (ingress): two records, swapped ends. */
	err = kcoll_bpf_flows_foreach(b, count_flows, &n);
	tap_ok(!err && n == 2, "2 flow records (%d)", n);
	n = 0;
	err = kcoll_bpf_flows_foreach(b, stop_at_first, &n);
	tap_ok(err == 7 && n == 1, "a callback's non-zero stops the walk and is returned (%d after %d)",
	       err, n);
	err = kcoll_bpf_link_total(b, 5, &total);
	tap_ok(!err && total.tx_pkts == 10 && total.rx_pkts == 10, "link 5 total: %llu packets out, %llu in",
	       (unsigned long long)total.tx_pkts, (unsigned long long)total.rx_pkts);
	tap_ok(kcoll_bpf_flows_foreach(b, NULL, NULL) == -EINVAL, "NULL callback: -EINVAL");
	tap_ok(kcoll_bpf_reset(b) == 0, "reset");
	n = 0;
	kcoll_bpf_flows_foreach(b, count_flows, &n);
	tap_ok(n == 0, "no flow after reset (%d)", n);
out:
	tap_ok(kcoll_bpf_detach(b) == 0, "detach");
	tap_ok(access(pin, F_OK) != 0, "pin directory gone");
	tap_ok(kcoll_bpf_detach(b) == 0, "detach again: 0");
	n = 0;
	tap_ok(kcoll_bpf_flows_foreach(b, count_flows, &n) == -ENOENT, "reading after detach: -ENOENT");
	kcoll_bpf_close(b);
	kcoll_bpf_close(NULL);
	return tap_done();
}
