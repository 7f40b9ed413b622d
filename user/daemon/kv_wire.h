/* SPDX-License-Identifier: MIT */
/*
 * The frames of a KD_CONN_KV connection after its HELLO (docs/kv.md "Across
 * hosts"): the owner's verdict on the HELLO, then requests and answers.
 * kv_send.c and kv_serve.c speak them; tests/kv_hostile.c speaks them as a
 * peer that is not kcolld.
 */
#ifndef KCOLLD_KV_WIRE_H
#define KCOLLD_KV_WIRE_H

#include <stdint.h>

#include "wire.h"

enum { KV_OP_WRITE = 0, KV_OP_READ = 1, KV_OP_NOTIFY = 2, KV_OP_RDMA = 3, KV_OP_MSG = 4 };

/* kv_ack.features: what the owner's kcolld serves beyond the first version
 * (an older one sends 0 there and drops a connection on an unknown op). */
#define KV_ACK_F_MSG	(1u << 0)	/* KV_OP_MSG */

/* KV_OP_MSG: KV_REQ {op MSG, nr 0, notify_id, tag} kv_msg data[len]: queue
 * a notification for the segment's owner, then bump notify_id unless NONE;
 * answered by KV_RESP {status, tag} (-ENOBUFS: the owner's queue is full). */
struct kv_msg {
	uint64_t sender;	/* the initiator's import (opaque to the owner) */
	uint32_t len;		/* 1..KCOLL_NOTIF_MAX_BYTES */
	uint32_t reserved;
};

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
	uint32_t features;	/* KV_ACK_F_* (0 from kcollds before notifications) */
};

#endif
