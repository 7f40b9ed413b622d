// SPDX-License-Identifier: MIT
/* Per-segment notification queues (kv_notif.h, docs/kv.md "Notifications"). */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <kcoll/futex.h>

#include "kv_notif.h"

struct kv_notif {
	struct kv_notif *next;
	uint64_t sender;
	uint32_t notify_id;
	uint32_t len;
	uint8_t data[];
};

static atomic_ulong notif_bytes;	/* every queue's messages, headers included */

void kv_notifq_init(struct kv_notifq *q, uint32_t *word)
{
	pthread_mutex_init(&q->lock, NULL);
	q->head = NULL;
	q->tail = &q->head;
	q->len = 0;
	q->word = word;
}

void kv_notifq_destroy(struct kv_notifq *q)
{
	struct kv_notif *n;

	while ((n = q->head)) {
		q->head = n->next;
		atomic_fetch_sub(&notif_bytes, sizeof(*n) + n->len);
		free(n);
	}
	q->tail = &q->head;
	q->len = 0;
	pthread_mutex_destroy(&q->lock);
}

int kv_notifq_post(struct kv_notifq *q, uint64_t sender, uint32_t notify_id, const void *data,
		   uint32_t len)
{
	size_t cost = sizeof(struct kv_notif) + len;
	struct kv_notif *n;

	if (!len || len > KCOLL_NOTIF_MAX_BYTES)
		return -EINVAL;
	pthread_mutex_lock(&q->lock);
	if (q->len >= KCOLL_SEG_NOTIF_QUEUE ||
	    atomic_fetch_add(&notif_bytes, cost) + cost > KV_NOTIF_TOTAL_BYTES) {
		if (q->len < KCOLL_SEG_NOTIF_QUEUE)
			atomic_fetch_sub(&notif_bytes, cost);
		pthread_mutex_unlock(&q->lock);
		return -ENOBUFS;
	}
	n = malloc(cost);
	if (!n) {
		atomic_fetch_sub(&notif_bytes, cost);
		pthread_mutex_unlock(&q->lock);
		return -ENOMEM;
	}
	n->next = NULL;
	n->sender = sender;
	n->notify_id = notify_id;
	n->len = len;
	memcpy(n->data, data, len);
	*q->tail = n;
	q->tail = &n->next;
	q->len++;
	if (q->word) {
		__atomic_store_n(q->word, q->len, __ATOMIC_RELEASE);
		kcoll_futex_wake(q->word, INT_MAX);
	}
	pthread_mutex_unlock(&q->lock);
	return 0;
}

uint32_t kv_notifq_take(struct kv_notifq *q, struct kcoll_notif_wire *out, uint32_t max,
			uint32_t *left)
{
	uint32_t k = 0;

	pthread_mutex_lock(&q->lock);
	while (k < max && q->head) {
		struct kv_notif *n = q->head;

		q->head = n->next;
		if (!q->head)
			q->tail = &q->head;
		q->len--;
		memset(&out[k], 0, sizeof(out[k]));
		out[k].sender = n->sender;
		out[k].notify_id = n->notify_id;
		out[k].len = n->len;
		memcpy(out[k].data, n->data, n->len);
		atomic_fetch_sub(&notif_bytes, sizeof(*n) + n->len);
		free(n);
		k++;
	}
	if (q->word)
		__atomic_store_n(q->word, q->len, __ATOMIC_RELEASE);
	*left = q->len;
	pthread_mutex_unlock(&q->lock);
	return k;
}

uint64_t kv_notif_bytes(void)
{
	return atomic_load(&notif_bytes);
}
