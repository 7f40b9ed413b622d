// SPDX-License-Identifier: MIT
/*
 * The largest GSO/GRO packet of network interfaces, through rtnetlink
 * (libnl): what scripts/netns-cluster.sh up --gso sets on the cluster's veth
 * links. Above 64 KiB this is BIG TCP (IPv6 since Linux 5.19, IPv4 since
 * 6.3); Debian 12's iproute2 (6.1) cannot set the IPv4 sizes.
 *
 *   link_gso BYTES IFACE...   set gso/gro_max_size and gso/gro_ipv4_max_size
 *   link_gso --get IFACE      print the four, one "name value" per line
 *
 * Runs in the caller's network namespace. Exit 0, 1 on a failure (with the
 * reason), 2 on a usage error.
 */
#include <errno.h>
#include <limits.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>

/* Newer than Debian 12's kernel headers (Linux 6.3's if_link.h). */
#ifndef IFLA_GSO_IPV4_MAX_SIZE
#define IFLA_GSO_IPV4_MAX_SIZE 63
#define IFLA_GRO_IPV4_MAX_SIZE 64
#endif

static const struct {
	int attr;
	const char *name;
} sizes[] = {
	{ IFLA_GSO_MAX_SIZE, "gso_max_size" },
	{ IFLA_GRO_MAX_SIZE, "gro_max_size" },
	{ IFLA_GSO_IPV4_MAX_SIZE, "gso_ipv4_max_size" },
	{ IFLA_GRO_IPV4_MAX_SIZE, "gro_ipv4_max_size" },
};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static int usage(void)
{
	fprintf(stderr, "usage: link_gso BYTES IFACE...   (set the GSO/GRO maxima)\n"
			"       link_gso --get IFACE\n");
	return 2;
}

static int index_of(const char *ifname)
{
	int idx = (int)if_nametoindex(ifname);

	if (!idx)
		fprintf(stderr, "link_gso: no interface '%s' in this network namespace\n", ifname);
	return idx;
}

static int set(struct nl_sock *sk, const char *ifname, uint32_t bytes)
{
	struct ifinfomsg ifi = { .ifi_family = AF_UNSPEC };
	struct nl_msg *msg;
	int err = -NLE_NOMEM;

	ifi.ifi_index = index_of(ifname);
	if (!ifi.ifi_index)
		return 1;
	msg = nlmsg_alloc_simple(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK);
	if (msg && nlmsg_append(msg, &ifi, sizeof(ifi), NLMSG_ALIGNTO) >= 0) {
		err = 0;
		for (size_t i = 0; i < NSIZES && !err; i++)
			err = nla_put_u32(msg, sizes[i].attr, bytes);
		if (!err)
			err = nl_send_sync(sk, msg);	/* sends, waits for the ack, frees */
		msg = NULL;
	}
	nlmsg_free(msg);
	if (err < 0) {
		fprintf(stderr, "link_gso: %s: setting the GSO/GRO maxima to %u: %s%s\n", ifname, bytes,
			nl_geterror(err), err == -NLE_INVAL ? " (more than the device takes? veth: "
			"at most 524280, 65536 on kernels without BIG TCP)" : "");
		return 1;
	}
	return 0;
}

static int got_link(struct nl_msg *msg, void *arg)
{
	struct nlattr **tb = arg;

	return nlmsg_parse(nlmsg_hdr(msg), sizeof(struct ifinfomsg), tb, IFLA_GRO_IPV4_MAX_SIZE,
			   NULL) < 0 ? NL_STOP : NL_OK;
}

static int get(struct nl_sock *sk, const char *ifname)
{
	struct ifinfomsg ifi = { .ifi_family = AF_UNSPEC };
	struct nlattr *tb[IFLA_GRO_IPV4_MAX_SIZE + 1] = { 0 };
	int err;

	ifi.ifi_index = index_of(ifname);
	if (!ifi.ifi_index)
		return 1;
	err = nl_socket_modify_cb(sk, NL_CB_VALID, NL_CB_CUSTOM, got_link, tb);
	if (err >= 0)
		err = nl_send_simple(sk, RTM_GETLINK, 0, &ifi, sizeof(ifi));
	if (err >= 0)
		err = nl_recvmsgs_default(sk);
	if (err < 0) {
		fprintf(stderr, "link_gso: %s: %s\n", ifname, nl_geterror(err));
		return 1;
	}
	for (size_t i = 0; i < NSIZES; i++) {
		if (tb[sizes[i].attr])
			printf("%s %u\n", sizes[i].name, nla_get_u32(tb[sizes[i].attr]));
		else
			printf("%s none\n", sizes[i].name);	/* a kernel without it */
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct nl_sock *sk;
	unsigned long bytes = 0;
	char *end;
	int rc = 0, err;

	if (argc < 3 || (!strcmp(argv[1], "--get") && argc != 3))
		return usage();
	if (strcmp(argv[1], "--get")) {
		errno = 0;
		bytes = strtoul(argv[1], &end, 10);
		if (errno || *end || bytes < 1024 || bytes > UINT32_MAX) {
			fprintf(stderr, "link_gso: BYTES '%s': a size in bytes, at least 1024\n",
				argv[1]);
			return 2;
		}
	}
	sk = nl_socket_alloc();
	if (!sk) {
		fprintf(stderr, "link_gso: no memory for a netlink socket\n");
		return 1;
	}
	err = nl_connect(sk, NETLINK_ROUTE);
	if (err < 0) {
		fprintf(stderr, "link_gso: rtnetlink: %s\n", nl_geterror(err));
		nl_socket_free(sk);
		return 1;
	}
	if (!strcmp(argv[1], "--get"))
		rc = get(sk, argv[2]);
	else
		for (int i = 2; i < argc; i++)
			rc |= set(sk, argv[i], (uint32_t)bytes);
	nl_socket_free(sk);
	return rc;
}
