/* SPDX-License-Identifier: MIT */
/*
 * Notifications (docs/kv.md "Notifications"): short messages a transfer
 * leaves for the owner of its remote segment, queued per segment in kcolld
 * until the owner takes them (KCOLL_MSG_SEG_NOTIFS). The queue is bounded
 * per segment (KCOLL_SEG_NOTIF_QUEUE) and per daemon (KV_NOTIF_TOTAL_BYTES):
 * a post beyond either is refused with -ENOBUFS, never dropped silently.
 */
#ifndef KCOLLD_KV_NOTIF_H
#define KCOLLD_KV_NOTIF_H

#include <pthread.h>
#include <stdint.h>

#include <kcoll/proto.h>

#define KV_NOTIF_TOTAL_BYTES	(64u << 20)	/* every segment's queue together */

struct kv_notif;

struct kv_notifq {
	pthread_mutex_t lock;
	struct kv_notif *head, **tail;
	uint32_t len;
	uint32_t *word;		/* len, in the owner's counters memfd: its futex */
};

/* What an initiator sends with a batch: who (the import) and the bytes. */
struct kv_msgout {
	uint64_t sender;
	uint32_t len;		/* 0: no notification */
	uint8_t data[KCOLL_NOTIF_MAX_BYTES];
};

void kv_notifq_init(struct kv_notifq *q, uint32_t *word);
/* Free what is queued (the segment is dead: nobody takes it any more). */
void kv_notifq_destroy(struct kv_notifq *q);
/* Queue one message (len 1..KCOLL_NOTIF_MAX_BYTES) and wake the owner:
 * 0, -ENOBUFS (the segment's queue or the daemon's is full), -ENOMEM. */
int kv_notifq_post(struct kv_notifq *q, uint64_t sender, uint32_t notify_id, const void *data,
		   uint32_t len);
/* Take up to max, oldest first, into out; *left: how many stay queued. */
uint32_t kv_notifq_take(struct kv_notifq *q, struct kcoll_notif_wire *out, uint32_t max,
			uint32_t *left);
/* Bytes queued in the whole daemon (status). */
uint64_t kv_notif_bytes(void);

#endif
