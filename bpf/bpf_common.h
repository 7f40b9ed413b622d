/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * What the eBPF programs (flows.bpf.c, steer.bpf.c) share: the packet
 * constants vmlinux.h does not carry (they are #defines in the kernel's
 * uapi headers, which BTF does not record) and the shape of a map that
 * libbpf pins by name under the bpffs directory the loader picks.
 * Include after vmlinux.h and <bpf/bpf_helpers.h>.
 */
#ifndef KCOLL_BPF_COMMON_H
#define KCOLL_BPF_COMMON_H

/* tc direct-action verdicts (linux/pkt_cls.h) */
#define TC_ACT_UNSPEC	(-1)	/* go on with the next filter */
#define TC_ACT_OK	0
#define TC_ACT_SHOT	2

#define ETH_P_IP	0x0800
#define ETH_HLEN	14
#define IPPROTO_TCP	6
#define IPPROTO_UDP	17

/* A map pinned by name: KCOLL_PINNED_MAP(BPF_MAP_TYPE_HASH, 64, __u32, __u32) name SEC(".maps"); */
#define KCOLL_PINNED_MAP(map_type, max, key_type, value_type)	\
	struct {						\
		__uint(type, map_type);				\
		__uint(max_entries, max);			\
		__type(key, key_type);				\
		__type(value, value_type);			\
		__uint(pinning, LIBBPF_PIN_BY_NAME);		\
	}

#endif
