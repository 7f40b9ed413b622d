/* SPDX-License-Identifier: MIT */
/*
 * The frames of a KD_CONN_KV connection after its HELLO (docs/kv.md "Across
 * hosts"): the owner's verdict on the HELLO, then requests and answers. kv.c
 * speaks them; tests/kv_hostile.c speaks them as a peer that is not kcolld.
 */
#ifndef KCOLLD_KV_WIRE_H
#define KCOLLD_KV_WIRE_H

#include <stdint.h>

#include "net.h"

enum { KV_OP_WRITE = 0, KV_OP_READ = 1, KV_OP_NOTIFY = 2, KV_OP_RDMA = 3 };

struct kv_fent {
	uint64_t off, len;
};

struct kv_req {
	struct kd_phdr hdr;
	uint32_t op, nr, notify_id, reserved;
	uint64_t tag;
};

struct kv_resp {
	struct kd_phdr hdr;
	int32_t status;
	uint32_t reserved;
	uint64_t tag;
};

struct kv_ack {
	struct kd_phdr hdr;
	int32_t status;
	uint32_t reserved;
};

#endif
