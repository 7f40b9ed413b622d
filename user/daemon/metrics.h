/* SPDX-License-Identifier: MIT */
/*
 * Prometheus metrics of kcolld (docs/metrics.md lists every one).
 *
 * The data path only adds to relaxed atomics (kd_metrics_op, kd_metrics_kv):
 * no lock, no allocation. Everything else runs on the control thread: the
 * C4 tick feeds link and anomaly counters, the renderer walks the client and
 * communicator lists as `kcollctl status` does, and the HTTP responder
 * (KCOLL_METRICS) is a nested epoll set inside the control thread's, every
 * connection non-blocking with a size and a time limit, so a scraper can
 * neither block nor grow the daemon. KCOLL_METRICS_FILE rewrites a file for
 * node_exporter's textfile collector from the same loop.
 */
#ifndef KCOLLD_METRICS_H
#define KCOLLD_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Any thread: a collective finished (err 0 or -errno); bytes it delivered
 * into the local ranks' receive buffers, ns since its first local rank
 * submitted it. */
void kd_metrics_op(uint8_t opcode, int err, uint64_t bytes, int64_t ns);
/* Any thread: a KV transfer batch finished. */
void kd_metrics_kv(bool write, int err, uint64_t bytes, int64_t ns);
/* A KV segment (dev: in GPU memory) was registered (+1) or ended (-1). */
void kd_metrics_kv_seg(bool dev, int delta);
/* Bytes copied to or from device KV segments, each once. */
void kd_metrics_kv_dev(uint64_t bytes);
/* For status: device segments now, and the bytes above so far. */
void kd_metrics_kv_dev_get(uint32_t *segs, uint64_t *bytes);

/* Control thread (the C4 tick, c4d.c). */
void kd_metrics_c4_raised(uint32_t kind);
/* A C4 view (this host's verdicts and wait) went to a peer host. */
void kd_metrics_c4_view_sent(void);
/* Link observation deltas toward peer host 'peer' over our link l, direction
 * dir (0 rx, 1 tx): bytes of large pieces and the time they took. */
void kd_metrics_link(const char *peer, uint32_t l, uint32_t dir, uint64_t bytes, uint64_t busy_ns);
/* The detector's current rate estimate of the same key (B/s). */
void kd_metrics_link_rate(const char *peer, uint32_t l, uint32_t dir, uint64_t rate);
/* BPF flow tracker: TCP retransmissions seen on our link l since the last call. */
void kd_metrics_retrans(uint32_t l, uint64_t n);

/*
 * What the renderer reads from other rooms, installed by main.c: metrics.c
 * calls none of them directly, so the rooms that count into it (comm, kv,
 * c4d) and the ones it reads (c4d, net) form no cycle through it
 * (scripts/layering.py).
 */
struct kd_metrics_src {
	void (*c4_active_kinds)(uint64_t *n, uint32_t nkinds);	/* active anomalies by kind */
	uint32_t (*nlinks)(void);				/* our links (interfaces) */
	void (*link_ifname)(uint32_t l, char *buf, size_t len);
	bool (*bpf_on)(void);					/* flow tracking attached */
};

/* Control thread: KCOLL_METRICS / KCOLL_METRICS_FILE. 0, or -EINVAL for a
 * value that does not parse (kcolld refuses to start: it says why). A port
 * that cannot be bound is logged and leaves the endpoint off. */
int kd_metrics_start(int epfd, void *tag, const struct kd_metrics_src *src);
/* The nested epoll set (tag) is readable. */
void kd_metrics_event(void);
/* Periodically: connection deadlines, the textfile. */
void kd_metrics_tick(int64_t now);
/* Close the endpoint; write the textfile a last time. */
void kd_metrics_stop(void);
/* The exposition text (format 0.0.4) into buf; its length, or -EMSGSIZE
 * when cap is too small. */
long kd_metrics_render(char *buf, size_t cap);
/* "127.0.0.1:9464" while serving, else "" (status). */
const char *kd_metrics_addr(void);

#endif /* KCOLLD_METRICS_H */
